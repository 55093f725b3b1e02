"""`Episode`, `SequenceReplay`, `PrioritizedSequenceReplay` and their pipe stages.

The spec's example and every error it lists (a buffer refused a call is unchanged), a list
model of FIFO eviction with stable ids, chi-square checks of both samplers, weights by brute
force, chunk contents, state round trips, and the env pipeline end to end.
"""
import collections.abc
import numpy as np
import pytest
import torch
from torch.utils.data.datapipes.iter import IterableWrapper

from fastrl_per.core import SimpleStep
from fastrl_per.stages.envs import GymTransformBlock
from fastrl_per.stages.pipes import find_upstream
from fastrl_per.replay.sequence import (Episode, EpisodeAssembler, PrioritizedBatch, PrioritizedSequenceReplay,
                                 SequenceReplay, SequenceReplayPipe)
from conftest import assert_state_equal

EPS = 1e-6


def make_episode(n, episode_n=0, env_id=0, state_dim=2, action_dtype=int):
    "An episode of `n` steps: state = [episode_n, i], step_n = i, so every row says where it came from."
    return Episode([SimpleStep(state=[float(episode_n), float(i)] + [0.] * (state_dim - 2), action=action_dtype(i % 2),
                               next_state=[float(episode_n), float(i + 1)] + [0.] * (state_dim - 2),
                               terminated=i == n - 1, reward=float(i), env_id=env_id, step_n=i, episode_n=episode_n)
                    for i in range(n)])


def filled(lengths, cls=PrioritizedSequenceReplay, capacity=100, **kwargs):
    buf = cls(capacity, seed=kwargs.pop('seed', 0), **kwargs)
    for i, n in enumerate(lengths): buf.add(make_episode(n, episode_n=i))
    return buf


class TinySlots(PrioritizedSequenceReplay):
    "Few slots to start with, so that slot reuse and growth happen in small tests."
    min_slots = 2




def chi_square(counts, probs):
    expected = counts.sum() * np.asarray(probs)
    return float(((counts - expected) ** 2 / expected).sum())


# chi-square critical values at p = 0.001 (upper tail), by degrees of freedom
CHI2_999 = {4: 18.467, 5: 20.515, 11: 31.264}


# ---------------------------------------------------------------- the spec's examples and defaults

def test_spec_example_and_defaults():
    buffer = PrioritizedSequenceReplay(capacity=1000)
    assert (buffer.alpha, buffer.beta) == (0.6, 0.4)
    default = PrioritizedSequenceReplay()
    assert (default.capacity, default.alpha, default.beta, default.epsilon) == (1_000_000, 0.6, 0.4, 1e-6)
    assert isinstance(default, SequenceReplay)
    assert (len(default), default.n_episodes) == (0, 0)


# ---------------------------------------------------------------- Episode

def test_episode_from_steps_batch_and_chunks():
    ep = make_episode(6)
    assert len(ep) == 6 and ep.done
    assert Episode(ep.steps) == ep == Episode(list(ep.steps))
    assert Episode([ep[:2], ep[2], ep[3:]]) == ep               # batches and single steps mix
    assert ep.chunk(2, 3) == ep[2:5]
    assert ep.chunk(2, 3).step_n.tolist() == [2, 3, 4]
    assert ep[0] == ep.steps[0] and not ep[0].is_batch
    assert not Episode([ep[0]]).done


@pytest.mark.parametrize('steps, contains', [
    ([], 'empty'),
    (SimpleStep.from_steps(list(make_episode(3).steps))[0:0], 'empty'),
    ('steps', 'str'),
    (None, 'NoneType'),
    ([make_episode(2)[0], 7], 'int: 7'),
    ([make_episode(2)[0], make_episode(2, state_dim=3)[0]], "'state'"),
])
def test_episode_rejects(steps, contains):
    with pytest.raises(ValueError, match=None) as e: Episode(steps)
    assert contains in str(e.value)


def test_episode_chunk_out_of_range():
    ep = make_episode(4)
    for start, length in [(3, 2), (0, 5), (-1, 2), (0, 0)]:
        with pytest.raises(ValueError): ep.chunk(start, length)


