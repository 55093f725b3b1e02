"""Check that every code cell of the notebooks compiles, slow ones included: `nbdev_test` and execnb's
`run_all(exc_stop=True)` stop on a cell that raises, but not on one that does not compile (IPython reports the
SyntaxError and goes on). Cells are compiled as IPython would run them (magics and `!` lines transformed first).
Usage: python tools/check_cells.py [NOTEBOOK ...] (default: nbs/*.ipynb); exits 1 naming each failing cell."""
import sys
from pathlib import Path
from execnb.nbio import read_nb
from IPython.core.inputtransformer2 import TransformerManager

def cell_errors(path):
    "'notebook cell N: error' for each code cell of the notebook at `path` that does not compile."
    transform, res = TransformerManager().transform_cell, []
    for i, cell in enumerate(read_nb(path).cells):
        if cell.cell_type != 'code': continue
        try: compile(transform(cell.source), f'{path.name} cell {i}', 'exec')
        except SyntaxError as e: res.append(f'{path.name} cell {i}, line {e.lineno}: {e.msg}: {(e.text or "").strip()}')
    return res

def check_cells(paths):
    "The compile errors of all notebooks at `paths`."
    return [err for p in paths for err in cell_errors(Path(p))]

if __name__ == '__main__':
    paths = sys.argv[1:] or sorted((Path(__file__).parent.parent/'nbs').glob('*.ipynb'))
    errors = check_cells(paths)
    if errors: sys.exit('code cells that do not compile (prose belongs in markdown cells):\n' + '\n'.join(errors))
