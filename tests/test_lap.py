"""The kind protocol: LAP (loss-adjusted prioritization, Fujimoto, Meger & Precup 2020) on the buffers, the learner
and the command, and a user's own kind (recency-weighted) behind the same protocol, on every buffer."""

import subprocess, sys
from functools import partial

import numpy as np
import pytest
import torch

from fastrl_per.core import SimpleStep
from fastrl_per.replay.priorities import Priorities, PriorityKind, KINDS, LAP, kind_class
from fastrl_per.replay.per import PrioritizedExperienceReplay, PrioritizedReplayBuffer
from fastrl_per.replay.sequence import PrioritizedSequenceReplay, Episode
from fastrl_per.learners.learner import Learner
from conftest import assert_state_equal
from test_per import steps, chi_square

CHI2_9DF_P001 = 27.877  # chi-square critical value, 9 degrees of freedom, p = 0.001


def lap_buffer(n, max_sz=16, seed=0, **kwargs):
    "A LAP buffer holding `n` steps."
    buf = PrioritizedReplayBuffer(max_sz=max_sz, seed=seed, prioritization='lap', **kwargs)
    if n: buf.add(SimpleStep.from_steps(steps(n)))
    return buf


def test_lap_defaults_and_leaves_floored_at_one():
    buf = lap_buffer(10, max_sz=10)
    assert (buf.alpha, buf.prioritizer.prioritization, buf.kind.huber, buf.kind.shardable) == (0.4, 'lap', True, False)
    td = np.array([0., 1e-3, 0.5, 0.999, 1., 2., 10., 100., -50., -0.2])
    buf.update_priorities(np.arange(10), td)
    expect = np.maximum(np.abs(td) + 1e-6, 1.) ** 0.4
    np.testing.assert_allclose(buf.kind[:], expect, rtol=1e-14)
    assert (buf.kind[:] >= 1.).all() and buf.kind[:5].tolist() == [1.] * 4 + [pytest.approx(1.000001 ** 0.4)]
    assert buf.priorities[0] == pytest.approx(1e-6)   # the raw priority is kept: alpha or the kind could change
    buf.set_alpha(1.)
    np.testing.assert_allclose(buf.kind[:], np.maximum(np.abs(td) + 1e-6, 1.), rtol=1e-14)


@pytest.mark.parametrize('weight_norm', ['batch', 'buffer'])
def test_lap_weights_are_all_one_whatever_beta(weight_norm):
    buf = lap_buffer(16, weight_norm=weight_norm)
    buf.update_priorities(np.arange(16), np.linspace(0, 30, 16))
    for fraction in (0., 0.5, 1.):
        buf.anneal_beta(fraction)
        batch = buf.sample(64)
        assert batch.weights.dtype == torch.float32 and torch.equal(batch.weights, torch.ones(64))


def test_lap_draw_frequencies_match_floored_priorities_chi_square():
    buf = lap_buffer(10, max_sz=10, seed=3)
    td = np.array([0., 0.3, 0.9, 1.5, 3., 6., 12., 25., 50., 100.])
    buf.update_priorities(np.arange(10), td)
    probs = np.maximum(td + 1e-6, 1.) ** 0.4
    probs /= probs.sum()
    counts = np.bincount(buf.sample(40_000).idxs.numpy(), minlength=10)
    assert chi_square(counts, probs) < CHI2_9DF_P001, (counts, probs * 40_000)
    assert counts[0] == pytest.approx(counts[2], rel=0.1)   # below the floor: alike


