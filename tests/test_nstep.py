"""The n-step stage: targets by hand across termination, truncation and interleaved sub-envs, a property test
against a brute-force reference, composition with both buffers on real CartPole, bad input."""

import math
import re

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st
from torch.utils.data.datapipes.iter import IterableWrapper

from fastrl_per.core import SimpleStep, STEP_FIELDS
from fastrl_per.stages.envs import GymTransformBlock
from fastrl_per.replay.memory import ExperienceReplay
from fastrl_per.stages.nstep import NStepTransitions, nstep_discount
from fastrl_per.replay.per import PrioritizedExperienceReplay


def mk(env, t, r, ep=0, term=False, trunc=False):
    "Step `t` of episode `ep` of sub-env `env`: state [env, ep, t], next state [env, ep, t + 1]."
    return SimpleStep(state=[float(env), float(ep), float(t)], action=(t + env) % 2,
                      next_state=[float(env), float(ep), float(t + 1)], terminated=term, truncated=trunc,
                      reward=r, total_reward=float(10 * t + env), env_id=env, step_n=t, episode_n=ep)


def episode(env, ep, rewards, end):
    "The steps of one episode; `end` is 'term', 'trunc' or None (the stream stops inside it)."
    last = len(rewards) - 1
    return [mk(env, t, r, ep, term=end == 'term' and t == last, trunc=end == 'trunc' and t == last)
            for t, r in enumerate(rewards)]


def key(s):
    "Where a transition starts: (env_id, episode_n, step_n)."
    return int(s.env_id), int(s.episode_n), int(s.step_n)


# Two sub-envs alternating, episodes of different lengths, both kinds of end:
# env 0: episode 0 rewards 1..5 terminated, episode 1 rewards 6, 7 truncated;
# env 1: episode 0 rewards 10, 20, 30 truncated, episode 1 rewards 40..70 terminated.
ENV0 = episode(0, 0, [1., 2., 3., 4., 5.], 'term') + episode(0, 1, [6., 7.], 'trunc')
ENV1 = episode(1, 0, [10., 20., 30.], 'trunc') + episode(1, 1, [40., 50., 60., 70.], 'term')
STREAM = [s for pair in zip(ENV0, ENV1) for s in pair]
GAMMA = 0.5   # every sum below is exact in float32

# (env, episode, start) -> (reward, t of next_state, k, terminated, truncated), worked out by hand with γ = 0.5
HAND = {
    2: {(0, 0, 0): (1 + 1, 2, 2, False, False), (0, 0, 1): (2 + 1.5, 3, 2, False, False),
        (0, 0, 2): (3 + 2, 4, 2, False, False), (0, 0, 3): (4 + 2.5, 5, 2, True, False), (0, 0, 4): (5, 5, 1, True, False),
        (0, 1, 0): (6 + 3.5, 2, 2, False, True), (0, 1, 1): (7, 2, 1, False, True),
        (1, 0, 0): (10 + 10, 2, 2, False, False), (1, 0, 1): (20 + 15, 3, 2, False, True), (1, 0, 2): (30, 3, 1, False, True),
        (1, 1, 0): (40 + 25, 2, 2, False, False), (1, 1, 1): (50 + 30, 3, 2, False, False),
        (1, 1, 2): (60 + 35, 4, 2, True, False), (1, 1, 3): (70, 4, 1, True, False)},
    3: {(0, 0, 0): (1 + 1 + .75, 3, 3, False, False), (0, 0, 1): (2 + 1.5 + 1, 4, 3, False, False),
        (0, 0, 2): (3 + 2 + 1.25, 5, 3, True, False), (0, 0, 3): (4 + 2.5, 5, 2, True, False), (0, 0, 4): (5, 5, 1, True, False),
        (0, 1, 0): (6 + 3.5, 2, 2, False, True), (0, 1, 1): (7, 2, 1, False, True),
        (1, 0, 0): (10 + 10 + 7.5, 3, 3, False, True), (1, 0, 1): (20 + 15, 3, 2, False, True), (1, 0, 2): (30, 3, 1, False, True),
        (1, 1, 0): (40 + 25 + 15, 3, 3, False, False), (1, 1, 1): (50 + 30 + 17.5, 4, 3, True, False),
        (1, 1, 2): (60 + 35, 4, 2, True, False), (1, 1, 3): (70, 4, 1, True, False)},
    5: {(0, 0, 0): (1 + 1 + .75 + .5 + .3125, 5, 5, True, False), (0, 0, 1): (2 + 1.5 + 1 + .625, 5, 4, True, False),
        (0, 0, 2): (3 + 2 + 1.25, 5, 3, True, False), (0, 0, 3): (4 + 2.5, 5, 2, True, False), (0, 0, 4): (5, 5, 1, True, False),
        (0, 1, 0): (6 + 3.5, 2, 2, False, True), (0, 1, 1): (7, 2, 1, False, True),
        (1, 0, 0): (10 + 10 + 7.5, 3, 3, False, True), (1, 0, 1): (20 + 15, 3, 2, False, True), (1, 0, 2): (30, 3, 1, False, True),
        (1, 1, 0): (40 + 25 + 15 + 8.75, 4, 4, True, False), (1, 1, 1): (50 + 30 + 17.5, 4, 3, True, False),
        (1, 1, 2): (60 + 35, 4, 2, True, False), (1, 1, 3): (70, 4, 1, True, False)},
}

