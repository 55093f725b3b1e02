"The background collector with real CartPole: episode boundaries, policy versions, its worker's life and failures, the stale rule under concurrency, learning."
import gc, multiprocessing, os, signal, subprocess, sys, threading, time
from pathlib import Path
import numpy as np
import pytest
import torch
from fastrl_per.learners.dqn import QNetwork
from fastrl_per.learners.learner import Learner
from fastrl_per.stages.pipes import UnbatchSteps
from fastrl_per.replay.per import PrioritizedReplayBuffer
from fastrl_per.learners.collect import AsyncCollector, Publish
from conftest import wait_for_saved_steps


def wait_for(count, running, seconds=10.):
    "Wait until `running()` is down to `count` (a worker's end is asynchronous, and its queues' threads end when they are collected); the count reached."
    deadline = time.monotonic() + seconds
    while running() > count and time.monotonic() < deadline: gc.collect(); time.sleep(0.02)
    return running()

def processes(): return len(multiprocessing.active_children())


def test_transitions_at_episode_boundaries_match_the_synchronous_stepper():
    "Each sub-env's rows chain state to next state within an episode; an episode's end is followed by step 1 of the next (autoreset rows left out)."
    net = QNetwork(4, 2)
    collector = AsyncCollector('CartPole-v1', net, seed=3, nenvs=2, explore_start=1., explore_end=1., n=150)
    ours = list(collector)
    collector.close()
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
    collector = AsyncCollector('CartPole-v1', net, seed=0, explore_start=0., explore_end=0., chunk=1)
    stream, seen = iter(collector), []
    for version in range(1, 6):
        with torch.no_grad(): net[-1].bias.copy_(torch.tensor([1., -1.]) * (1 if version % 2 else -1) * 100)
        collector.publish(net.state_dict(), version)
        for _ in range(4):
            b = next(stream)
            seen.append(collector.version)   # the version of the weights that chose `b`
            if collector.version == version: assert int(b.action) == (0 if version % 2 else 1)   # greedy on that bias
    collector.close()
    assert seen == sorted(seen) and seen[-1] == 5
    with pytest.raises(ValueError, match='must grow'): collector.publish(net.state_dict(), 5)


@pytest.mark.parametrize('method', ['process', 'thread'])
@pytest.mark.parametrize('how', ['close', 'break', 'exhaust', 'error'])
def test_the_worker_outlives_its_consumers_until_closed(method, how):
    "However a consumer stops, the worker goes on with the same episodes for the next; `close()` ends it, then a new worker starts afresh."
    children = wait_for(0, processes)              # earlier tests' workers may still be ending
    gc.collect()
    threads = threading.active_count()
    collector = AsyncCollector('CartPole-v1', QNetwork(4, 2), seed=0, chunk=3, method=method, n=7 if how == 'exhaust' else None)
    stream = iter(collector)
    if how == 'close':
        first = [next(stream)]; stream.close()
    elif how == 'break':
        first = []
        for b in collector:
            first.append(b)
            if len(first) == 5: break
    elif how == 'exhaust':
        first = list(stream)
        assert len(first) == 7
    else:
        first = []
        with pytest.raises(ZeroDivisionError):
            for b in collector: first.append(b); 1 / 0
    collector.n = 4
    after = list(collector)
    assert torch.equal(after[0].state, first[-1].next_state) or bool(first[-1].terminated or first[-1].truncated)
    assert collector.steps == len(first) + 4
    assert (processes(), threading.active_count()) > (children, threads)
    collector.close()
    assert wait_for(children, processes) <= children and wait_for(threads, threading.active_count) <= threads
    kept = [b for _, b in collector.ready]   # stepped ahead by the closed worker: its last chunk's rest, the calls in flight
    collector.n = len(kept) + 1
    again = list(collector)          # a new worker: the kept batches first, then a fresh episode's first step
    assert all(a is b for a, b in zip(again, kept)) and int(again[-1].step_n) == 1
    collector.close()


@pytest.fixture
def busy_loops():
    "Two processes spinning on the machine's CPUs while a test runs (as a loaded machine, or CUDA torch's slow imports, would)."
    loops = [subprocess.Popen([sys.executable, '-c', 'while True: pass']) for _ in range(2)]
    yield
    for p in loops: p.kill(); p.wait()

def test_close_waits_for_the_worker_process_even_under_load(busy_loops):
    "Once `close()` returns no process of the collector is alive: no waiting loop after it."
    collector = AsyncCollector('CartPole-v1', QNetwork(4, 2), seed=0, chunk=2)
    stream = iter(collector)
    for _ in range(5): next(stream)
    worker = collector.process
    collector.close()
    assert not worker.is_alive() and worker.exitcode == 0 and multiprocessing.active_children() == []

def test_a_worker_that_does_not_exit_is_terminated_with_a_warning():
    from fastrl_per.learners.collect import join_worker
    stuck = multiprocessing.get_context('spawn').Process(target=time.sleep, args=(60,))
    stuck.start()
    with pytest.warns(RuntimeWarning, match='did not exit within 0.5 s'): join_worker(stuck, 0.5)
    assert not stuck.is_alive()


def failing_setup(): raise ValueError("no such simulator here")

