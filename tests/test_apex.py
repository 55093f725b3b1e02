"Ape-X: the replay server and actor in one process, and one bounded run on a local Ray with an actor killed mid-run."
import csv
import json
import signal
import subprocess

import numpy as np
import pytest
import torch
from fastrl_per.core import SimpleStep
from fastrl_per.envs import GymTransformBlock
from fastrl_per.dqn import QNetwork
from fastrl_per.apex import ReplayServer, ApexActor, ApexRun, apex_epsilons, td_errors, ray_get
from test_cli import COMMAND, interrupt   # the single-process run's SIGINT test: start a long run, signal it once it has checkpointed


def nstep_batch(n=40, seed=0):
    return SimpleStep.from_steps(list(GymTransformBlock(None, n=n, seed=seed)(['CartPole-v1']).unbatch().nstep(3, 0.99)))


@pytest.mark.parametrize('n', [1, 2, 5, 8])
def test_epsilons_follow_the_apex_schedule(n):
    eps = apex_epsilons(n)
    assert eps[0] == 0.4 and len(eps) == n
    if n > 1: assert np.isclose(eps[-1], 0.4 ** 8) and all(a > b for a, b in zip(eps, eps[1:]))


@pytest.mark.parametrize('bad', [dict(n=0), dict(n=2, eps=1.5), dict(n=2, eps=-0.1), dict(n=True)])
def test_epsilons_reject_bad_input(bad):
    with pytest.raises(ValueError): apex_epsilons(**bad)


def test_actor_priorities_are_its_own_nstep_td_errors():
    "The priorities an actor pushes are |n-step TD error| + eps under the weights it acted with."
    server = ReplayServer(max_sz=1_000, bs=8, alpha=1., seed=0)
    actor = ApexActor('CartPole-v1', server, epsilon=0.5, seed=1, n=3, gamma=0.9)
    torch.manual_seed(0)
    net = QNetwork(4, 2, layer_norm=True)   # the actor's network: LayerNorm, as the learner's
    result = actor.collect(net.state_dict(), 1, 64)
    assert result['version'] == 1 and result['steps'] == 64 == len(server.buffer)
    stored = server.buffer.memory[:]
    expected = td_errors(net, stored, 0.9).abs().double() + server.buffer.eps
    np.testing.assert_allclose(server.buffer.priorities[:64], expected.numpy(), rtol=1e-5)
    assert {int(k) for k in stored.n_steps} <= {1, 2, 3} and 3 in set(stored.n_steps.tolist())


def test_replay_server_rejects_bad_priorities_before_storing():
    server = ReplayServer(max_sz=100, bs=4, seed=0)
    batch = nstep_batch()
    for td in (torch.ones(len(batch) + 1), torch.full((len(batch),), float('nan'))):
        with pytest.raises(ValueError): server.add(batch, td)
        assert server.stats()['n_added'] == 0


def test_stale_rule_with_prefetched_samples():
    "The learner draws its next batch before updating the last; an actor adds in between, rewriting some drawn slots."
    server = ReplayServer(max_sz=32, bs=16, alpha=1., seed=0)
    batch = nstep_batch(60)
    server.add(batch[:32], torch.ones(32))
    first, second = server.sample_batches(2)       # one call draws both: `second` before `first`'s update
    server.add(batch[32:48], torch.ones(16))       # rewrites slots 0..15
    server.update_priorities(first.idxs, torch.full((16,), 7.))
    p, idxs = server.buffer.priorities, first.idxs.numpy()
    assert np.allclose(p[idxs[idxs < 16]], 1 + 1e-6)   # rewritten since drawn: dropped
    assert np.allclose(p[idxs[idxs >= 16]], 7 + 1e-6)  # untouched since drawn: applied
    server.update_priorities(second.idxs, torch.full((16,), 3.))
    idxs = second.idxs.numpy()
    assert np.allclose(p[idxs[idxs < 16]], 1 + 1e-6) and np.allclose(p[idxs[idxs >= 16]], 3 + 1e-6)


