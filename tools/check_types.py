"""Type-check the example code a reader copies: the README's Python blocks and the notebooks' code cells that are not
exported, each as a module, with mypy (the dev extra). Only one kind of error is reported: "has no attribute" on a
name of this package, which is what a reader's IDE says when a class's methods are added outside its body. Other
libraries (torch, numpy, gymnasium, ...) are taken as untyped, so the check stays fast and about this package.
Usage: python tools/check_types.py [--inside] [NOTEBOOK ...]; exits 1 if any such error is found."""
import ast, re, subprocess, sys, tempfile
from pathlib import Path
from execnb.nbio import read_nb

root = Path(__file__).resolve().parent.parent
_re_py_block = re.compile(r'```python\n(.*?)```', re.DOTALL)
UNTYPED = ['torch', 'torchdata', 'numpy', 'gymnasium', 'ray', 'fastcore', 'fastprogress', 'matplotlib', 'tensorboard',
           'numba', 'ale_py', 'cv2', 'minatar', 'IPython', 'execnb', 'nbdev', 'moviepy', 'scipy', 'pandas']
CONFIG = '[mypy]\nignore_missing_imports = True\ncheck_untyped_defs = True\n' + ''.join(
    f'[mypy-{name}.*]\nfollow_imports = skip\n[mypy-{name}]\nfollow_imports = skip\n' for name in UNTYPED)

def example_code(nb_path:Path) -> str:
    "The code cells of a notebook that are not exported, as a module that sees what the notebook's exported cells define."
    cells = [c.source for c in read_nb(nb_path).cells if c.cell_type == 'code']
    exported = [src for src in cells if '#| export' in src]
    module = next((m.group(1) for src in cells if (m := re.search(r'#\| default_exp ([\w.]+)', src))), None)
    head = [ast.get_source_segment(src, node) for src in exported for node in ast.parse(src).body
            if isinstance(node, (ast.Import, ast.ImportFrom)) and getattr(node, 'module', None) != '__future__']
    if module and exported: head.append(f'from fastrl_per.{module} import *')
    keep = lambda line: not line.lstrip().startswith(('#|', '%', '!'))
    examples = ['\n'.join(l for l in src.splitlines() if keep(l)) for src in cells if src not in exported]
    return '\n'.join(head) + '\n\n' + '\n\n'.join(examples)

def package_names() -> set[str]:
    "The classes the package defines, as mypy names them in its messages."
    names = set()
    for py in (root / 'fastrl_per').rglob('*.py'):
        names.update(re.findall(r'^class (\w+)', py.read_text(), re.MULTILINE))
    return names

def attribute_errors(paths:list[Path], inside:bool=False) -> list[str]:
    "mypy's \"has no attribute\" errors on the package's classes in the examples of `paths` (`inside`: in the package too)."
    with tempfile.TemporaryDirectory() as d:
        d, files = Path(d), []
        for i, path in enumerate(paths):
            text = '\n\n'.join(_re_py_block.findall(path.read_text())) if path.suffix == '.md' else example_code(path)
            stem = re.sub(r'\W', '_', path.stem)
            files.append(d / f'example_{i}_{stem}.py')
            files[-1].write_text(text + '\n')
        (d / 'mypy.ini').write_text(CONFIG)
        res = subprocess.run([sys.executable, '-m', 'mypy', '--config-file', str(d / 'mypy.ini'), '--no-error-summary',
                              '--cache-dir', str(d / 'cache'), *map(str, files)], capture_output=True, text=True, cwd=root)
        if 'errors prevented further checking' in res.stdout: raise SystemExit(f"mypy could not check:\n{res.stdout}")
        ours = package_names()
        names = {f.name: str(p.relative_to(root)) for f, p in zip(files, paths)}
        errors = []
        for line in res.stdout.splitlines():
            m = re.search(r'"(\w+)" has no attribute "(\w+)"', line)
            file = line.split(':', 1)[0]
            if m and m.group(1) in ours and 'error' in line and (Path(file).name in names or inside):
                errors.append(line.replace(file, names.get(Path(file).name, file), 1))
        return errors

if __name__ == '__main__':
    inside = '--inside' in sys.argv   # also the package's own code, as mypy reads it from the examples
    paths = [Path(p).resolve() for p in sys.argv[1:] if p != '--inside'] or [root / 'README.md', *sorted((root / 'nbs').glob('*.ipynb'))]
    errors = attribute_errors(paths, inside)
    print('\n'.join(errors) if errors else f'no "has no attribute" errors for the package\'s names in {len(paths)} files')
    sys.exit(1 if errors else 0)
