"""The import graph of fastrl_per: each module's floor (1 + the highest floor it imports; the ground floor imports
nothing of the package), its `from .x import` edges (in functions too), and, with `--apart`, whether two groups of
modules import each other. Exits 1 on a cycle or on an import between groups kept apart.
Usage: python tools/import_graph.py [--edges] [--apart memory,frames,per envs,nstep,atari]"""
import argparse, ast, sys
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / 'fastrl_per'

def imported(node:ast.ImportFrom, parent:list, mods) -> set:
    "The modules of the package a `from ... import` names, dotted: `from .x import y` names x, `from . import x` x."
    if node.level: base = parent[:len(parent) - node.level + 1] + (node.module.split('.') if node.module else [])
    elif node.module and node.module.split('.')[0] == 'fastrl_per': base = node.module.split('.')[1:]
    else: return set()
    names = ('.'.join(base + [a.name]) for a in node.names)   # `from . import learner` names a module
    return {n if n in mods else '.'.join(base) for n in names}

def edges_of(pkg:Path=PKG) -> dict:
    "`{module: sorted modules of the package it imports}`, modules named by their path below `pkg`, dotted."
    mods = {'.'.join(p.relative_to(pkg).with_suffix('').parts): p for p in pkg.rglob('*.py')
            if p.stem not in ('_modidx', '__init__', '__main__', 'all')}
    edges = {}
    for m, p in mods.items():
        found = set()
        for n in ast.walk(ast.parse(p.read_text())):
            if isinstance(n, ast.ImportFrom): found |= imported(n, m.split('.')[:-1], mods)
            elif isinstance(n, ast.Import):
                found |= {a.name.split('.', 1)[1] for a in n.names if a.name.startswith('fastrl_per.')}
        edges[m] = sorted(d for d in found if d)
    return edges

def floors_of(edges:dict) -> dict:
    "`{module: floor}`; a `ValueError` naming a cycle if there is one."
    floor = {}
    def visit(m, path):
        if m in path: raise ValueError(f"import cycle: {' -> '.join(path + (m,))}")
        if m not in floor: floor[m] = 1 + max((visit(d, path + (m,)) for d in edges[m]), default=-1)
        return floor[m]
    for m in edges: visit(m, ())
    return floor

if __name__ == '__main__':
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--edges', action='store_true', help="list each module's imports too")
    ap.add_argument('--apart', nargs=2, metavar='GROUP', help='two comma-separated groups that must not import each other')
    args = ap.parse_args()
    edges = edges_of()
    try: floor = floors_of(edges)
    except ValueError as e: sys.exit(str(e))
    for f in range(max(floor.values()) + 1):
        print(f"floor {f:2}: {', '.join(sorted(m for m in floor if floor[m] == f))}")
    if args.edges:
        for m in sorted(edges): print(f"  {m} <- {', '.join(edges[m]) or '-'}")
    print(f"{len(edges)} modules, {max(floor.values()) + 1} floors, {sum(map(len, edges.values()))} imports")
    if args.apart:
        a, b = (set(g.split(',')) for g in args.apart)
        crossing = [(m, d) for m in sorted(edges) for d in edges[m] if (m in a and d in b) or (m in b and d in a)]
        print(f"imports between the groups: {crossing or 'none'}")
        if crossing: sys.exit(1)
