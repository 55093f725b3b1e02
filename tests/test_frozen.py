"""No module of the package holds module-level state a caller could change: its tables are frozen.

Every assignment at a module's top level whose value is a dict, list or set (a display, a comprehension or a
`dict(...)`/`list(...)`/`set(...)` call) is a mutable container that any importer could edit for every other; the
tables are `MappingProxyType`s, tuples and frozensets instead. `__all__` is nbdev's and stays a list.
"""
import ast, types
from pathlib import Path
import pytest
from fastrl_per.learners.learner import CHECKPOINT_KEYS, RUN_KEYS
from fastrl_per.run.cli import FLAG_ALIASES, FLAG_INSTEAD, FLAG_NAMES, SECTIONS
from fastrl_per.stages.atari import ATARI_DEFAULTS, ID_DEFAULTS, MINATAR_DEFAULTS
from fastrl_per.integrations.sb3 import UPSTREAM_HASHES

PACKAGE = Path(__file__).parents[1] / 'fastrl_per'
MUTABLE_CALLS = {'dict', 'list', 'set', 'defaultdict', 'OrderedDict', 'bytearray'}

def mutable(value) -> bool:
    "Whether expression `value` makes a mutable container."
    if isinstance(value, (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)): return True
    return isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in MUTABLE_CALLS

def module_containers(path:Path, root:Path=PACKAGE) -> list[str]:
    "`path:line name` (`path` relative to `root`) of each top-level assignment of a mutable container but `__all__`."
    found = []
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign): targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None: targets, value = [node.target], node.value
        else: continue
        names = [ast.unparse(t) for t in targets]
        if mutable(value) and names != ['__all__']: found.append(f"{path.relative_to(root)}:{node.lineno} {names[0]}")
    return found

def test_no_module_level_mutable_containers():
    modules = [p for p in sorted(PACKAGE.rglob('*.py')) if p.name != '_modidx.py']
    assert len(modules) > 30
    assert [c for p in modules for c in module_containers(p)] == []

def test_the_scan_sees_a_mutable_table(tmp_path):
    "The scan is not blind: a plain dict, a list comprehension or a `set()` at module level are each found."
    for source in ("T = {'a': 1}", "T = [x for x in range(3)]", "T: set = set()"):
        (path := tmp_path / 'm.py').write_text(source + "\n__all__ = ['T']\n")
        assert module_containers(path, tmp_path) == ['m.py:1 T']

TABLES = dict(FLAG_NAMES=FLAG_NAMES, FLAG_ALIASES=FLAG_ALIASES, FLAG_INSTEAD=FLAG_INSTEAD, SECTIONS=SECTIONS,
              ATARI_DEFAULTS=ATARI_DEFAULTS, MINATAR_DEFAULTS=MINATAR_DEFAULTS, ID_DEFAULTS=ID_DEFAULTS,
              UPSTREAM_HASHES=UPSTREAM_HASHES)

@pytest.mark.parametrize('name', TABLES)
def test_tables_refuse_changes(name):
    table = TABLES[name]
    assert isinstance(table, types.MappingProxyType)
    with pytest.raises(TypeError): table['new'] = 1
    for value in table.values(): assert value is None or isinstance(value, (str, int, float, tuple, types.MappingProxyType))

def test_key_sets_are_frozen():
    assert isinstance(CHECKPOINT_KEYS, frozenset) and isinstance(RUN_KEYS, frozenset)
    assert 'config' in CHECKPOINT_KEYS and RUN_KEYS == {'board'}
