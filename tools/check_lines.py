"""List every line over 120 characters and every function over 60 lines in the generated package (fastrl_per/*.py
except nbdev's _modidx.py). nbdev writes each module's `__all__` (the line after `# %% auto #0`) wrapped at 120 before
it prefixes `__all__ = `, so that one generated line may reach 130: it is not counted.
Usage: python tools/check_lines.py [FILE ...] (default: fastrl_per/*.py); exits 1 if any line or function is over."""
import ast, sys
from pathlib import Path

LIMIT, FUNCTION_LIMIT = 120, 60

def long_lines(path):
    "'file:line: n characters' for each line of `path` over `LIMIT`, nbdev's `__all__` line aside."
    lines = Path(path).read_text().splitlines()
    return [f'{path}:{i + 1}: {len(line)} characters' for i, line in enumerate(lines)
            if len(line) > LIMIT and not (line.startswith('__all__ = [') and i and lines[i - 1] == '# %% auto #0')]

def long_functions(path):
    "'file:line: name is n lines' for each function (or method) of `path` longer than `FUNCTION_LIMIT` lines."
    nodes = ast.walk(ast.parse(Path(path).read_text()))
    return [f'{path}:{n.lineno}: {n.name} is {n.end_lineno - n.lineno + 1} lines' for n in nodes
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno + 1 > FUNCTION_LIMIT]

if __name__ == '__main__':
    pkg = Path(__file__).parent.parent/'fastrl_per'
    paths = sys.argv[1:] or sorted(p for p in pkg.rglob('*.py') if p.name != '_modidx.py')
    found = [hit for p in paths for hit in long_lines(p) + long_functions(p)]
    if found: sys.exit(f'lines over {LIMIT} characters or functions over {FUNCTION_LIMIT} lines:\n' + '\n'.join(found))
