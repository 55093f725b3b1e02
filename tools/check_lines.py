"""List every line over 120 characters in the generated package (fastrl_per/*.py except nbdev's _modidx.py).
nbdev writes each module's `__all__` (the line after `# %% auto #0`) wrapped at 120 before it prefixes `__all__ = `,
so that one generated line may reach 130: it is not counted.
Usage: python tools/check_lines.py [FILE ...] (default: fastrl_per/*.py); exits 1 if any line is over."""
import sys
from pathlib import Path

LIMIT = 120

def long_lines(path):
    "'file:line: n characters' for each line of `path` over `LIMIT`, nbdev's `__all__` line aside."
    lines = Path(path).read_text().splitlines()
    return [f'{path}:{i + 1}: {len(line)} characters' for i, line in enumerate(lines)
            if len(line) > LIMIT and not (line.startswith('__all__ = [') and i and lines[i - 1] == '# %% auto #0')]

if __name__ == '__main__':
    pkg = Path(__file__).parent.parent/'fastrl_per'
    paths = sys.argv[1:] or sorted(p for p in pkg.glob('*.py') if p.name != '_modidx.py')
    long = [hit for p in paths for hit in long_lines(p)]
    if long: sys.exit(f'lines over {LIMIT} characters:\n' + '\n'.join(long))
