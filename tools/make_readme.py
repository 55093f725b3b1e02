"""Write README.md from nbs/index.ipynb: markdown cells as they are, code cells as python blocks.
Cells whose first line is `#| hide` are left out. (nbdev's own `nbdev_readme` needs Quarto.)"""
from pathlib import Path
from execnb.nbio import read_nb

def cell_text(cell):
    src = cell.source.strip()
    if cell.cell_type == 'markdown': return src
    if src.startswith('#| hide') or src.startswith('#|hide'): return None
    lines = [l for l in src.splitlines() if not l.startswith('#|')]
    return '```python\n' + '\n'.join(lines) + '\n```'

def make_readme(root=Path(__file__).parent.parent):
    nb = read_nb(root/'nbs'/'index.ipynb')
    parts = [t for t in map(cell_text, nb.cells) if t]
    (root/'README.md').write_text('\n\n'.join(parts) + '\n')

if __name__ == '__main__': make_readme()
