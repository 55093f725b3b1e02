"""Importance weights that cannot collapse (#41): the default normalisation keeps a batch's weights up when one
priority falls to eps; `weight_norm` travels in every state; the uniform buffer answers the prioritized interface
with the same checks; annealing past the end of training holds beta at its final value."""
import inspect
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from fastrl_per.core import SimpleStep
from fastrl_per.learners.dqn import RunConfig
from fastrl_per.replay.frames import FrameStorage
from fastrl_per.learners.learner import Learner, upgrade_checkpoint
from fastrl_per.replay.memory import ReplayBuffer, ExperienceReplay
from fastrl_per.replay.per import PrioritizedReplayBuffer, PrioritizedExperienceReplay
from fastrl_per.replay.priorities import Priorities, EPS, WEIGHT_NORM, WEIGHT_NORMS
from fastrl_per.replay.sequence import PrioritizedSequenceReplay, Episode
from fastrl_per.learners.apex import ReplayClient, ReplayServer

ROOT = Path(__file__).resolve().parents[1]
FLOOR = 0.5   # the least mean weight of a batch whose priorities lie within a factor 10 of each other


def transitions(n:int) -> dict:
    return dict(state=np.arange(n, dtype=np.float32)[:, None], action=np.zeros(n, np.int64), reward=np.ones(n),
                next_state=np.arange(1, n + 1, dtype=np.float32)[:, None], terminated=np.zeros(n, bool))


def one_near_zero(**kwargs) -> PrioritizedReplayBuffer:
    "1,000 transitions with |td| in [1, 10], and one whose TD error reached 0: its priority is eps."
    buf = PrioritizedReplayBuffer(max_sz=1000, bs=128, seed=0, **kwargs)
    buf.extend(**transitions(1000))
    buf.update_priorities(np.arange(1000), np.r_[0., np.linspace(1., 10., 999)])
    return buf


# ---------------------------------------------------------------- the weights under the defaults

def test_one_near_zero_priority_leaves_the_batch_weights_above_the_floor():
    ("Fails with the former default, the buffer's normalisation at eps 1e-6: mean weight 0.024, every weight "
     "divided by the weight of eps.")
    buf = one_near_zero()
    means = [buf.sample().weights.mean().item() for _ in range(20)]
    assert min(means) > FLOOR, means


@pytest.mark.parametrize('norm, low, high', [('buffer', 0., 0.1), ('batch', FLOOR, 1.)])
def test_each_normalisation_on_the_same_priorities(norm, low, high):
    buf = one_near_zero(weight_norm=norm, eps=1e-6)
    batch = buf.sample()
    assert low < batch.weights.mean().item() <= high
    if norm == 'batch': assert batch.weights.max().item() == 1.


def test_the_two_normalisations_differ_by_one_factor_per_batch():
    a, b = one_near_zero(weight_norm='buffer'), one_near_zero(weight_norm='batch')
    x, y = a.sample(), b.sample()
    assert torch.equal(x.idxs, y.idxs)   # the draw does not depend on the normalisation
    np.testing.assert_allclose((x.weights / x.weights.max()).numpy(), y.weights.numpy(), rtol=1e-5)


def test_every_default_has_one_home():
    homes = [Priorities.__init__, PrioritizedReplayBuffer.__init__, PrioritizedExperienceReplay.__init__,
             PrioritizedSequenceReplay.__init__, RunConfig]
    for f in homes:
        params = inspect.signature(f).parameters
        assert params['weight_norm'].default == WEIGHT_NORM, f
        assert params['epsilon' if 'epsilon' in params else 'eps'].default == EPS, f
    assert Learner('CartPole-v1', max_sz=500, bs=32).config.weight_norm == WEIGHT_NORM
    assert WEIGHT_NORM in WEIGHT_NORMS


@pytest.mark.parametrize('make', [
    lambda v: Priorities(4, weight_norm=v), lambda v: PrioritizedReplayBuffer(max_sz=4, weight_norm=v),
    lambda v: PrioritizedExperienceReplay([], max_sz=4, weight_norm=v),
    lambda v: PrioritizedSequenceReplay(100, weight_norm=v), lambda v: Learner('CartPole-v1', weight_norm=v),
    lambda v: ReplayClient(0.4, 1., 8, weight_norm=v)])
