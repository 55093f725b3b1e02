"""`fastrl_per train --compile`: the real command, the loss's networks through `torch.compile` (inductor, the CPU).

A compiled update reorders float operations, so its metrics are close to the plain run's, not equal bit for bit; a
run this short keeps them within float32 rounding. The net is tiny so that the compile takes seconds (torch caches it
on disk, so a second run compiles nothing)."""
import csv, subprocess, sys
from pathlib import Path
import numpy as np
import pytest
import torch
from test_resume import LOOP_FLAGS
from fastrl_per.learners.learner import Learner

pytestmark = pytest.mark.usefixtures('one_thread')

COMMAND = [str(Path(sys.executable).parent / 'fastrl_per'), 'train']
FLAGS = ['--steps', '300', '--hidden', '16', '--device', 'cpu', *LOOP_FLAGS]

def metrics(run_dir) -> dict:
    "Column → values of `run_dir/metrics.csv`, empty cells as nan."
    with open(Path(run_dir) / 'metrics.csv') as f: rows = list(csv.DictReader(f))
    return {k: np.array([float(r[k]) if r[k] else np.nan for r in rows]) for k in rows[0]}

def test_a_compiled_run_trains_as_the_plain_one(tmp_path):
    for name, more in [('compiled', ['--compile']), ('plain', [])]:
        done = subprocess.run([*COMMAND, '--out', str(tmp_path / name), *FLAGS, *more], capture_output=True,
                              text=True, timeout=600)
        assert done.returncode == 0, done.stderr
    compiled, plain = metrics(tmp_path / 'compiled'), metrics(tmp_path / 'plain')
    assert compiled.keys() == plain.keys() and np.isfinite(plain['loss']).sum() > 100   # it trained: 100+ updates
    for k in plain: np.testing.assert_allclose(compiled[k], plain[k], rtol=1e-4, atol=1e-5, err_msg=k)
    saved = torch.load(tmp_path / 'compiled' / 'checkpoint.pt', weights_only=True)
    assert saved['config']['compile'] is True
    assert saved['model'].keys() == torch.load(tmp_path / 'plain' / 'checkpoint.pt', weights_only=True)['model'].keys()

def test_a_compiled_learner_resumes_a_plain_ones_state_only_as_a_compiled_run():
    "`compile` is a setting of the run: a checkpoint names it, and a learner of the other setting refuses it."
    plain = Learner('CartPole-v1', seed=0, total_steps=200, hidden=16)
    plain.fit(100)
    compiled = Learner('CartPole-v1', seed=0, total_steps=200, hidden=16, compile=True)
    with pytest.raises(ValueError, match=r"'compile': \(False, True\)"): compiled.load_state_dict(plain.state_dict())
