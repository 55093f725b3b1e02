"Ape-X: the replay server and actor in one process, shards sampling as one buffer, bounded runs on a local Ray and on two-node\nclusters on loopback (ray.cluster_utils.Cluster) with an actor's node or the replay's node killed mid-run."
import csv
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time

import numpy as np
import pytest
import torch
from fastrl_per.core import SimpleStep
from fastrl_per.stages.envs import GymTransformBlock
from fastrl_per.learners.dqn import QNetwork
from fastrl_per.learners.apex import ReplayServer, ApexActor, ApexRun, apex_epsilons, batch_td_errors, ray_get
from fastrl_per.replay.store import SavedArrays
from conftest import wait_for_saved_steps
from test_cli import COMMAND, interrupt   # the single-process run's SIGINT test: start a long run, signal it once it has checkpointed


def nstep_batch(n=40, seed=0):
    return SimpleStep.from_steps(list(GymTransformBlock(None, n=n, seed=seed)(['CartPole-v1']).unbatch().nstep(3, 0.99)))


@pytest.mark.parametrize('n', [1, 2, 5, 8])
def test_epsilons_follow_the_apex_schedule(n):
    eps = apex_epsilons(n)
    assert eps[0] == 0.4 and len(eps) == n
    if n > 1: assert np.isclose(eps[-1], 0.4 ** 8) and all(a > b for a, b in zip(eps, eps[1:]))


@pytest.mark.parametrize('bad', [dict(n=0), dict(n=2, explore_base=1.5), dict(n=2, explore_base=-0.1), dict(n=True)])
def test_epsilons_reject_bad_input(bad):
    with pytest.raises(ValueError): apex_epsilons(**bad)


def test_actor_priorities_are_its_own_nstep_td_errors():
    "The priorities an actor pushes are |n-step TD error| + eps under the weights it acted with."
    server = ReplayServer(max_sz=1_000, bs=8, alpha=1., seed=0)
    actor = ApexActor('CartPole-v1', server, explore_end=0.5, seed=1, n=3, gamma=0.9)
    torch.manual_seed(0)
    net = QNetwork(4, 2, layer_norm=True)   # the actor's network: LayerNorm, as the learner's
    result = actor.collect(net.state_dict(), 1, 64)
    assert result['version'] == 1 and result['steps'] == 64 == len(server.buffer)
    stored = server.buffer.memory[:]
    expected = batch_td_errors(net, stored, 0.9).abs().double() + server.buffer.eps
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
    first, second = server.draw([16, 16])['batches']   # one call draws both: `second` before `first`'s update
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
    sets = [s.draw([8, 8, 8])['batches'] for s in servers]
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
        assert run.episodes.env_steps >= 400 and counts == sorted(counts) and run.stats()['n_added'] >= counts[-1]
        assert rows[-1]['version'] > 1 and all(np.isfinite(r['loss']) for r in rows)
        after = ray_get(run.actors[0].collect.remote(None, 0, 1), 60, 'actor 0 after its restart')['pid']
        assert after != before
    finally:
        run.close()
    assert not ray.is_initialized()
    assert run.restarts == [1, 0] == [a['restarts'] for a in run.placement['actors']]   # as Ray counted them


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
    from fastrl_per.run.train import train
    with pytest.raises(ValueError, match='`dueling` does not apply to `actors`'): train(actors=1, dueling=True, out=tmp_path / 'a')
    with pytest.raises(ValueError, match=r"`actors` trains the mlp Q-network \(Ape-X\), not model='recurrent'"):
        train(actors=1, model='recurrent', out=tmp_path / 'a')
    for kind in ('rank', 'lap'):   # Ape-X shards the proportional kind alone: refused by name before anything starts
        with pytest.raises(ValueError, match=f"the '{kind}' kind does not offer"):
            train(actors=1, prioritization=kind, out=tmp_path / 'a')
    assert not (tmp_path / 'a').exists()


