"""List every line over 120 characters in the generated package (fastrl_per/*.py except nbdev's _modidx.py).
Usage: python tools/check_lines.py [FILE ...] (default: fastrl_per/*.py); exits 1 if any line is over."""
import sys
from pathlib import Path

LIMIT = 120
paths = sys.argv[1:] or sorted(p for p in (Path(__file__).parent.parent/'fastrl_per').glob('*.py') if p.name != '_modidx.py')
long = [f'{p}:{i}: {len(line)} characters' for p in paths
        for i, line in enumerate(Path(p).read_text().splitlines(), 1) if len(line) > LIMIT]
if long: sys.exit(f'lines over {LIMIT} characters:\n' + '\n'.join(long))
