"""`PrioritizedExperienceReplay`: sampling statistics, weights, priority feedback, stale updates, save/load, bad input, the pipe."""

import numpy as np
import pytest
import torch

from fastrl_per.core import SimpleStep
from fastrl_per.stages.envs import GymTransformBlock
from fastrl_per.replay.memory import ExperienceReplay, ReplayBuffer
from fastrl_per.replay.per import PrioritizedExperienceReplay, PrioritizedReplayBuffer
from conftest import assert_state_equal, assert_unchanged, assert_refused_unchanged, snapshot

EPS = 1e-6          # the default eps
CHI2_7DF_P001 = 24.322  # chi-square critical value, 7 degrees of freedom, p = 0.001 (any table)


def make_step(i, state_dim=2):
    "A step whose every field is derived from its unique `step_n` `i`."
    return SimpleStep(state=[float(i)] + [-float(i)] * (state_dim - 1), action=i % 3,
                      next_state=[float(i) + 0.5] * state_dim, terminated=i % 5 == 0, truncated=i % 7 == 0,
                      reward=float(i) / 4, total_reward=float(i), env_id=i % 2, step_n=i, episode_n=i // 10)


def steps(n, start=0):
    return [make_step(start + i) for i in range(n)]


def per_buffer(n, max_sz=8, seed=0, start=0, **kwargs):
    "A prioritized buffer holding `n` steps (written in one batch)."
    buf = PrioritizedReplayBuffer(max_sz=max_sz, seed=seed, **kwargs)
    if n: buf.add(SimpleStep.from_steps(steps(n, start)))
    return buf


def per_pipe(n, max_sz=8, bs=1, seed=0, start=0, **kwargs):
    "A prioritized pipe without a source, holding `n` steps."
    er = PrioritizedExperienceReplay(None, bs=bs, max_sz=max_sz, seed=seed, **kwargs)
    if n: er.add(SimpleStep.from_steps(steps(n, start)))
    return er




def chi_square(counts, probs):
    "Pearson's statistic of observed `counts` against cell probabilities `probs`."
    expected = counts.sum() * np.asarray(probs)
    return float(((counts - expected) ** 2 / expected).sum())


# ---------------------------------------------------------------- sampling statistics

TD8 = np.array([0.05, 0.2, 0.45, 0.8, 1.3, 2.0, 3.1, 4.6])  # distinct magnitudes for 8 slots


def stat_buffer(alpha, seed):
    buf = per_buffer(8, max_sz=8, seed=seed, alpha=alpha)
    buf.update_priorities(np.arange(8), TD8)
    return buf


def test_frequencies_match_priorities_chi_square():
    alpha = 0.6
    probs = (TD8 + EPS) ** alpha / ((TD8 + EPS) ** alpha).sum()
    buf = stat_buffer(alpha, seed=1234)
    # single draws: plain proportional sampling
    counts = np.bincount(np.concatenate([buf.sample(1).idxs.numpy() for _ in range(12_000)]), minlength=8)
    assert chi_square(counts, probs) < CHI2_7DF_P001
    # the test can tell: the same counts are far from uniform (and from the un-alpha'd distribution)
    assert chi_square(counts, np.full(8, 1 / 8)) > 10 * CHI2_7DF_P001
    assert chi_square(counts, (TD8 + EPS) / (TD8 + EPS).sum()) > 10 * CHI2_7DF_P001
    # large stratified batches: the same frequencies (with less spread)
    counts = np.bincount(np.concatenate([buf.sample(500).idxs.numpy() for _ in range(40)]), minlength=8)
    assert chi_square(counts, probs) < CHI2_7DF_P001


def test_alpha_zero_is_uniform():
    buf = stat_buffer(0.0, seed=99)
    counts = np.bincount(np.concatenate([buf.sample(1).idxs.numpy() for _ in range(8_000)]), minlength=8)
    assert chi_square(counts, np.full(8, 1 / 8)) < CHI2_7DF_P001
    counts = np.bincount(buf.sample(8000).idxs.numpy(), minlength=8)
    assert counts.tolist() == [1000] * 8  # stratified over 8 equal leaves: exactly bs/8 each
    assert torch.equal(buf.sample(64).weights, torch.ones(64))


def _assert_stratified(idxs, leaf_mass, bs):
    "The k-th drawn slot's leaf interval [cum[i-1], cum[i]) meets the k-th segment [k·s, (k+1)·s)."
    cum = np.cumsum(leaf_mass)
    lo, hi = cum - leaf_mass, cum
    seg = cum[-1] / bs
    assert len(idxs) == bs
    assert (np.diff(idxs) >= 0).all(), f"draws are not in cumulative order: {idxs}"
    tol = 1e-9 * cum[-1]
    for k, i in enumerate(idxs):
        assert lo[i] <= (k + 1) * seg + tol and hi[i] >= k * seg - tol, f"draw {k} (slot {i}) is outside segment {k}"
    # hence each slot is drawn as often as the segments its leaf spans, give or take the two at its ends
    counts = np.bincount(idxs, minlength=len(leaf_mass))
    assert (np.abs(counts - leaf_mass / seg) < 2 + 1e-9).all()


@pytest.mark.parametrize('n,bs,alpha', [(8, 16, 0.6), (8, 5, 1.0), (64, 32, 0.6), (50, 7, 0.3)])
def test_one_draw_per_segment(n, bs, alpha):
    rng = np.random.default_rng(n + bs)
    td = rng.exponential(1.0, n) if n != 8 else TD8
    buf = per_buffer(n, max_sz=n, seed=7, alpha=alpha)
    buf.update_priorities(np.arange(n), td)
    mass = (td + EPS) ** alpha
    for _ in range(50): _assert_stratified(buf.sample(bs).idxs.numpy(), mass, bs)


# ---------------------------------------------------------------- importance weights

def brute_force_weights(prios, alpha, beta):
    "w_i = (N·P(i))^-β / max_j (N·P(j))^-β over the stored slots."
    p = np.asarray(prios, dtype=np.float64) ** alpha
    P = p / p.sum()
    w = (len(p) * P) ** -beta
    return w / w.max()


@pytest.mark.parametrize('weight_norm', ['buffer', 'batch'])
@pytest.mark.parametrize('max_sz,n', [(40, 40), (40, 27), (16, 37)])  # full, part-filled, wrapped
def test_weights_equal_brute_force(max_sz, n, weight_norm):
    rng = np.random.default_rng(max_sz * n)
    for alpha in (0.6, 1.0):
        buf = per_buffer(n, max_sz=max_sz, seed=3, alpha=alpha, weight_norm=weight_norm)
        stored = len(buf)
        td = rng.exponential(2.0, stored) * rng.choice([1e-3, 1, 10], stored)
        buf.update_priorities(np.arange(stored), td)
        for beta in (0.0, 0.4, 0.7, 1.0, 1.6):
            buf.set_beta(beta)
            expect = brute_force_weights(td + EPS, alpha, beta)
            for _ in range(5):
                batch = buf.sample(32)
                assert batch.idxs.dtype == torch.int64 and batch.weights.dtype == torch.float32
                idxs = batch.idxs.numpy()
                assert ((0 <= idxs) & (idxs < stored)).all()
                # 'buffer': divided by the largest weight of any stored transition; 'batch': of the batch's
                want = expect[idxs] if weight_norm == 'buffer' else expect[idxs] / expect[idxs].max()
                np.testing.assert_allclose(batch.weights.numpy(), want, rtol=2e-6, atol=0)
                assert (batch.weights <= 1 + 1e-6).all() and (batch.weights > 0).all()
                for row, i in zip(batch, idxs): assert row == buf.memory[int(i)]


def test_weight_of_the_smallest_priority_is_one():
    buf = per_buffer(8, seed=0, weight_norm='buffer')
    buf.update_priorities(np.arange(8), [5., 5., 5., 5., 5., 5., 5., 0.5])  # slot 7 is rarer but drawn
    seen = False
    for _ in range(200):
        batch = buf.sample(16)
        w7 = batch.weights[batch.idxs == 7]
        if len(w7): seen = True; assert torch.equal(w7, torch.ones_like(w7))
        assert (batch.weights[batch.idxs != 7] < 1).all()
    assert seen
    buf = per_buffer(8, seed=0, weight_norm='batch')   # the batch's largest weight is 1, slot 7 drawn or not
    buf.update_priorities(np.arange(8), [5., 5., 5., 5., 5., 5., 5., 0.5])
    assert all(buf.sample(16).weights.max() == 1 for _ in range(50))


def test_weights_follow_anneal_beta():
    td = np.array([0.1, 1., 2., 4.])
    buf = per_buffer(4, max_sz=4, seed=5, beta=0.4)
    buf.update_priorities(np.arange(4), td)
    for fraction in (0., 0.5, 1.):
        buf.anneal_beta(fraction)
        batch = buf.sample(64)
        expect = brute_force_weights(td + EPS, 0.6, 0.4 + fraction * 0.6)
        np.testing.assert_allclose(batch.weights.numpy(), expect[batch.idxs.numpy()], rtol=2e-6)


# ---------------------------------------------------------------- new steps and max_priority

@pytest.mark.parametrize('full', [True, False])
def test_new_step_is_drawn_soon(full):
    max_sz = 1000
    n = max_sz if full else 600
    buf = per_buffer(n, max_sz=max_sz, seed=11)
    buf.update_priorities(np.arange(n), np.full(n, 1e-3))  # everything small; max_priority stays 1.0
    assert buf.max_priority == 1.0
    slot = buf.add(make_step(5000))
    assert slot.tolist() == [0 if full else n]  # a full ring overwrites its oldest slot
    assert buf.priorities[slot[0]] == buf.max_priority
    assert buf.memory[int(slot[0])].step_n.item() == 5000
    hits = [int(slot[0]) in buf.sample(32).idxs.tolist() for _ in range(3)]
    assert any(hits), "the new step was not drawn in three batches of 32"


def test_new_steps_enter_at_raised_max_priority():
    buf = per_buffer(4, max_sz=8, seed=0, alpha=0.5)
    buf.update_priorities([1], [7.5])
    assert buf.max_priority == 7.5 + EPS
    slots = buf.add(steps(3, 100))
    assert slots.tolist() == [4, 5, 6]
    assert (buf.priorities[4:7] == 7.5 + EPS).all()
    np.testing.assert_allclose(buf.kind[4:7], (7.5 + EPS) ** 0.5, rtol=1e-14)
    assert buf.kind[7] == 0 and buf.priorities[7] == 0  # never written


# ---------------------------------------------------------------- update_priorities

@pytest.mark.parametrize('kind', ['list', 'numpy', 'torch', 'torch-float32-grad'])
def test_update_priorities_stores_magnitude_plus_eps(kind):
    buf = per_buffer(8, seed=0, alpha=0.7, eps=1e-3)
    idxs, td = [6, 1, 3], [0.25, -4.0, 0.0]   # signed: the magnitude is stored
    if kind == 'numpy': idxs, td = np.array(idxs, np.int32), np.array(td)
    elif kind == 'torch': idxs, td = torch.tensor(idxs), torch.tensor(td, dtype=torch.float64)
    elif kind == 'torch-float32-grad': idxs, td = torch.tensor(idxs), torch.tensor(td, requires_grad=True) * 1.0
    buf.update_priorities(idxs, td)
    expect = np.ones(8)
    expect[[6, 1, 3]] = np.array([0.25, 4.0, 0.0]) + 1e-3
    np.testing.assert_array_equal(buf.priorities, expect)
    np.testing.assert_allclose(buf.kind[:], expect ** 0.7, rtol=1e-14)
    assert buf.max_priority == 4.0 + 1e-3
    assert buf.kind.total == pytest.approx((expect ** 0.7).sum(), rel=1e-12)


def test_update_priorities_last_repeat_wins_and_others_untouched():
    buf = per_buffer(8, seed=0)
    buf.update_priorities([0, 1, 2, 3, 4, 5, 6, 7], np.arange(8) / 10)
    before = buf.priorities.copy()
    buf.update_priorities([2, 5, 2, 2, 5], [9., 1., 0.3, 0.7, 2.5])
    expect = before.copy()
    expect[2], expect[5] = 0.7 + EPS, 2.5 + EPS
    np.testing.assert_array_equal(buf.priorities, expect)
    np.testing.assert_allclose(buf.kind[:], expect ** 0.6, rtol=1e-14)
    # the raw stored priorities are what the sampler uses
    counts = np.bincount(np.concatenate([buf.sample(400).idxs.numpy() for _ in range(10)]), minlength=8)
    probs = expect ** 0.6 / (expect ** 0.6).sum()
    assert chi_square(counts, probs) < CHI2_7DF_P001


def test_handed_back_idxs_update_as_a_copy_of_them_does():
    "The last batch's own `idxs` tensor (read without conversion) and a copy of it (converted) land the same."
    a, b = per_buffer(8, seed=3), per_buffer(8, seed=3)
    first_a, first_b = a.sample(4), b.sample(4)
    second_a, second_b = a.sample(4), b.sample(4)
    td = torch.tensor([0.5, -2.0, 0.25, 3.0])
    a.update_priorities(second_a.idxs, td); b.update_priorities(second_b.idxs.clone(), td)
    a.update_priorities(first_a.idxs, td / 2); b.update_priorities(first_b.idxs.clone(), td / 2)   # not the last
    np.testing.assert_array_equal(a.priorities, b.priorities)
    second_a.idxs[0] = 7   # the handed-out tensor shares its slots: an edit in place is what is read back
    a.update_priorities(second_a.idxs, td)
    assert a.priorities[7] == 0.5 + EPS

def test_max_priority_only_grows():
    buf = per_buffer(8, seed=0)
    assert buf.max_priority == 1.0
    buf.update_priorities([0], [3.])
    assert buf.max_priority == 3. + EPS
    buf.update_priorities([0, 1], [0.1, 0.2])
    assert buf.max_priority == 3. + EPS  # lower errors later do not lower it
    buf.update_priorities(torch.tensor([4]), torch.tensor([10.]))
    assert buf.max_priority == 10. + EPS
    buf.update_priorities([], [])  # an empty update is fine and changes nothing
    assert buf.max_priority == 10. + EPS


def test_pipe_forwards_priority_interface():
    er = per_pipe(6, max_sz=8, bs=4, alpha=0.5, beta=0.3, eps=1e-4)
    assert (er.alpha, er.beta, er.eps, er.max_priority) == (0.5, 0.3, 1e-4, 1.0)
    er.update_priorities([1, 2], [2., 3.])
    assert er.buffer.priorities[1:3].tolist() == [2. + 1e-4, 3. + 1e-4] and er.max_priority == 3. + 1e-4
    er.anneal_beta(0.5, final=0.9)
    assert er.beta == pytest.approx(0.6)
    er.beta = 0.75
    assert er.buffer.beta == 0.75
    er.alpha = 1.0
    assert er.buffer.alpha == 1.0
    np.testing.assert_allclose(er.buffer.kind[:6], er.buffer.priorities[:6], rtol=1e-14)


# ---------------------------------------------------------------- stale feedback

def test_stale_update_dropped_only_for_overwritten_slots():
    buf = per_buffer(8, max_sz=8, seed=0)
    batch = buf.sample(8)  # equal priorities, 8 segments: each slot exactly once
    assert sorted(batch.idxs.tolist()) == list(range(8))
    new = buf.add(steps(3, 100))  # the ring wraps: slots 0, 1, 2 get new occupants
    assert new.tolist() == [0, 1, 2]
    td = torch.tensor([50., 60., 70., 0.3, 0.4, 0.5, 0.6, 0.7], dtype=torch.float64)[batch.idxs]
    buf.update_priorities(batch.idxs, td)
    assert buf.priorities[:3].tolist() == [1.0] * 3  # new occupants keep max_priority
    np.testing.assert_array_equal(buf.priorities[3:], np.array([0.3, 0.4, 0.5, 0.6, 0.7]) + EPS)
    assert buf.max_priority == 1.0  # the dropped errors did not raise it either
    np.testing.assert_allclose(buf.kind[:], buf.priorities ** 0.6, rtol=1e-14)
    # once the new occupant has been sampled, its own update applies
    while 0 not in (b := buf.sample(4)).idxs.tolist(): pass
    buf.update_priorities([0], [2.])
    assert buf.priorities[0] == 2. + EPS


def test_stale_after_full_ring_wrap_and_repeat_sampling():
    buf = per_buffer(5, max_sz=5, seed=2)
    old = buf.sample(5).idxs
    assert sorted(old.tolist()) == list(range(5))
    buf.add(steps(7, 100))       # the ring wraps past its start: slots 0 and 1 are written twice
    buf.update_priorities(old, torch.full((5,), 9.))   # every slot was rewritten: all stale
    assert buf.priorities.tolist() == [1.0] * 5 and buf.max_priority == 1.0
    again = buf.sample(5).idxs    # the new occupants are sampled ...
    buf.add(steps(2, 200))       # ... then slots 2 and 3 are rewritten once more
    buf.update_priorities(again, torch.full((5,), 0.5))  # stale for 2 and 3 only
    assert buf.priorities.tolist() == [0.5 + EPS] * 2 + [1.0] * 2 + [0.5 + EPS]
    # (the design remembers only the write count of the *last* sampling, so an update from a sampling
    # before that one cannot be told apart; that limit is the design's, not tested here)


def test_update_for_written_never_sampled_slot_applies():
    buf = per_buffer(6, max_sz=4, seed=0)  # slots 0 and 1 written twice, nothing sampled
    buf.update_priorities([0, 1, 2, 3], [0.1, 0.2, 0.3, 0.4])
    np.testing.assert_array_equal(buf.priorities, np.array([0.1, 0.2, 0.3, 0.4]) + EPS)


# ---------------------------------------------------------------- anneal_beta and alpha

@pytest.mark.parametrize('beta0', [0.0, 0.4, 0.9])
@pytest.mark.parametrize('final', [1.0, 0.8, 0.2])
def test_anneal_beta_linear(beta0, final):
    buf = per_buffer(3, beta=beta0)
    for fraction in (0.0, 0.1, 0.25, 0.5, 0.9, 1.0, 0.3):  # not cumulative: always from beta0
        buf.anneal_beta(fraction, final=final)
        assert buf.beta == pytest.approx(beta0 + fraction * (final - beta0), abs=1e-12)
    buf.anneal_beta(1.0)  # default final is 1
    assert buf.beta == pytest.approx(1.0)


def test_set_alpha_relays_tree():
    buf = per_buffer(6, max_sz=8, seed=0, alpha=0.6)
    td = np.array([0.01, 0.5, 2., 7., 0.3, 11.])
    buf.update_priorities(np.arange(6), td)
    raw = buf.priorities.copy()
    for alpha in (0.0, 0.3, 1.0, 1.7, 0.6):
        buf.set_alpha(alpha)
        assert buf.alpha == alpha
        np.testing.assert_array_equal(buf.priorities, raw)  # raw priorities survive any alpha
        np.testing.assert_array_equal(buf.kind[:6], raw[:6] ** alpha)
        assert buf.kind[6:].tolist() == [0., 0.]  # unwritten slots stay out of the tree
        assert buf.kind.total == pytest.approx((raw[:6] ** alpha).sum(), rel=1e-12)
    buf.set_alpha(0.0)
    new = buf.add(make_step(99))
    assert buf.kind[int(new[0])] == 1.0 and buf.priorities[int(new[0])] == buf.max_priority == 11. + EPS


# ---------------------------------------------------------------- batch add

def _tracker(er): return (er._sz_tracker, er._idx_tracker, er._cycle_tracker, len(er))


@pytest.mark.parametrize('as_batch', [False, True])
@pytest.mark.parametrize('first,second', [(7, 6), (10, 3), (3, 10), (4, 25)])
def test_batch_add_wraps_like_experience_replay(as_batch, first, second):
    max_sz = 10
    per, er = per_pipe(first, max_sz=max_sz, alpha=0.5), ExperienceReplay(None, max_sz=max_sz)
    er.add(SimpleStep.from_steps(steps(first)))
    assert _tracker(per) == _tracker(er)
    per.update_priorities(np.arange(len(per)), np.linspace(0.1, 4.2, len(per)))
    top = per.max_priority
    assert top == 4.2 + EPS
    before = per.buffer.priorities.copy()
    new = steps(second, 100)
    batch = SimpleStep.from_steps(new) if as_batch else new
    slots = per.add(batch)
    er.add(batch)
    assert _tracker(per) == _tracker(er)
    expect_slots = [(first + j) % max_sz for j in range(second)][-max_sz:]
    assert slots.tolist() == expect_slots
    assert list(per.memory) == list(er.memory)
    for j, s in enumerate(expect_slots):
        assert per.memory[s].step_n.item() == 100 + second - len(expect_slots) + j
    written = np.zeros(max_sz, bool)
    written[expect_slots] = True
    assert (per.buffer.priorities[written] == top).all()
    np.testing.assert_allclose(per.buffer.kind[:][written], top ** 0.5, rtol=1e-14)
    np.testing.assert_array_equal(per.buffer.priorities[~written], before[~written])
    n_added = first + second
    assert _tracker(per) == (min(n_added, max_sz), (n_added - 1) % max_sz + 1, (n_added - 1) // max_sz, min(n_added, max_sz))


def test_empty_list_add_changes_nothing():
    buf = per_buffer(3, seed=0)
    before = snapshot(buf)
    assert buf.add([]).tolist() == []
    assert_unchanged(before, buf)


# ---------------------------------------------------------------- state_dict / save / load

def _busy_buffer(seed=3, max_sz=16):
    buf = per_buffer(25, max_sz=max_sz, seed=seed, alpha=0.7, beta=0.5, eps=1e-4)
    rng = np.random.default_rng(0)
    for _ in range(3):
        b = buf.sample(8)
        buf.update_priorities(b.idxs, rng.exponential(1.0, 8))
    buf.sample(8)  # sampled, not yet updated
    buf.add(steps(3, 500))  # ... and partly overwritten
    buf.anneal_beta(0.3)
    return buf


def test_save_load_round_trip(tmp_path):
    a = _busy_buffer()
    path = tmp_path / 'per.pt'
    a.save(path)
    b = PrioritizedReplayBuffer(max_sz=16, seed=999)
    b.load(path)
    c = PrioritizedReplayBuffer(max_sz=16, seed=12345, alpha=0.1)
    c.load_state_dict(a.state_dict())
    for other in (b, c):
        assert_state_equal(a.state_dict(), other.state_dict())
        assert (other.alpha, other.beta, other.beta0, other.eps, other.max_priority, other.bs) == \
               (a.alpha, a.beta, a.beta0, a.eps, a.max_priority, a.bs)
        np.testing.assert_allclose(other.kind[:], a.kind[:], rtol=1e-14)
        assert list(other.memory) == list(a.memory)
    rng = np.random.default_rng(1)
    for step in range(6):
        x, y, z = a.sample(8), b.sample(8), c.sample(8)
        assert torch.equal(x.idxs, y.idxs) and torch.equal(x.idxs, z.idxs)
        assert torch.equal(x.weights, y.weights) and torch.equal(x.weights, z.weights)
        assert x == y == z
        td = rng.exponential(1.0, 8)
        for buf in (a, b, c): buf.update_priorities(x.idxs, td)
        if step == 2:
            for buf in (a, b, c): buf.add(steps(5, 700))
        np.testing.assert_array_equal(a.priorities, b.priorities)
        np.testing.assert_array_equal(a.priorities, c.priorities)
        assert a.max_priority == b.max_priority == c.max_priority
    assert_state_equal(a.state_dict(), b.state_dict())


def test_pipe_save_load_round_trip(tmp_path):
    a = per_pipe(30, max_sz=20, bs=4, seed=8)
    a.update_priorities(np.arange(20), np.linspace(0, 3, 20))
    a.save(tmp_path / 'pipe.pt')
    b = PrioritizedExperienceReplay(None, max_sz=20, seed=1)
    b.load(tmp_path / 'pipe.pt')
    assert _tracker(a) == _tracker(b) and b.bs == 4
    for _ in range(4):
        x, y = a.sample(), b.sample()
        assert torch.equal(x.idxs, y.idxs) and torch.equal(x.weights, y.weights)


def test_empty_per_round_trip(tmp_path):
    a = PrioritizedReplayBuffer(max_sz=5, seed=0, alpha=0.3)
    a.save(tmp_path / 'empty.pt')
    b = per_buffer(3, max_sz=5)
    b.load(tmp_path / 'empty.pt')
    assert len(b) == 0 and b.kind.total == 0 and b.alpha == 0.3
    with pytest.raises(ValueError, match='empty'):
        b.sample()


def test_uniform_state_into_per_raises_and_changes_nothing(tmp_path):
    uniform = ReplayBuffer(max_sz=16, bs=2, seed=0)
    uniform.add(steps(20))
    per = _busy_buffer()
    before = snapshot(per)
    with pytest.raises(ValueError, match='ReplayBuffer'):
        per.load_state_dict(uniform.state_dict())
    assert_unchanged(before, per)
    uniform.save(tmp_path / 'uniform.pt')
    with pytest.raises(ValueError, match='ReplayBuffer'):
        per.load(tmp_path / 'uniform.pt')
    assert_unchanged(before, per)
    # and through the pipes
    pipe, er = per_pipe(5, max_sz=16), ExperienceReplay(None, max_sz=16)
    er.add(steps(5))
    before = snapshot(pipe)
    with pytest.raises(ValueError):
        pipe.load_state_dict(er.state_dict())
    assert_unchanged(before, pipe)


def test_per_state_into_uniform_raises_and_changes_nothing(tmp_path):
    uniform = ReplayBuffer(max_sz=16, bs=2, seed=0)
    uniform.add(steps(20))
    before = uniform.state_dict()
    per = _busy_buffer()
    with pytest.raises(ValueError, match='PrioritizedReplayBuffer'):
        uniform.load_state_dict(per.state_dict())
    assert_state_equal(before, uniform.state_dict())
    per.save(tmp_path / 'per.pt')
    with pytest.raises(ValueError, match='PrioritizedReplayBuffer'):
        uniform.load(tmp_path / 'per.pt')
    assert_state_equal(before, uniform.state_dict())
    twin = ReplayBuffer(max_sz=16, bs=2, seed=77)
    twin.load_state_dict(before)
    x, y = uniform.sample(), twin.sample()  # the sampler's state is untouched as well
    assert x == y and torch.equal(x.idxs, y.idxs)


# ---------------------------------------------------------------- bad input

def _full(): return per_buffer(8, max_sz=8, seed=0)
def _part(): return per_buffer(5, max_sz=8, seed=0)
def _sampled():
    buf = _full()
    buf.update_priorities(np.arange(8), TD8)
    buf.sample(4)
    return buf
def _empty(): return PrioritizedReplayBuffer(max_sz=8, seed=0)
def _pipe(): return per_pipe(6, max_sz=8, bs=2)


def _bad_eps_state(buf):
    state = _full().state_dict()
    state['eps'] = 0.0
    buf.load_state_dict(state)


def _large_priority():
    buf = per_buffer(4, max_sz=4)
    buf.update_priorities([1], [1e10])
    return buf


def _large_max_priority():
    "A stored priority of 1e10 lowered again: only max_priority keeps it."
    buf = _large_priority()
    buf.update_priorities([1], [0.5])
    assert buf.max_priority > 1e10 and buf.priorities.max() < 2
    return buf


nan, inf = float('nan'), float('inf')

BAD_INPUT = [
    # id, buffer to build first (or None), action, substrings of the ValueError's message
    ('alpha<0', None, lambda _: PrioritizedReplayBuffer(alpha=-0.5), ['alpha', '-0.5']),
    ('alpha=nan', None, lambda _: PrioritizedReplayBuffer(alpha=nan), ['alpha', 'nan']),
    ('set_alpha<0', _sampled, lambda b: b.set_alpha(-1.5), ['alpha', '-1.5']),
    ('set_alpha=inf', _sampled, lambda b: b.set_alpha(inf), ['alpha', 'inf']),
    ('pipe alpha<0', _pipe, lambda p: setattr(p, 'alpha', -2.0), ['alpha', '-2.0']),
    ('beta<0', None, lambda _: PrioritizedReplayBuffer(beta=-0.25), ['beta', '-0.25']),
    ('set_beta<0', _sampled, lambda b: b.set_beta(-0.125), ['beta', '-0.125']),
    ('pipe beta<0', _pipe, lambda p: setattr(p, 'beta', -3.0), ['beta', '-3.0']),
    ('eps=0', None, lambda _: PrioritizedReplayBuffer(eps=0), ['eps', '0']),
    ('eps<0', None, lambda _: PrioritizedReplayBuffer(eps=-1e-3), ['eps', '-0.001']),
    ('eps=nan', None, lambda _: PrioritizedReplayBuffer(eps=nan), ['eps', 'nan']),
    ('state eps=0', _sampled, _bad_eps_state, ['eps', '0.0']),
    ('td nan', _sampled, lambda b: b.update_priorities([0, 1, 2], [0.5, nan, 0.2]), ['nan']),
    ('td inf', _sampled, lambda b: b.update_priorities([3, 4], [0.5, inf]), ['inf']),
    ('td -inf', _sampled, lambda b: b.update_priorities([3], torch.tensor([-inf])), ['-inf']),
    ('td 1e308 twice, alpha 1', lambda: per_buffer(4, max_sz=4, alpha=1.0),
     lambda b: b.update_priorities([0, 1], [1e308, 1e308]), ['1e+308', 'overflows']),
    ('td 1e154, alpha 2', lambda: per_buffer(4, max_sz=4, alpha=2.0),
     lambda b: b.update_priorities([0], [1e154]), ['1e+154', 'overflows']),
    ('one huge update after two adds', lambda: per_buffer(2, max_sz=4, alpha=1.0),
     lambda b: b.update_priorities([0], [1.7e308]), ['overflows']),
    ('set_alpha(40) over a large priority', _large_priority, lambda b: b.set_alpha(40), ['1e+10', 'alpha=40', 'overflows']),
    ('set_alpha(40) over max_priority', _large_max_priority, lambda b: b.set_alpha(40), ['max_priority', 'overflows']),
    ('pipe td nan', _pipe, lambda p: p.update_priorities([0, 1], [nan, 1.0]), ['nan']),
    ('idx -1', _sampled, lambda b: b.update_priorities([0, -1], [0.5, 0.5]), ['-1']),
    ('idx >= max_sz', _sampled, lambda b: b.update_priorities([2, 8], [0.5, 0.5]), ['8']),
    ('idx huge', _sampled, lambda b: b.update_priorities(torch.tensor([123456]), torch.tensor([0.5])), ['123456']),
    ('idx never written', _part, lambda b: b.update_priorities([1, 6], [0.5, 0.5]), ['6', '5']),
    ('idx on empty buffer', _empty, lambda b: b.update_priorities([0], [0.5]), ['0']),
    ('length mismatch', _sampled, lambda b: b.update_priorities([0, 1, 2], [1., 2.]), ['3', '2']),
    ('length mismatch td longer', _sampled, lambda b: b.update_priorities([0], [1., 2., 3., 4.]), ['1', '4']),
    ('sample empty', _empty, lambda b: b.sample(), ['empty']),
    ('sample empty bs=4', _empty, lambda b: b.sample(4), ['empty']),
    ('sample bs=0', _sampled, lambda b: b.sample(0), ['bs', '0']),
    ('sample bs=-3', _sampled, lambda b: b.sample(-3), ['bs', '-3']),
    ('sample bs=2.5', _sampled, lambda b: b.sample(2.5), ['bs', '2.5']),
    ('pipe sample bs=0', _pipe, lambda p: p.sample(0), ['bs', '0']),
    ('ctor bs=0', None, lambda _: PrioritizedReplayBuffer(bs=0), ['bs', '0']),
    ('anneal fraction<0', _sampled, lambda b: b.anneal_beta(-0.1), ['fraction', '-0.1']),
    ('anneal fraction=nan', _sampled, lambda b: b.anneal_beta(nan), ['fraction', 'nan']),
    ('anneal final<0', _sampled, lambda b: b.anneal_beta(0.5, final=-1.0), ['final', '-1.0']),
    ('overflow under alpha>1', lambda: per_buffer(4, max_sz=4, alpha=2.0),
     lambda b: b.update_priorities([0, 1], [1.0, 1e200]), ['1e+200', 'alpha=2.0']),
    ('non-integral idx', _sampled, lambda b: b.update_priorities([1.5], [3.0]), ['1.5']),
]


def _case(c):
    "A table row as a pytest.param with its first value as id."
    return pytest.param(*c[1:], id=c[0])


@pytest.mark.filterwarnings('ignore:overflow encountered:RuntimeWarning')
@pytest.mark.parametrize('build,action,contains', [_case(c) for c in BAD_INPUT])
def test_bad_input(build, action, contains): assert_refused_unchanged(build, action, contains)


# ---------------------------------------------------------------- the pipe

def _cartpole(n): return GymTransformBlock(None, n=n, seed=0)(['CartPole-v1']).unbatch()


def test_pipe_trackers_and_batches_match_experience_replay():
    per = PrioritizedExperienceReplay(_cartpole(60), bs=4, max_sz=20, seed=0)
    er = ExperienceReplay(_cartpole(60), bs=4, max_sz=20, seed=0)
    batches, uniform = list(per), list(er)
    # fastrl's convention: idx reads max_sz right after a fill, cycle counts the wraps: 60 = 3 fills
    assert _tracker(per) == _tracker(er) == (20, 20, 2, 20)
    assert len(batches) == len(uniform) == 60 - 4 + 1
    assert list(per.memory) == list(er.memory)
    for b in batches:
        assert isinstance(b, SimpleStep) and len(b) == 4
        assert b.idxs.dtype == torch.int64 and b.weights.dtype == torch.float32
        assert b.weights.shape == (4,) and (b.weights <= 1 + 1e-6).all()
    # nothing was updated: every stored step sits at max_priority, so all weights are one
    assert all(torch.equal(b.weights, torch.ones(4)) for b in batches)
    assert (per.buffer.priorities == 1.0).all()


def test_pipe_return_idxs_and_feedback_in_the_loop():
    per = PrioritizedExperienceReplay(_cartpole(40), bs=8, max_sz=16, return_idxs=True, seed=0)
    n, seen_weights = 0, []
    for batch, idxs in per:
        assert isinstance(batch, SimpleStep) and torch.equal(batch.idxs, idxs) and idxs.dtype == torch.int64
        for row, i in zip(batch, idxs.tolist()): assert row == per.memory[i]
        seen_weights.append(batch.weights)
        per.update_priorities(idxs, batch.reward.abs() * (idxs.float() + 1) / 4)  # a stand-in |td|
        n += 1
    assert n == 40 - 8 + 1
    assert _tracker(per) == (16, 8, 2, 16)
    assert any((w < 1).any() for w in seen_weights)  # the feedback changed the distribution
    assert per.max_priority >= 1.0
    batch, idxs = per.sample()
    assert torch.equal(batch.idxs, idxs) and len(idxs) == 8


def test_pipe_wraps_a_list_source():
    from torch.utils.data.datapipes.iter import IterableWrapper
    src = IterableWrapper([make_step(i) for i in range(10)])
    per = PrioritizedExperienceReplay(src, bs=3, max_sz=4, seed=0)
    out = list(per)
    assert len(out) == 8 and _tracker(per) == (4, 2, 2, 4)
    assert [s.step_n.item() for s in per.memory] == [8, 9, 6, 7]


def test_a_nan_td_error_is_named_as_a_user_writes_it():
    "The message shows `nan`, not numpy's repr `np.float64(nan)`, and the buffer is unchanged."
    buf = PrioritizedReplayBuffer(max_sz=8, bs=2, seed=0)
    for _ in range(2): buf.add(state=[0.], action=0, reward=0., next_state=[1.], terminated=False)
    batch = buf.sample()
    with pytest.raises(ValueError) as e: buf.update_priorities(batch.idxs, np.array([np.nan, 1.]))
    assert str(e.value).endswith('must be finite, got nan'), str(e.value)


def test_the_runs_page_lists_every_replay_tag():
    from pathlib import Path
    page = (Path(__file__).resolve().parents[1] / 'docs' / 'runs.md').read_text()
    for tag in ('replay/mean_priority', 'replay/max_priority', 'replay/mean_weight', 'replay/stale_dropped'):
        assert f'`{tag}`' in page, tag