def test_apex_run_stops_on_sigint_resumes_and_evaluates(tmp_path):
    "Two actors until the run has checkpointed past 100 steps, then SIGINT: exit 130 with a checkpoint naming the shard's save in replay/shard_0; --resume reloads it; evaluate reads it."
    pytest.importorskip('ray', reason="Ape-X needs the ray extra: pip install 'fastrl_per[ray]'")
    out = tmp_path / 'run'
    code, _, stderr = interrupt(out, signal.SIGINT, '--actors', '2', '--eval-every', '200', '--eval-episodes', '1')
    assert code == 130 and 'stopped by SIGINT' in stderr and 'Traceback' not in stderr, stderr
    state = torch.load(out / 'checkpoint.pt', weights_only=True)
    manifest = json.loads((out / 'run.json').read_text())
    assert state['learner'] == manifest['learner'] == 'ApexRun' and state['config']['actors'] == 2
    assert manifest['env_steps'] == state['env_steps'] >= 100 and sum(state['actor_steps']) == state['env_steps']
    shard = SavedArrays(out / 'replay' / 'shard_0').read()   # saved by the shard's Ray actor, when the run closed
    assert state['replay'] is None and shard['save_id'] == state['replay_save']
    assert shard['n_added'] >= state['env_steps']   # calls in flight may have pushed more
    assert state['weights_version'] == 1 + state['updates'] // 50   # published at the start and every 50 updates
    assert all((out / name).exists() for name in ('metrics.csv', 'plot.png', 'tb'))
    with open(out / 'metrics.csv', newline='') as f: evaluated = any(r['eval_return'] for r in csv.DictReader(f))
    assert (out / 'best.pt').exists() == evaluated   # evaluations every 200 steps; a stop by signal does not evaluate
    frames = state['env_steps']
    done = command('train', '--resume', out, '--steps', frames + 200, '--no-progress')
    assert done.returncode == 0, done.stderr
    assert "the actors' envs started afresh" in done.stdout and f'{frames + 200}' in done.stdout
    assert 'resumed with the replay (each shard reloaded from its directory)' in done.stdout
    assert 'continued their episodes exactly' not in done.stdout and 'the envs started fresh episodes' in done.stdout
    resumed = torch.load(out / 'checkpoint.pt', weights_only=True)
    after = SavedArrays(out / 'replay' / 'shard_0').read()
    assert resumed['env_steps'] >= frames + 200 and after['n_added'] > shard['n_added'] and resumed['updates'] > state['updates']
    assert after['save_id'] == resumed['replay_save']
    with open(out / 'metrics.csv', newline='') as f: rows = [r for r in csv.DictReader(f) if r['update']]
    assert [int(r['update']) for r in rows] == list(range(1, len(rows) + 1))   # the update rows, not episodes' own
    assert [int(r['frame']) for r in rows] == sorted(int(r['frame']) for r in rows)
    assert len(json.loads((out / 'run.json').read_text())['legs']) == 2
    evaluated = command('evaluate', out, '--episodes', 2)
    assert evaluated.returncode == 0 and 'mean return over 2 greedy episodes' in evaluated.stdout, evaluated.stderr


def test_one_actor_runs_the_learners_algorithm():
    "With one actor, Ape-X is the single-process Learner (3-step returns, Ape-X's default) made asynchronous: same initial network, exploration and beta schedules, update count and loss scale on the same seed."
    pytest.importorskip('ray', reason="Ape-X needs the ray extra: pip install 'fastrl_per[ray]'")
    from fastrl_per.learners.learner import Learner
    torch.set_num_threads(1)
    steps = 1_500
    run = ApexRun('CartPole-v1', actors=1, seed=0, total_steps=steps, timeout=60)
    learner = Learner('CartPole-v1', seed=0, total_steps=steps, **{k: run.config.plain()[k] for k in ('n_step', 'bs', 'tau', 'lr', 'max_sz', 'layer_norm')})
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
    # both weight their losses without collapse: a batch's mean importance weight stays in (0, 1] and, over the last
    # 300 updates, above 0.05 (the weights divided by the batch's largest, the default since #41; divided by the largest
    # the buffer could give, the Learner's fell to 0.004 here). A falling weighted loss, which this test used to read as
    # learning, was that collapse: the loss over the mean weight rises in these 1,500 steps under either normalisation,
    # as the Q-values grow
    median = lambda rows, key: np.median([r[key] for r in rows])
    for rows in (single, apex):
        assert all(np.isfinite(r['loss']) and 0 < r['weight'] <= 1 for r in rows)
        assert median(rows[-300:], 'weight') > 0.05
    # their loss levels are not compared: the importance weights and how far behind the actor's data the learner is
    # differ with the machine's load (a factor of 13 apart at load 15), and that is asynchrony, not another algorithm