# ---------------------------------------------------------------- bad input: every error names the value, nothing changes

def _ok_buffer():
    buf = filled([4, 6, 3], capacity=20)
    buf.update_priorities([0, 1, 2], [0.5, 2., 1.])
    return buf

BAD_CONSTRUCTORS = [
    (lambda: PrioritizedSequenceReplay(alpha=-0.1), '-0.1'),
    (lambda: PrioritizedSequenceReplay(beta=-2), '-2'),
    (lambda: PrioritizedSequenceReplay(epsilon=0), 'epsilon'),
    (lambda: PrioritizedSequenceReplay(epsilon=-1e-3), '-0.001'),
    (lambda: PrioritizedSequenceReplay(alpha=float('nan')), 'nan'),
    (lambda: PrioritizedSequenceReplay(beta=float('inf')), 'inf'),
    (lambda: PrioritizedSequenceReplay(capacity=0), 'capacity'),
    (lambda: SequenceReplay(-5), '-5'),
    (lambda: SequenceReplay(2.5), '2.5'),
    (lambda: SequenceReplayPipe(IterableWrapper([]), buffer='buffer'), 'str'),
    (lambda: SequenceReplayPipe(IterableWrapper([]), SequenceReplay(10), bs=0), 'bs'),
    (lambda: SequenceReplayPipe(IterableWrapper([]), SequenceReplay(10), length=-1), 'length'),
]

@pytest.mark.parametrize('build, contains', BAD_CONSTRUCTORS)
def test_bad_constructor(build, contains):
    with pytest.raises(ValueError) as e: build()
    assert contains in str(e.value)


BAD_CALLS = [
    # add
    (lambda b: b.add(make_episode(21)), ['21 transitions', 'capacity 20']),
    (lambda b: b.add([]), ['empty']),
    (lambda b: b.add('episode'), ['str']),
    (lambda b: b.add([make_episode(1)[0], 3]), ['int: 3']),
    (lambda b: b.add(make_episode(2, state_dim=3)), ["'state'"]),
    (lambda b: b.add(make_episode(2, action_dtype=float)), ["'action'", 'dtype']),
    # sample / sample_prioritized
    (lambda b: b.sample(0, 2), ['batch_size', '0']),
    (lambda b: b.sample(2, 0), ['length', '0']),
    (lambda b: b.sample(2.0, 2), ['batch_size', '2.0']),
    (lambda b: b.sample(2, 7), ['length 7', 'longest', '6 transitions']),
    (lambda b: b.sample_prioritized(0, 2), ['batch_size']),
    (lambda b: b.sample_prioritized(2, -3), ['length', '-3']),
    (lambda b: b.sample_prioritized(2, 9), ['length 9', '6 transitions']),
    # update_priorities
    (lambda b: b.update_priorities([0, 1], [1.]), ['2 indices but 1 errors']),
    (lambda b: b.update_priorities([0], [1., 2.]), ['1 indices but 2 errors']),
    (lambda b: b.update_priorities([0, 1], [1., float('nan')]), ['nan']),
    (lambda b: b.update_priorities([0, 1], [float('inf'), 1.]), ['inf']),
    (lambda b: b.update_priorities(torch.tensor([0, 1]), torch.tensor([1., -float('inf')])), ['-inf']),
    (lambda b: b.update_priorities([0, 99], [1., 1.]), ['index 99', 'never issued']),
    (lambda b: b.update_priorities([-1], [1.]), ['index -1']),
    (lambda b: b.update_priorities([0.5], [1.]), ['integer', 'float']),
    # exponents
    (lambda b: b.anneal_beta(-0.1), ['-0.1']),
    (lambda b: b.anneal_beta(0.5, final=-1), ['final', '-1']),
    (lambda b: b.anneal_beta(float('nan')), ['nan']),
    (lambda b: b.set_alpha(-1), ['alpha', '-1']),
    (lambda b: b.set_alpha(2000.), ['overflow']),
    (lambda b: b.set_beta(-1), ['beta', '-1']),
    (lambda b: setattr(b, 'alpha', float('inf')), ['alpha', 'inf']),
    # reads
    (lambda b: b.episode(7), ['episode 7']),
    (lambda b: b.priorities([5]), ['episode 5']),
    # state
    (lambda b: b.load_state_dict({**b.state_dict(), 'capacity': 30}), ['capacity 30']),
    (lambda b: b.load_state_dict({**b.state_dict(), 'priorities': torch.tensor([1., 0., 1.])}), ['priorities']),
    (lambda b: b.load_state_dict({**b.state_dict(), 'lengths': torch.tensor([4, 6, 2])}), ['back to back']),
    (lambda b: b.load_state_dict({**b.state_dict(), 'rng': 'garbage'}), ['sampler state']),
    (lambda b: b.load_state_dict({k: v for k, v in b.state_dict().items() if k != 'alpha'}), ["'alpha'"]),
    (lambda b: b.load_state_dict(SequenceReplay(20).state_dict()), ['SequenceReplay']),
]

