"""MinAtar through the library (the minatar extra): the ids register, the grids are stored as bools, the MinAtar
network learns in the pipeline, and `fastrl_per train` / `evaluate` run end to end."""

import numpy as np
import pytest
import torch

pytest.importorskip('minatar')

from fastrl_per.conv import MinAtarQNetwork
from fastrl_per.dqn import discrete_env_dims
from fastrl_per.learner import Learner
from test_cli import run


def test_ids_register_and_grids_are_image_shaped():
    assert discrete_env_dims('MinAtar/Breakout-v1', images=True) == ((10, 10, 4), 3)
    with pytest.raises(ValueError, match='flat Box'): discrete_env_dims('MinAtar/Breakout-v1')


def test_learner_stores_bool_grids_and_uses_the_minatar_network():
    learner = Learner('MinAtar/Breakout-v1', seed=0, total_steps=400, bs=32, max_sz=400, n_step=1)
    assert isinstance(learner.model, MinAtarQNetwork)
    assert learner.replay_nbytes / 400 == 848          # 2 x 400 bool cells and the step's other fields
    rows = learner.fit(200)
    batch = learner.replay.buffer.sample(8)
    assert batch.state.dtype == torch.bool and batch.state.shape == (8, 10, 10, 4)
    assert np.isfinite([r['loss'] for r in rows]).all()


def test_train_and_evaluate_end_to_end(tmp_path):
    out = tmp_path / 'breakout'
    done = run('train', '--env', 'MinAtar/Breakout-v1', '--steps', 2000, '--out', out, '--no-progress', check=0, timeout=600)
    assert (out / 'best.pt').exists() and (out / 'checkpoint.pt').exists(), done.stdout
    shown = run('evaluate', out, '--episodes', 2, check=0, timeout=300)
    assert 'MinAtar/Breakout-v1' in shown.stdout or 'return' in shown.stdout, shown.stdout