# K replay shards sample as one buffer holding everything


def test_shards_sample_the_distribution_of_one_buffer():
    "8 transitions with distinct priorities split over 3 shards (3, 3, 2): drawn as often as from one buffer, with its weights."
    from test_per import make_step, chi_square, CHI2_7DF_P001, TD8
    from fastrl_per.learners.apex import shard_counts, join_shards
    steps = SimpleStep.from_steps([make_step(i) for i in range(8)])
    alpha, beta, eps = 0.6, 0.4, 1e-6
    leaves = (TD8 + eps) ** alpha
    probs, weights = leaves / leaves.sum(), (leaves / leaves.min()) ** -beta
    one = ReplayServer(max_sz=8, bs=4, alpha=alpha, beta=beta, eps=eps, seed=0)
    one.add(steps, torch.tensor(TD8))
    shards = [ReplayServer(max_sz=3, bs=3, alpha=alpha, beta=beta, eps=eps, seed=10 + k) for k in range(3)]
    for k, s in enumerate(shards): s.add(steps[k::3], torch.tensor(TD8[k::3]))
    rng, drawn, single = np.random.default_rng(0), [], []
    for _ in range(300):   # as the learner fetches: 16 batches of 4 a call, in proportion to the shards' totals
        counts = shard_counts([s.totals()['total'] for s in shards], 16, 4, rng)
        drawn += join_shards([s.draw(counts[:, k]) for k, s in enumerate(shards)], capacity=3)
        single += one.draw([4] * 16)['batches']
    for batches in (drawn, single):
        n = torch.cat([b.step_n for b in batches]).long().numpy()
        assert chi_square(np.bincount(n, minlength=8), probs) < CHI2_7DF_P001
        assert chi_square(np.bincount(n, minlength=8), np.full(8, 1 / 8)) > 10 * CHI2_7DF_P001   # the test can tell
        np.testing.assert_allclose(torch.cat([b.weights for b in batches]).numpy(), weights[n], rtol=1e-5)   # normalised across shards
    for b in drawn:   # a global idx names the shard and its slot: feedback finds the transition it was drawn as
        k, slot = b.idxs // 3, b.idxs % 3
        assert all(shards[int(a)].buffer.memory[int(i)].step_n == s for a, i, s in zip(k, slot, b.step_n))


# on a Ray cluster: two nodes or three on 127.0.0.1 (ray.cluster_utils.Cluster), joined with RAY_ADDRESS


@pytest.fixture(scope='module')
def cluster(tmp_path_factory):
    "A head and a worker node of 1 CPU each on loopback, in a Ray temp dir of their own (so no other Ray on the machine finds them)."
    pytest.importorskip('ray', reason="Ape-X needs the ray extra: pip install 'fastrl_per[ray]'")
    from ray.cluster_utils import Cluster
    # a temp dir of its own (short: Ray's socket paths live there), and loopback as this machine's address: Ray otherwise
    # resolves 127.0.0.1 in RAY_ADDRESS to the machine's outward IP, where these nodes do not listen
    # and no token auth on its nodes, whatever an earlier ray.init in this process set (runs here and in the commands
    # inherit it too, unless a test drops it)
    settings = dict(RAY_TMPDIR=tempfile.mkdtemp(prefix='rc', dir='/tmp'), RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER='0',
                    RAY_AUTH_MODE='disabled')
    previous = {k: os.environ.get(k) for k in settings}
    os.environ.update(settings)
    node = dict(num_cpus=1, node_ip_address='127.0.0.1', include_dashboard=False)
    c = Cluster(initialize_head=True, head_node_args=node)
    c.add_node(**node)
    c.node_args = node
    try: yield c
    finally:
        c.shutdown()
        for k, v in previous.items():
            if v is None: os.environ.pop(k)
            else: os.environ[k] = v
        shutil.rmtree(settings['RAY_TMPDIR'], ignore_errors=True)


