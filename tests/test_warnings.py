"""Importing the package and running a short pipeline raises no torch.utils.data warnings.

Runs in a fresh interpreter so that module-level warnings at import time are seen (pytest's
own process has imported everything already, and `warnings` shows each once per location).
"""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = r'''
import json, warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter('always')
    import fastrl_per.all
    from fastrl_per.all import *
    from fastrl_per.stages.envs import GymTransformBlock
    from fastrl_per.replay.memory import ExperienceReplay
    pipe = GymTransformBlock(None, n=60, seed=0)(['CartPole-v1']).unbatch()
    pipe = ExperienceReplay(pipe, bs=4, max_sz=50)
    batches = list(pipe.header(8))
    assert len(batches) == 8 and all(len(b) == 4 for b in batches)
    for _ in zip(range(3), pipe): pass
print(json.dumps([dict(category=w.category.__name__, filename=w.filename, lineno=w.lineno,
                       message=str(w.message)) for w in caught]))
'''


def test_no_torch_data_warnings():
    env = {**os.environ, 'PYTHONPATH': os.pathsep.join(filter(None, [str(ROOT), os.environ.get('PYTHONPATH')]))}
    env.pop('PYTHONWARNINGS', None)
    res = subprocess.run([sys.executable, '-c', SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, f"pipeline script failed:\n{res.stdout}\n{res.stderr}"
    caught = json.loads(res.stdout.strip().splitlines()[-1])
    data_dir = os.path.join('torch', 'utils', 'data')
    bad = [w for w in caught
           if w['category'] in ('DeprecationWarning', 'FutureWarning', 'UserWarning')
           and data_dir in os.path.normpath(w['filename'])]
    listing = '\n'.join(f"{w['category']} {w['filename']}:{w['lineno']}: {w['message']}" for w in caught) or '(none)'
    assert not bad, f"warnings from torch/utils/data:\n{listing}"
