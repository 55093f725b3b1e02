"""The package's folders are its floors: the foundation modules (checks, core, state) import no other module of the
package; replay/ and stages/ import only the foundation and their own folder (neither the other); learners/ builds
on those; run/ on learners/ and below; integrations/ on replay/ and the foundation. No import goes up a floor and
no two modules import each other, directly or round a cycle. Read from the source with `ast`, as a reviewer would."""
import ast
from pathlib import Path
import pytest

PKG = Path(__file__).resolve().parent.parent / 'fastrl_per'
FOUNDATION = {'checks', 'core', 'state'}
MAY_IMPORT = {   # a folder, and the folders its modules may import from besides itself and the foundation
    'replay': set(), 'stages': set(), 'learners': {'replay', 'stages'}, 'run': {'replay', 'stages', 'learners'},
    'integrations': {'replay'}}

def module_name(path: Path) -> str:
    return '.'.join(path.relative_to(PKG).with_suffix('').parts)

def imports(path: Path) -> set[str]:
    "The package's modules that `path` imports, resolved to dotted names below fastrl_per (absolute or relative)."
    here = module_name(path).split('.')[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[:len(here) - node.level + 1] + (node.module.split('.') if node.module else [])
            elif node.module and node.module.split('.')[0] == 'fastrl_per': base = node.module.split('.')[1:]
            else: continue
            names = [a.name for a in node.names]
            for n in names:   # `from . import learner` names a module, `from .memory import X` a name in one
                dotted = '.'.join(base + [n])
                found.add(dotted if (PKG / Path(*dotted.split('.'))).with_suffix('.py').exists() else '.'.join(base))
        elif isinstance(node, ast.Import):
            found |= {a.name.split('.', 1)[1] for a in node.names if a.name.startswith('fastrl_per.')}
    return {m for m in found if m}

MODULES = {module_name(p): imports(p) for p in sorted(PKG.rglob('*.py'))
           if p.name not in ('_modidx.py', '__init__.py', '__main__.py', 'all.py')}

def folder(module: str) -> str: return module.split('.')[0] if '.' in module else 'foundation'

def test_the_folders_are_the_ones_documented():
    assert {folder(m) for m in MODULES} == {'foundation', *MAY_IMPORT}
    assert {m for m in MODULES if folder(m) == 'foundation'} == FOUNDATION

@pytest.mark.parametrize('module', sorted(MODULES))
def test_no_import_goes_up_a_floor(module):
    allowed = set() if folder(module) == 'foundation' else {'foundation', folder(module), *MAY_IMPORT[folder(module)]}
    wrong = sorted(m for m in MODULES[module] if folder(m) not in allowed and m in MODULES)
    unknown = sorted(m for m in MODULES[module] if m not in MODULES)
    assert not unknown, f'{module} imports modules that do not exist: {unknown}'
    assert not wrong, f'{module} ({folder(module)}) imports {wrong}, a floor it may not reach'

def test_no_cycles():
    state = {}
    def visit(m, path):
        if state.get(m) == 'done': return
        assert state.get(m) != 'open', 'import cycle: ' + ' -> '.join(path[path.index(m):] + [m])
        state[m] = 'open'
        for n in sorted(MODULES[m]): visit(n, path + [m])
        state[m] = 'done'
    for m in sorted(MODULES): visit(m, [])