def on_cluster(cluster, *args, wait=True, timeout=240, flag=False, address=None, env=None):
    """`fastrl_per train ...` with RAY_ADDRESS set to `address` (default: `cluster`'s; `flag`: --ray-address instead) in
    `env` (default: this process's): its result, or the process."""
    address, env = address or cluster.address, dict(os.environ if env is None else env)
    env = {k: v for k, v in env.items() if k != 'RAY_ADDRESS'} if flag else dict(env, RAY_ADDRESS=address)
    if flag: args = (*args, '--ray-address', address)
    cmd = [*COMMAND, 'train', *map(str, args)]
    if wait: return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def without_cluster(*args, timeout=240):
    "`fastrl_per ...` with no RAY_ADDRESS: the run starts a Ray of its own."
    env = {k: v for k, v in os.environ.items() if k != 'RAY_ADDRESS'}
    return subprocess.run([*COMMAND, *map(str, args)], capture_output=True, text=True, timeout=timeout, env=env)


def placed(run_dir, seconds=180):
    "The `ray` record of the run's last leg in run.json, once it is there."
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try: leg = json.loads((run_dir / 'run.json').read_text())['legs'][-1]
        except (OSError, ValueError, KeyError): leg = {}
        if 'ray' in leg: return leg['ray']
        time.sleep(0.5)
    raise AssertionError(f"no placement in {run_dir / 'run.json'} within {seconds} s")


FAST = ('--no-progress', '--solved', 0, '--eval-every', 0, '--bs', 32, '--chunk', 20, '--publish-every', 10)


def test_train_joins_a_cluster_spreads_its_actors_and_resumes_without_it(cluster, tmp_path):
    out = tmp_path / 'run'
    done = on_cluster(cluster, '--actors', 2, '--steps', 300, '--out', out, *FAST)
    assert done.returncode == 0, done.stderr
    ray_leg = json.loads((out / 'run.json').read_text())['legs'][0]['ray']
    nodes = {n.node_id for n in cluster.list_all_nodes()}
    assert {a['node_id'] for a in ray_leg['actors']} == nodes and all(a['ip'] == '127.0.0.1' for a in ray_leg['actors'])
    assert [s['node_id'] for s in ray_leg['replay_shards']] == [ray_leg['learner']['node_id']] and ray_leg['ray'] == 'joined'
    assert ray_leg['address'] == cluster.address and ray_leg['nodes'] == 2
    assert 'on 2 of 2 nodes, 1 replay shard on the learner\'s node' in done.stdout
    state = torch.load(out / 'checkpoint.pt', weights_only=True)
    assert 'address' not in state['config'] and 'num_cpus' not in state['config']   # the deployment is not the run
    assert SavedArrays(out / 'replay' / 'shard_0').read()['save_id'] == state['replay_save']   # saved on the shard's node
    resumed = without_cluster('train', '--resume', out, '--steps', state['env_steps'] + 200, '--actor-cpus', 0.5, '--no-progress')
    assert resumed.returncode == 0, resumed.stderr   # where it runs may change on a resume: --actor-cpus is no contradiction
    legs = json.loads((out / 'run.json').read_text())['legs']
    assert len(legs) == 2 and legs[1]['ray']['ray'] == 'started' and legs[1]['ray']['address'] != cluster.address
    assert 'each shard reloaded from its directory' in resumed.stdout


def test_auto_finds_the_cluster_started_here_and_joins_it_in_its_auth_mode(cluster, tmp_path):
    """RAY_ADDRESS=auto: the cluster whose address Ray's temp dir records (as `ray start` leaves it). The nodes run without
    token auth, while a token is at hand and RAY_AUTH_MODE unset: Ray alone would then turn token auth on for 'auto' and
    the replay actor died at start; the run asks the cluster instead."""
    env = {k: v for k, v in os.environ.items() if k != 'RAY_AUTH_MODE'}
    env['RAY_AUTH_TOKEN'] = 'a' * 32   # a token Ray finds, as it finds ~/.ray/auth_token after any local ray.init
    done = on_cluster(cluster, '--actors', 2, '--actor-cpus', 0.5, '--steps', 100, '--out', tmp_path / 'run', *FAST,
                      address='auto', env=env)
    assert done.returncode == 0, done.stderr
    ray_leg = json.loads((tmp_path / 'run' / 'run.json').read_text())['legs'][0]['ray']
    assert ray_leg['ray'] == 'joined' and ray_leg['address'] == cluster.address and ray_leg['nodes'] == 2
    assert [s['node_id'] for s in ray_leg['replay_shards']] == [ray_leg['learner']['node_id']]