@pytest.mark.parametrize('bad', ['max', 'Batch', None, 1])
def test_a_bad_weight_norm_is_a_value_error_naming_it(make, bad):
    with pytest.raises(ValueError, match=f"weight_norm.*{bad!r}"): make(bad)


def test_rank_kind_takes_both_normalisations():
    for norm in WEIGHT_NORMS:
        buf = PrioritizedReplayBuffer(max_sz=200, bs=32, seed=0, prioritization='rank', weight_norm=norm)
        buf.extend(**transitions(200)); buf.update_priorities(np.arange(200), np.linspace(0., 5., 200))
        w = buf.sample().weights
        assert 0 < w.min() and w.max() <= 1
        if norm == 'batch': assert w.max() == 1.


def test_sequence_buffer_normalises_by_the_batch():
    step = lambda i: SimpleStep(state=[float(i)], action=0, next_state=[i + 1.], step_n=i)
    for norm, floor in (('buffer', 0.), ('batch', FLOOR)):
        buf = PrioritizedSequenceReplay(1000, seed=0, weight_norm=norm)
        for e in range(50): buf.add(Episode([step(i) for i in range(4)]))
        buf.update_priorities(np.arange(50), np.r_[0., np.linspace(1., 10., 49)])
        w = buf.sample_prioritized(16, 2).weights
        assert w.mean().item() > floor and (norm == 'buffer' or w.max().item() == 1.)


# ---------------------------------------------------------------- the state

@pytest.mark.parametrize('norm', WEIGHT_NORMS)
@pytest.mark.parametrize('storage', [None, 'frames'])
def test_the_state_keeps_weight_norm_and_an_older_state_loads_as_buffer(norm, storage):
    def make(n):
        return PrioritizedReplayBuffer(bs=2, seed=0, weight_norm=n, max_sz=None if storage else 8,
                                       storage=FrameStorage(8) if storage else None)
    buf = make(norm)
    stacks = np.broadcast_to(np.arange(8, dtype=np.uint8)[:, None, None], (8, 3, 3))   # frame t is all t
    frames = dict(state=np.stack([stacks[i:i + 2] for i in range(6)]),               # stacks of two frames
                  next_state=np.stack([stacks[i + 1:i + 3] for i in range(6)]))
    buf.extend(**(dict(transitions(6), **frames) if storage else transitions(6)))
    state = buf.state_dict()
    assert state['weight_norm'] == norm
    other = make('buffer' if norm == 'batch' else 'batch')
    other.load_state_dict(state)
    assert other.weight_norm == norm and other.prioritizer.weight_norm == norm
    other.load_state_dict({k: v for k, v in state.items() if k != 'weight_norm'})   # saved before the option
    assert other.weight_norm == 'buffer'
    with pytest.raises(ValueError, match="'max'"): other.load_state_dict({**state, 'weight_norm': 'max'})
    assert other.weight_norm == 'buffer'   # a rejected state changes nothing


def test_the_sequence_state_keeps_weight_norm():
    buf = PrioritizedSequenceReplay(100, weight_norm='batch')
    buf.add(Episode([SimpleStep(state=[0.], action=0, next_state=[1.])] * 3))
    other = PrioritizedSequenceReplay(100, weight_norm='buffer')
    other.load_state_dict(buf.state_dict())
    assert other.weight_norm == 'batch'


def test_a_learner_checkpoint_keeps_weight_norm_and_one_from_before_runs_with_buffer():
    learner = Learner('CartPole-v1', seed=0, total_steps=400, max_sz=500, bs=32, weight_norm='batch')
    learner.fit(100)
    state = learner.state_dict()
    assert (state['config']['weight_norm'], state['replay']['weight_norm']) == ('batch', 'batch')
    again = Learner(**state['config']); again.load_state_dict(state)
    assert again.replay.weight_norm == 'batch'
    old = dict(state, version=5, config={k: v for k, v in state['config'].items() if k != 'weight_norm'},
               replay={k: v for k, v in state['replay'].items() if k != 'weight_norm'})
    upgraded = upgrade_checkpoint(old)
    assert upgraded['config']['weight_norm'] == 'buffer'
    rebuilt = Learner(**upgraded['config']); rebuilt.load_state_dict(upgraded)
    assert rebuilt.replay.weight_norm == 'buffer'