# n = 3 TD targets by hand, with a target network that values every state at 100:
# reward + 0.5^k · 100, and no bootstrap after a terminated step (truncated ones still bootstrap)
HAND_TARGETS_3 = {(0, 0, 0): 2.75 + 12.5, (0, 0, 1): 4.5 + 12.5, (0, 0, 2): 6.25, (0, 0, 3): 6.5, (0, 0, 4): 5.,
                  (0, 1, 0): 9.5 + 25, (0, 1, 1): 7. + 50,
                  (1, 0, 0): 27.5 + 12.5, (1, 0, 1): 35. + 25, (1, 0, 2): 30. + 50,
                  (1, 1, 0): 80. + 12.5, (1, 1, 1): 97.5, (1, 1, 2): 95., (1, 1, 3): 70.}


@pytest.mark.parametrize('n', [2, 3, 5])
def test_hand_computed_transitions(n):
    out = list(IterableWrapper(STREAM).nstep(n, GAMMA))
    assert len(out) == len(STREAM)
    got = {key(s): (s.reward.item(), int(s.next_state[2]), int(s.n_steps), bool(s.terminated), bool(s.truncated)) for s in out}
    assert got == HAND[n]
    firsts = {key(s): s for s in STREAM}
    for s in out:   # the first step of the window gives state, action and the bookkeeping
        first = firsts[key(s)]
        for name in ('state', 'action', 'total_reward', 'env_id', 'step_n', 'episode_n'):
            assert torch.equal(getattr(s, name), getattr(first, name)), name
        assert s.next_state[:2].tolist() == first.state[:2].tolist()   # never another env's or episode's state
        assert s.reward.dtype == torch.float32 and s.n_steps.dtype == torch.int32


def test_hand_computed_targets():
    batch = SimpleStep.from_steps(list(IterableWrapper(STREAM).nstep(3, GAMMA)))
    value = torch.full((len(batch),), 100.)     # Q_target(next_state) of every transition
    target = batch.reward + nstep_discount(batch, GAMMA) * value * ~batch.terminated
    assert dict(zip(map(key, batch), target.tolist())) == HAND_TARGETS_3


def test_emission_order():
    "A window is emitted when it closes: n - 1 steps later, or at once when its episode ends."
    out = [key(s) for s in IterableWrapper(STREAM).nstep(3, GAMMA)]
    assert out[:4] == [(0, 0, 0), (1, 0, 0), (1, 0, 1), (1, 0, 2)]   # env 1's truncation flushes its episode
    for env in (0, 1):   # per sub-env, transitions come out in stream order
        mine = [k for k in out if k[0] == env]
        assert mine == sorted(mine)


def test_n1_reproduces_the_input():
    out = list(IterableWrapper(STREAM, deepcopy=False).nstep(1, 0.9))
    assert out == STREAM
    assert all(a is b for a, b in zip(out, STREAM))   # passed through, not rebuilt