@pytest.mark.parametrize('action, contains', BAD_CALLS)
def test_bad_call_raises_and_changes_nothing(action, contains):
    buf = _ok_buffer()
    before = buf.state_dict()
    with pytest.raises(ValueError) as e: action(buf)
    for c in contains: assert c in str(e.value), (c, str(e.value))
    assert_state_equal(buf.state_dict(), before)


@pytest.mark.parametrize('cls', [SequenceReplay, PrioritizedSequenceReplay])
def test_sampling_empty_buffer(cls):
    buf = cls(10)
    with pytest.raises(ValueError, match='empty'): buf.sample(1, 1)
    if cls is PrioritizedSequenceReplay:
        with pytest.raises(ValueError, match='empty'): buf.sample_prioritized(1, 1)


def test_update_that_overflows_the_total_raises_and_changes_nothing():
    buf = filled([3, 3], alpha=1.)
    before = buf.state_dict()
    with pytest.raises(ValueError, match='overflow'): buf.update_priorities([0, 1], [1e308, 1e308])
    assert_state_equal(buf.state_dict(), before)


def test_zero_total_priority_raises():
    buf = filled([3, 4], alpha=200.)               # (0 + eps) ** 200 underflows to 0
    buf.update_priorities([0, 1], [0., 0.])
    with pytest.raises(ValueError, match='total priority.*0.0'): buf.sample_prioritized(2, 2)


def test_huge_priority_is_rejected_so_the_total_stays_finite():
    "A priority whose leaf would make the total overflow (alone, or once a second episode enters at it) is refused."
    buf = filled([3, 3], alpha=1.)
    before = buf.state_dict()
    with pytest.raises(ValueError, match='overflows'): buf.update_priorities([0], [1e308])
    assert_state_equal(buf.state_dict(), before)
    buf.update_priorities([0], [1e299])                        # at the ceiling's scale: accepted ...
    for i in range(2, 12): buf.add(make_episode(3, episode_n=i))   # ... and new episodes entering at it keep the total finite
    assert np.isfinite(buf.kind.total) and buf.kind.total > 1e300
    assert len(buf.sample_prioritized(4, 2)) == 4


def test_set_alpha_that_would_overflow_changes_nothing():
    buf = filled([3, 3], alpha=1.)
    buf.update_priorities([1], [1e10])
    before = buf.state_dict()
    with pytest.raises(ValueError, match='overflows'): buf.set_alpha(40)
    assert_state_equal(buf.state_dict(), before)
    assert buf.alpha == 1. and len(buf.sample_prioritized(2, 2)) == 2


# ---------------------------------------------------------------- eviction, stable ids, priorities

