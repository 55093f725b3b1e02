"""Installing the package says nothing of ours, and the scripts a newcomer runs install what they use (#44).

Building the wheel and the editable wheel (what `tools/setup.sh`'s `pip install -e` builds) must raise no warning from
setup.py's metadata: pip prints every warning its build backend raises, setuptools' banners included. The build runs
on a copy of the package's files, in a fresh interpreter, as pip's build hook runs it (warnings recorded, the default
filters), so the clone gets no build/ or egg-info.
"""
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

BUILD = r'''
import json, sys, warnings
from setuptools import build_meta
with warnings.catch_warnings(record=True) as caught:
    getattr(build_meta, sys.argv[1])(sys.argv[2])
print(json.dumps([f'{w.category.__name__}: {w.message}' for w in caught if issubclass(w.category, UserWarning)]))
'''


@pytest.mark.parametrize('hook', ['build_wheel', 'build_editable'])
def test_building_the_package_raises_no_warning(hook, tmp_path):
    pytest.importorskip('setuptools')
    src = tmp_path/'src'
    src.mkdir()
    for name in ['setup.py', 'settings.ini', 'pyproject.toml', 'README.md', 'LICENSE']: shutil.copy(ROOT/name, src)
    shutil.copytree(ROOT/'fastrl_per', src/'fastrl_per', ignore=shutil.ignore_patterns('__pycache__'))
    res = subprocess.run([sys.executable, '-c', BUILD, hook, str(tmp_path/'dist')], cwd=src, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert json.loads(res.stdout.strip().splitlines()[-1]) == []
    assert list((tmp_path/'dist').glob('fastrl_per-*.whl'))


def test_the_wheel_carries_the_license_as_an_spdx_expression(tmp_path):
    pytest.importorskip('setuptools')
    script = 'import setuptools.build_meta as b, sys; b.prepare_metadata_for_build_wheel(sys.argv[1])'
    res = subprocess.run([sys.executable, '-c', script, str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    meta = next(tmp_path.glob('*.dist-info/METADATA')).read_text()
    assert 'License-Expression: Apache-2.0' in meta and 'Classifier: License ::' not in meta


def install_line(script):
    "The one `pip install -e '.[...]'` line of a tools/ script, and the line number it is on."
    lines = (ROOT/'tools'/script).read_text().splitlines()
    found = [(i, m.group(1)) for i, l in enumerate(lines) if (m := re.search(r"pip install -q -e '(\.\[[^']*\])'", l))]
    assert len(found) == 1, f'{script}: expected one editable install line, found {found}'
    return found[0]


def test_docs_installs_what_it_uses_before_using_it():
    "tools/docs.sh works straight after tools/setup.sh: it installs the extras tools/test.sh does, before any tool."
    at, extras = install_line('docs.sh')
    assert extras == install_line('test.sh')[1], 'tools/docs.sh runs the notebooks: it needs the extras the tests use'
    lines = (ROOT/'tools'/'docs.sh').read_text().splitlines()
    uses = [i for i, l in enumerate(lines) if re.search(r'\.venv/bin/(?!python -m pip)', l)]
    assert uses and min(uses) >= at, f'tools/docs.sh uses .venv before it installs into it: line {min(uses) + 1}'


def test_the_tests_install_what_the_cleanrl_example_imports():
    ("examples/cleanrl_dqn_per.py's imports beyond the package's own requirements are its `cleanrl` extra, which "
     "tools/test.sh installs: its end-to-end tests import them and so fail, not skip, where they are missing.")
    import configparser
    cfg = configparser.ConfigParser()
    cfg.read(ROOT/'settings.ini')
    extra = {re.split(r'[<>=\[]', r)[0] for r in cfg['DEFAULT']['cleanrl_requirements'].split()}
    assert extra == {'tyro', 'tensorboard'}
    source = (ROOT/'examples'/'cleanrl_dqn_per.py').read_text()
    assert re.search(r'^import tyro$', source, re.M) and 'torch.utils.tensorboard import SummaryWriter' in source
    assert 'cleanrl' in install_line('test.sh')[1].strip('.[]').split(',')
    tests = (ROOT/'tests'/'test_weights.py').read_text()
    assert "importorskip('tyro')" not in tests and 'import tyro' in tests
