"""The device path (`fastrl_per.replay.devicetree`) against the host one, on `device='cpu'`: the tree's sums and draws, the
priority core's draws, weights, stale rule and max priority, float32 trees on adversarial priorities, the state."""
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from fastrl_per.replay.devicetree import DevicePriorities, DeviceSumTree, last_writes
from fastrl_per.replay.priorities import Priorities
from fastrl_per.replay.sumtree import SumTree


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
    settings_ = dict(alpha=draw(st.sampled_from([0.0, 1.0])), weight_norm=draw(st.sampled_from(['batch', 'buffer'])),
                     stale_rule=draw(st.booleans()))
    return capacity, settings_, draw(st.lists(ops(capacity), min_size=1, max_size=12))


def assert_same_core(dev, host):
    assert np.array_equal(dev.raw.numpy(), host.raw)
    assert np.array_equal(dev.writes.numpy(), host.writes) and np.array_equal(dev.sampled_at.numpy(), host.sampled_at)
    assert np.array_equal(dev.kind.leaves.numpy(), host.kind[:])
    assert (dev.max_priority, dev.stale_dropped, dev.beta) == (host.max_priority, host.stale_dropped, host.beta)


@settings(max_examples=300, deadline=None)
@given(core_histories())
def test_the_device_core_follows_the_host_core(history):
    """Adds, draws, updates with repeated keys (the last wins) and stale ones (dropped), beta moves: the same keys,
    weights, priorities, write counts, max priority and drop count. Alpha 0 and 1 are exact powers in numpy and torch
    alike; for other alphas torch's pow may differ from numpy's in the last bit (the next test)."""
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
            dkeys, dweights = dev.draw_given(torch.from_numpy(r))
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
        dkeys, dweights = dev.draw_given(torch.from_numpy(r))
        assert np.array_equal(dkeys.numpy(), keys)
        assert np.allclose(dweights.numpy(), weights, rtol=1e-6, atol=0)
        td = rng.normal(size=64) * 10
        host.update(keys, td), dev.update(dkeys, torch.from_numpy(td))
    assert np.array_equal(dev.raw.numpy(), host.raw)
    assert np.allclose(dev.kind.leaves.numpy(), host.kind[:], rtol=4e-16, atol=0)


@pytest.mark.parametrize('weight_norm', ['batch', 'buffer'])
def test_the_weights_are_the_host_formula(weight_norm):
    dev = DevicePriorities(8, alpha=1., beta=0.5, weight_norm=weight_norm)
    dev.add(0, 8)
    dev.update(torch.arange(8), torch.tensor([1., 2., 3., 4., 5., 6., 7., 8.]) - 1e-6)   # priorities 1..8
    keys, weights = dev.draw_given(torch.full((4,), 0.5, dtype=torch.float64))
    least = dev.kind.leaves[keys].min() if weight_norm == 'batch' else 1.
    assert torch.allclose(weights.double(), (dev.kind.leaves[keys] / least) ** -0.5)
    assert weights.max() <= 1


def test_an_update_for_a_rewritten_key_is_dropped_and_counted():
    dev = DevicePriorities(4, alpha=1.)
    dev.add(0, 4)
    keys, _ = dev.draw_given(torch.zeros(4, dtype=torch.float64))
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
    dkeys, _ = dev.draw_given(torch.from_numpy(r))
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


# The buffers on a device: the host buffer's draws, priorities, schema, errors and saves

from conftest import assert_refused_unchanged, assert_state_equal
from fastrl_per.core import SimpleStep
from fastrl_per.replay.memory import DeviceStorage, ReplayBuffer
from fastrl_per.replay.per import PrioritizedReplayBuffer

BUFFERS = [ReplayBuffer, PrioritizedReplayBuffer]


def fields(rng, k):
    "A batch of `k` transitions with a 3-float state, an int action and an extra int field, as numpy arrays."
    state = rng.random((k, 3)).astype(np.float32)
    return dict(state=state, action=rng.integers(0, 4, k), reward=rng.random(k).astype(np.float32),
                next_state=state + 1, terminated=rng.random(k) > 0.8, env_id=rng.integers(0, 2, k))


def given_as(kw, how):
    "The same fields as numpy (0), torch tensors (1) or, for one row, Python values where they are numbers (2)."
    if how == 0: return kw
    if how == 1: return {n: torch.from_numpy(np.asarray(v)) for n, v in kw.items()}
    return {n: v.tolist() if n != 'state' and n != 'next_state' else torch.from_numpy(v) for n, v in kw.items()}


