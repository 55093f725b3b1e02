"""Envs with `Discrete` observations (FrozenLake-v1, Taxi-v4, CliffWalking-v1) train and evaluate (#44 item 7).

Replay stores the integer observation as it is; the networks one-hot encode it at their input (`OneHot`, as SB3
encodes them), so a checkpoint, `evaluate` and `--resume` rebuild the same network from the env. gymnasium 1.x names
Taxi `Taxi-v4` (Taxi-v3 is gone from its registry).
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fastrl_per.learners.dqn import OneHot, QNetwork, env_dims, discrete_env_dims
from fastrl_per.learners.learner import Learner
from fastrl_per.learners.recurrent_learner import RecurrentLearner

COMMAND = [str(Path(sys.executable).parent / 'fastrl_per')]


def run(*args):
    done = subprocess.run([*COMMAND, *map(str, args)], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, COLUMNS='100'))
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    assert 'Traceback' not in done.stderr and 'warning' not in done.stderr, done.stderr
    return done.stdout


@pytest.mark.parametrize('env_id, n', [('FrozenLake-v1', 16), ('Taxi-v4', 500), ('CliffWalking-v1', 48)])
def test_the_learner_stores_integers_and_reads_them_one_hot(env_id, n):
    assert env_dims(env_id) == (n, env_dims(env_id)[1], True)
    learner = Learner(env_id, seed=0, total_steps=400, bs=16, warmup=32)
    assert learner.fit(100)
    batch = learner.replay.sample()
    assert batch.state.dtype == torch.int64 and batch.state.shape == (16,) and int(batch.state.max()) < n
    assert isinstance(learner.model[0], OneHot) and learner.model[0].n == n
    assert learner.replay_nbytes < 100 * learner.config.max_sz   # integers, not n floats per observation


def test_one_hot_is_the_plain_network_on_one_hot_vectors():
    net = QNetwork(16, 4, one_hot=True)
    plain = QNetwork(16, 4)
    plain.load_state_dict({k.replace(str(i), str(i - 1), 1): v for k, v in net.state_dict().items()
                           for i in [int(k.split('.')[0])]})
    idx = torch.tensor([0, 3, 15])
    torch.testing.assert_close(net(idx), plain(torch.eye(16)[idx]))


def test_the_background_collector_steps_them_too():
    with Learner('FrozenLake-v1', seed=0, total_steps=600, bs=16, warmup=32, collector='thread') as learner:
        assert learner.fit(200) and learner.replay.sample().state.dtype == torch.int64


def test_a_box_only_network_still_names_the_space():
    with pytest.raises(ValueError, match=r"'FrozenLake-v1' has Discrete\(16\)"): discrete_env_dims('FrozenLake-v1')


@pytest.mark.parametrize('env_id', ['FrozenLake-v1', 'Taxi-v4'])
def test_the_command_trains_evaluates_and_resumes_on_discrete_observations(env_id, tmp_path):
    out = tmp_path / 'run'
    assert '800 steps' in run('train', '--env', env_id, '--steps', 800, '--eval-every', 400, '--eval-episodes', 2,
                              '--confirm-episodes', 0, '--no-progress', '--out', out)
    assert 'mean return over 2 greedy episodes' in run('evaluate', out, '--episodes', 2)
    assert '1,000 steps' in run('train', '--resume', out, '--steps', 1000, '--no-progress')


def test_the_recurrent_learner_on_frozenlake(tmp_path):
    learner = RecurrentLearner('FrozenLake-v1', seed=0, total_steps=400, bs=4, warmup=40, length=4, burn_in=2,
                               recurrent_state='zero')
    assert learner.fit(120) and learner.model.one_hot
    out = tmp_path / 'rec'
    assert '600 steps' in run('train', '--model', 'recurrent', '--env', 'FrozenLake-v1', '--steps', 600, '--warmup', 100,
                              '--eval-every', 300, '--eval-episodes', 2, '--confirm-episodes', 0, '--no-progress',
                              '--out', out)
    assert 'mean return over 2 greedy episodes' in run('evaluate', out, '--episodes', 2)
