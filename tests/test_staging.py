"""Single-step adds (bookkeeping run in batches) and packed row storage: nothing observable differs from one step at a time."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from fastrl_per.core import SimpleStep
from fastrl_per.replay.memory import ReplayBuffer
from fastrl_per.replay.per import PrioritizedReplayBuffer
from conftest import assert_state_equal


def make_step(i):
    return SimpleStep(state=[float(i), -float(i)], action=i % 3, next_state=[i + 0.5, i + 0.5], terminated=i % 5 == 0,
                      truncated=i % 7 == 0, reward=i / 4, total_reward=float(i), env_id=i % 2, step_n=i, episode_n=i // 10)


def pair(cls, max_sz, tell_every):
    "Two buffers seeded alike: one runs its bookkeeping every `tell_every` single steps, the other after each."
    staged, direct = cls(max_sz=max_sz, seed=0), cls(max_sz=max_sz, seed=0)
    staged.tell_every, direct.tell_every = tell_every, 1
    return staged, direct


def assert_batches_equal(a, b):
    assert a == b
    assert torch.equal(a.idxs, b.idxs) and torch.equal(a.weights, b.weights)


ops = st.lists(st.one_of(
    st.tuples(st.just('single'), st.integers(1, 6)),   # that many single adds
    st.tuples(st.just('batch'), st.integers(1, 9)),    # one batch add
    st.tuples(st.just('list'), st.integers(1, 4)),     # one add of a list of single steps
    st.tuples(st.just('sample'), st.integers(1, 5)),   # sample, then feed TD errors back
    st.tuples(st.just('read'), st.just(0)),            # len, trackers and memory
), min_size=1, max_size=25)


@settings(max_examples=150, deadline=None)
@given(st.sampled_from([ReplayBuffer, PrioritizedReplayBuffer]), st.integers(1, 12), st.integers(2, 8), ops)
def test_batched_bookkeeping_is_invisible(cls, max_sz, tell_every, history):
    staged, direct = pair(cls, max_sz, tell_every)
    n = 0
    for op, k in history:
        if op == 'single':
            for i in range(n, n + k):
                assert np.array_equal(staged.add(make_step(i)), direct.add(make_step(i)))
        elif op == 'batch':
            batch = SimpleStep.from_steps([make_step(i) for i in range(n, n + k)])
            assert np.array_equal(staged.add(batch), direct.add(batch))
        elif op == 'list':
            steps = [make_step(i) for i in range(n, n + k)]
            assert np.array_equal(staged.add(steps), direct.add(steps))
        elif op == 'sample' and len(direct) >= (k if cls is ReplayBuffer else 1):
            a, b = staged.sample(k), direct.sample(k)
            assert_batches_equal(a, b)
            if cls is PrioritizedReplayBuffer:
                td = np.abs(a.reward.numpy()) + a.idxs.numpy() / 10
                staged.update_priorities(a.idxs, td); direct.update_priorities(b.idxs, td)
        elif op == 'read':
            assert len(staged) == len(direct)
            assert [s.step_n.item() for s in staged.memory] == [s.step_n.item() for s in direct.memory]
        n += k if op in ('single', 'batch', 'list') else 0
        assert len(staged) == len(direct) == min(n, max_sz)
    assert_state_equal(staged.state_dict(), direct.state_dict())
    if cls is PrioritizedReplayBuffer: assert np.array_equal(staged.kind[:], direct.kind[:])


def test_bookkeeping_runs_at_the_limit_and_before_reads():
    buf = PrioritizedReplayBuffer(max_sz=10, seed=0)
    buf.tell_every = 4
    for i in range(3): buf.add(make_step(i))
    assert (buf.storage.n_added, buf._untold, len(buf), buf.draw.core.kind.total) == (3, 3, 3, 0.)
    buf.add(make_step(3))
    assert (buf._untold, buf.draw.core.kind.total) == (0, 4.)   # four leaves at max_priority 1
    buf.add(make_step(4))
    assert buf.kind.total == 5. and buf._untold == 0   # reading the tree caught it up


@pytest.mark.parametrize('bad,contains', [
    (SimpleStep(state=[0., 0., 0.], action=0, next_state=[0., 0., 0.]), "'state' has shape (3,)"),
    (SimpleStep(state=[0., 0.], action=0.5, next_state=[0., 0.]), "'action' has dtype float32"),
    ('a string', 'got str'),
])
def test_bad_single_step_changes_nothing(bad, contains):
    staged, direct = pair(PrioritizedReplayBuffer, 8, 100)
    for i in range(5): staged.add(make_step(i)); direct.add(make_step(i))
    with pytest.raises((ValueError, TypeError)) as e: staged.add(bad)
    assert contains in str(e.value)
    assert_state_equal(staged.state_dict(), direct.state_dict())
    staged.add(make_step(5)); direct.add(make_step(5))   # and it goes on as if nothing happened
    assert_batches_equal(staged.sample(4), direct.sample(4))


def test_load_state_with_pending_bookkeeping():
    source = PrioritizedReplayBuffer(max_sz=6, seed=1)
    source.add(SimpleStep.from_steps([make_step(i) for i in range(4)]))
    buf = PrioritizedReplayBuffer(max_sz=6, seed=0)
    for i in range(3): buf.add(make_step(100 + i))
    with pytest.raises(ValueError): buf.load_state_dict({**source.state_dict(), 'max_sz': 7})
    assert [s.step_n.item() for s in buf.memory] == [100, 101, 102]   # the failed load changed nothing
    buf.add(make_step(103))
    buf.load_state_dict(source.state_dict())
    assert len(buf) == 4 and [s.step_n.item() for s in buf.memory] == [0, 1, 2, 3]
    assert_state_equal(buf.state_dict(), source.state_dict())


def test_packed_rows_keep_mixed_dtypes_and_shapes(tmp_path):
    "An image state (uint8), an int32 action, float32 rewards and bools share one record, each aligned."
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (9, 3, 5, 5), dtype=np.uint8)
    steps = [SimpleStep(state=torch.from_numpy(images[i]), action=torch.tensor(i, dtype=torch.int32),
                        next_state=torch.from_numpy(images[(i + 1) % 9]), reward=float(i), terminated=i == 8, step_n=i)
             for i in range(9)]
    buf = ReplayBuffer(max_sz=12, seed=0)
    for s in steps: buf.add(s)
    record = buf.storage.rows.dtype
    assert all(offset % record.fields[n][0].base.itemsize == 0 for n, (_, offset) in
               ((n, record.fields[n][:2]) for n in record.names))
    assert record.itemsize % 8 == 0 and record.itemsize - sum(record.fields[n][0].itemsize for n in record.names) < 8
    batch = buf.sample(9)
    for k, i in enumerate(batch.idxs.tolist()):
        assert batch[k] == steps[i]
    assert batch.state.dtype == torch.uint8 and batch.action.dtype == torch.int32
    assert batch.state.contiguous().view(9, -1).shape == (9, 75)   # views work like any tensor once contiguous
    buf.save(tmp_path / 'b.pt')
    again = ReplayBuffer(max_sz=12)
    again.load(tmp_path / 'b.pt')
    assert all(a == b for a, b in zip(again.memory, steps))


def test_single_steps_with_grad_or_strides_are_stored_by_value():
    "Fields that need grad, or are strided views, are copied into the record; changing them later changes nothing."
    image = torch.rand(2, 10, 10, requires_grad=True)     # 200 elements: handed over as an array
    wide = torch.arange(12.).reshape(3, 4)[:, 1]           # a strided view of 3 elements
    step = SimpleStep(state=image, action=1, next_state=image * 2, reward=torch.tensor(0.5, requires_grad=True))
    strided = SimpleStep(state=wide, action=2, next_state=wide + 1)
    buf, other = ReplayBuffer(max_sz=4, seed=0), ReplayBuffer(max_sz=4, seed=0)
    buf.add(step); buf.add(step)
    other.add(strided)
    stored = buf.memory[1]
    assert torch.equal(stored.state, image.detach()) and stored.reward.item() == 0.5 and not stored.state.requires_grad
    assert other.memory[0].state.tolist() == [1., 5., 9.]
    with torch.no_grad(): image.add_(1.)                   # the caller reuses its tensor
    assert torch.equal(buf.memory[1].state, stored.state)


@pytest.mark.parametrize('how', ['deepcopy', 'pickle'])
def test_copies_of_a_buffer_stay_whole(how):
    "A copied buffer writes and reads its own records: no field is left behind as a detached copy."
    import copy, pickle
    buf = PrioritizedReplayBuffer(max_sz=8, seed=0)
    buf.add(SimpleStep.from_steps([make_step(i) for i in range(3)]))
    buf.add(make_step(3))
    twin = copy.deepcopy(buf) if how == 'deepcopy' else pickle.loads(pickle.dumps(buf))
    for b in (buf, twin):
        b.add(SimpleStep.from_steps([make_step(i) for i in range(4, 6)]))
        b.add(make_step(6))
    assert [s.step_n.item() for s in twin.memory] == list(range(7))
    assert_state_equal(twin.state_dict(), buf.state_dict())
    assert_batches_equal(twin.sample(5), buf.sample(5))
