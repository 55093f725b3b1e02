"""The write path compiled from the schema (issue #40): `add`/`extend` given keywords or a mapping write straight into
the columns, and store exactly what the `SimpleStep` path stores, or raise exactly its error and store nothing.

Random schemas (extra fields, `Dict` observations, bool/uint8/int32/int64/float32/float64 values), values as numpy
arrays, torch tensors or Python numbers, single transitions and batches, some of them bent out of the schema."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from fastrl_per.core import FIELD_DTYPES
from fastrl_per.replay.memory import ReplayBuffer, FIELD_DEFAULTS
from fastrl_per.replay.per import PrioritizedReplayBuffer

DTYPES = [np.bool_, np.uint8, np.int32, np.int64, np.float32, np.float64]
SHAPES = [(), (1,), (3,), (2, 2)]
OPTIONAL = list(FIELD_DEFAULTS)   # the one-number fields a caller may leave out


@st.composite
def schemas(draw):
    "A random schema: field -> (dtype, shape), `state` possibly a dict of them; the optional one-number fields given."
    cell = lambda: (draw(st.sampled_from(DTYPES)), draw(st.sampled_from(SHAPES)))
    state = {k: cell() for k in draw(st.lists(st.sampled_from('abc'), min_size=1, max_size=2, unique=True))} \
        if draw(st.booleans()) else cell()
    extras = draw(st.lists(st.sampled_from(['logp', 'goal', 'mask']), max_size=2, unique=True))
    fields = dict(state=state, next_state=state, action=cell(), **{n: cell() for n in extras})
    numbers = dict(reward=draw(st.sampled_from(DTYPES)), terminated=draw(st.sampled_from(DTYPES)))
    for n in draw(st.lists(st.sampled_from(OPTIONAL), max_size=3, unique=True)):   # an int one is given no floats
        whole = not FIELD_DTYPES[n].is_floating_point and FIELD_DTYPES[n] != torch.bool
        numbers[n] = draw(st.sampled_from(DTYPES[:4] if whole else DTYPES))
    return fields, numbers


def values(rng, dtype, shape, form, python_ok):
    "Random values of `dtype` and `shape` as numpy, a torch tensor, or (0-d, where `python_ok`) a Python number."
    a = rng.integers(0, 3, shape).astype(dtype) if np.dtype(dtype).kind != 'f' else \
        (rng.standard_normal(shape) * 3).astype(dtype)
    if form == 'torch': return torch.from_numpy(np.array(a))
    if form == 'python' and a.ndim == 0 and python_ok: return a.item()
    return a


PYTHON_TYPES = (np.bool_, np.int64, np.float32, np.float64)   # what a Python number of the same kind is stored as


def transition(rng, schema, k, forms):
    "Keyword fields of one transition (`k` None) or `k` of them, each value in a form drawn from `forms`."
    fields, numbers = schema
    form = lambda: forms[rng.integers(len(forms))]
    one = lambda d, s, lead: values(rng, d, lead + s, form(), d in PYTHON_TYPES)
    lead = () if k is None else (k,)
    out = {n: {key: one(d, s, lead) for key, (d, s) in spec.items()} if isinstance(spec, dict) else one(*spec, lead)
           for n, spec in fields.items()}
    for n, d in numbers.items():   # any number casts to a one-number field; a batch may give one for every row
        shared = k is not None and n != 'terminated' and rng.random() < 0.2
        out[n] = values(rng, d, () if shared else lead, form(), True)
    return out


def bent(rng, fields, k):
    "`fields` with one thing changed so that it may not fit: a dtype, a shape, a field missing or unknown, a list."
    fields, name = dict(fields), list(fields)[rng.integers(len(fields))]
    how = rng.integers(6)
    v = fields[name]
    if isinstance(v, dict): v = next(iter(v.values()))
    arr = v.numpy() if isinstance(v, torch.Tensor) else np.asarray(v)
    if how == 0: fields[name] = arr.astype(np.int32 if arr.dtype != np.int32 else np.int64)
    elif how == 1: fields[name] = np.concatenate([arr.reshape(-1), arr.reshape(-1)])
    elif how == 2: del fields[name]
    elif how == 3: fields['unknown'] = arr
    elif how == 4: fields[name] = arr.tolist()
    else: fields[name] = arr[:1] if k is not None and arr.ndim else np.stack([arr, arr])   # a short column; a batch
    return fields


def outcome(buffer, method, fields):
    "The slots written, or the error raised (type and message)."
    try: return getattr(buffer, method)(**fields).tolist()
    except (ValueError, TypeError) as e: return (type(e), str(e))


def rows_of(buffer):
    "Each column of the storage (None before the first write)."
    rows = buffer.storage.rows
    return None if rows is None else {n: rows[n].copy() for n in rows.dtype.names}


def assert_same_rows(a, b):
    assert (a is None) == (b is None)
    if a is None: return
    assert a.keys() == b.keys()
    for n in a: assert a[n].dtype == b[n].dtype and np.array_equal(a[n], b[n], equal_nan=True), n


@pytest.mark.parametrize('kind', [ReplayBuffer, PrioritizedReplayBuffer])
@settings(max_examples=60, deadline=None)
@given(schema=schemas(), seed=st.integers(0, 2 ** 32 - 1), writes=st.lists(st.tuples(st.integers(0, 5), st.booleans()),
                                                                         min_size=2, max_size=6))
def test_fast_path_stores_what_the_simplestep_path_stores(kind, schema, seed, writes):
    rng = np.random.default_rng(seed)
    fast, slow = kind(max_sz=7, bs=1, seed=0), kind(max_sz=7, bs=1, seed=0)
    slow.storage.write_fields = lambda fields, batch: None   # every write of `slow` takes the SimpleStep path
    for i, (k, straight) in enumerate(writes):
        k = k or None   # 0: one transition with add
        fields = transition(rng, schema, k, ['numpy', 'torch', 'python'])
        if i and not straight: fields = bent(rng, fields, k)   # the first write fixes the schema drawn
        method = 'add' if k is None else 'extend'
        before = rows_of(fast)
        if (straight or not i) and fast.storage.rows is not None:   # a write that fits takes the quick path
            assert fast.storage.writer.columns(fields, k is not None) is not None
        got, want = outcome(fast, method, fields), outcome(slow, method, fields)
        assert got == want
        assert_same_rows(rows_of(fast), rows_of(slow))
        if isinstance(got, tuple): assert_same_rows(rows_of(fast), before)   # a refused write stores nothing
    assert fast.storage.n_added == slow.storage.n_added
    if kind is PrioritizedReplayBuffer:   # the bookkeeping of deferred writes: each slot counted as often as written
        assert np.array_equal(fast.writes, slow.writes) and np.array_equal(fast.priorities, slow.priorities)
    if len(fast):
        a, b = fast.sample(1), slow.sample(1)
        assert a == b and torch.equal(a.idxs, b.idxs) and torch.equal(a.weights, b.weights)


def test_python_numbers_are_stored_as_the_simplestep_path_stores_them():
    o = np.zeros(4, np.float32)
    rb = ReplayBuffer(max_sz=4)
    rb.add(state=o, action=1, reward=1.0, next_state=o, terminated=False)
    rb.add(state=o, action=2, reward=3, next_state=o, terminated=1, truncated=0.5, env_id=np.int32(2))
    rows = rb.storage.rows
    assert rows.dtype['action'] == np.int64 and rows.dtype['reward'] == np.float32 and rows.dtype['terminated'] == bool
    assert rows['action'][:2].tolist() == [1, 2] and rows['reward'][:2].tolist() == [1., 3.]
    assert rows['terminated'][:2].tolist() == [False, True] and rows['truncated'][:2].tolist() == [False, True]
    assert rows['env_id'][:2].tolist() == [0, 2] and rows['n_steps'][:2].tolist() == [1, 1]
    with pytest.raises(ValueError, match="'action' has dtype float32"):   # an int column given a float: refused
        rb.add(state=o, action=1.5, reward=1.0, next_state=o, terminated=False)
    with pytest.raises(ValueError, match="'state' has dtype int64"):
        rb.add(state=np.zeros(4, np.int64), action=1, reward=1.0, next_state=o, terminated=False)
    assert rb.storage.n_added == 2


def test_a_big_python_int_is_not_written_half():
    o = np.zeros(2, np.float32)
    rb = ReplayBuffer(max_sz=2)
    rb.add(state=o, action=1, reward=1.0, next_state=o, terminated=False)
    rb.add(state=o + 1, action=2, reward=2.0, next_state=o, terminated=False)
    before = rows_of(rb)
    for big, message in [(dict(action=2 ** 70), "field 'action': 1180591620717411303424 does not fit int64"),
                         (dict(n_steps=2 ** 40), "field 'n_steps': 1099511627776 does not fit its dtype int32"),
                         (dict(n_steps=np.int64(2 ** 31)), "field 'n_steps': np.int64(2147483648) does not fit"),
                         (dict(episode_n=1e30), "field 'episode_n': 1e+30 does not fit its dtype int64")]:
        with pytest.raises(ValueError) as e: rb.add(**dict(dict(state=o, action=1, reward=1.0, next_state=o,
                                                                terminated=False), **big))
        assert message in str(e.value), e.value
        assert_same_rows(rows_of(rb), before)
        assert rb.storage.n_added == 2


@pytest.mark.parametrize('kind', [ReplayBuffer, PrioritizedReplayBuffer])
def test_a_sampled_batch_is_a_simplestep(kind):
    "One name for a sampled batch, in code and docs (#44): `SimpleStep`, its fields made when first read."
    from fastrl_per.core import SimpleStep
    o = np.zeros(2, np.float32)
    rb = kind(max_sz=4, bs=2, seed=0)
    rb.extend(state=np.stack([o, o + 1]), action=np.arange(2), reward=np.ones(2), next_state=np.stack([o, o]),
              terminated=np.zeros(2, bool))
    batch = rb.sample()
    assert type(batch) is SimpleStep and 'state' not in vars(batch) and batch.state.shape == (2, 2)
    assert type(batch[0]) is SimpleStep and type(rb.memory[:]) is SimpleStep