def test_feedback_of_several_batches_in_one_call_is_feedback_one_after_another():
    "The learner sends the priorities of a set of batches concatenated: the buffer ends as if it had them batch by batch."
    batch = nstep_batch(60)
    servers = [ReplayServer(max_sz=24, bs=8, alpha=0.7, seed=1) for _ in range(2)]
    for s in servers: s.add(batch[:24], torch.ones(24))
    sets = [s.sample_batches(3) for s in servers]
    for s in servers: s.add(batch[24:30], torch.full((6,), 2.))   # rewrites slots 0..5: stale for what was drawn there
    tds = [torch.randn(8, generator=torch.Generator().manual_seed(i)) for i in range(3)]
    for b, td in zip(sets[0], tds): servers[0].update_priorities(b.idxs, td)
    servers[1].update_priorities(torch.cat([b.idxs for b in sets[1]]), torch.cat(tds))
    assert all(torch.equal(a.idxs, b.idxs) for a, b in zip(*sets))   # same seed, same draws
    np.testing.assert_array_equal(servers[0].buffer.priorities, servers[1].buffer.priorities)
    assert min(s.buffer.prioritizer.stale_dropped for s in servers) > 0   # counted per update call, so only both > 0


def test_ray_run_survives_a_killed_actor():
    "Two actors on a local Ray, a few hundred steps; actor 0 is killed mid-run: training goes on, the buffer's count only grows, the actor comes back."
    ray = pytest.importorskip('ray', reason="Ape-X needs the ray extra: pip install 'fastrl_per[ray]'")
    torch.set_num_threads(1)
    run = ApexRun('CartPole-v1', actors=2, seed=0, bs=32, chunk=20, publish_every=10, timeout=60, num_cpus=2).start()   # a loaded machine starts actors slowly
    try:
        before = ray_get(run.actors[0].collect.remote(None, 0, 1), 60, 'actor 0')['pid']
        rows, counts, killed_at = [], [], None
        for row in run.iterate(400):
            rows.append(row)
            if len(rows) % 20 == 0: counts.append(run.stats()['n_added'])
            if len(rows) == 60:
                ray.kill(run.actors[0], no_restart=False)
                killed_at = row['update']
        assert killed_at is not None and rows[-1]['update'] > killed_at + 50   # updates went on after the kill
        assert run.episodes.frames >= 400 and counts == sorted(counts) and run.stats()['n_added'] >= counts[-1]
        assert rows[-1]['version'] > 1 and all(np.isfinite(r['loss']) for r in rows)
        after = ray_get(run.actors[0].collect.remote(None, 0, 1), 60, 'actor 0 after its restart')['pid']
        assert after != before
    finally:
        run.close()
    assert not ray.is_initialized()


def test_without_ray_the_error_names_the_extra(monkeypatch):
    import builtins
    real_import = builtins.__import__
    def no_ray(name, *args, **kwargs):
        if name == 'ray': raise ImportError("No module named 'ray'")
        return real_import(name, *args, **kwargs)
    monkeypatch.setattr(builtins, '__import__', no_ray)
    with pytest.raises(ImportError, match=r"fastrl_per\[ray\]"): ApexRun().start()


# `fastrl_per train --actors N`: a run directory like any other



def command(*args, timeout=240):
    return subprocess.run([*COMMAND, *map(str, args)], capture_output=True, text=True, timeout=timeout)


def test_actors_refuse_what_apex_does_not_take(tmp_path):
    pytest.importorskip('ray', reason="Ape-X needs the ray extra: pip install 'fastrl_per[ray]'")
    from fastrl_per.train import train
    with pytest.raises(ValueError, match='--dueling does not apply to --actors'): train(actors=1, dueling=True, out=tmp_path / 'a')
    with pytest.raises(ValueError, match=r'--actors trains the mlp Q-network \(Ape-X\), not --model recurrent'):
        train(actors=1, model='recurrent', out=tmp_path / 'a')
    assert not (tmp_path / 'a').exists()