def test_a_killed_worker_process_is_an_error_not_a_hang_and_the_next_iterator_starts_another():
    collector = AsyncCollector('CartPole-v1', QNetwork(4, 2), seed=0, chunk=2)
    stream = iter(collector)
    next(stream)
    os.kill(collector.process.pid, signal.SIGKILL)
    started = time.monotonic()
    with pytest.raises(RuntimeError, match='exit code -9'):
        for _ in range(1_000): next(stream)
    assert time.monotonic() - started < 10
    collector.ready.clear()
    collector.n = 3
    assert len(list(collector)) == 3       # a new worker
    collector.close()


def test_an_error_in_the_worker_reaches_the_consumer():
    collector = AsyncCollector('CartPole-v1', QNetwork(4, 2), seed=0, method='thread', setup=failing_setup)
    with pytest.raises(ValueError, match='no such simulator'): next(iter(collector))
    assert collector.stream is None


@pytest.mark.parametrize('bad, match', [(dict(method='fork'), "'fork'"), (dict(chunk=0), 'chunk'), (dict(env_id='NoSuchEnv-v0'), 'NoSuchEnv')])
def test_bad_arguments_are_refused_by_name(bad, match):
    args = dict(env_id='CartPole-v1', model=QNetwork(4, 2)) | bad
    with pytest.raises(ValueError, match=match): AsyncCollector(**args)


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
        collector.close()
    assert not writer.is_alive()


def test_training_with_the_collector_learns():
    "DQN fed by the collector, publishing every 20 updates: CartPole returns well above a random policy's (~22) after 2,500 steps."
    torch.set_num_threads(1)
    learner = Learner('CartPole-v1', seed=0, total_steps=2_500, explore_steps=1_000, bs=64, n_step=1)   # an update per env step from step 64
    collector = AsyncCollector('CartPole-v1', learner.model, seed=0, explore_steps=1_000, n=2_500)
    learner.episodes.source_datapipe = UnbatchSteps(collector)    # where the learner's steps come from
    learner.pipe = Publish(learner.pipe, collector, learner.model, every=20)
    rows = learner.fit(2_500)
    collector.close()
    returns = [r for _, r in learner.episodes.returns]
    assert len(rows) == 2_500 - 63 and collector.version >= 100
    assert np.mean(returns[:10]) < 40 and np.mean(returns[-10:]) > 60, returns


COMMAND = [str(Path(sys.executable).parent / 'fastrl_per')]

def test_the_command_with_a_collector_stops_on_ctrl_c_of_its_process_group_and_resumes(tmp_path):
    "`fastrl_per train --collector process`: Ctrl-C reaches the learner and its worker (one process group); the run saves, the worker ends, `--resume` finishes."
    run = tmp_path / 'run'
    flags = ['--checkpoint-every', '200', '--eval-every', '500', '--eval-episodes', '2', '--solved', '0', '--no-progress']
    proc = subprocess.Popen([*COMMAND, 'train', '--collector', 'process', '--steps', '1500', '--out', str(run), *flags],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    wait_for_saved_steps(proc, run, 200)
    os.killpg(proc.pid, signal.SIGINT)   # what a terminal's Ctrl-C does
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130 and 'stopped by SIGINT' in stderr and 'Traceback' not in stderr, stderr
    def group_alive():
        try: os.killpg(proc.pid, 0)
        except ProcessLookupError: return 0
        return 1
    assert wait_for(0, group_alive) == 0   # nothing of the run is left: its worker ended too
    saved = torch.load(run / 'checkpoint.pt', weights_only=True)
    assert saved['config']['collector'] == 'process' and saved['envs'] is None and saved['collector']['steps'] >= 200
    resumed = subprocess.run([*COMMAND, 'train', '--resume', str(run), *flags], capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resumed at step {saved['env_steps']}: the envs started fresh episodes" in resumed.stdout
    frames = [int(line.split(',')[0]) for line in (run / 'metrics.csv').read_text().splitlines()[1:]]
    assert frames == sorted(frames) and frames[-1] > 1500 - 3   # the last env steps may store no 3-step transition yet
    assert torch.load(run / 'checkpoint.pt', weights_only=True)['env_steps'] == 1500


def test_a_learner_with_a_collector_restores_its_record_and_refuses_a_checkpoint_without_one():
    torch.set_num_threads(1)
    config = dict(env_id='CartPole-v1', seed=0, total_steps=1_000, collector='thread', publish_every=10)
    with Learner(**config) as first:
        first.fit(400)
        state = first.state_dict()
    assert state['collector']['steps'] == 400 and state['collector']['policy']['version'] >= 20
    with Learner(**config) as again:
        again.load_state_dict(state)
        assert (again.collector.steps, again.collector.published) == (400, state['collector']['policy']['version'])
        assert again.explorer.state_dict() == state['agent'] and again.agent.model is again.model
        assert len(again.fit(200)) > 150 and again.episodes.env_steps == 600
        assert again.collector.version > state['collector']['policy']['version']   # the learner went on publishing
    plain = Learner('CartPole-v1', seed=0, total_steps=1_000)
    with pytest.raises(ValueError, match='collector state unexpected'): plain.load_state_dict(dict(state, config=plain.config.plain()))
    assert plain.episodes.env_steps == 0 and plain.collector is None   # nothing was loaded