def test_eviction_keeps_priorities_with_their_episodes():
    buf = TinySlots(20, seed=0)
    for i, n in enumerate([5, 4, 6, 3]): buf.add(make_episode(n, episode_n=i))       # 18 stored
    buf.update_priorities([0, 1, 2, 3], [0.1, 0.2, 0.3, 0.4])
    buf.add(make_episode(8, episode_n=4))        # 18 + 8 > 20: evicts 0 (13 + 8 > 20 still), then 1
    assert list(buf.ids) == [2, 3, 4] and len(buf) == 17
    np.testing.assert_array_equal(buf.priorities([2, 3]), [0.3 + EPS, 0.4 + EPS])
    assert buf.priorities([4])[0] == buf.max_priority == 1.0
    for i in buf.ids: assert buf.episode(i) == make_episode([5, 4, 6, 3, 8][i], episode_n=i)
    before = buf.state_dict()
    buf.update_priorities([0, 1, 0], [5., 6., 7.])   # evicted ids: dropped, even where their slot is reused
    assert_state_equal(buf.state_dict(), before)
    buf.update_priorities([1, 3], [9., 0.05])        # a mix: the stored one applies
    np.testing.assert_array_equal(buf.priorities(), [0.3 + EPS, 0.05 + EPS, 1.0])
    assert buf.max_priority == 1.0                   # the dropped 9 does not count as seen


def test_update_to_evicted_id_never_reaches_the_slots_new_occupant():
    buf = TinySlots(4, seed=0)
    for i in range(4): buf.add(make_episode(1, episode_n=i))
    batch = buf.sample_prioritized(8, 1)
    for i in range(4, 8): buf.add(make_episode(1, episode_n=i))    # every sampled id evicted; slots reused
    assert set(buf._slots(batch.indices.numpy())) <= set(buf._slots(buf.ids))
    before = buf.state_dict()
    buf.update_priorities(batch.indices, torch.full((8,), 50.))
    assert_state_equal(buf.state_dict(), before)


def test_repeated_indices_last_wins():
    buf = filled([3, 3, 3])
    buf.update_priorities([1, 2, 1, 1, 2], [4., 5., 6., 7., 0.5])
    np.testing.assert_array_equal(buf.priorities(), [1.0, 7 + EPS, 0.5 + EPS])
    assert buf.max_priority == 7 + EPS
    buf.update_priorities(torch.tensor([0, 0]), torch.tensor([-3., 2.]))   # magnitudes, last wins
    assert buf.priorities([0])[0] == 2 + EPS


def test_new_episode_enters_at_largest_priority_seen():
    buf = filled([3, 3])
    buf.update_priorities([0, 1], [5., 0.1])
    buf.update_priorities([0], [0.2])               # the maximum stays the largest *seen*
    buf.add(make_episode(3, episode_n=2))
    assert buf.priorities([2])[0] == 5 + EPS == buf.max_priority


def test_list_model_of_fifo_eviction_and_priorities():
    "Random adds and updates against a plain list of (id, length, priority), with slots growing from 2."
    rng = np.random.default_rng(1)
    buf, model, max_p, next_id = TinySlots(30, alpha=0.7, seed=3), [], 1.0, 0
    for _ in range(400):
        if rng.random() < 0.5:
            n = int(rng.integers(1, 9))
            while sum(m[1] for m in model) + n > 30: model.pop(0)
            model.append([next_id, n, max_p]); buf.add(make_episode(n, episode_n=next_id)); next_id += 1
        elif next_id:
            ids = rng.integers(0, next_id, size=int(rng.integers(1, 6)))
            errs = rng.normal(size=len(ids)) * 3
            buf.update_priorities(ids, errs)
            live = {m[0]: m for m in model}
            for i, e in zip(ids, errs):
                if i in live:
                    live[i][2] = abs(e) + EPS
                    max_p = max(max_p, abs(e) + EPS)
        assert list(buf.ids) == [m[0] for m in model]
        assert len(buf) == sum(m[1] for m in model) and buf.n_episodes == len(model)
        np.testing.assert_allclose(buf.priorities(), [m[2] for m in model], rtol=1e-12)
        assert buf.max_priority == pytest.approx(max_p)
        if model:
            assert (buf.longest, buf.shortest) == (max(m[1] for m in model), min(m[1] for m in model))
            eligible = [m[2] ** 0.7 for m in model if m[1] >= buf.tree_length]
            assert buf.kind.total == pytest.approx(sum(eligible))
    assert buf.n_slots > 2                           # it grew
    for m in model: assert buf.episode(m[0]) == make_episode(m[1], episode_n=m[0])


