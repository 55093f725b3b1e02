"The background collector with real CartPole: episode boundaries, policy versions, clean stops, the stale rule under concurrency, learning."
import threading, time
import numpy as np
import pytest
import torch
from fastrl_per.dqn import QNetwork
from fastrl_per.learner import Learner
from fastrl_per.pipes import UnbatchSteps
from fastrl_per.per import PrioritizedReplayBuffer
from fastrl_per.collect import AsyncCollector, Publish


def wait_for_threads(count, seconds=5.):
    "Wait until only `count` threads run (the worker's end is asynchronous); the count reached."
    deadline = time.monotonic() + seconds
    while threading.active_count() > count and time.monotonic() < deadline: time.sleep(0.02)
    return threading.active_count()


def test_transitions_at_episode_boundaries_match_the_synchronous_stepper():
    "Each sub-env's rows chain state to next state within an episode; an episode's end is followed by step 1 of the next (autoreset rows left out)."
    net = QNetwork(4, 2)
    ours = list(AsyncCollector('CartPole-v1', net, seed=3, nenvs=2, eps_start=1., eps_end=1., n=150))
    singles = [s for b in ours for s in b]
    ends = [s for s in singles if s.terminated or s.truncated]
    assert len(ends) >= 2
    by_env = {}
    for s in singles: by_env.setdefault(int(s.env_id), []).append(s)
    for steps in by_env.values():
        for a, b in zip(steps, steps[1:]):
            if a.terminated or a.truncated:   # the next row starts a new episode from a reset state
                assert (int(b.episode_n), int(b.step_n)) == (int(a.episode_n) + 1, 1)
                assert not torch.equal(b.state, a.next_state)
            else:
                assert torch.equal(b.state, a.next_state) and int(b.step_n) == int(a.step_n) + 1


def test_versions_grow_and_tag_what_each_version_chose():
    torch.manual_seed(0)
    net = QNetwork(4, 2)
    collector = AsyncCollector('CartPole-v1', net, seed=0, eps_start=0., eps_end=0., prefetch=1)
    stream, seen = iter(collector), []
    for version in range(1, 6):
        with torch.no_grad(): net[-1].bias.copy_(torch.tensor([1., -1.]) * (1 if version % 2 else -1) * 100)
        collector.publish(net.state_dict(), version)
        for _ in range(4):
            b = next(stream)
            seen.append(b.version)
            if b.version == version: assert int(b.action) == (0 if version % 2 else 1)   # greedy on that version's bias
    stream.close()
    assert seen == sorted(seen) and seen[-1] == 5
    with pytest.raises(ValueError, match='must grow'): collector.publish(net.state_dict(), 5)


@pytest.mark.parametrize('how', ['close', 'break', 'exhaust', 'error'])
def test_worker_thread_stops_with_the_consumer(how):
    before = threading.active_count()
    collector = AsyncCollector('CartPole-v1', QNetwork(4, 2), seed=0, prefetch=3, n=None if how != 'exhaust' else 7)
    stream = iter(collector)
    if how == 'close':
        next(stream); stream.close()
    elif how == 'break':
        for i, _ in enumerate(collector):
            if i == 5: break
    elif how == 'exhaust':
        assert len(list(stream)) == 7
    else:
        with pytest.raises(ZeroDivisionError):
            for b in collector: 1 / 0
    assert wait_for_threads(before) == before


def test_stale_updates_dropped_while_a_collector_thread_writes():
    "A writer thread fills a small ring from the collector while this thread samples, lets the ring lap, and updates."
    buf = PrioritizedReplayBuffer(max_sz=64, bs=16, seed=0)
    collector = AsyncCollector('CartPole-v1', QNetwork(4, 2), seed=0)
    stop = threading.Event()
    def write():
        for batch in collector:
            buf.add(batch)
            if stop.is_set(): break
    writer = threading.Thread(target=write); writer.start()
    try:
        while len(buf) < 64: time.sleep(0.01)
        batch = buf.sample()
        n0 = buf.storage.n_added
        while buf.storage.n_added < n0 + 64: time.sleep(0.01)   # every slot rewritten at least once since the draw
        stop.set()
        writer.join(10)
        before = buf.priorities.copy()
        buf.update_priorities(batch.idxs, torch.full((16,), 50.))
        np.testing.assert_array_equal(buf.priorities, before)      # all stale: nothing lands on the new occupants
        fresh = buf.sample()
        buf.update_priorities(fresh.idxs, torch.full((16,), 50.))
        assert np.allclose(buf.priorities[fresh.idxs.numpy()], 50 + buf.eps)
    finally:
        stop.set(); writer.join(10)
    assert not writer.is_alive()


def test_training_with_the_collector_learns():
    "DQN fed by the collector, publishing every 20 updates: CartPole returns well above a random policy's (~22) after 2,500 steps."
    torch.set_num_threads(1)
    learner = Learner('CartPole-v1', seed=0, total_steps=2_500, eps_decay_steps=1_000, bs=64, n_step=1)   # an update per env step from step 64
    collector = AsyncCollector('CartPole-v1', learner.model, seed=0, eps_decay_steps=1_000, n=2_500)
    learner.episodes.source_datapipe = UnbatchSteps(collector)    # where the learner's steps come from
    learner.pipe = Publish(learner.pipe, collector, learner.model, every=20)
    rows = learner.fit(2_500)
    returns = [r for _, r in learner.episodes.returns]
    assert len(rows) == 2_500 - 63 and collector.version >= 100
    assert np.mean(returns[:10]) < 40 and np.mean(returns[-10:]) > 60, returns