def test_apex_run_stops_on_sigint_resumes_and_evaluates(tmp_path):
    "Two actors until the run has checkpointed past 100 steps, then SIGINT: exit 130 with a checkpoint holding the replay; --resume continues it; evaluate reads it."
    pytest.importorskip('ray', reason="Ape-X needs the ray extra: pip install 'fastrl_per[ray]'")
    out = tmp_path / 'run'
    code, _, stderr = interrupt(out, signal.SIGINT, '--actors', '2', '--eval-every', '200', '--eval-episodes', '1')
    assert code == 130 and 'stopped by SIGINT' in stderr and 'Traceback' not in stderr, stderr
    state = torch.load(out / 'checkpoint.pt', weights_only=True)
    manifest = json.loads((out / 'run.json').read_text())
    assert state['learner'] == manifest['learner'] == 'ApexRun' and state['config']['actors'] == 2
    assert manifest['env_steps'] == state['frames'] >= 100 and sum(state['actor_steps']) == state['frames']
    assert state['replay']['n_added'] >= state['frames']   # calls in flight may have pushed more
    assert state['weights_version'] == 1 + state['updates'] // 50   # published at the start and every 50 updates
    assert all((out / name).exists() for name in ('metrics.csv', 'plot.png', 'tb'))
    with open(out / 'metrics.csv', newline='') as f: evaluated = any(r['eval_return'] for r in csv.DictReader(f))
    assert (out / 'best.pt').exists() == evaluated   # evaluations every 200 steps; a stop by signal does not evaluate
    frames = state['frames']
    done = command('train', '--resume', out, '--steps', frames + 200, '--no-progress')
    assert done.returncode == 0, done.stderr
    assert "the actors' envs started afresh" in done.stdout and f'{frames + 200}' in done.stdout
    resumed = torch.load(out / 'checkpoint.pt', weights_only=True)
    assert resumed['frames'] >= frames + 200 and resumed['replay']['n_added'] > state['replay']['n_added'] and resumed['updates'] > state['updates']
    with open(out / 'metrics.csv', newline='') as f: rows = list(csv.DictReader(f))
    assert [int(r['update']) for r in rows] == list(range(1, len(rows) + 1))
    assert [int(r['frame']) for r in rows] == sorted(int(r['frame']) for r in rows)
    assert len(json.loads((out / 'run.json').read_text())['legs']) == 2
    evaluated = command('evaluate', out, '--episodes', 2)
    assert evaluated.returncode == 0 and 'mean return over 2 greedy episodes' in evaluated.stdout, evaluated.stderr


def test_one_actor_runs_the_learners_algorithm():
    "With one actor, Ape-X is the single-process Learner (3-step returns, Ape-X's default) made asynchronous: same initial network, exploration and beta schedules, update count and loss scale on the same seed."
    pytest.importorskip('ray', reason="Ape-X needs the ray extra: pip install 'fastrl_per[ray]'")
    from fastrl_per.learner import Learner
    torch.set_num_threads(1)
    steps = 1_500
    run = ApexRun('CartPole-v1', actors=1, seed=0, total_steps=steps, timeout=60)
    learner = Learner('CartPole-v1', seed=0, total_steps=steps, **{k: run.config[k] for k in ('n_step', 'bs', 'tau', 'lr', 'max_sz', 'layer_norm')})
    assert all(torch.equal(a, b) for a, b in zip(learner.model.state_dict().values(), run.model.state_dict().values()))
    single = learner.fit(steps)
    with run: apex = run.fit(steps)
    assert not run.running
    # what asynchrony changes: the actor steps ahead of the learner (a few calls of 50), so Ape-X makes somewhat fewer updates in the same steps;
    # never more than one per env step that has reached the replay (replay_ratio 1), which it nears when a loaded machine slows the actor
    assert 0.75 * len(single) <= len(apex) and all(r['update'] <= r['frame'] for r in apex)
    schedule = lambda frame: 1 - 0.99 * min(1., frame / 5_000)       # the Learner's 1 -> 0.01 decay over 5,000 env steps
    for rows in (single, apex): assert abs(rows[-1]['epsilon'] - schedule(rows[-1]['frame'])) <= 0.99 * 100 / 5_000   # within two calls of 50 steps
    assert 0.4 < apex[-1]['beta'] <= single[-1]['beta'] + 0.05      # both anneal over the planned updates; Ape-X, with fewer updates, no further
    median = lambda rows: np.median([r['loss'] for r in rows])
    # both learn: the loss falls at least threefold (measured with LayerNorm: 27x for the Learner; 8.5x to 27.6x for
    # Ape-X alone on the machine, 4.7x with another job beside it, as the actor runs further ahead of the learner)
    for rows in (single, apex): assert median(rows[-300:]) < median(rows[:50]) / 3
    # their loss levels are not compared: the importance weights and how far behind the actor's data the learner is
    # differ with the machine's load (a factor of 13 apart at load 15), and that is asynchrony, not another algorithm
