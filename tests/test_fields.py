"""The buffers in a user's own loop (issue #25): `add(**fields)`/`extend(**fields)`, extra fields and `Dict`
observations, the schema the first write fixes, `sample(device=)` and TD errors shaped (B,) or (B, 1), for the
uniform, prioritized and frame buffers. Every bad write leaves the buffer's state exactly as it was."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from fastrl_per.core import SimpleStep, STEP_FIELDS
from fastrl_per.replay.memory import ReplayBuffer, copier, pinned_copy
from fastrl_per.replay.per import PrioritizedReplayBuffer
from fastrl_per.replay.frames import FrameStorage


def with_frames(buffer):
    "A maker of `buffer`s given a `FrameStorage` of `max_sz` transitions (and `frame_slots`) instead of a ring."
    def make(max_sz=100, frame_slots=None, **kwargs): return buffer(storage=FrameStorage(max_sz, frame_slots), **kwargs)
    return make


FRAME_UNIFORM, FRAME_PRIORITIZED = with_frames(ReplayBuffer), with_frames(PrioritizedReplayBuffer)
KINDS = [ReplayBuffer, PrioritizedReplayBuffer, FRAME_UNIFORM, FRAME_PRIORITIZED]
FRAMES = (FRAME_UNIFORM, FRAME_PRIORITIZED)


def transitions(kind, n, start=0):
    "`n` transitions as keyword columns with extras of several dtypes and a dict field: `state` a `Dict` observation,"
    " except for the frame buffers, whose state is a stack of uint8 frames and whose dict field is an extra, `info`."
    t = np.arange(start, start + n)
    cols = dict(action=np.stack([t % 3, t % 5], 1).astype(np.float32), reward=t.astype(np.float32) / 7,
                terminated=t % 11 == 10, logp=-t / 3, goal=np.stack([t, -t], 1), mask=np.stack([t % 2 == 0] * 3, 1),
                code=(t % 256).astype(np.uint8))
    if kind in FRAMES:
        frames = ((start + np.arange(n + 4))[:, None, None] % 251).astype(np.uint8) * np.ones((1, 2, 2), np.uint8)
        stack = lambda k: np.stack([frames[i + k:i + k + 4] for i in range(n)])
        cols.update(state=stack(0), next_state=stack(1), terminated=np.zeros(n, bool),
                    info=dict(pos=np.stack([t, t + 1], 1).astype(np.float32), id=t.astype(np.int32)))
    else:
        obs = lambda k: dict(pos=np.stack([t + k, t - k], 1).astype(np.float32),
                             img=np.full((n, 2, 2), t[:, None, None] % 9, np.uint8))
        cols.update(state=obs(0), next_state=obs(1))
    return cols


def row(cols, i):
    "Transition `i` of keyword columns."
    return {n: {k: a[i] for k, a in v.items()} if isinstance(v, dict) else v[i] for n, v in cols.items()}


def make(kind, max_sz=64, **kwargs): return kind(max_sz=max_sz, bs=4, seed=0, **kwargs)


def filled(kind, n=10, **kwargs):
    buf = make(kind, **kwargs)
    cols = transitions(kind, n)
    buf.extend(**cols)
    return buf, cols


def flat(x, prefix=''):
    "Every tensor and value of a (nested) state dict, by path."
    if isinstance(x, dict): return {k: v for key, val in x.items() for k, v in flat(val, f'{prefix}{key}/').items()}
    return {prefix: x}


def assert_same_state(a, b):
    fa, fb = flat(a), flat(b)
    assert fa.keys() == fb.keys()
    for k, v in fa.items():
        if isinstance(v, torch.Tensor): assert torch.equal(v, fb[k]), k
        else: assert v == fb[k], k


def check_batch(batch, cols, kind):
    "Every field of a sampled batch holds what was written at its slots."
    idxs = batch.idxs.numpy()
    assert len(batch) == len(idxs) and batch.weights.shape == (len(idxs),)
    for n, v in cols.items():
        got = getattr(batch, n)
        parts = v.items() if isinstance(v, dict) else [(None, v)]
        for k, a in parts:
            g = got[k] if k is not None else got
            expected = a[idxs]
            if expected.dtype.kind == 'f': expected = expected.astype(np.float32)
            np.testing.assert_array_equal(g.numpy(), expected, err_msg=f'{n} {k}')
            assert g.numpy().dtype == expected.dtype, (n, k)


@pytest.mark.parametrize('kind', KINDS)
def test_extend_add_sample_round_trip(kind):
    buf, cols = filled(kind)
    more = transitions(kind, 3, start=10)
    for i in range(3):
        if i % 2: buf.add(row(more, i))     # a mapping
        else: buf.add(**row(more, i))       # keywords
    join = lambda a, b: ({k: np.concatenate([x, b[k]]) for k, x in a.items()} if isinstance(a, dict)
                         else np.concatenate([a, b]))
    both = {n: join(v, more[n]) for n, v in cols.items()}
    assert len(buf) == 13
    batch = buf.sample(8, device='cpu')
    check_batch(batch, both, kind)
    assert 'logp' in batch.extra_fields and isinstance(batch.state if kind not in FRAMES else batch.info, dict)


@pytest.mark.parametrize('kind', KINDS)
def test_state_dict_and_file_round_trip(kind, tmp_path):
    buf, cols = filled(kind)
    if hasattr(buf, 'update_priorities'): buf.update_priorities(buf.sample(4).idxs, torch.rand(4, 1))
    other = make(kind)
    other.load_state_dict(buf.state_dict())
    buf.save(tmp_path / 'b.pt')
    third = make(kind)
    third.load(tmp_path / 'b.pt')
    assert_same_state(other.state_dict(), buf.state_dict())
    assert_same_state(third.state_dict(), buf.state_dict())
    a, b, c = buf.sample(6), other.sample(6), third.sample(6)
    assert a == b == c and torch.equal(a.idxs, b.idxs) and torch.equal(a.weights, c.weights)
    check_batch(c, cols, kind)
    third.extend(**transitions(kind, 2, start=10))   # the loaded schema takes the same writes
    assert len(third) == 12


@pytest.mark.parametrize('kind', KINDS)
def test_simplestep_with_extras_and_batch_defaults(kind):
    "A `SimpleStep` batch that leaves out the defaulted fields stores them broadcast; its extras are fields."
    cols = transitions(kind, 4)
    buf = make(kind)
    slots = buf.add(SimpleStep(**cols))
    assert slots.tolist() == [0, 1, 2, 3]
    batch = buf.sample(4)
    assert batch.truncated.tolist() == [False] * 4 and batch.n_steps.tolist() == [1] * 4
    check_batch(batch, cols, kind)


def test_vector_env_batch_without_terminated_is_a_batch():
    "The issue's case: a SimpleStep of 4 env steps without `terminated` is 4 transitions, not one of shape (4, 3)."
    obs = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    buf = PrioritizedReplayBuffer(max_sz=16, bs=2, seed=0)
    slots = buf.add(SimpleStep(obs, np.zeros((4, 1), np.float32), obs, reward=np.ones(4, np.float32)))
    assert slots.tolist() == [0, 1, 2, 3]
    assert buf.sample(2).state.shape == (2, 3)


def _buf_with_schema(kind):
    buf, _ = filled(kind, n=6)
    return buf


def _bad(kind, change):
    cols = transitions(kind, 4, start=6)
    return change(cols, kind)


def _drop(name): return lambda c, k: {n: v for n, v in c.items() if n != name}
def _with(**new): return lambda c, k: dict(c, **{n: f(c) for n, f in new.items()})

BAD_EXTEND = [
    ('missing terminated', _drop('terminated'), TypeError, "missing ['terminated']"),
    ('missing an extra field', _drop('logp'), ValueError, "['logp'] are missing"),
    ('a new extra field', _with(extra=lambda c: np.zeros(4)), ValueError, "['extra'] are not in the buffer's schema"),
    ('extra of another dtype', _with(code=lambda c: c['code'].astype(np.int64)), ValueError,
     "'code' has dtype int64, the buffer stores uint8"),
    ('extra of another shape', _with(goal=lambda c: c['goal'][:, :1]), ValueError,
     "'goal' has shape (1,) per step, the buffer stores (2,)"),
    ('mismatched leading lengths', _with(logp=lambda c: c['logp'][:3]), ValueError, 'different batch sizes'),
    ('one-number field per row', _with(reward=lambda c: c['reward'][:, None]), ValueError, "'reward' has shape (1,)"),
    ('not a batch', lambda c, k: row(c, 0), ValueError, 'extend stores a batch'),
    ('terminated and reward lengths differ', _with(terminated=lambda c: c['terminated'][:3]), ValueError,
     'batch length'),
    ('an int32 field given 2**40', _with(n_steps=lambda c: np.full(4, 2 ** 40)), ValueError,
     "field 'n_steps': array([1099511627776,"),
    ('an int32 field given 2**31', _with(n_steps=lambda c: np.array([1, 2, 3, 2 ** 31])), ValueError,
     "2147483648]) does not fit its dtype int32"),
    ('an int64 field given 2**70', _with(env_id=lambda c: 2 ** 70), ValueError,
     "field 'env_id': 1180591620717411303424 does not fit int64"),
    ('a step count given 1.5', _with(step_n=lambda c: np.full(4, 1.5)), ValueError,
     "field 'step_n': array([1.5, 1.5, 1.5, 1.5]) does not fit its dtype int64"),
    ('a uint8 extra given 300', _with(code=lambda c: np.full(4, 300)), ValueError,
     "'code' has dtype int64, the buffer stores uint8"),   # refused by its dtype before any value is looked at
    ('a float32 reward given 1e300', _with(reward=lambda c: np.array([1., 2., 1e300, 3.])), ValueError,
     "field 'reward': array([1.e+000, 2.e+000, 1.e+300, 3.e+000]) does not fit its dtype float32: 1e+300 at index (2,)"),
    ('a float32 extra given -1e300', _with(logp=lambda c: np.array([0., -1e300, 0., 0.])), ValueError,
     "field 'logp': array([ 0.e+000, -1.e+300,  0.e+000,  0.e+000]) does not fit its dtype float32"),
    ('a float32 reward given a float64 tensor 1e39', _with(reward=lambda c: torch.full((4,), 1e39, dtype=torch.float64)),
     ValueError, "field 'reward': tensor([1.0000e+39,"),
    ('an int64 field given uint64 2**64-1', _with(step_n=lambda c: np.array([0, 2 ** 64 - 1, 1, 2], np.uint64)),
     ValueError, "does not fit its dtype int64: 18446744073709551615 at index (1,)"),
    ('an int64 field given uint64 2**63', _with(episode_n=lambda c: np.full(4, 2 ** 63, np.uint64)), ValueError,
     "field 'episode_n': array([9223372036854775808,"),
    ('an int32 field given uint32 2**32-1', _with(n_steps=lambda c: np.array([1, 1, 2 ** 32 - 1, 1], np.uint32)),
     ValueError, "field 'n_steps': array([         1,          1, 4294967295,          1], dtyp does not fit its dtype int32: 4294967295"),
    ('an int64 field given the scalar np.uint64(2**64-1)', _with(env_id=lambda c: np.uint64(2 ** 64 - 1)), ValueError,
     "field 'env_id': np.uint64(18446744073709551615) does not fit its dtype int64"),
]
NO_SCHEMA = ('not a batch', 'terminated and reward lengths differ', 'an int32 field given 2**40',
             'an int32 field given 2**31', 'an int64 field given 2**70', 'a step count given 1.5',
             'a float32 reward given 1e300', 'a float32 extra given -1e300', 'a float32 reward given a float64 tensor 1e39',
             'an int64 field given uint64 2**64-1', 'an int64 field given uint64 2**63',
             'an int32 field given uint32 2**32-1', 'an int64 field given the scalar np.uint64(2**64-1)')   # field errors


@pytest.mark.parametrize('kind', KINDS)
@pytest.mark.parametrize('what,change,exc,contains', BAD_EXTEND, ids=[c[0] for c in BAD_EXTEND])
def test_bad_extend_stores_nothing(kind, what, change, exc, contains):
    buf = _buf_with_schema(kind)
    before = buf.state_dict()
    with pytest.raises(exc) as e: buf.extend(**_bad(kind, change))
    assert contains in str(e.value)
    if exc is ValueError and what not in NO_SCHEMA:
        assert 'logp: float32[]' in str(e.value)   # the message shows the buffer's schema
    assert_same_state(buf.state_dict(), before)


@pytest.mark.parametrize('kind', KINDS)
def test_add_given_a_batch_stores_nothing(kind):
    buf = _buf_with_schema(kind)
    before = buf.state_dict()
    cols = transitions(kind, 4, start=6)
    with pytest.raises(ValueError, match='use extend'): buf.add(**cols)      # reward and terminated carry a batch
    with pytest.raises(ValueError, match=r"a batch of 4\? `add` stores one transition"):
        buf.add(**dict(row(cols, 0), goal=cols['goal']))
    assert_same_state(buf.state_dict(), before)


BAD_ADD_NUMBERS = [   # one transition's number that its field's dtype cannot hold: refused, naming the field
    (dict(reward=1e300), "field 'reward': 1e+300 does not fit its dtype float32"),
    (dict(reward=-3.5e38), "field 'reward': -3.5e+38 does not fit its dtype float32"),
    (dict(reward=np.float64(1e300)), "field 'reward': np.float64(1e+300) does not fit its dtype float32"),
    (dict(logp=1e300), "field 'logp': 1e+300 does not fit its dtype float32"),
    (dict(env_id=np.uint64(2 ** 64 - 1)), "field 'env_id': np.uint64(18446744073709551615) does not fit its dtype int64"),
    (dict(step_n=np.array(2 ** 63, np.uint64)), "field 'step_n': array(9223372036854775808, dtype=uint64) does not fit"),
    (dict(n_steps=np.uint32(2 ** 32 - 1)), "field 'n_steps': np.uint32(4294967295) does not fit its dtype int32"),
    (dict(n_steps=np.uint64(2 ** 31)), "field 'n_steps': np.uint64(2147483648) does not fit its dtype int32"),
]
FINE_ADD_NUMBERS = [   # numpy scalars and the infinities a user gave: stored as these numbers
    (dict(env_id=np.uint64(5), step_n=np.int8(-3), episode_n=np.bool_(True), n_steps=np.uint16(1)),
     dict(env_id=5, step_n=-3, episode_n=1, n_steps=1)),
    (dict(env_id=np.uint64(2 ** 63 - 1), n_steps=np.uint32(2 ** 31 - 1)), dict(env_id=2 ** 63 - 1, n_steps=2 ** 31 - 1)),
    (dict(reward=float('inf'), logp=-np.inf), dict(reward=float('inf'), logp=-float('inf'))),
    (dict(reward=3.4028235e38, logp=np.float64(-3.4028235677973362e38)),   # the largest that round to float32's max
     dict(reward=3.4028234663852886e38, logp=-3.4028234663852886e38)),
    (dict(terminated=np.bool_(True), reward=np.uint64(2 ** 64 - 1)), dict(terminated=True, reward=2.0 ** 64)),
]


@pytest.mark.parametrize('kind', KINDS)
@pytest.mark.parametrize('fresh', [True, False], ids=['first write', 'schema fixed'])
def test_numbers_that_do_not_fit_store_nothing(kind, fresh):
    "A number its field cannot hold is refused by name through either write path; numpy scalars and infs are kept."
    buf = make(kind) if fresh else _buf_with_schema(kind)
    one = row(transitions(kind, 4, start=6), 0)
    for change, message in BAD_ADD_NUMBERS:
        before = buf.state_dict()
        with pytest.raises(ValueError) as e: buf.add(**dict(one, **change))
        assert message in str(e.value), e.value
        assert_same_state(buf.state_dict(), before)
    for change, stored in FINE_ADD_NUMBERS:
        slot = buf.add(**dict(one, **change))
        got = buf.storage.gather(slot)
        assert {n: getattr(got, n).item() for n in stored} == stored


@settings(max_examples=200, deadline=None, database=None)
@given(reward=st.floats(allow_nan=False), env_id=st.integers(0, 2 ** 64 - 1), fresh=st.booleans())
def test_any_float_and_uint64_is_stored_exactly_or_refused(reward, env_id, fresh):
    "A float64 reward is stored as float32 rounds it unless a finite one would become inf; a uint64 env_id as given."
    buf = make(ReplayBuffer) if fresh else _buf_with_schema(ReplayBuffer)
    one = dict(row(transitions(ReplayBuffer, 1), 0), reward=reward, env_id=np.uint64(env_id))
    with np.errstate(over='ignore'): as_f32 = np.float32(reward)
    reward_fits = bool(np.isfinite(as_f32) or not np.isfinite(reward))
    before = len(buf)
    if not (reward_fits and env_id < 2 ** 63):   # the first field in order that does not fit is named
        with pytest.raises(ValueError, match="field 'env_id'" if reward_fits else "field 'reward'"): buf.add(**one)
        assert len(buf) == before
        return
    got = buf.storage.gather(buf.add(**one))
    assert (got.reward.item(), got.env_id.item()) == (float(as_f32), env_id)


@pytest.mark.parametrize('kind', [ReplayBuffer, PrioritizedReplayBuffer])
def test_bad_dict_and_pair_writes_store_nothing(kind):
    buf = _buf_with_schema(kind)
    before = buf.state_dict()
    cols = transitions(kind, 4, start=6)
    with pytest.raises(ValueError, match=r"\['state.img'\] are missing"):
        buf.extend(**dict(cols, state=dict(pos=cols['state']['pos'])))
    with pytest.raises(ValueError, match="'state.pos' has shape"):
        buf.extend(**dict(cols, state=dict(cols['state'], pos=cols['state']['pos'][:, :1])))
    assert_same_state(buf.state_dict(), before)
    empty = make(kind)
    with pytest.raises(ValueError, match="'next_state.pos' is missing"):
        empty.extend(**dict(cols, next_state=dict(img=cols['next_state']['img'])))
    with pytest.raises(ValueError, match=r"'reward' has shape \(1,\) per transition"):
        empty.extend(**dict(cols, reward=cols['reward'][:, None]))
    assert len(empty) == 0 and empty.schema is None


def test_frame_buffer_rejects_a_dict_state():
    buf = FRAME_UNIFORM(max_sz=8, seed=0)
    cols = transitions(ReplayBuffer, 4)
    with pytest.raises(ValueError, match='uint8 frame stacks'): buf.extend(**cols)
    assert len(buf) == 0


@pytest.mark.parametrize('kind', [PrioritizedReplayBuffer, FRAME_PRIORITIZED])
@pytest.mark.parametrize('dtype', [torch.float16, torch.float32, torch.float64, np.float32, np.float64])
def test_column_td_updates_like_flat(kind, dtype):
    flat_buf, column_buf = filled(kind)[0], filled(kind)[0]
    idxs = flat_buf.sample(4).idxs; column_buf.sample(4)
    td = np.array([0.5, 1., 2., 4.])
    as_ = (lambda a: torch.tensor(a, dtype=dtype)) if isinstance(dtype, torch.dtype) else (lambda a: a.astype(dtype))
    flat_buf.update_priorities(idxs, as_(td))
    column_buf.update_priorities(idxs, as_(td[:, None]))
    np.testing.assert_array_equal(column_buf.priorities, flat_buf.priorities)
    assert_same_state(column_buf.state_dict(), flat_buf.state_dict())


BAD_TD = [((4, 2), (4,)), ((4, 1, 1), (4,)), ((5,), (4,)), ((1, 4), (4,)), ((4, 1), (4, 1)), ((), (4,))]


@pytest.mark.parametrize('td_shape,idx_shape', BAD_TD)
def test_other_td_shapes_name_both_and_change_nothing(td_shape, idx_shape):
    buf = filled(PrioritizedReplayBuffer)[0]
    idxs = buf.sample(4).idxs.reshape(idx_shape)
    before = buf.state_dict()
    with pytest.raises(ValueError) as e: buf.update_priorities(idxs, torch.ones(td_shape))
    assert f'td_errors of shape {td_shape}' in str(e.value) and f'idxs of shape {idx_shape}' in str(e.value)
    assert_same_state(buf.state_dict(), before)


def test_sample_device_cpu_and_the_copy_path():
    "No GPU here: device='cpu' gives the host batch itself; the CUDA path is chosen (pinned, non-blocking) but not run."
    buf, cols = filled(ReplayBuffer)
    b = buf.sample(4, device='cpu')
    assert b.state['pos'].device.type == 'cpu' and b.idxs.device.type == 'cpu'
    assert copier(None) is None and copier('cpu') is None and copier(torch.device('cpu')) is None
    cuda = copier('cuda:0')
    assert cuda.func is pinned_copy and cuda.keywords == {'device': torch.device('cuda:0')}
    meta = buf.sample(4, device='meta')        # any other device goes through `.to`
    assert meta.state['pos'].device.type == 'meta' and meta.weights.device.type == 'meta'


def test_sampled_batch_pickles_and_copies_as_a_plain_step():
    import copy, pickle
    buf, _ = filled(PrioritizedReplayBuffer)
    b = buf.sample(4)
    for other in (pickle.loads(pickle.dumps(b)), copy.copy(b)):
        assert type(other) is SimpleStep and other == b and torch.equal(other.idxs, b.idxs)
        assert other.extra_fields == b.extra_fields and set(other.state) == {'pos', 'img'}


DTYPES = st.sampled_from([np.bool_, np.uint8, np.int32, np.int64, np.float32, np.float64])
SHAPES = st.sampled_from([(), (1,), (2,), (2, 3)])


@settings(max_examples=60, deadline=None, database=None)
@given(extras=st.dictionaries(st.sampled_from(['a', 'b', 'logp', 'goal']), st.tuples(DTYPES, SHAPES), max_size=3),
       chunks=st.lists(st.integers(1, 7), min_size=1, max_size=5), max_sz=st.integers(1, 12),
       prioritized=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_any_extra_fields_round_trip(extras, chunks, max_sz, prioritized, seed):
    "Random extra fields written in chunks (extend) or one at a time (add): memory holds the last max_sz, as given."
    rng = np.random.default_rng(seed)
    n = sum(chunks)
    cols = dict(state=rng.standard_normal((n, 2)).astype(np.float32), action=rng.integers(0, 3, n),
                reward=rng.random(n).astype(np.float32), terminated=rng.random(n) < 0.2)
    cols['next_state'] = cols['state'] + 1
    for name, (dtype, shape) in extras.items(): cols[name] = (rng.random((n, *shape)) * 100).astype(dtype)
    buf = (PrioritizedReplayBuffer if prioritized else ReplayBuffer)(max_sz=max_sz, seed=seed)
    lo = 0
    for k in chunks:
        part = {name: a[lo:lo + k] for name, a in cols.items()}
        if k == 1: buf.add(**row(part, 0))
        else: buf.extend(part)
        lo += k
    kept = np.arange(max(0, n - max_sz), n)
    slots = kept % max_sz
    stored = buf.memory[:]
    for name, a in cols.items():
        want = a[kept].astype(np.float32) if a.dtype.kind == 'f' else a[kept]
        np.testing.assert_array_equal(getattr(stored, name).numpy()[slots], want)
    other = type(buf)(max_sz=max_sz)
    other.load_state_dict(buf.state_dict())
    assert other.memory[:] == stored


# ---------------------------------------------------------------- a schema declared up front

def _declared(kind, **more):
    import gymnasium as gym
    obs = gym.spaces.Dict(pos=gym.spaces.Box(-np.inf, np.inf, (2,)), img=gym.spaces.Box(0, 255, (2, 2), np.uint8))
    return kind(max_sz=16, bs=4, seed=0, schema=dict(state=obs, action=(np.float32, (2,)), logp=(np.float64, ()),
                                                     goal=(torch.int64, (2,)), mask=(bool, (3,)), code=(np.uint8, ()),
                                                     **more))


@pytest.mark.parametrize('kind', [ReplayBuffer, PrioritizedReplayBuffer])
def test_declared_schema_checks_the_first_write(kind):
    buf = _declared(kind)
    declared = buf.schema
    assert declared['state.img'] == (np.dtype(np.uint8), (2, 2))
    assert declared['next_state.pos'] == (np.dtype(np.float32), (2,))
    assert declared['logp'] == (np.dtype(np.float32), ()) and declared['reward'] == (np.dtype(np.float32), ())
    cols = transitions(kind, 4)
    before = buf.state_dict()
    with pytest.raises(ValueError, match=r"'goal' has shape \(1,\) per step, the buffer stores \(2,\)"):
        buf.extend(**dict(cols, goal=cols['goal'][:, :1]))
    with pytest.raises(ValueError, match=r"\['extra'\] are not in the buffer's schema"):
        buf.add(**dict(row(cols, 0), extra=1.))
    with pytest.raises(ValueError, match=r"'code' has dtype int64, the buffer stores uint8"):
        buf.add(**dict(row(cols, 0), code=3))
    assert len(buf) == 0 and buf.schema == declared
    assert_same_state(buf.state_dict(), before)
    buf.extend(**cols)          # the write the declaration describes
    buf.add(**row(cols, 1))
    assert len(buf) == 5 and buf.schema == declared
    check_batch(buf.sample(4), {n: {k: np.concatenate([a, a[1:2]]) for k, a in v.items()} if isinstance(v, dict)
                                else np.concatenate([v, v[1:2]]) for n, v in cols.items()}, kind)


@pytest.mark.parametrize('kind', [ReplayBuffer, PrioritizedReplayBuffer])
def test_declared_schema_and_states(kind):
    "A declared buffer loads a state of its schema and an empty one (keeping the declaration); no other."
    buf = _declared(kind)
    empty = buf.state_dict()
    buf.extend(**transitions(kind, 4))
    other = _declared(kind)
    other.load_state_dict(buf.state_dict())
    assert_same_state(other.state_dict(), buf.state_dict())
    other.load_state_dict(empty)
    assert len(other) == 0 and other.schema == buf.schema
    undeclared = filled(kind, n=4, max_sz=16)[0]   # the declared fields, but not the extra one `narrow` declares
    narrow = _declared(kind, extra=(np.float32, ()))
    before = narrow.state_dict()
    with pytest.raises(ValueError, match='are not the declared schema'): narrow.load_state_dict(undeclared.state_dict())
    assert_same_state(narrow.state_dict(), before)


def test_declared_schema_from_a_vector_envs_spaces():
    import gymnasium as gym
    envs = gym.make_vec('Pendulum-v1', 4)
    buf = PrioritizedReplayBuffer(max_sz=32, seed=0, schema=dict(state=envs.single_observation_space,
                                                                 action=envs.single_action_space))
    obs, _ = envs.reset(seed=0)
    with pytest.raises(ValueError, match=r"'state' has shape \(2,\) per step, the buffer stores \(3,\)"):
        buf.add(state=obs[0, :2], action=np.zeros(1, np.float32), reward=0., next_state=obs[0, :2], terminated=False)
    assert len(buf) == 0
    action = envs.action_space.sample()
    nobs, reward, terminated, truncated, _ = envs.step(action)
    slots = buf.extend(state=obs, action=action, reward=reward, next_state=nobs, terminated=terminated,
                       truncated=truncated)
    envs.close()
    assert slots.tolist() == [0, 1, 2, 3] and buf.sample(2).action.shape == (2, 1)


def test_bad_declarations_and_frame_buffers():
    with pytest.raises(ValueError, match="missing \\['action'\\]"): ReplayBuffer(schema=dict(state=(np.float32, (3,))))
    with pytest.raises(ValueError, match="may not use"):
        ReplayBuffer(schema=dict(state=(np.float32, (3,)), action=(np.int64, ()), idxs=(np.int64, ())))
    with pytest.raises(ValueError, match="'terminated' is stored as {terminated: bool\\[\\]}"):
        ReplayBuffer(schema=dict(state=(np.float32, (3,)), action=(np.int64, ()), terminated=(np.float32, ())))
    with pytest.raises(ValueError, match='a declared field is'):
        PrioritizedReplayBuffer(schema=dict(state='float32', action=(np.int64, ())))
    with pytest.raises(ValueError, match="'reward' is stored as"):   # a one-number field holds one number
        ReplayBuffer(schema=dict(state=(np.float32, (3,)), action=(np.int64, ()), reward=(np.float32, (2,))))
    frames = dict(state=(np.uint8, (4, 2, 2)), action=(np.int64, ()))
    with pytest.raises(TypeError, match='schema'): FRAME_PRIORITIZED(schema=frames)
    with pytest.raises(TypeError, match='schema'): FRAME_UNIFORM(schema=frames)