def host_view(state):
    "A buffer state with the storage's name left out: the device buffer's is `DeviceStorage`, the host's `RingStorage`."
    return {k: v for k, v in state.items() if k != 'storage'}


def assert_same_batch(a, b):
    for name in ('state', 'action', 'reward', 'next_state', 'terminated', 'truncated', 'env_id', 'step_n', 'idxs',
                 'weights'):
        assert torch.equal(getattr(a, name), getattr(b, name)), name


@st.composite
def buffer_histories(draw):
    cls = draw(st.sampled_from(BUFFERS))
    max_sz = draw(st.sampled_from([4, 9, 32]))
    kw = dict(weight_norm=draw(st.sampled_from(['batch', 'buffer']))) if cls is PrioritizedReplayBuffer else {}
    write = st.tuples(st.just('write'), st.integers(1, 2 * max_sz), st.integers(0, 2))
    sample = st.tuples(st.just('sample'), st.integers(1, 4), st.lists(st.integers(0, 3), max_size=6))
    return cls, max_sz, kw, draw(st.lists(st.one_of(write, sample), min_size=1, max_size=10))


@settings(max_examples=150, deadline=None)
@given(buffer_histories(), st.integers(0, 2 ** 16))
def test_a_device_buffer_draws_and_keeps_what_the_host_buffer_does(history, seed):
    """Writes of batches and single rows (numpy, tensors, Python numbers), samples, updates with repeated and stale
    slots: the same batches, weights and idxs, and the same state (priorities, write counts, sampler) after each."""
    cls, max_sz, kw, steps = history
    host, dev = cls(max_sz=max_sz, bs=1, seed=seed, **kw), cls(max_sz=max_sz, bs=1, seed=seed, device='cpu', **kw)
    rng = np.random.default_rng(seed)
    for op, *args in steps:
        if op == 'write':
            k, how = args
            batch = fields(rng, k)
            if k == 1 and how:
                one = {n: v[0] for n, v in batch.items()}
                host.add(**one), dev.add(**given_as(one, how))
            else: host.extend(**batch), dev.extend(**given_as(batch, min(how, 1)))
        elif len(host) >= args[0]:
            bs, feedback = args
            a, b = host.sample(bs), dev.sample(bs)
            assert_same_batch(a, b)
            if feedback:
                at = torch.tensor(feedback) % bs
                td = torch.from_numpy(rng.normal(size=len(feedback)))
                host.update_priorities(a.idxs[at], td), dev.update_priorities(b.idxs[at], td)
        assert_state_equal(host_view(dev.state_dict()), host_view(host.state_dict()))


@pytest.mark.parametrize('cls', BUFFERS)
def test_a_sampled_batch_and_the_columns_live_on_the_device(cls):
    buf = cls(max_sz=16, bs=4, seed=0, device='cpu')
    buf.extend(**given_as(fields(np.random.default_rng(0), 10), 1))
    assert isinstance(buf.storage, DeviceStorage) and buf.device == torch.device('cpu')
    assert all(isinstance(c, torch.Tensor) for c in buf.storage.columns.values())
    batch = buf.sample()
    assert batch.idxs.dtype == torch.int64 and batch.weights.dtype == torch.float32
    assert batch.state.shape == (4, 3) and batch.env_id.dtype == torch.int64
    buf.update_priorities(batch.idxs, torch.ones(4, 1))        # a (B, 1) column, as a loss's gather gives it
    assert len(buf.memory) == 10 and buf.memory[2].state.shape == (3,)


@pytest.mark.parametrize('cls', BUFFERS)
def test_a_step_given_as_a_simple_step_or_a_list_is_stored_as_the_host_stores_it(cls):
    host, dev = cls(max_sz=8, bs=2, seed=1), cls(max_sz=8, bs=2, seed=1, device='cpu')
    steps = [SimpleStep(state=[i, 0.], action=i, next_state=[i + 1., 0.], reward=float(i)) for i in range(5)]
    for buf in (host, dev):
        buf.add(steps[0]), buf.add(steps[1:3]), buf.add(SimpleStep.from_steps(steps[3:]))
    assert_state_equal(host_view(dev.state_dict()), host_view(host.state_dict()))
    assert_same_batch(host.sample(), dev.sample())