def test_source_running_out_flushes_without_flags():
    steps = episode(0, 0, [1., 1., 1., 1.], None)
    out = list(IterableWrapper(steps).nstep(3, GAMMA))
    assert [(key(s)[2], int(s.n_steps), s.reward.item(), bool(s.terminated), bool(s.truncated)) for s in out] == [
        (0, 3, 1.75, False, False), (1, 3, 1.75, False, False), (2, 2, 1.5, False, False), (3, 1, 1., False, False)]


def test_each_iterator_starts_fresh():
    pipe = IterableWrapper(STREAM).nstep(3, GAMMA)
    assert list(pipe) == list(pipe)


# -- property test against a brute-force reference ------------------------------------------------------------

def reference(steps, n, gamma):
    "Brute force: every step starts a window of its own episode, up to n steps long, cut at the episode's end."
    by_episode = {}
    for s in steps: by_episode.setdefault((int(s.env_id), int(s.episode_n)), []).append(s)
    out = {}
    for ep in by_episode.values():
        for i, first in enumerate(ep):
            k = min(n, len(ep) - i)
            last = ep[i + k - 1]
            ret = sum(gamma ** j * float(ep[i + j].reward) for j in range(k))
            out[key(first)] = (ret, last.next_state.tolist(), k, bool(last.terminated), bool(last.truncated),
                               first.state.tolist(), int(first.action), float(first.total_reward))
    return out


@st.composite
def streams(draw):
    "Several sub-envs with random episode lengths and ends, interleaved at random; the last episode may be cut."
    per_env = []
    for env in range(draw(st.integers(1, 4))):
        steps, lengths = [], draw(st.lists(st.integers(1, 8), min_size=1, max_size=4))
        for ep, length in enumerate(lengths):
            end = draw(st.sampled_from(['term', 'trunc', None] if ep == len(lengths) - 1 else ['term', 'trunc']))
            rewards = draw(st.lists(st.floats(-10, 10, width=32), min_size=length, max_size=length))
            steps += episode(env, ep, rewards, end)
        per_env.append(steps)
    order = draw(st.permutations([env for env, steps in enumerate(per_env) for _ in steps]))
    its = [iter(steps) for steps in per_env]
    return [next(its[env]) for env in order]


@settings(max_examples=150, deadline=None)
@given(stream=streams(), n=st.integers(1, 6), gamma=st.floats(0, 1))
def test_matches_brute_force(stream, n, gamma):
    out = list(IterableWrapper(stream).nstep(n, gamma))
    assert len(out) == len(stream)
    ref = reference(stream, n, gamma)
    got = {key(s): s for s in out}
    assert got.keys() == ref.keys()
    for k, (ret, next_state, steps, term, trunc, state, action, total) in ref.items():
        s = got[k]
        assert math.isclose(s.reward.item(), ret, rel_tol=1e-5, abs_tol=1e-4), (k, s.reward.item(), ret)
        assert (s.next_state.tolist(), int(s.n_steps), bool(s.terminated), bool(s.truncated)) == (next_state, steps, term, trunc), k
        assert (s.state.tolist(), int(s.action), float(s.total_reward)) == (state, action, total), k
    if n == 1: assert out == stream


# -- composition with both buffers on real CartPole --------------------------------------------------------------

def cartpole(n_batches=150, **nstep):
    pipe = GymTransformBlock(None, n=n_batches, seed=0, nenvs=2)(['CartPole-v1']).unbatch()
    return pipe.nstep(**nstep) if nstep else pipe


@pytest.mark.parametrize('buffer', [ExperienceReplay, PrioritizedExperienceReplay])
def test_composes_with_buffers(buffer):
    gamma = 0.99
    replay = buffer(cartpole(n=3, gamma=gamma), bs=16, max_sz=1000, seed=0)
    batches = list(replay)
    singles = list(cartpole())   # the same seeded single steps (autoreset rows left out)
    assert len(replay) == len(singles) and len(batches) == len(singles) - 16 + 1   # every transition stored
    for b in batches:
        assert b.n_steps.dtype == torch.int32 and set(b.n_steps.tolist()) <= {1, 2, 3}
        assert torch.allclose(b.reward, (1 - gamma ** b.n_steps.double()).float() / (1 - gamma))   # CartPole pays 1 a step
        assert b.idxs is not None and b.weights is not None
    # what the buffer stored is exactly the brute-force n-step stream of the same seeded single steps
    ref = reference(singles, 3, gamma)
    stored = list(replay.memory)
    assert sorted(map(key, stored)) == sorted(ref)
    for s in stored:
        ret, next_state, k, term, trunc, state, action, _ = ref[key(s)]
        assert math.isclose(s.reward.item(), ret, rel_tol=1e-6)
        assert (s.next_state.tolist(), int(s.n_steps), bool(s.terminated), bool(s.truncated), s.state.tolist(), int(s.action)) == \
            (torch.tensor(next_state).tolist(), k, term, trunc, torch.tensor(state).tolist(), action)
    assert sorted({int(s.n_steps) for s in stored}) == [1, 2, 3]