def test_a_failed_start_leaves_no_run_directory(tmp_path):
    "Actors asking for more CPUs than the machine's Ray has: one line, exit 1, and --out is still free."
    pytest.importorskip('ray', reason="Ape-X needs the ray extra: pip install 'fastrl_per[ray]'")
    out = tmp_path / 'run'
    failed = without_cluster('train', '--actors', 1, '--steps', 100, '--out', out, '--num-cpus', 1, '--actor-cpus', 2, '--timeout', 5,
                             *FAST)
    assert failed.returncode == 1 and 'Traceback' not in failed.stderr, failed.stderr
    assert 'actors did not start within 5 s: each asks for 2 CPU (--actor-cpus) and Ray has 1 of 1 free' in failed.stderr
    assert not out.exists()


@pytest.mark.slow
def test_losing_a_node_of_actors_only_the_run_finishes(cluster, tmp_path):
    "A third node; once the run has placed its actors, a node holding only actors is killed: they restart elsewhere, the run ends 0."
    cluster.add_node(**cluster.node_args)
    out = tmp_path / 'run'
    proc = on_cluster(cluster, '--actors', 2, '--steps', 16_000, '--out', out, *FAST, wait=False)
    try:
        where = placed(out)
        assert [a['restarts'] for a in where['actors']] == [0, 0]
        head, learner = cluster.head_node.node_id, where['learner']['node_id']
        doomed = next(a['node_id'] for a in where['actors'] if a['node_id'] not in (head, learner))
        node = next(n for n in cluster.list_all_nodes() if n.node_id == doomed)
        cluster.remove_node(node, allow_graceful=False)
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None: proc.kill()
    assert proc.returncode == 0, stderr
    manifest = json.loads((out / 'run.json').read_text())
    assert manifest['ended'] and manifest['env_steps'] >= 16_000
    actors = manifest['legs'][0]['ray']['actors']
    # as Ray counts them: one restart for each actor that was on the lost node, none for the others
    assert [a['restarts'] for a in actors] == [int(a['node_id'] == doomed) for a in where['actors']], (doomed, where, actors)
    assert f" {sum(a['restarts'] for a in actors)} actor restarts" in stdout and [a['actor_id'] for a in actors] == [
        a['actor_id'] for a in where['actors']]   # restarted, not replaced
    assert doomed not in {a['node_id'] for a in actors}, (doomed, manifest['legs'][0]['ray'])   # where they run now


@pytest.mark.slow
def test_losing_the_replays_node_ends_with_one_line_and_a_checkpoint_to_resume(cluster, tmp_path):
    "The replay placed on a node of its own (--replay-node), killed after a checkpoint: exit 1, one line naming the step and the checkpoint."
    node = cluster.add_node(**cluster.node_args)
    out = tmp_path / 'run'
    proc = on_cluster(cluster, '--actors', 2, '--actor-cpus', 0.5, '--steps', 50_000, '--checkpoint-every', 200, '--replay-node',
                      node.node_id, '--out', out, *FAST, wait=False, flag=True)
    try:
        wait_for_saved_steps(proc, out, 200)
        where = placed(out)
        assert where['replay_shards'][0]['node_id'] == node.node_id and where['address'] == cluster.address
        cluster.remove_node(node, allow_graceful=False)
        _, stderr = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None: proc.kill()
    ours = [line for line in stderr.splitlines() if line.startswith('fastrl_per train:')]
    print(ours)   # shown with -s: the line a user reads
    assert proc.returncode == 1 and 'Traceback' not in stderr and len(ours) == 1, stderr
    manifest, state = json.loads((out / 'run.json').read_text()), torch.load(out / 'checkpoint.pt', weights_only=True)
    assert re.search(r"training stopped at step \d+: replay shard 0 of 1 on 127.0.0.1 \(node \w{8}\) (died|did not answer)", ours[0]), ours[0]
    assert f"{out / 'checkpoint.pt'} keeps step {state['env_steps']}" in ours[0] and state['env_steps'] >= 200
    assert manifest['ended'] and 'replay shard 0' in manifest['legs'][-1]['error'] and manifest['env_steps'] == state['env_steps']
    resumed = without_cluster('train', '--resume', out, '--steps', state['env_steps'] + 100, '--no-progress')
    assert resumed.returncode == 0, resumed.stderr