@pytest.mark.parametrize('cls', BUFFERS)
@pytest.mark.parametrize('how', ['dir', 'state'])
def test_a_device_buffer_saves_and_loads(cls, how, tmp_path):
    buf = cls(max_sz=12, bs=3, seed=2, device='cpu')
    rng = np.random.default_rng(2)
    for _ in range(4):
        buf.extend(**fields(rng, 5))
        batch = buf.sample()
        buf.update_priorities(batch.idxs, torch.from_numpy(rng.normal(size=3)))
    back = cls(max_sz=12, bs=3, device='cpu')
    if how == 'dir':
        buf.save(tmp_path / 'b'), back.load(tmp_path / 'b')
        buf.extend(**fields(rng, 2)), back.extend(**fields(np.random.default_rng(7), 2))
        buf.save(tmp_path / 'b')                                # the incremental save, rows written since
        back.load(tmp_path / 'b')
    else: back.load_state_dict(buf.state_dict())
    assert_state_equal(back.state_dict(), buf.state_dict())
    assert_same_batch(back.sample(), buf.sample())


@pytest.mark.parametrize('cls', BUFFERS)
def test_a_device_buffer_refuses_a_host_buffers_state_by_name(cls):
    host = cls(max_sz=8, seed=0)
    host.extend(**fields(np.random.default_rng(0), 3))
    assert_refused_unchanged(lambda: cls(max_sz=8, device='cpu'), lambda b: b.load_state_dict(host.state_dict()),
                             ['RingStorage', 'DeviceStorage'])


def filled_device(cls):
    def build():
        buf = cls(max_sz=8, bs=2, seed=0, device='cpu')
        buf.extend(**fields(np.random.default_rng(0), 5))
        return buf
    return build


one = {n: v[0] for n, v in fields(np.random.default_rng(1), 1).items()}
BAD_WRITES = [
    ('extend', dict(given_as(fields(np.random.default_rng(1), 2), 1), action=torch.zeros(2, dtype=torch.int32)),
     ["'action'", 'int32']),
    ('extend', dict(given_as(fields(np.random.default_rng(1), 2), 1), state=torch.zeros(2, 4)), ["'state'", '(4,)']),
    ('extend', dict(fields(np.random.default_rng(1), 2), reward=torch.zeros(3)), ['reward', '(3,)']),
    ('add', given_as(fields(np.random.default_rng(1), 2), 1), ['use extend']),
    ('add', dict(given_as(one, 1), extra=torch.ones(1)), ["['extra']", 'not in the buffer']),
]


@pytest.mark.parametrize('cls', BUFFERS)
@pytest.mark.parametrize('method, kw, contains', BAD_WRITES)
def test_a_bad_write_of_tensors_is_named_and_stores_nothing(cls, method, kw, contains):
    assert_refused_unchanged(filled_device(cls), lambda b: getattr(b, method)(**kw), contains)


@pytest.mark.parametrize('cls', BUFFERS)
@pytest.mark.parametrize('idxs, td, contains', [
    (torch.tensor([0, 7]), torch.ones(2), ['7', 'not a written slot']),
    (torch.tensor([0, 1]), torch.tensor([1., math.nan]), ['finite']),
    (torch.tensor([0, 1]), torch.ones(3), ['do not pair']),
])
def test_a_bad_update_of_a_device_buffer_is_named_and_stores_nothing(cls, idxs, td, contains):
    assert_refused_unchanged(filled_device(cls), lambda b: b.update_priorities(idxs, td), contains)


def test_a_device_buffer_is_proportional_and_makes_its_own_storage():
    with pytest.raises(ValueError, match="'rank'"): PrioritizedReplayBuffer(max_sz=8, prioritization='rank', device='cpu')
    with pytest.raises(TypeError, match='no device'): ReplayBuffer(storage=DeviceStorage(8), device='cpu')
    buf = PrioritizedReplayBuffer(bs=2, storage=DeviceStorage(8))   # a storage given: the buffer uses its device
    assert buf.device == torch.device('cpu')


def test_add_prioritized_on_a_device_sets_the_given_priorities():
    host, dev = PrioritizedReplayBuffer(max_sz=8, seed=0), PrioritizedReplayBuffer(max_sz=8, seed=0, device='cpu')
    steps = [SimpleStep(state=[float(i)], action=i, next_state=[0.]) for i in range(4)]
    for buf in (host, dev): buf.add_prioritized(steps, [0.5, -2., 3., 0.])
    assert np.array_equal(dev.priorities.numpy(), host.priorities)

