"""MinAtar through the library (the minatar extra): the ids register, the grids are stored as bools, the MinAtar
network learns in the pipeline, a run takes Revisiting Rainbow's DQN settings for the flags it is not given, and
`fastrl_per train` / `evaluate` (with its video) run end to end."""

import json
import numpy as np
import pytest
import torch

pytest.importorskip('minatar')

from fastrl_per.learners.conv import MinAtarQNetwork
from fastrl_per.learners.dqn import discrete_env_dims
from fastrl_per.learners.learner import Learner
from fastrl_per.run.train import new_learner
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


# Revisiting Rainbow (Obando-Ceron & Castro 2021), Configs/dqn_*.gin and Dopamine's JaxDQNAgent defaults: the settings a
# MinAtar run resolves to (target_update_period 1,000 env steps = 250 updates of one per 4 steps; see nbs/02c_atari)
PAPER = dict(bs=32, max_sz=100_000, lr=2.5e-4, gamma=0.99, explore_start=1.0, explore_end=0.01, explore_steps=250_000,
             warmup=1_000, target_every=250, train_every=4, gradient_steps=1, double=False, n_step=1,
             max_grad_norm=None)


def test_a_dueling_checkpoint_with_the_keys_before_one_dueling_head_loads():
    "Before #42 the conv networks held their dueling streams as `value.*`/`advantage.*` beside `features.*`."
    learner = Learner('MinAtar/Breakout-v1', seed=0, total_steps=300, bs=8, max_sz=300, warmup=50, dueling=True)
    learner.fit(100)
    state = learner.state_dict()
    assert any(k.startswith('head.value.') for k in state['model'])
    old = {k: ({n.removeprefix('head.'): t for n, t in v.items()} if k in ('model', 'target_model') else v)
           for k, v in state.items()}
    assert any(k.startswith('value.') for k in old['model']) and not any(k.startswith('head.') for k in old['model'])
    again = Learner('MinAtar/Breakout-v1', seed=0, total_steps=300, bs=8, max_sz=300, warmup=50, dueling=True)
    again.load_state_dict(old)
    for a, b in [(learner.model, again.model), (learner.dqn_update.target_model, again.dqn_update.target_model)]:
        assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert len(again.fit(50)) == 50   # and trains on


def test_a_minatar_run_takes_the_papers_settings():
    learner = new_learner('mlp', env_id='MinAtar/SpaceInvaders-v1')
    assert {k: learner.config.plain()[k] for k in PAPER} == PAPER and learner.config.total_steps == 1_000_000
    assert learner.dqn_update.target_update.every == 250 and learner.dqn_update.target_update.tau is None   # hard copies
    assert isinstance(learner.dqn_update.optimizer, torch.optim.Adam) and learner.dqn_update.optimizer.param_groups[0]['lr'] == 2.5e-4


def test_flags_given_win_and_short_runs_cap_buffer_and_warmup():
    config = new_learner('mlp', env_id='MinAtar/Breakout-v1', total_steps=2_000, train_every=1, double=True,
                         replay='uniform').config.plain()
    assert (config['train_every'], config['double'], config['replay']) == (1, True, 'uniform')
    assert (config['max_sz'], config['warmup'], config['target_every']) == (2_000, 500, 250)
    assert new_learner('mlp', env_id='CartPole-v1').config.lr == 5e-4     # other ids keep the learner's own defaults


def test_train_and_evaluate_end_to_end(tmp_path):
    out = tmp_path / 'breakout'
    done = run('train', '--env', 'MinAtar/Breakout-v1', '--steps', 20_000, '--out', out, '--no-progress', check=0,
               timeout=900)   # the command: a short run at every other default
    assert (out / 'best.pt').exists() and (out / 'checkpoint.pt').exists(), done.stdout
    manifest = json.loads((out / 'run.json').read_text())
    assert {k: manifest['config'][k] for k in ('lr', 'target_every', 'double', 'max_sz', 'warmup')} == dict(
        lr=2.5e-4, target_every=250, double=False, max_sz=20_000, warmup=1_000)
    assert 'Revisiting Rainbow' in manifest['defaults'] and 'Adam' in manifest['defaults']
    shown = run('evaluate', out, '--episodes', 2, check=0, timeout=300)
    assert 'mean return over 2 greedy episodes' in shown.stdout, shown.stdout
    filmed = run('evaluate', out, '--episodes', 1, '--video', check=0, timeout=300)
    iio = pytest.importorskip('imageio.v3')
    frames = iio.imread(out / 'videos' / 'greedy-seed10000-episode-0.mp4')
    assert frames.shape[1:] == (160, 160, 3) and frames.max() > 100, (frames.shape, frames.max(), filmed.stdout)
