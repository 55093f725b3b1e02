"""Rank-based prioritization (`prioritization='rank'`): the heap's invariants, the segments, the draw's statistics and
weights, max-priority insertion, the stale rule, state and resume, bad input, and the buffers and learner that offer it."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from fastrl_per.core import SimpleStep
from functools import partial
from fastrl_per.replay.priorities import Priorities, RankHeap, Proportional, kind_class
from fastrl_per.replay.per import PrioritizedExperienceReplay, PrioritizedReplayBuffer
from fastrl_per.replay.sequence import PrioritizedSequenceReplay
from fastrl_per.learners.learner import Learner
from conftest import assert_state_equal, assert_refused_unchanged
from test_per import steps, TD8

nan, inf = float('nan'), float('inf')


def rank_buffer(n, max_sz=8, seed=0, **kwargs):
    "A rank-based buffer holding `n` steps."
    buf = PrioritizedReplayBuffer(max_sz=max_sz, seed=seed, prioritization='rank', **kwargs)
    if n: buf.add(SimpleStep.from_steps(steps(n)))
    return buf


def is_heap(h:RankHeap) -> bool:
    "Every parent at least its children; `pos` the inverse of `heap`; exactly the positive keys inside."
    keys = h.heap[:h.size]
    v = h.value[keys]
    return (all(v[(j - 1) // 2] >= v[j] for j in range(1, h.size)) and (h.pos[keys] == np.arange(h.size)).all()
            and set(keys.tolist()) == set(np.flatnonzero(h.value > 0).tolist()) and (h.pos[h.value == 0] == -1).all())


# ---------------------------------------------------------------- the heap

@settings(max_examples=200, deadline=None)
@given(st.integers(1, 40).flatmap(lambda cap: st.tuples(st.just(cap), st.lists(st.tuples(
    st.lists(st.integers(0, cap - 1), min_size=1, max_size=6), st.sampled_from([0., 0.5, 1., 2., 3.]), st.booleans()),
    max_size=30))))
def test_heap_invariants_after_any_writes(case):
    cap, writes = case
    h, expect = RankHeap(cap), np.zeros(cap)
    for keys, value, fresh in writes:
        values = np.full(len(keys), value) * (1 + np.arange(len(keys)) % 2)
        h.update_unchecked(np.array(keys, np.int64), values, fresh)
        expect[keys] = values                       # numpy too: the last of repeated keys wins
        assert is_heap(h)
    np.testing.assert_array_equal(h[:], expect)
    h.sort()
    assert is_heap(h) and (np.diff(h.value[h.heap[:h.size]]) <= 0).all()


def test_new_items_rise_above_equals_and_the_array_is_sorted_every_capacity_writes():
    h = RankHeap(8)
    h.set_range_unchecked(0, np.ones(5))
    assert h.heap[0] == 4                              # the newest of five equal items is ranked first
    h.update_unchecked(np.array([0]), np.array([1.]))
    assert h.heap[0] == 4                              # an update does not pass its equals
    assert h.writes_since_sort == 6
    h.update_unchecked(np.arange(3), np.array([3., 2., 5.]))   # the 8th and later writes: sorted
    assert h.writes_since_sort == 0 and h.value[h.heap[:h.size]].tolist() == [5., 3., 2., 1., 1.]


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 3000), st.integers(1, 64), st.floats(0, 2))
def test_segments_partition_the_positions(n, k, alpha):
    k = min(k, n)
    starts, widths = RankHeap(n).segments(n, k, alpha)
    assert len(starts) == k and starts[0] == 0 and (widths >= 1).all() and widths.sum() == n
    np.testing.assert_array_equal(starts[1:], np.cumsum(widths)[:-1])
    p = np.arange(1, n + 1) ** -alpha
    mass = np.add.reduceat(p / p.sum(), starts)
    assert mass.max() <= 1 / k + p.max() / p.sum() + 1e-12 or (widths == 1).any()   # no segment over 1/k plus one position


# ---------------------------------------------------------------- the draw

def test_draw_frequencies_match_the_segments_chi_square():
    "Position j of a segment of width m is drawn with probability 1 / (k m); 20,000 batches of 4 over 40 ranked keys."
    core = Priorities(40, prioritization='rank')
    core.add(0, 40)
    core.update(np.arange(40), np.arange(40.) + 1)     # key 39 ranks first
    core.kind.sort()
    starts, widths = core.kind.segments(40, 4, core.alpha)
    rng, counts = np.random.default_rng(0), np.zeros(40)
    for _ in range(20_000): np.add.at(counts, core.draw(rng, 4)[0], 1)
    p = np.repeat(1 / (4 * widths), widths)           # by position; position j holds key 39 - j
    expected = p[::-1] * counts.sum()
    chi2 = ((counts - expected) ** 2 / expected).sum()
    assert chi2 < 73.4, chi2                            # chi-square, 39 degrees of freedom, p = 0.001


def test_one_draw_per_segment_and_weights_from_widths():
    core = Priorities(1000, prioritization='rank', beta=0.5)
    core.add(0, 1000)
    core.update(np.arange(1000), np.arange(1000.))
    core.kind.sort()
    starts, widths = core.kind.segments(1000, 32, core.alpha)
    keys, weights = core.draw(np.random.default_rng(1), 32)
    at = core.kind.pos[keys]
    assert ((at >= starts) & (at < starts + widths)).all()
    np.testing.assert_allclose(weights, (widths / widths.max()) ** 0.5, rtol=1e-6)
    assert weights.max() <= 1 and weights.dtype == np.float32


def test_the_same_seed_draws_the_same_keys_and_alpha_zero_is_uniform():
    a, b = rank_buffer(8), rank_buffer(8)
    for buf in (a, b): buf.update_priorities(np.arange(8), TD8)
    assert torch.equal(a.sample(4).idxs, b.sample(4).idxs)
    core = Priorities(50, alpha=0., prioritization='rank')
    core.add(0, 50)
    core.update(np.arange(50), np.arange(50.))
    assert (core.kind.segments(50, 5, 0.)[1] == 10).all()   # equal widths: every rank equally likely


def test_new_step_enters_at_max_priority_and_ranks_first():
    buf = rank_buffer(8, max_sz=16, bs=4)
    buf.update_priorities(np.arange(8), TD8)
    buf.add(steps(1, start=8)[0])
    assert buf.priorities[8] == buf.max_priority
    assert buf.prioritizer.kind.heap[0] == 8          # the new step rises above the largest stored priority


# ---------------------------------------------------------------- feedback, stale rule, state

def test_update_reorders_and_only_the_drawn_occupant_takes_it():
    buf = rank_buffer(4, max_sz=4)
    batch = buf.sample(4)                              # N = k = 4: one draw per position, every slot once
    buf.add(steps(1, start=4)[0])                     # slot 0 gets a new occupant after the draw
    td = np.array([5., 1., 2., 3.])
    buf.update_priorities(batch.idxs, td)
    idxs = batch.idxs.numpy()
    assert sorted(idxs.tolist()) == [0, 1, 2, 3] and buf.stale_dropped == 1 and buf.priorities[0] == 1.
    np.testing.assert_allclose(buf.priorities[idxs[idxs != 0]], td[idxs != 0] + 1e-6)
    assert is_heap(buf.prioritizer.kind)
    buf.add(steps(1, start=5)[0])                     # slot 1: a new occupant enters at the largest priority, first
    assert buf.priorities[1] == buf.max_priority == pytest.approx(td[idxs != 0].max() + 1e-6) and buf.prioritizer.kind.heap[0] == 1


def test_state_round_trip_and_resume_draws_the_same_distribution(tmp_path):
    buf = rank_buffer(8, max_sz=8, bs=4)
    buf.update_priorities(np.arange(8), TD8)
    buf.sample(4)
    state = buf.state_dict()
    assert state['prioritization'] == 'rank'
    buf.save(tmp_path / 'rank.pt')
    other = PrioritizedReplayBuffer(max_sz=8, seed=5, prioritization='rank')
    other.load(tmp_path / 'rank.pt')
    assert_state_equal(state, other.state_dict())
    assert (np.diff(other.kind.value[other.kind.heap[:8]]) <= 0).all()   # restored sorted: exact ranks
    again = PrioritizedReplayBuffer(max_sz=8, seed=7, prioritization='rank')
    again.load(tmp_path / 'rank.pt')
    assert torch.equal(other.sample(4).idxs, again.sample(4).idxs)        # the sampler's state travels


def test_pipe_and_sequence_buffer_offer_rank():
    pipe = PrioritizedExperienceReplay(None, bs=2, max_sz=8, seed=0, prioritization='rank')
    pipe.add(SimpleStep.from_steps(steps(6)))
    assert pipe.prioritizer.prioritization == 'rank' and (pipe.alpha, pipe.beta) == (0.7, 0.5)
    pipe.update_priorities(pipe.sample(2).idxs, [1., 2.])
    seq = PrioritizedSequenceReplay(capacity=100, seed=0, prioritization='rank')
    from fastrl_per.replay.sequence import Episode
    for e in range(4): seq.add(Episode(steps(5, start=10 * e)))
    batch = seq.sample_prioritized(4, 3)
    seq.update_priorities(batch.indices, np.arange(4.))
    state = seq.state_dict()
    loaded = PrioritizedSequenceReplay(capacity=100, prioritization='rank')
    loaded.load_state_dict(state)
    assert loaded.prioritizer.prioritization == 'rank'
    np.testing.assert_array_equal(loaded.priorities(), seq.priorities())


def test_learner_trains_with_rank():
    learner = Learner('CartPole-v1', seed=0, total_steps=300, bs=16, max_sz=300, prioritization='rank', n_step=1)
    rows = learner.fit(100)
    buf = learner.replay.buffer
    assert buf.prioritizer.prioritization == 'rank' and (buf.alpha, buf.beta0) == (0.7, 0.5)
    assert len(rows) and np.isfinite([r['loss'] for r in rows if r.get('loss') is not None]).all()
    assert is_heap(buf.prioritizer.kind) and buf.prioritizer.kind.size == len(buf)


# ---------------------------------------------------------------- bad input

def _sampled():
    buf = rank_buffer(8)
    buf.update_priorities(np.arange(8), TD8)
    buf.sample(4)
    return buf


def _proportional_state_into_rank(buf):
    other = PrioritizedReplayBuffer(max_sz=8, seed=0)
    other.add(SimpleStep.from_steps(steps(8)))
    buf.load_state_dict(other.state_dict())


BAD_INPUT = [
    ('prioritization typo', None, lambda _: PrioritizedReplayBuffer(prioritization='ranked'), ["'ranked'", 'rank']),
    ('prioritization None', None, lambda _: Priorities(8, prioritization=None), ['None']),
    ('segments=0', None, lambda _: Priorities(8, prioritization=partial(RankHeap, segments=0)), ['segments', '0']),
    ('segments=2.5', None, lambda _: Priorities(8, prioritization=partial(RankHeap, segments=2.5)), ['segments', '2.5']),
    ('alpha<0', None, lambda _: rank_buffer(0, alpha=-0.5), ['alpha', '-0.5']),
    ('beta<0', None, lambda _: rank_buffer(0, beta=-0.25), ['beta', '-0.25']),
    ('eps=0', None, lambda _: rank_buffer(0, eps=0), ['eps', '0']),
    ('learner rank with uniform replay', None, lambda _: Learner(replay='uniform', prioritization='rank'), ["'rank'", 'per']),
    ('td nan', _sampled, lambda b: b.update_priorities([0, 1], [0.5, nan]), ['nan']),
    ('td inf', _sampled, lambda b: b.update_priorities([3], [inf]), ['inf']),
    ('idx -1', _sampled, lambda b: b.update_priorities([0, -1], [0.5, 0.5]), ['-1']),
    ('idx >= max_sz', _sampled, lambda b: b.update_priorities([2, 8], [0.5, 0.5]), ['8']),
    ('length mismatch', _sampled, lambda b: b.update_priorities([0, 1, 2], [1., 2.]), ['3', '2']),
    ('overflow, alpha 2', lambda: rank_buffer(4, max_sz=4, alpha=2.0), lambda b: b.update_priorities([0], [1e200]),
     ['1e+200', 'overflows']),
    ('set_alpha<0', _sampled, lambda b: b.set_alpha(-1.5), ['alpha', '-1.5']),
    ('sample bs=0', _sampled, lambda b: b.sample(0), ['bs', '0']),
    ('sample empty', lambda: rank_buffer(0), lambda b: b.sample(2), ['empty']),
    ('proportional state into rank', _sampled, _proportional_state_into_rank, ["'proportional'", "'rank'"]),
    ('rank state into proportional', None,
     lambda _: PrioritizedReplayBuffer(max_sz=8).load_state_dict(_sampled().state_dict()), ["'rank'", "'proportional'"]),
]


@pytest.mark.filterwarnings('ignore:overflow encountered:RuntimeWarning')
@pytest.mark.parametrize('build,action,contains', [pytest.param(*c[1:], id=c[0]) for c in BAD_INPUT])
def test_bad_input(build, action, contains): assert_refused_unchanged(build, action, contains)


def test_empty_heap_draw_says_so():
    with pytest.raises(ValueError, match='nothing to draw'):
        Priorities(4, prioritization='rank').draw(np.random.default_rng(0), 2)


def test_segments_are_an_option_of_the_rank_kind_alone():
    with pytest.raises(TypeError, match='segments'): Priorities(8, prioritization=partial(Proportional, segments=4))
    core = Priorities(100, prioritization=partial(RankHeap, segments=4))
    assert core.kind.n_segments == 4 and core.prioritization == 'rank' and (core.alpha, core.beta) == (0.7, 0.5)
    assert kind_class(partial(RankHeap, segments=4)) is RankHeap
    assert core.moved(200, np.arange(0), np.arange(0)).kind.n_segments == 4   # a grown core keeps the option
