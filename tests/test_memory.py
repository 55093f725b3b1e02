"""`ExperienceReplay`: ring-buffer model test, sampling, save/load, bad input, graph traversal."""
import collections.abc
import os
import tracemalloc

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st
from torch.utils.data import IterDataPipe
from torch.utils.data.datapipes.iter import IterableWrapper
from torch.utils.data.graph import traverse_dps

from fastrl_per.core import SimpleStep
from fastrl_per.stages.envs import GymTransformBlock
from fastrl_per.replay.memory import ExperienceReplay
from conftest import assert_state_equal


def make_step(i, state_dim=2):
    "A step whose every field is derived from its unique `step_n` `i`."
    return SimpleStep(state=[float(i)] + [-float(i)] * (state_dim - 1), action=i % 3,
                      next_state=[float(i) + 0.5] * state_dim, terminated=i % 5 == 0, truncated=i % 7 == 0,
                      reward=float(i) / 4, total_reward=float(i), env_id=i % 2, step_n=i, episode_n=i // 10)


def filled(n, max_sz=20, bs=1, seed=None, start=0):
    er = ExperienceReplay(None, bs=bs, max_sz=max_sz, seed=seed)
    if n: er.add(SimpleStep.from_steps([make_step(start + i) for i in range(n)]))
    return er




# ---------------------------------------------------------------- ring-buffer model

class RingModel:
    "fastrl's ring buffer written out one row at a time as a plain Python list."
    def __init__(self, max_sz):
        self.max_sz, self.slots, self.idx, self.cycle = max_sz, [None] * max_sz, 0, 0

    def add_one(self, step):
        if self.idx >= self.max_sz:  # wrap only when the next row is written: idx reads max_sz when full
            self.idx, self.cycle = 0, self.cycle + 1
        self.slots[self.idx] = step
        self.idx += 1

    @property
    def sz(self): return sum(s is not None for s in self.slots)


add_kind = st.one_of(st.tuples(st.just('single'), st.just(1)),
                     st.tuples(st.just('list'), st.integers(0, 5)),
                     st.tuples(st.just('batch'), st.integers(1, 30)))


@settings(max_examples=200, deadline=None, database=None)
@given(max_sz=st.integers(1, 12), adds=st.lists(add_kind, max_size=12))
def test_ring_buffer_matches_list_model(max_sz, adds):
    er, model, counter = ExperienceReplay(None, max_sz=max_sz), RingModel(max_sz), 0
    assert (er._sz_tracker, er._idx_tracker, er._cycle_tracker, len(er)) == (0, 0, 0, 0)
    for kind, k in adds:
        steps = [make_step(counter + j) for j in range(k)]
        counter += k
        if kind == 'single': er.add(steps[0])
        elif kind == 'list': er.add(steps)
        else: er.add(SimpleStep.from_steps(steps))
        for s in steps: model.add_one(s)
        assert er._sz_tracker == model.sz == len(er) == len(er.memory)
        assert er._idx_tracker == model.idx
        assert er._cycle_tracker == model.cycle
        stored = model.slots[:model.sz]
        assert [s.step_n.item() for s in er.memory] == [s.step_n.item() for s in stored]
        assert list(er.memory) == stored
        if stored: assert er.memory[:] == SimpleStep.from_steps(stored)


def test_tracker_values_of_the_spec():
    er = filled(20, max_sz=20)
    assert (er._sz_tracker, er._idx_tracker, er._cycle_tracker) == (20, 20, 0)
    er.add([make_step(20 + i) for i in range(10)])
    assert (er._sz_tracker, er._idx_tracker, er._cycle_tracker) == (20, 10, 1)
    er.add([make_step(30 + i) for i in range(10)])
    assert (er._sz_tracker, er._idx_tracker, er._cycle_tracker) == (20, 20, 1)
    assert [s.step_n.item() for s in er.memory] == list(range(20, 40))


# ---------------------------------------------------------------- sampling

def test_sample_distinct_rows_equal_memory():
    er = filled(57, max_sz=40, bs=16, seed=1)  # wrapped once
    for _ in range(30):
        batch = er.sample()
        assert len(batch) == 16
        idxs = batch.idxs.tolist()
        assert batch.idxs.dtype == torch.int64 and len(set(idxs)) == 16
        assert all(0 <= i < 40 for i in idxs)
        assert batch.weights.dtype == torch.float32 and torch.equal(batch.weights, torch.ones(16))
        for row, i in zip(batch, idxs): assert row == er.memory[i]
    assert len(er.sample(40)) == 40



def test_copies_sample_their_own_rows():
    "A copied or pickled buffer samples from its own rows: the raw view `gather` reads is remade, not copied apart."
    import copy, pickle
    er = filled(8, max_sz=8, bs=8, seed=0)
    for other in (copy.deepcopy(er), pickle.loads(pickle.dumps(er))):
        other.add(SimpleStep.from_steps([make_step(100 + i) for i in range(8)]))    # overwrites every slot of the copy
        assert sorted(other.sample(8).step_n.tolist()) == list(range(100, 108))
    assert sorted(er.sample().step_n.tolist()) == list(range(8))

def test_sample_reaches_every_slot():
    er = filled(100, max_sz=30, seed=0)
    hits = set()
    for _ in range(400): hits.update(er.sample().idxs.tolist())
    assert hits == set(range(30))
    er = filled(13, max_sz=30, seed=0)  # not full: only the written slots
    hits = set()
    for _ in range(200): hits.update(er.sample(3).idxs.tolist())
    assert hits == set(range(13))


def test_pipe_yields_samples_and_return_idxs():
    src = IterableWrapper([make_step(i) for i in range(10)])
    er = ExperienceReplay(src, bs=4, max_sz=8, return_idxs=True, seed=0)
    out = list(er)
    assert len(out) == 7  # a sample per item once 4 are stored
    for batch, idxs in out:
        assert torch.equal(batch.idxs, idxs) and len(set(idxs.tolist())) == 4


# ---------------------------------------------------------------- state_dict / save / load

def test_save_load_round_trip(tmp_path):
    a = filled(55, max_sz=40, bs=8, seed=3)
    for _ in range(3): a.sample()
    path = tmp_path / 'buffer.pt'
    a.save(path)
    b = ExperienceReplay(None, bs=1, max_sz=40, seed=123)
    b.load(path)
    c = ExperienceReplay(None, bs=1, max_sz=40, seed=456)
    c.load_state_dict(a.state_dict())
    for other in (b, c):
        assert (other._sz_tracker, other._idx_tracker, other._cycle_tracker, other.bs) == \
               (a._sz_tracker, a._idx_tracker, a._cycle_tracker, a.bs)
        assert list(other.memory) == list(a.memory)
    for _ in range(5):
        x, y, z = a.sample(), b.sample(), c.sample()
        assert x == y == z
        assert torch.equal(x.idxs, y.idxs) and torch.equal(x.idxs, z.idxs)
    # the restored buffers keep writing where the original does
    more = [make_step(100 + i) for i in range(7)]
    for buf in (a, b, c): buf.add(more)
    assert list(a.memory) == list(b.memory) == list(c.memory)
    assert a._idx_tracker == b._idx_tracker == c._idx_tracker
    assert_state_equal(a.state_dict(), b.state_dict())


def test_empty_buffer_round_trip(tmp_path):
    a = ExperienceReplay(None, max_sz=5, seed=0)
    a.save(tmp_path / 'empty.pt')
    b = filled(3, max_sz=5)
    b.load(tmp_path / 'empty.pt')
    assert len(b) == 0 and b._idx_tracker == 0


def test_load_other_max_sz_raises_and_changes_nothing(tmp_path):
    a = filled(55, max_sz=40, bs=8, seed=3)
    path = tmp_path / 'buffer.pt'
    a.save(path)
    d = filled(12, max_sz=41, bs=2, seed=5, start=500)
    before = d.state_dict()
    with pytest.raises(ValueError, match='max_sz 40'):
        d.load(path)
    assert_state_equal(before, d.state_dict())
    with pytest.raises(ValueError, match='max_sz 40'):
        d.load_state_dict(a.state_dict())
    assert_state_equal(before, d.state_dict())
    assert d.sample() == filled(12, max_sz=41, bs=2, seed=5, start=500).sample()


def test_corrupt_file_raises_value_error_naming_path(tmp_path):
    path = tmp_path / 'corrupt.pt'
    path.write_bytes(np.random.default_rng(0).bytes(4096))
    d = filled(12, max_sz=20, seed=5)
    before = d.state_dict()
    with pytest.raises(ValueError) as e:
        d.load(path)
    assert str(path) in str(e.value)
    assert_state_equal(before, d.state_dict())


# ---------------------------------------------------------------- bad input

def _bad_shape(er): er.add(make_step(99, state_dim=3))

BAD_INPUT = [
    # id, buffer to build first (or None), action, exception, substrings of the message
    ('bs<1', None, lambda _: ExperienceReplay(None, bs=0), ValueError, ['bs=0 is not an int >= 1']),
    ('sample bs<1', lambda: filled(5), lambda er: er.sample(-2), ValueError, ['bs', '-2']),
    ('max_sz<1', None, lambda _: ExperienceReplay(None, max_sz=-3), ValueError, ['max_sz', '-3']),
    ('bs>max_sz', None, lambda _: ExperienceReplay(None, bs=7, max_sz=5), ValueError, ['bs (7)', 'max_sz (5)']),
    ('non-int bs', None, lambda _: ExperienceReplay(None, bs=1.5), ValueError, ['1.5']),
    ('sample non-int bs', lambda: filled(5), lambda er: er.sample(1.5), ValueError, ['1.5']),
    ('non-step upstream', lambda: ExperienceReplay(IterableWrapper([1, 'x'])), lambda er: list(er), TypeError, ['int: 1']),
    ('state shape', lambda: filled(5), _bad_shape, ValueError, ["'state'", '(3,)', '(2,)']),
    ('sample empty', lambda: ExperienceReplay(None, max_sz=5), lambda er: er.sample(), ValueError, ['empty']),
    ('sample > stored', lambda: filled(3, max_sz=10), lambda er: er.sample(5), ValueError, ['sample 5', 'holding 3']),
    ('unknown env id', None, lambda _: GymTransformBlock(None, n=5)(['NoSuchEnv-v0']), ValueError, ['NoSuchEnv-v0']),
    ('n=-1', None, lambda _: GymTransformBlock(None, n=-1)(['CartPole-v1']), ValueError, ['-1']),
    ('state shapes differ within one list', lambda: filled(5),
     lambda er: er.add([make_step(50), make_step(51, state_dim=3)]), ValueError, ["'state'", '(3,)']),
]


def _case(c):
    "A table row as a pytest.param with its first value as id."
    return pytest.param(*c[1:], id=c[0])


@pytest.mark.parametrize('build,action,exc,contains', [_case(c) for c in BAD_INPUT])
def test_bad_input(build, action, exc, contains):
    er = build() if build else None
    before = er.state_dict() if er is not None else None
    with pytest.raises(exc) as e:
        action(er)
    for s in contains: assert s in str(e.value), f"{s!r} not in {str(e.value)!r}"
    if er is not None: assert_state_equal(before, er.state_dict())


def test_add_with_other_action_dtype_is_rejected():
    "A float action into a buffer of int actions would be truncated by numpy's cast: the add is refused, naming the field."
    er = filled(3, max_sz=5)
    before = er.state_dict()
    odd = SimpleStep(state=[1., 2.], action=0.7, next_state=[1., 2.])
    for add in (er.add, lambda s: er.add([s]), lambda s: er.add(SimpleStep.from_steps([s]))):   # single, list, batch
        with pytest.raises(ValueError, match="'action' has dtype float32, the buffer stores int64"): add(odd)
        assert_state_equal(before, er.state_dict())
    assert len(er) == 3 and er.sample(3).action.dtype == torch.int64


def test_empty_batch_first_add_round_trip(tmp_path):
    er = ExperienceReplay(None, max_sz=5, seed=0)
    er.add(SimpleStep.from_steps([make_step(1)])[0:0])
    assert len(er) == 0
    er.save(tmp_path / 'b.pt')
    other = ExperienceReplay(None, max_sz=5)
    other.load(tmp_path / 'b.pt')
    assert len(other) == 0


# ---------------------------------------------------------------- graph traversal

def _find(graph, cls):
    found = []
    for dp, sub in graph.values():
        if isinstance(dp, cls): found.append(dp)
        found += _find(sub, cls)
    return found


def _traverse_measured(pipe):
    "traverse_dps(pipe) and the peak Python memory it allocated."
    tracemalloc.start()
    try:
        graph = traverse_dps(pipe)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return graph, peak


def _collect(n):
    return list(GymTransformBlock(None, n=n, seed=0)(['CartPole-v1']).unbatch())


def test_traverse_dps_does_not_copy_storage():
    "Finding the buffer in a graph must not pickle its columns (torch pickles each pipe's pipe/collection attributes)."
    steps = SimpleStep.from_steps(_collect(3000))
    pipe = GymTransformBlock(None, seed=0)(['CartPole-v1']).unbatch()
    er = ExperienceReplay(pipe, max_sz=200_000)
    for _ in range(40): er.add(steps)  # 120_000 rows
    nbytes = er.buffer.storage.nbytes()
    assert nbytes > 10_000_000
    assert not any(isinstance(v, (np.ndarray, torch.Tensor)) for v in vars(er).values())
    graph, peak = _traverse_measured(er.header(5))
    assert _find(graph, ExperienceReplay) == [er]
    assert peak < nbytes / 10, f"traverse_dps allocated {peak} bytes: the {nbytes}-byte storage was pickled"


def test_traverse_dps_on_filled_env_pipeline():
    pipe = GymTransformBlock(None, n=3000, seed=0)(['CartPole-v1']).unbatch()
    er = ExperienceReplay(pipe, max_sz=200_000)
    for _ in er: pass
    assert len(er) == 3000
    graph, peak = _traverse_measured(er.header(5))
    assert _find(graph, ExperienceReplay) == [er]
    assert peak < er.buffer.storage.nbytes() / 10
