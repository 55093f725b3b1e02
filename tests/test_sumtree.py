"Property and bad-input tests for `fastrl_per.replay.sumtree.SumTree`."
import math
import re

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from fastrl_per.replay.sumtree import SumTree


TREES = [SumTree]


def stored_levels(tree):
    "For each level above the leaves, root included: (sums, left child sums, right child sums)."
    S = tree._sum
    for level in range(tree._depth):
        lo, hi = 1 << level, 2 << level
        yield S[lo:hi], S[2*lo:2*hi:2], S[2*lo+1:2*hi:2]


def check_tree(tree, leaves, us):
    "Everything that must hold for a tree whose leaves should equal `leaves`; `us` are fractions of the total."
    assert np.array_equal(tree[:], leaves)
    for sums, left, right in stored_levels(tree):
        assert np.array_equal(sums, left + right)             # computed the same way, so exactly equal
    if tree._min is not None:                                  # the cached minimum and its count, before any rescan
        assert tree._min == min((v for v in leaves if v > 0), default=math.inf)
        assert tree._min_count == (np.count_nonzero(leaves == tree._min) if tree._min < math.inf else 0)
    assert math.isclose(tree.total, math.fsum(leaves), rel_tol=1e-12, abs_tol=0)
    assert tree.min == min((v for v in leaves if v > 0), default=math.inf)
    if tree.total == 0: return
    cumsum = np.cumsum(leaves)
    u = np.array(us) * tree.total
    found = tree.find(u)
    assert found.dtype == np.int64
    near_boundary = np.abs(u[:, None] - cumsum[None, :]).min(1) <= 1e-9 * tree.total
    expected = np.searchsorted(cumsum, u, side='right')
    assert np.array_equal(found[~near_boundary], expected[~near_boundary])
    assert (leaves[found] > 0).all()                           # ties may go either way, never to an empty leaf
    assert tree.find([tree.total])[0] == np.flatnonzero(leaves)[-1]


values = st.one_of(st.just(0.0), st.floats(1e-6, 1e6))


@st.composite
def histories(draw):
    "A tree class, a capacity, and a few batches of (index, value) writes, indices often repeated."
    cls = draw(st.sampled_from(TREES))
    capacity = draw(st.one_of(st.integers(1, 40), st.sampled_from([1, 2, 3, 5, 64, 100, 257])))
    batch = st.lists(st.tuples(st.integers(0, capacity - 1), values), min_size=1, max_size=30)
    return cls, capacity, draw(st.lists(batch, min_size=1, max_size=5))


@settings(max_examples=300, deadline=None)
@given(histories(), st.lists(st.floats(0, 1), min_size=1, max_size=20))
def test_random_histories(history, us):
    cls, capacity, batches = history
    tree, leaves = cls(capacity), np.zeros(capacity)
    for batch in batches:
        idxs, vals = zip(*batch)
        tree.update(list(idxs), list(vals))
        for i, v in batch: leaves[i] = v                       # one write at a time: the last one wins
        check_tree(tree, leaves, us)


@pytest.mark.parametrize('cls', TREES)
@pytest.mark.parametrize('capacity', [1, 1000, 1024, 1025, 5000, 2**14 + 3])
def test_large_sparse_trees(cls, capacity):
    "Trees across the cut: sparse leaves, many batches, and prefix sums on and around every boundary."
    rng = np.random.default_rng(capacity)
    tree, leaves = cls(capacity), np.zeros(capacity)
    for _ in range(20):
        idxs = rng.integers(0, capacity, 64)
        vals = np.where(rng.random(64) < 0.6, 0.0, rng.random(64) * 10 ** rng.uniform(-3, 3, 64))
        tree.update(idxs, vals)
        for i, v in zip(idxs, vals): leaves[i] = v
    leaves[rng.integers(0, capacity)] = 0.1                     # at least one positive leaf
    tree.update(np.arange(capacity), leaves)
    check_tree(tree, leaves, rng.random(500))
    boundaries = np.cumsum(leaves)
    u = np.concatenate([boundaries, np.nextafter(boundaries, -np.inf), np.nextafter(boundaries, np.inf)])
    u = u[(u >= 0) & (u <= tree.total)]
    assert (leaves[tree.find(u)] > 0).all()


def test_repeated_indices_last_write_wins():
    tree = SumTree(8)
    tree.update(np.array([3, 3, 1, 3, 1]), np.array([1., 2., 3., 4., 5.]))
    assert tree[3] == 4. and tree[1] == 5. and tree.total == 9. and tree.min == 4.


