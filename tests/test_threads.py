"""One writer thread and one reader thread may share a buffer.

A writer adds (single steps, so the deferred bookkeeping runs concurrently too, and
batches; whole episodes for the sequence buffer) while a reader samples and feeds
priorities back, for many rounds, with Python switching threads as often as it can.
Nothing may raise, and at the end the sum tree must equal one rebuilt from the raw
priorities.
"""
import sys
import threading

import numpy as np
import pytest

from fastrl_per.core import SimpleStep
from fastrl_per.replay.per import PrioritizedExperienceReplay, PrioritizedReplayBuffer
from fastrl_per.replay.sequence import Episode, PrioritizedSequenceReplay
from fastrl_per.replay.sumtree import SumTree


def make_step(i, episode_n=0, last=False):
    return SimpleStep(state=[float(i), 1.], action=i % 2, next_state=[i + 1., 1.], terminated=last,
                      reward=float(i), step_n=i, episode_n=episode_n)


@pytest.fixture
def busy_switching():
    "Switch threads every microsecond, so that unlocked code would interleave mid-method."
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(old)


def run_concurrently(write, read, rounds):
    "`write(i)` for i < rounds in one thread while `read()` runs in another until the writer is done; errors of both."
    errors, done = [], threading.Event()
    def writer():
        try:
            for i in range(rounds): write(i)
        except Exception as e: errors.append(e)
        finally: done.set()
    def reader():
        try:
            while not done.is_set(): read()
        except Exception as e: errors.append(e)
    threads = [threading.Thread(target=writer), threading.Thread(target=reader)]
    for t in threads: t.start()
    for t in threads: t.join(timeout=600)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    return errors


def assert_tree_is_rebuild(core):
    "The tree's leaves and total equal those of a tree built afresh from the raw priorities of the keys in the draw."
    fresh = SumTree(core.capacity)
    fresh.update(np.arange(core.capacity), np.where(core.active, core.raw ** core.alpha, 0.))
    np.testing.assert_array_equal(core.kind[:], fresh[:])
    assert core.kind.total == pytest.approx(fresh.total, rel=1e-9)
    assert core.kind.min == fresh.min


@pytest.mark.parametrize('pipe', [False, True])
def test_transition_buffer_add_while_sampling_and_updating(busy_switching, pipe):
    buf = PrioritizedReplayBuffer(max_sz=500, bs=32, seed=0)
    target = PrioritizedExperienceReplay(None, bs=32, max_sz=500, seed=0) if pipe else buf
    target.add(SimpleStep.from_steps([make_step(i) for i in range(64)]))
    rng = np.random.default_rng(1)
    def write(i):
        if i % 50 == 0: target.add(SimpleStep.from_steps([make_step(i + k) for k in range(7)]))   # a batch now and then
        else: target.add(make_step(i))
    def read():
        batch = target.sample()
        target.update_priorities(batch.idxs, rng.normal(size=len(batch.idxs)))   # signed TD errors
    errors = run_concurrently(write, read, 5_000)
    assert errors == []
    core = target.prioritizer
    assert_tree_is_rebuild(core)
    assert (core.raw[:len(target)] > 0).all() and (core.raw[len(target):] == 0).all()


def test_sequence_buffer_add_while_sampling_and_updating(busy_switching):
    buf = PrioritizedSequenceReplay(300, seed=0)
    # 500 episodes (about 3,000 steps, ten trips round the ring) with some 100,000 reads between them: the reader
    # spins while each episode is built, so the rounds set the time (3,000 took two minutes); without the lock this
    # test raised within the first 2.5 s of each of three tries
    lengths = np.random.default_rng(2).integers(1, 12, size=500)
    for e in range(5): buf.add(Episode([make_step(i, e, i == 5) for i in range(6)]))
    rng = np.random.default_rng(3)
    def write(e):
        n = int(lengths[e])
        buf.add(Episode([make_step(i, e, i == n - 1) for i in range(n)]))
    def read():
        batch = buf.sample_prioritized(16, 3, pad=bool(rng.integers(2)))   # two lengths: the tree is re-laid too
        buf.update_priorities(batch.indices, rng.normal(size=len(batch)))
        buf.sample(4, 1)
    errors = run_concurrently(write, read, len(lengths))
    assert errors == []
    assert_tree_is_rebuild(buf.prioritizer)
    stored = buf._slots(buf.ids)
    assert (buf.prioritizer.raw[stored] > 0).all() and np.count_nonzero(buf.prioritizer.raw) == buf.n_episodes


def test_copies_get_their_own_lock():
    import copy, pickle
    buf = PrioritizedReplayBuffer(max_sz=8, seed=0)
    buf.add(make_step(0))
    for other in (copy.deepcopy(buf), pickle.loads(pickle.dumps(buf))):
        assert other.lock is not buf.lock
        with other.lock: assert len(other.sample(2)) == 2   # re-entrant: sample takes it again