def test_prioritized_feedback_of_nstep_td_errors():
    "The learner's n-step TD errors go back to the buffer as |td| + eps."
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    gamma = 0.99
    replay = PrioritizedExperienceReplay(cartpole(60, n=3, gamma=gamma), bs=32, max_sz=200, seed=0)
    for batch in replay:
        with torch.no_grad():
            target = batch.reward + nstep_discount(batch, gamma) * model(batch.next_state).max(-1).values * ~batch.terminated
            td = target - model(batch.state).gather(-1, batch.action[:, None]).squeeze(-1)
        replay.update_priorities(batch.idxs, td.abs())
        # one-step targets would differ wherever a transition sums more than one reward
        one_step = batch.reward + gamma * model(batch.next_state).max(-1).values * ~batch.terminated
        assert (batch.n_steps > 1).any() and not torch.allclose(target, one_step.detach())
    last = {int(i): abs(float(t)) for i, t in zip(batch.idxs, td)}   # the last write of a repeated slot wins
    prios = replay.buffer.priorities
    for i, t in last.items(): assert math.isclose(prios[i], t + replay.buffer.eps, rel_tol=1e-6)


# -- bad input -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize('n', [0, -1, 2.5, True, '3', None])
def test_bad_n(n):
    with pytest.raises(ValueError, match=re.escape(f"n={n!r} is not an int >= 1")): NStepTransitions(IterableWrapper([]), n, 0.9)


@pytest.mark.parametrize('gamma', [-0.01, 1.01, float('nan'), float('inf'), '0.9', None, True])
def test_bad_gamma(gamma):
    with pytest.raises(ValueError, match='gamma'): IterableWrapper([]).nstep(3, gamma)
    batch = SimpleStep.from_steps(STREAM[:2])
    with pytest.raises(ValueError, match='gamma'): nstep_discount(batch, gamma)


@pytest.mark.parametrize('item, error, match', [
    (1, TypeError, 'got int: 1'),
    ((1, 2), TypeError, 'got tuple'),
    (np.zeros(3), TypeError, 'got ndarray'),
    (SimpleStep.from_steps(STREAM[:2]), TypeError, r'\.unbatch\(\)'),
    (SimpleStep(state=[0.], action=0, next_state=[1.], n_steps=2), ValueError, 'n_steps=2'),
])
def test_bad_items(item, error, match):
    with pytest.raises(error, match=match): list(IterableWrapper([STREAM[0], item]).nstep(3, 0.9))


def test_episode_change_without_an_end():
    with pytest.raises(ValueError, match='env 0 moved from episode 0 to 1'):
        list(IterableWrapper([mk(0, 0, 1.), mk(0, 0, 1., ep=1)]).nstep(3, 0.9))


def test_nstep_discount():
    batch = SimpleStep.from_steps(list(IterableWrapper(STREAM).nstep(5, GAMMA)))
    d = nstep_discount(batch, GAMMA)
    assert d.dtype == torch.float32 and d.shape == batch.reward.shape
    assert d.tolist() == [GAMMA ** k for k in batch.n_steps.tolist()]
    assert nstep_discount(batch, 1.).tolist() == [1.] * len(batch)
    assert nstep_discount(batch, 0).tolist() == [0.] * len(batch)
    plain = SimpleStep.from_steps(STREAM)    # one-step transitions: the usual gamma
    assert torch.equal(nstep_discount(plain, 0.99), torch.full((len(plain),), 0.99))


def test_step_fields():
    assert STEP_FIELDS[-1] == 'n_steps'
    assert SimpleStep(state=[0.], action=0, next_state=[1.]).n_steps.item() == 1