def test_add_and_update_touch_few_tree_leaves():
    "No O(n) re-lay per add or update: each tree write covers the new episode, the evicted ones or the updated ids."
    buf = PrioritizedSequenceReplay(500, seed=0)
    for i in range(200): buf.add(make_episode(2, episode_n=i))
    tree, sizes = buf.kind, []
    for name in ('update_unchecked', 'set_range_unchecked'):   # every way a kind's leaf is written (its protocol)
        def counted(idxs, values, write=getattr(tree, name)): sizes.append(len(np.atleast_1d(values))); write(idxs, values)
        setattr(tree, name, counted)
    for i in range(200, 600): buf.add(make_episode(2, episode_n=i))     # evicts one episode per add
    buf.update_priorities(buf.ids[-3:], [1., 2., 3.])
    batch = buf.sample_prioritized(4, 2)                                # same length as the tree's: no re-lay
    assert len(sizes) >= 400 and max(sizes) <= 3, (len(sizes), max(sizes))
    assert buf.kind is tree                                             # the tree was not replaced
    assert len(batch) == 4


# ---------------------------------------------------------------- sampling distributions

def test_prioritized_episode_frequencies_chi_square():
    errors = np.array([0.1, 0.5, 1., 2., 4., 8.])
    buf = filled([6] * 6, alpha=0.6, seed=0)
    buf.update_priorities(np.arange(6), errors)
    ids = np.concatenate([buf.sample_prioritized(1000, 3).indices.numpy() for _ in range(30)])
    counts = np.bincount(ids, minlength=6)
    p = (errors + EPS) ** 0.6
    stat = chi_square(counts, p / p.sum())
    assert stat < CHI2_999[5], (stat, counts)
    q = errors + EPS                                 # the test has teeth: alpha = 1 is far off
    assert chi_square(counts, q / q.sum()) > 10 * CHI2_999[5]


def test_prioritized_sampling_skips_short_episodes():
    lengths, errors = [2, 9, 3, 5, 12, 4], np.array([9., 0.5, 9., 2., 1., 9.])
    buf = filled(lengths, alpha=0.8, seed=1)
    buf.update_priorities(np.arange(6), errors)
    ids = np.concatenate([buf.sample_prioritized(1000, 5).indices.numpy() for _ in range(20)])
    counts = np.bincount(ids, minlength=6)
    assert counts[[0, 2, 5]].sum() == 0
    p = (errors[[1, 3, 4]] + EPS) ** 0.8
    assert chi_square(counts[[1, 3, 4]], p / p.sum()) < CHI2_999[4]
    assert buf.tree_length == 5
    all_ids = buf.sample_prioritized(2000, 2).indices.numpy()   # a shorter length re-lays: all eligible again
    assert set(all_ids) == set(range(6)) and buf.tree_length == 2


def test_uniform_sampling_is_uniform_over_chunk_starts():
    buf = filled([3, 5, 10, 2], cls=SequenceReplay, seed=0)
    batch = buf.sample(24_000, 3)
    cells = [(e, s) for e, n in enumerate([3, 5, 10, 2]) for s in range(n - 2)]
    index = {c: i for i, c in enumerate(cells)}
    counts = np.bincount([index[(e, s)] for e, s in zip(batch.episode_n[:, 0].tolist(), batch.step_n[:, 0].tolist())],
                         minlength=len(cells))
    assert len(cells) == 12
    assert chi_square(counts, np.full(12, 1 / 12)) < CHI2_999[11]


def test_weights_equal_the_formula_by_brute_force():
    lengths, errors = [8, 3, 6, 7, 10], np.array([0.3, 0.001, 2.5, 0.05, 1.1])
    buf = filled(lengths, alpha=0.7, beta=0.55)
    buf.update_priorities(np.arange(5), errors)
    batch = buf.sample_prioritized(64, 6)
    eligible = [i for i, n in enumerate(lengths) if n >= 6]
    p = {i: (errors[i] + EPS) ** 0.7 for i in eligible}
    N, total = len(eligible), sum(p.values())
    w = {i: (N * p[i] / total) ** -0.55 for i in eligible}
    wmax = max(w.values())
    expected = np.array([w[i] / wmax for i in batch.indices.tolist()])
    assert batch.weights.dtype == torch.float32 and batch.indices.dtype == torch.int64
    np.testing.assert_allclose(batch.weights.numpy(), expected, rtol=1e-6)
    assert batch.weights.max() <= 1.0
    buf.anneal_beta(1.0)
    assert buf.beta == 1.0


