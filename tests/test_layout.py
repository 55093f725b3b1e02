"""The package's folders are its floors: the foundation modules (checks, core, state) import no other module of the
package; replay/ and stages/ import only the foundation and their own folder (neither the other); learners/ builds
on those; run/ on learners/ and below; integrations/ on replay/ and the foundation. No import goes up a floor and
no two modules import each other, directly or round a cycle. Read from the source with `ast` by
tools/import_graph.py, as a reviewer would."""
import sys
from pathlib import Path
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / 'tools'))
from import_graph import edges_of   # noqa: E402

PKG = Path(__file__).resolve().parent.parent / 'fastrl_per'
FOUNDATION = {'checks', 'core', 'state'}
MAY_IMPORT = {   # a folder, and the folders its modules may import from besides itself and the foundation
    'replay': set(), 'stages': set(), 'learners': {'replay', 'stages'}, 'run': {'replay', 'stages', 'learners'},
    'integrations': {'replay'}}

MODULES = edges_of(PKG)   # tools/import_graph.py reads the imports, in functions too

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