def test_lap_new_steps_enter_at_max_priority_and_the_state_round_trips(tmp_path):
    buf = lap_buffer(8)
    batch = buf.sample(4)
    buf.update_priorities(batch.idxs, torch.full((4,), 9.))
    new = buf.add(SimpleStep.from_steps(steps(2, start=8)))
    assert buf.max_priority == pytest.approx(9. + 1e-6) and buf.kind[new].tolist() == [pytest.approx(9. ** 0.4)] * 2
    buf.save(tmp_path / 'lap.pt')
    other = PrioritizedReplayBuffer(max_sz=16, prioritization='lap')
    other.load(tmp_path / 'lap.pt')
    assert_state_equal(other.state_dict(), buf.state_dict())
    np.testing.assert_array_equal(other.kind[:], buf.kind[:])
    assert torch.equal(other.sample(8).idxs, buf.sample(8).idxs)   # the sampler's state came along
    with pytest.raises(ValueError, match="'lap'.*'proportional'"):
        PrioritizedReplayBuffer(max_sz=16).load(tmp_path / 'lap.pt')


def test_lap_on_the_pipe_and_the_sequence_buffer():
    pipe = PrioritizedExperienceReplay(None, bs=4, max_sz=8, seed=0, prioritization='lap')
    pipe.add(SimpleStep.from_steps(steps(6)))
    assert (pipe.alpha, pipe.prioritizer.prioritization) == (0.4, 'lap')
    assert torch.equal(pipe.sample().weights, torch.ones(4))
    seq = PrioritizedSequenceReplay(capacity=100, seed=0, prioritization='lap')
    for k in range(3): seq.add(Episode(steps(5 + k, start=10 * k)))
    seq.update_priorities([0, 1, 2], [0.1, 4., 40.])
    np.testing.assert_allclose(seq.kind[seq._slots(seq.ids)], [1., 4.000001 ** 0.4, 40.000001 ** 0.4], rtol=1e-12)
    assert torch.equal(seq.sample_prioritized(6, 2).weights, torch.ones(6))


def test_learner_takes_lap_and_names_it_in_its_config():
    learner = Learner('CartPole-v1', seed=0, total_steps=300, bs=16, max_sz=300, prioritization='lap', n_step=1)
    assert (learner.config.prioritization, learner.config.alpha) == ('lap', 0.4)
    learner.fit(300)
    buf = learner.replay.buffer
    assert buf.prioritizer.prioritization == 'lap' and (buf.kind[:len(buf)] >= 1.).all()
    assert learner.dqn_update.updates > 0
    with pytest.raises(ValueError, match="'lap'.*per"): Learner(replay='uniform', prioritization='lap')


def test_the_command_offers_every_registered_kind_and_runs_lap(tmp_path):
    run = lambda *a: subprocess.run([sys.executable, '-m', 'fastrl_per', 'train', *a], capture_output=True, text=True,
                                    timeout=240)
    assert '--prioritization {' + ','.join(KINDS) + '}' in run('--help').stdout
    done = run('--prioritization', 'lap', '--steps', '300', '--bs', '16', '--buffer-size', '300', '--eval-every', '0',
               '--no-progress', '--out', str(tmp_path / 'lap'))
    assert done.returncode == 0, done.stderr[-2000:]
    import json
    config = json.loads((tmp_path / 'lap' / 'run.json').read_text())['config']
    assert (config['prioritization'], config['alpha']) == ('lap', 0.4)
    bad = run('--prioritization', 'laps', '--out', str(tmp_path / 'bad'))
    assert bad.returncode != 0 and "'laps'" in bad.stderr


# ---------------------------------------------------------------- a user's own kind