def test_all_equal_priorities_give_unit_weights():
    buf = filled([4, 5, 6])
    assert torch.equal(buf.sample_prioritized(16, 3).weights, torch.ones(16))


def test_anneal_beta_is_linear_from_the_start():
    buf = PrioritizedSequenceReplay(10, beta=0.4)
    for f, b in [(0., 0.4), (0.25, 0.55), (1., 1.0), (0.5, 0.7)]:
        buf.anneal_beta(f); assert buf.beta == pytest.approx(b)
    buf.anneal_beta(1.0, final=0.6); assert buf.beta == pytest.approx(0.6)


def test_alpha_zero_is_uniform_over_eligible_episodes():
    buf = filled([5, 5, 5, 5])
    buf.update_priorities(np.arange(4), [0.01, 1., 10., 100.])
    buf.alpha = 0
    counts = np.bincount(buf.sample_prioritized(4000, 2).indices.numpy(), minlength=4)
    assert chi_square(counts, np.full(4, 0.25)) < 16.27          # df 3
    assert buf.kind.total == pytest.approx(4.0)


# ---------------------------------------------------------------- chunk contents

@pytest.mark.parametrize('prioritized', [False, True])
def test_chunks_are_consecutive_steps_of_one_episode(prioritized):
    lengths = [3, 9, 5, 12, 7, 4, 8]
    buf = filled(lengths, capacity=40, seed=2)            # 48 > 40: the first episodes go, the ring wraps
    assert buf.first_id > 0
    if prioritized:
        chunks, ids, _ = buf.sample_prioritized(200, 4)
        assert torch.equal(chunks.episode_n[:, 0], ids)
    else:
        chunks = buf.sample(200, 4)
    assert chunks.state.shape == (200, 4, 2) and chunks.action.shape == (200, 4) and chunks.terminated.shape == (200, 4)
    assert chunks.reward.dtype == torch.float32 and chunks.terminated.dtype == torch.bool
    ep = chunks.episode_n
    assert (ep == ep[:, :1]).all()
    assert (chunks.step_n.diff(dim=1) == 1).all()
    assert (chunks.state[..., 1] == chunks.step_n.float()).all() and (chunks.state[..., 0] == ep.float()).all()
    stored = set(buf.ids.tolist())
    assert set(ep[:, 0].tolist()) <= {i for i in stored if lengths[i] >= 4}
    for c in chunks[:20]:                                  # each chunk is the slice of its stored episode
        start = int(c.step_n[0])
        assert c == buf.episode(int(c.episode_n[0])).chunk(start, 4)
    assert (chunks.step_n[:, -1] < torch.tensor(lengths)[ep[:, 0]]).all()


def test_episode_longer_than_length_one_still_sampled():
    buf = filled([1], cls=SequenceReplay)
    batch = buf.sample(3, 1)
    assert batch.state.shape == (3, 1, 2)


# ---------------------------------------------------------------- state

@pytest.mark.parametrize('cls', [SequenceReplay, PrioritizedSequenceReplay, TinySlots])
def test_state_round_trip(cls, tmp_path):
    buf = cls(25, seed=5)
    for i, n in enumerate([7, 5, 9, 6, 8]): buf.add(make_episode(n, episode_n=i))
    if cls is not SequenceReplay: buf.update_priorities(buf.ids, np.arange(buf.n_episodes) + 0.5)
    path = tmp_path / 'seq.pt'
    torch.save(buf.state_dict(), path)
    restored = cls(25)
    restored.load_state_dict(torch.load(path, weights_only=True))
    assert_state_equal(restored.state_dict(), buf.state_dict())
    assert restored.sample(5, 4) == buf.sample(5, 4)
    if cls is not SequenceReplay:
        a, b = buf.sample_prioritized(5, 6), restored.sample_prioritized(5, 6)
        assert a.chunks == b.chunks and torch.equal(a.indices, b.indices) and torch.equal(a.weights, b.weights)
    buf.add(make_episode(9, episode_n=5)); restored.add(make_episode(9, episode_n=5))
    assert_state_equal(restored.state_dict(), buf.state_dict())