# ---------------------------------------------------------------- one interface for both kinds

def _sampled(cls):
    buf = cls(max_sz=8, bs=4, seed=0)
    buf.extend(**transitions(6))
    buf.sample()
    return buf

BAD_FEEDBACK = [
    ([0, 1], [1.]), ([0], [1., 2.]), ([0, 1], [1., float('nan')]), ([0, 1], [float('inf'), 1.]),
    ([0, 7], [1., 1.]), ([-1], [1.]), ([0.5], [1.]), (np.zeros((2, 2), np.int64), np.zeros((2, 2))),
    ([0, 1], np.zeros((2, 2))), (torch.tensor([0, 1]), torch.tensor([[1.], [float('nan')]])),
]

@pytest.mark.parametrize('idxs, td', BAD_FEEDBACK)
def test_uniform_update_priorities_rejects_what_the_prioritized_one_rejects(idxs, td):
    messages = []
    for cls in (PrioritizedReplayBuffer, ReplayBuffer):
        buf = _sampled(cls)
        with pytest.raises(ValueError) as e: buf.update_priorities(idxs, td)
        messages.append(str(e.value))
    assert messages[0] == messages[1]


def test_uniform_buffer_and_pipe_take_feedback_and_keep_weights_of_one():
    buf = _sampled(ReplayBuffer)
    batch = buf.sample()
    buf.update_priorities(batch.idxs, torch.randn(4)); buf.update_priorities(batch.idxs, torch.randn(4, 1))
    buf.anneal_beta(0.3); buf.anneal_beta(1.0069)
    assert torch.equal(buf.sample().weights, torch.ones(4))
    pipe = ExperienceReplay([], bs=2, max_sz=8)
    pipe.add(SimpleStep.from_steps([SimpleStep(state=[0.], action=0, next_state=[1.])] * 3))
    pipe.update_priorities(pipe.sample().idxs, [0.5, -0.5]); pipe.anneal_beta(2.)
    with pytest.raises(ValueError, match='nan'): pipe.update_priorities([0, 1], [0.5, float('nan')])


# ---------------------------------------------------------------- anneal past the end

def _client():
    return ReplayClient(0.4, 1., 8)

KINDS = [lambda: PrioritizedReplayBuffer(max_sz=8), lambda: PrioritizedExperienceReplay([], max_sz=8),
         lambda: PrioritizedSequenceReplay(100), lambda: Priorities(8), _client]

@pytest.mark.parametrize('make', KINDS)
@pytest.mark.parametrize('fraction', [1.0, 1.0069, 1.5, 1e9])
@pytest.mark.parametrize('final', [1.0, 0.7])
def test_anneal_past_the_end_holds_final(make, fraction, final):
    buf = make()
    buf.anneal_beta(fraction, final)
    assert buf.beta == pytest.approx(final, abs=1e-12)


@pytest.mark.parametrize('make', [*KINDS, lambda: ReplayBuffer(max_sz=8), lambda: ExperienceReplay([], max_sz=8)])
@pytest.mark.parametrize('fraction', [-0.1, float('nan'), float('inf'), -float('inf')])
def test_anneal_below_zero_or_not_finite_is_an_error_naming_it(make, fraction):
    buf = make()
    before = getattr(buf, 'beta', None)
    with pytest.raises(ValueError, match=repr(fraction)): buf.anneal_beta(fraction)
    assert getattr(buf, 'beta', None) == before


def test_replay_server_anneals_past_the_end():
    server = ReplayServer(max_sz=8, bs=2)
    server.add(SimpleStep.from_steps([SimpleStep(state=[0.], action=0, next_state=[1.])] * 2), torch.ones(2))
    server.update_priorities([0], [1.], fraction=1.01)
    assert server.buffer.beta == 1.0


