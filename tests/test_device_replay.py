"""The device path (`fastrl_per.devicetree`) against the host one, on `device='cpu'`: the tree's sums and draws, the
priority core's draws, weights, stale rule and max priority, float32 trees on adversarial priorities, the state."""
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from fastrl_per.devicetree import DevicePriorities, DeviceSumTree, last_writes
from fastrl_per.priorities import Priorities
from fastrl_per.sumtree import SumTree


class Given:
    "A stand-in for a numpy Generator that hands the host core the uniforms a test chose, so both cores draw on them."
    def __init__(self, r): self.r = r
    def random(self, n):
        assert n == len(self.r)
        return self.r


fractions = st.floats(0, 1, exclude_max=True)
values = st.one_of(st.just(0.0), st.floats(1e-6, 1e6))


@st.composite
def tree_histories(draw):
    "A capacity and a few batches of (index, value) writes, indices often repeated."
    capacity = draw(st.one_of(st.integers(1, 40), st.sampled_from([1, 2, 3, 5, 64, 100, 257])))
    batch = st.lists(st.tuples(st.integers(0, capacity - 1), values), min_size=1, max_size=30)
    return capacity, draw(st.lists(batch, min_size=1, max_size=5))


@settings(max_examples=200, deadline=None)
@given(tree_histories(), st.lists(fractions, min_size=1, max_size=20))
def test_the_device_tree_holds_and_draws_what_the_host_tree_does(history, r):
    capacity, batches = history
    host, dev = SumTree(capacity), DeviceSumTree(capacity)
    for batch in batches:
        idxs, vals = (np.array(x) for x in zip(*batch))
        host.update(idxs, vals)
        dev.update(torch.from_numpy(idxs), torch.from_numpy(vals))
        assert np.array_equal(dev.sums.numpy(), host._sum)      # the same sums in the same order: bit for bit
        assert float(dev.min) == host.min
        if host.total > 0:
            r = np.array(r)
            found, leaves = dev.find_strata(torch.from_numpy(r))
            want, want_leaves = host.find_strata(r)
            assert np.array_equal(found.numpy(), want) and np.array_equal(leaves.numpy(), want_leaves)
            assert (want_leaves > 0).all()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.just(0.), st.floats(2. ** -100, 2. ** 100, width=32)), min_size=1, max_size=300),
       st.lists(st.one_of(st.just(0.), st.just(1 - 2 ** -24), fractions), min_size=1, max_size=64))
def test_a_float32_tree_never_draws_a_slot_holding_zero(leaves, r):
    leaves = torch.tensor(leaves, dtype=torch.float32)
    if not leaves.sum() > 0: leaves[-1] = 2 ** -100                 # something must be drawable
    tree = DeviceSumTree(len(leaves), dtype=torch.float32)
    tree.set_leaves(leaves)
    found, values = tree.find_strata(torch.tensor(r))
    assert (leaves[found] > 0).all() and torch.equal(values, leaves[found])
    assert ((found >= 0) & (found < len(leaves))).all()


def test_last_writes_keeps_the_last_value_of_each_index():
    idxs = torch.tensor([3, 1, 3, 3, 0, 1])
    keys, vals = last_writes(idxs, torch.arange(6.))
    assert keys.tolist() == [0, 1, 1, 3, 3, 3] and vals.tolist() == [4., 5., 5., 3., 3., 3.]


def ops(capacity):
    "One step of a core's life: add n new keys at a start, or draw a batch and send TD errors for some of its keys."
    add = st.tuples(st.just('add'), st.integers(0, capacity - 1), st.integers(1, capacity))
    td = st.floats(-1e3, 1e3)
    draw = st.tuples(st.just('draw'), st.lists(fractions, min_size=1, max_size=16),
                     st.lists(st.tuples(st.integers(0, 15), td), max_size=20))
    knob = st.tuples(st.just('beta'), st.floats(0, 1))
    return st.one_of(add, draw, knob)


@st.composite
def core_histories(draw):
    capacity = draw(st.sampled_from([1, 2, 7, 16, 33]))
    settings_ = dict(alpha=draw(st.sampled_from([0.5, 1.0])), weight_norm=draw(st.sampled_from(['batch', 'buffer'])),
                     stale_rule=draw(st.booleans()))
    return capacity, settings_, draw(st.lists(ops(capacity), min_size=1, max_size=12))


def assert_same_core(dev, host):
    assert np.array_equal(dev.raw.numpy(), host.raw)
    assert np.array_equal(dev.writes.numpy(), host.writes) and np.array_equal(dev.sampled_at.numpy(), host.sampled_at)
    assert np.array_equal(dev.tree.leaves.numpy(), host.tree[:])
    assert (dev.max_priority, dev.stale_dropped, dev.beta) == (host.max_priority, host.stale_dropped, host.beta)


@settings(max_examples=300, deadline=None)
@given(core_histories())
def test_the_device_core_follows_the_host_core(history):
    """Adds, draws, updates with repeated keys (the last wins) and stale ones (dropped), beta moves: the same keys,
    weights, priorities, write counts, max priority and drop count. Alpha 0.5 and 1 are exact powers in both numpy
    and torch (a square root, the value itself); other alphas may differ in the last bit (the next test)."""
    capacity, kw, steps = history
    host, dev = Priorities(capacity, **kw), DevicePriorities(capacity, **kw)
    for op, *args in steps:
        if op == 'add':
            start, n = args
            host.add(start, n), dev.add(start, n)
        elif op == 'beta':
            host.anneal_beta(args[0]), dev.anneal_beta(args[0])
        elif host.raw.max() > 0:
            r, feedback = np.array(args[0]), args[1]
            keys, weights = host.draw(Given(r), len(r))
            dkeys, dweights = dev.draw(torch.from_numpy(r))
            assert np.array_equal(dkeys.numpy(), keys) and np.array_equal(dweights.numpy(), weights)
            if feedback:
                at, td = (np.array(x) for x in zip(*feedback))
                chosen = keys[at % len(keys)]                    # repeats among them are common
                host.update(chosen, td)
                dev.update(torch.from_numpy(chosen), torch.from_numpy(td))
        assert_same_core(dev, host)