def test_empty_state_round_trip():
    buf = PrioritizedSequenceReplay(10)
    other = PrioritizedSequenceReplay(10)
    other.load_state_dict(buf.state_dict())
    assert len(other) == 0 and other.n_episodes == 0
    other.add(make_episode(3))
    assert other.n_episodes == 1


# ---------------------------------------------------------------- pipe stages

def test_episode_assembler_groups_interleaved_env_ids():
    a, b = make_episode(4, episode_n=0, env_id=0), make_episode(3, episode_n=0, env_id=1)
    a2 = make_episode(2, episode_n=1, env_id=0)
    stream = [a[0], b[0], a[1], b[1], a[2], b[2], a[3], a2[0], a2[1]]
    episodes = list(EpisodeAssembler(IterableWrapper(stream)))
    assert episodes == [b, a, a2]
    assert list(EpisodeAssembler(IterableWrapper([SimpleStep.from_steps(stream)]))) == [b, a, a2]   # batches too


def test_episode_assembler_drops_cut_off_episodes_and_rejects_non_steps():
    cut, whole = make_episode(5, episode_n=0), make_episode(2, episode_n=1)
    assert list(EpisodeAssembler(IterableWrapper([cut[0], cut[1], whole[0], whole[1]]))) == [whole]
    with pytest.raises(TypeError, match='int'): list(EpisodeAssembler(IterableWrapper([1])))


def test_episode_assembler_on_gym_stream_with_two_sub_envs():
    steps = GymTransformBlock(None, n=250, seed=0, nenvs=2)(['CartPole-v1']).unbatch()
    episodes = list(EpisodeAssembler(steps))
    assert len(episodes) > 10
    assert {int(e.steps.env_id[0]) for e in episodes} == {0, 1}
    for e in episodes:
        assert e.done and not (e.steps.terminated[:-1] | e.steps.truncated[:-1]).any()
        assert e.steps.step_n.tolist() == list(range(1, len(e) + 1))
        assert e.steps.env_id.unique().numel() == 1 and e.steps.episode_n.unique().numel() == 1
        assert torch.equal(e.steps.state[1:], e.steps.next_state[:-1])   # consecutive in time


def test_sequence_replay_pipe_end_to_end_with_feedback():
    steps = GymTransformBlock(None, n=400, seed=0)(['CartPole-v1']).unbatch()
    buffer = PrioritizedSequenceReplay(300, seed=0)
    pipe = SequenceReplayPipe(EpisodeAssembler(steps), buffer, bs=8, length=10)
    assert find_upstream(pipe, SequenceReplayPipe).buffer is buffer
    assert not isinstance(buffer, collections.abc.Collection)   # so graph traversal never pickles the storage
    n = 0
    for batch in pipe:
        assert isinstance(batch, PrioritizedBatch) and batch.chunks.state.shape == (8, 10, 4)
        assert (batch.chunks.step_n.diff(dim=1) == 1).all()
        buffer.update_priorities(batch.indices, torch.rand(8))
        n += 1
    assert n > 0 and buffer.first_id > 0 and len(buffer) <= 300
    uniform = SequenceReplayPipe(IterableWrapper([make_episode(3), make_episode(5, episode_n=1)]), SequenceReplay(20), bs=2, length=4)
    out = list(uniform)
    assert len(out) == 1 and out[0].state.shape == (2, 4, 2)      # nothing until an episode is long enough


# issue 27: sequences of burn_in + length steps for R2D2-style replay