# ---------------------------------------------------------------- the CleanRL-style example, end to end

@pytest.mark.slow
@pytest.mark.parametrize('replay', ['per', 'uniform', 'sb3'])
def test_the_cleanrl_example_runs_end_to_end(replay, tmp_path):
    # the `cleanrl` and `sb3` extras are installed by tools/test.sh: a missing one fails here instead of skipping
    import tyro, stable_baselines3   # noqa: F401
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    out = tmp_path / replay
    done = subprocess.run([sys.executable, str(ROOT / 'examples' / 'cleanrl_dqn_per.py'), '--total-timesteps', '2500',
                           '--learning-starts', '500', '--target-network-frequency', '100', '--replay', replay,
                           '--weight-norm', 'batch', '--out', str(out)],
                          capture_output=True, text=True, timeout=600, env={**_env(), 'OMP_NUM_THREADS': '1'},
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    *log, last = done.stdout.splitlines()
    summary = json.loads(out.joinpath('summary.json').read_text())
    assert summary == {**json.loads(last), 'args': summary['args']}   # what it prints last is what it saved
    # CleanRL's lines: one per episode, and SPS every 100 steps once learning (steps 600, 700, ..., 2,400)
    episode_lines = [line for line in log if re.fullmatch(r'global_step=\d+, episodic_return=[\d.]+', line)]
    assert len(episode_lines) == summary['episodes']
    assert len([line for line in log if re.fullmatch(r'SPS: \d+', line)]) == 19
    assert len(log) == summary['episodes'] + 19   # and nothing else
    # and its TensorBoard run under runs/ in the working directory
    (run,) = tmp_path.joinpath('runs').iterdir()
    assert run.name.startswith('CartPole-v1__cleanrl_dqn_per__1__')
    tags = EventAccumulator(str(run)).Reload().Tags()['scalars']
    assert {'charts/episodic_return', 'charts/SPS', 'losses/td_loss', 'losses/q_values', 'losses/mean_weight'} <= set(tags)
    # updates every 10 steps past step 500: 510, 520, ..., 2,490
    assert summary['updates'] == 199 and summary['episodes'] > 0 and summary['sps'] > 0
    assert summary['args']['replay'] == replay
    weight = summary['mean_weight']
    assert (weight == 1.) if replay != 'per' else (0 < weight < 1)
    episodes = out.joinpath('episodes.csv').read_text().splitlines()
    assert episodes[0] == 'step,return' and len(episodes) == summary['episodes'] + 1
    rows = out.joinpath('train.csv').read_text().splitlines()
    assert rows[0] == 'step,loss,weight,epsilon,beta,sps' and len(rows) == 3   # at steps 1,000 and 2,000


def test_the_example_refuses_an_unknown_replay():
    import tyro   # noqa: F401  (the cleanrl extra, which tools/test.sh installs)
    done = subprocess.run([sys.executable, str(ROOT / 'examples' / 'cleanrl_dqn_per.py'), '--replay', 'prioritized'],
                          capture_output=True, text=True, timeout=120, env=_env())
    assert done.returncode != 0 and 'prioritized' in done.stderr


def _env() -> dict:
    import os
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get('PYTHONPATH')])))


def test_the_command_takes_weight_norm_and_names_a_bad_one(tmp_path):
    command = [str(Path(sys.executable).parent / 'fastrl_per'), 'train', '--out', str(tmp_path / 'run')]
    done = subprocess.run([*command, '--weight-norm', 'max'], capture_output=True, text=True, timeout=300, env=_env())
    # refused by the parser as the other named choices are (exit 2, usage and one error line), before any run starts
    assert done.returncode == 2 and 'Traceback' not in done.stderr
    assert "argument --weight-norm: invalid choice: 'max' (choose from batch, buffer)" in done.stderr, done.stderr
    assert not (tmp_path / 'run').exists()
    helped = subprocess.run([*command[:2], '--help'], capture_output=True, text=True, timeout=300, env=_env())
    assert '--weight-norm {batch,buffer}' in helped.stdout