def test_state_dict_round_trip_and_indexing():
    rng = np.random.default_rng(0)
    tree = SumTree(3000)
    tree.update(rng.integers(0, 3000, 700), rng.random(700))
    state = tree.state_dict()
    assert state['capacity'] == 3000 and state['leaves'].dtype == np.float64
    state['leaves'][0] = 123.                                   # a copy: the tree does not change
    assert tree[0] != 123.
    loaded = SumTree(3000)
    loaded.load_state_dict(tree.state_dict())
    assert np.array_equal(loaded._sum, tree._sum) and loaded.min == tree.min
    assert len(tree) == 3000 and tree[[1, 2]].shape == (2,)
    with pytest.raises(IndexError): tree[3000]


def filled_tree():
    tree = SumTree(10)
    tree.update(np.arange(10), np.arange(10.) / 2)              # total 22.5, leaf 0 empty
    return tree


BAD_CALLS = [  # (what, call on a filled tree, text the message must contain)
    ('index == capacity', lambda t: t.update([1, 10], [1., 1.]), 'leaf index 10'),
    ('negative index', lambda t: t.update([-1], [1.]), 'leaf index -1'),
    ('float indices', lambda t: t.update([0.5], [1.]), 'float64'),
    ('length mismatch', lambda t: t.update([0, 1, 2], [1., 2.]), '(3,) and (2,)'),
    ('2-d indices', lambda t: t.update([[0, 1]], [[1., 2.]]), '(1, 2)'),
    ('negative value', lambda t: t.update([0, 1], [1., -2.5]), '-2.5'),
    ('NaN value', lambda t: t.update([0, 1], [np.nan, 1.]), 'nan'),
    ('inf value', lambda t: t.update([0, 1], [1., np.inf]), 'inf'),
    ('negative prefix sum', lambda t: t.find([1., -0.25]), '-0.25'),
    ('prefix sum above total', lambda t: t.find([23.5]), '23.5'),
    ('NaN prefix sum', lambda t: t.find([np.nan]), 'nan'),
    ('inf prefix sum', lambda t: t.find([1., np.inf]), 'inf'),
    ('load: other capacity', lambda t: t.load_state_dict(SumTree(11).state_dict()), 'capacity 11'),
    ('load: bad leaf', lambda t: t.load_state_dict({'capacity': 10, 'leaves': [0.] * 9 + [-7.]}), '-7.0'),
    ('load: wrong shape', lambda t: t.load_state_dict({'capacity': 10, 'leaves': np.ones(9)}), '(9,)'),
]


@pytest.mark.parametrize('call,text', [b[1:] for b in BAD_CALLS], ids=[b[0] for b in BAD_CALLS])
def test_bad_input_leaves_tree_unchanged(call, text):
    tree = filled_tree()
    before, sums, mins = tree.state_dict(), tree._sum.copy(), (tree._min, tree._min_count)
    with pytest.raises(ValueError) as e: call(tree)
    assert text in str(e.value)
    after = tree.state_dict()
    assert before.keys() == after.keys() and all(np.array_equal(before[k], after[k]) for k in before)
    assert np.array_equal(tree._sum, sums) and (tree._min, tree._min_count) == mins


@pytest.mark.parametrize('capacity', [0, -3, 2.5, '8', True, None])
def test_bad_capacity(capacity):
    with pytest.raises(ValueError, match=re.escape(f"capacity={capacity!r} is not an int")): SumTree(capacity)


def test_find_on_empty_tree():
    tree = SumTree(4)
    with pytest.raises(ValueError, match='total is 0.0'): tree.find([0.])
    tree.update([2], [1.])
    tree.update([2], [0.])                                      # cleared again
    with pytest.raises(ValueError, match='total is 0.0'): tree.find([0.])
    assert tree.min == math.inf


def test_walk_and_rebuild_give_the_same_bits():
    "Small batches walk paths up, large ones recompute whole levels: the nodes must agree exactly."
    rng = np.random.default_rng(1)
    leaves = np.where(rng.random(3000) < 0.3, 0., rng.random(3000))
    walked, rebuilt = SumTree(3000), SumTree(3000)
    for chunk in np.array_split(rng.permutation(3000), 300):   # 10 leaves a call: below 4096 // 16
        walked.update(chunk, leaves[chunk])
    rebuilt.update(np.arange(3000), leaves)
    assert np.array_equal(walked._sum, rebuilt._sum) and walked.min == rebuilt.min


@settings(max_examples=100, deadline=None, database=None)
@given(st.integers(1, 70), st.data())
def test_set_range_matches_update(capacity, data):
    "Writing a run of leaves with set_range leaves the same tree as update with their indices."
    start = data.draw(st.integers(0, capacity - 1))
    values = data.draw(st.lists(st.floats(0, 1e3), min_size=0, max_size=capacity - start))
    by_range, by_update = SumTree(capacity), SumTree(capacity)
    for tree in (by_range, by_update): tree.update(np.arange(capacity), np.ones(capacity))
    by_range.set_range(start, values)
    by_update.update(np.arange(start, start + len(values)), values)
    assert np.array_equal(by_range._sum, by_update._sum)
    assert by_range.min == by_update.min
    assert by_range.total == by_update.total