@pytest.mark.parametrize('burn_in,length', [(0, 1), (0, 5), (3, 4), (8, 16)])
def test_sample_sequences_rows_and_masks(burn_in, length):
    "Every sequence: its trained rows are steps s, s+1, ... of one episode, the last repeated and masked past its end; its burn-in the up to `burn_in` steps before s, left-aligned, the rest masked."
    lengths = [1, 2, 7, 30]
    buf = filled(lengths, capacity=200)
    batch = buf.sample_sequences(2_000, length, burn_in)
    assert batch.chunks.state.shape == (2_000, burn_in + length, 2) and batch.mask.dtype == torch.bool
    for steps, mask, id, episode in zip(batch.chunks.step_n.numpy(), batch.mask.numpy(), batch.indices.numpy(),
                                        batch.chunks.episode_n.numpy()):
        n, s = lengths[id], steps[burn_in]
        assert (episode == id).all()                                                # never across episodes
        assert list(steps[burn_in:]) == [min(s + k, n - 1) for k in range(length)]
        assert list(mask[burn_in:]) == [s + k < n for k in range(length)]
        b = min(s, burn_in)
        assert list(steps[:b]) == list(range(s - b, s)) and list(mask[:burn_in]) == [k < b for k in range(burn_in)]
    starts = batch.chunks.step_n[:, burn_in]
    for id, n in enumerate(lengths):                                                # a start at every step of every episode
        assert set(starts[batch.indices == id].tolist()) == set(range(n))


def test_sample_sequences_follows_episode_priorities_and_starts_uniformly():
    buf = filled([10, 10, 10])
    buf.update_priorities([0, 1, 2], [6., 3., 1.])
    batch = buf.sample_sequences(30_000, 4, 2)
    p = np.array([6., 3., 1.]) ** 0.6
    assert np.allclose(np.bincount(batch.indices.numpy(), minlength=3) / 30_000, p / p.sum(), atol=0.01)
    assert np.allclose(np.bincount(batch.chunks.step_n[:, 2].numpy(), minlength=10) / 30_000, 0.1, atol=0.01)
    w = (3 * p / p.sum()) ** -0.4
    assert torch.allclose(batch.weights, torch.tensor(w / w.max(), dtype=torch.float32)[batch.indices], atol=1e-5)


def test_sample_sequences_bad_arguments_change_nothing():
    buf = filled([5, 6])
    before = buf.state_dict()
    for args, contains in [((4, 0), 'length'), ((4, 3, -1), 'burn_in'), ((0, 3), 'batch_size')]:
        with pytest.raises(ValueError, match=contains): buf.sample_sequences(*args)
    assert_state_equal(before, buf.state_dict())
    with pytest.raises(ValueError, match='empty'): PrioritizedSequenceReplay(10).sample_sequences(2, 3)


def test_sequence_priorities_of_an_evicted_episode_are_dropped():
    "A sequence's priority goes to its episode's stable id; once the episode is evicted, the late update is dropped."
    buf = TinySlots(12, seed=0)
    for i in range(2): buf.add(make_episode(6, episode_n=i))
    ids = buf.sample_sequences(8, 3, 1).indices
    assert 0 in ids
    buf.add(make_episode(6, episode_n=2))                 # evicts episode 0; episode 2 takes its slot
    buf.update_priorities(ids, torch.where(ids == 0, 5., 0.5))
    assert list(buf.ids) == [1, 2]
    assert buf.priorities([2])[0] == 1.0                  # the newcomer keeps the largest priority seen at its add
    assert buf.prioritizer.raw.max() < 5                  # id 0's late update reached no slot


def test_pipe_with_burn_in_waits_for_warmup_and_samples_sequences():
    buf = PrioritizedSequenceReplay(100, seed=0)
    steps = [s for e in (make_episode(5), make_episode(4, episode_n=1)) for s in e.steps]
    out = list(SequenceReplayPipe(IterableWrapper(steps), buf, bs=3, length=2, burn_in=1, warmup=5))
    assert len(out) == 5 and all(b.mask.shape == (3, 3) for b in out)   # from the 5th step on: one batch per step
    with pytest.raises(ValueError, match='burn_in needs a PrioritizedSequenceReplay'):
        SequenceReplayPipe(IterableWrapper(steps), SequenceReplay(100), burn_in=1)