class Recency(PriorityKind):
    "Recency-weighted prioritization (as in the 04b notebook): p ** alpha * decay ** (items written after it)."
    name, alpha, beta = 'recency', 0.6, 0.4

    def __init__(self, capacity:int, decay:float=0.999):
        self.value, self.stamp, self.clock, self.decay = np.zeros(capacity), np.zeros(capacity, np.int64), 0, decay
    def __getitem__(self, keys): return self.value[keys].copy()
    def update_unchecked(self, keys, leaves): self.value[keys] = leaves
    def set_range_unchecked(self, start, leaves):
        n = len(leaves)
        self.value[start:start + n], self.stamp[start:start + n] = leaves, self.clock + np.arange(n)
        self.clock += n

    def draw(self, rng, bs, alpha, beta, weight_norm):
        mass = self.value * self.decay ** (self.clock - 1 - self.stamp)
        if not mass.sum() > 0: raise ValueError("nothing to draw: no key holds a positive priority")
        p = mass / mass.sum()
        keys = rng.choice(len(p), bs, p=p)
        n_p = np.count_nonzero(mass) * p
        least = n_p[keys].min() if weight_norm == 'batch' else n_p[mass > 0].min()
        return keys, ((n_p[keys] / least) ** -beta).astype(np.float32)

    def state_dict(self, keys): return dict(stamp=torch.from_numpy(self.stamp[keys]), clock=self.clock)
    def load_state_dict(self, state, keys): self.stamp[keys], self.clock = state['stamp'].numpy(), state['clock']


def test_a_user_kind_draws_newer_steps_more_on_the_transition_buffer():
    buf = PrioritizedReplayBuffer(max_sz=10, seed=0, prioritization=partial(Recency, decay=0.8))
    buf.add(SimpleStep.from_steps(steps(10)))
    buf.update_priorities(np.arange(10), np.ones(10))        # equal priorities: the age alone decides
    counts = np.bincount(buf.sample(20_000).idxs.numpy(), minlength=10)
    probs = 0.8 ** np.arange(9, -1, -1.); probs /= probs.sum()
    assert chi_square(counts, probs) < CHI2_9DF_P001, (counts, probs * 20_000)
    assert (buf.alpha, buf.beta, buf.prioritizer.prioritization) == (0.6, 0.4, 'recency')


def test_a_user_kind_keeps_its_state_and_the_stale_rule():
    buf = PrioritizedReplayBuffer(max_sz=4, seed=0, prioritization=Recency)
    buf.add(SimpleStep.from_steps(steps(6)))                  # wraps: slots 0, 1 rewritten
    batch = buf.sample(8)
    buf.add(SimpleStep.from_steps(steps(1, start=6)))        # slot 2 rewritten since the draw
    buf.update_priorities(batch.idxs, torch.full((8,), 5.))
    assert buf.prioritizer.stale_dropped == int((batch.idxs == 2).sum())   # the priority core's rule, for any kind
    other = PrioritizedReplayBuffer(max_sz=4, prioritization=Recency)
    other.load_state_dict(buf.state_dict())
    assert other.kind.stamp.tolist() == buf.kind.stamp.tolist() and other.kind.clock == buf.kind.clock == 5   # 4 + 1 items entered
    assert torch.equal(other.sample(16).idxs, buf.sample(16).idxs)


def test_a_user_kind_on_the_sequence_buffer_moves_with_its_slots():
    seq = PrioritizedSequenceReplay(capacity=10_000, seed=0, prioritization=partial(Recency, decay=0.9))
    for k in range(40): seq.add(Episode(steps(3, start=10 * k)))   # the episode slots grow: the priority core is moved
    assert seq.prioritizer.prioritization == 'recency' and len(seq.ids) == 40
    assert sorted(seq.kind.stamp[seq._slots(seq.ids)].tolist()) == list(range(40))   # the stamps moved along
    mean = seq.sample_prioritized(4000, 1).indices.float().mean()
    assert 29 < mean < 31, mean   # episode i drawn in proportion to 0.9 ** (39 - i): a mean id of 30.0
    loaded = PrioritizedSequenceReplay(capacity=10_000, prioritization=partial(Recency, decay=0.9))
    loaded.load_state_dict(seq.state_dict())
    assert_state_equal(loaded.state_dict(), seq.state_dict())


def test_a_kind_is_a_named_priority_kind_class():
    class Nameless(PriorityKind): pass
    for bad in (dict, Nameless, 'Recency', 3, LAP(4)):
        with pytest.raises(ValueError, match='PriorityKind'): Priorities(4, prioritization=bad)
    assert kind_class(partial(LAP)) is LAP and kind_class('lap') is LAP