def test_at_the_default_alpha_the_draws_match_and_the_leaves_agree_to_the_last_bit():
    host, dev = Priorities(1000), DevicePriorities(1000)
    rng = np.random.default_rng(0)
    for core in (host, dev): core.add(0, 1000)
    for step in range(50):
        r = rng.random(64)
        keys, weights = host.draw(Given(r), 64)
        dkeys, dweights = dev.draw(torch.from_numpy(r))
        assert np.array_equal(dkeys.numpy(), keys)
        assert np.allclose(dweights.numpy(), weights, rtol=1e-6, atol=0)
        td = rng.normal(size=64) * 10
        host.update(keys, td), dev.update(dkeys, torch.from_numpy(td))
    assert np.array_equal(dev.raw.numpy(), host.raw)
    assert np.allclose(dev.tree.leaves.numpy(), host.tree[:], rtol=4e-16, atol=0)


@pytest.mark.parametrize('weight_norm', ['batch', 'buffer'])
def test_the_weights_are_the_host_formula(weight_norm):
    dev = DevicePriorities(8, alpha=1., beta=0.5, weight_norm=weight_norm)
    dev.add(0, 8)
    dev.update(torch.arange(8), torch.tensor([1., 2., 3., 4., 5., 6., 7., 8.]) - 1e-6)   # priorities 1..8
    keys, weights = dev.draw(torch.full((4,), 0.5, dtype=torch.float64))
    least = dev.tree.leaves[keys].min() if weight_norm == 'batch' else 1.
    assert torch.allclose(weights.double(), (dev.tree.leaves[keys] / least) ** -0.5)
    assert weights.max() <= 1


def test_an_update_for_a_rewritten_key_is_dropped_and_counted():
    dev = DevicePriorities(4, alpha=1.)
    dev.add(0, 4)
    keys, _ = dev.draw(torch.zeros(4, dtype=torch.float64))
    dev.add(int(keys[0]), 1)                                   # that slot gets a new occupant
    before = dev.raw[keys[0]].clone()
    dev.update(keys, torch.full((4,), 9.))
    assert dev.stale_dropped == 1 and dev.raw[keys[0]] == before
    assert dev.max_priority == 9 + dev.eps


@pytest.mark.parametrize('keys, td, message', [
    ([0, 4], [1., 1.], 'is not a written slot'),
    ([-1], [1.], 'is not a written slot'),
    ([0, 1], [1., math.nan], 'must be finite'),
    ([0, 1], [1., math.inf], 'must be finite'),
    ([0, 1], [1.], 'do not pair'),
    ([0.5], [1.], 'integer keys'),
])
def test_a_bad_update_is_named_and_stores_nothing(keys, td, message):
    dev = DevicePriorities(4)
    dev.add(0, 4)
    state = dev.state_dict(np.arange(4))
    with pytest.raises(ValueError, match=message): dev.update(torch.tensor(keys), torch.tensor(td))
    assert_states_equal(dev.state_dict(np.arange(4)), state)


def test_an_update_that_would_overflow_is_refused():
    dev = DevicePriorities(4, alpha=3.)
    dev.add(0, 4)
    with pytest.raises(ValueError, match='overflows'): dev.update(torch.tensor([1]), torch.tensor([1e120], dtype=torch.float64))
    assert dev.max_priority == 1


def assert_states_equal(a, b):
    assert a.keys() == b.keys()
    for k in a: assert torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k], k


def test_the_state_is_the_host_cores_both_ways():
    host, dev = Priorities(16), DevicePriorities(16)
    rng = np.random.default_rng(3)
    for core in (host, dev): core.add(0, 12)
    r = rng.random(8)
    keys, _ = host.draw(Given(r), 8)
    dkeys, _ = dev.draw(torch.from_numpy(r))
    td = rng.normal(size=8)
    host.update(keys, td), dev.update(dkeys, torch.from_numpy(td))
    stored = np.arange(12)
    assert_states_equal(dev.state_dict(stored), host.state_dict(stored))
    twin = DevicePriorities(16)
    twin.load_state_dict(host.state_dict(stored), stored)
    assert_same_core(twin, host)
    with pytest.raises(ValueError, match='max_priority'):
        twin.load_state_dict(dict(host.state_dict(stored), max_priority=-1.), stored)
    assert_same_core(twin, host)                               # a refused state changed nothing


def test_alpha_re_lays_the_tree_as_the_host_does():
    host, dev = Priorities(16, alpha=1.), DevicePriorities(16, alpha=1.)
    for core in (host, dev): core.add(0, 16)
    td = np.linspace(-3, 3, 16)
    host.update(np.arange(16), td), dev.update(torch.arange(16), torch.from_numpy(td))
    host.alpha = dev.alpha = 0.5
    assert_same_core(dev, host)
    with pytest.raises(ValueError, match='alpha'): dev.alpha = -1
    with pytest.raises(ValueError, match='overflows'): dev.alpha = 1e4
    assert dev.alpha == 0.5
