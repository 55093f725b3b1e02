"""Scaling out on this machine: env steps and learner updates per second for (a) the
single-process Learner, (b) the Learner with its collector (`fastrl_per train --collector`), its
worker in a process or a thread, (c) Ape-X on a local Ray with 1 and 2 actors; then the replay
actor's capacity.

`--shards` measures the replay instead: transitions per second into the replay and learner updates
per second with 8 light actors (0.25 CPU each, CartPole-v1, replay ratio 0.25 so the learner
does not hold them back) for 1, 2 and 4 replay shards, with the CPU time the shards spent per
transition pushed (their share of the learner's draws and priority updates included), how busy
each shard was, the learner's CPU time per update and the actors' per transition (all from
/proc: a loopback cluster's processes are on this machine), then the replay capacity table
below; `--cluster` runs it on a two-node Ray cluster on this machine (ray.cluster_utils.Cluster,
1 CPU a node, loopback only) and prints where the actors and shards ran.

Every mode runs the same DQN at one update per env step (batch 64) for `--steps` env steps,
timed after start-up (Ray's start, the actors' and the collector's worker's imports are not counted), each in a fresh
process so that its peak memory is its own. It runs on plain CartPole-v1 and Acrobot-v1, whose
steps (~10 and ~50 µs) cost far less than an update (~1 ms), and on
"PaddedCartPole-v1": CartPole-v1 behind `PadStep`, a wrapper that sleeps so that each step
takes at least 1 ms, standing in for an env whose step costs about as much as an update (a
simulator that runs outside the Python interpreter; sleeping releases the GIL as such a call
would). Ratios are against (a) on the same env in the same run; the
updates per env step column shows that every mode does the same work per env step (Ray's
runs end a few calls' worth of updates short: the learner stops when the actors have
delivered the budget). Peak memory: the peak resident set of the
learner's process; for Ray, plus the peaks of the actor and replay processes; for the
collector's worker process, plus its peak.

Replay capacity: µs per `add` of 64 transitions (with their priorities) and per sample of 256
plus its priority update, on a `ReplayServer` in this process and through a Ray actor handle.

The GIL's cost to the background collector: CPU and wall time per update of the learner's
thread alone and beside a thread that steps CartPole every millisecond.

    python benchmarks/scale.py --steps 3000
    python benchmarks/scale.py --shards --cluster --steps 4000
"""
import argparse, json, os, resource, subprocess, sys, time
import numpy as np
import torch
import gymnasium as gym

PAD_S = 1e-3

class PadStep(gym.Wrapper):
    "Make every `step` (and `reset`) take at least `PAD_S` seconds, sleeping out the rest."
    def step(self, action):
        start = time.perf_counter()
        out = self.env.step(action)
        time.sleep(max(0., PAD_S - (time.perf_counter() - start)))
        return out

def register_padded():
    "Register PaddedCartPole-v1 in this process (Ray runs this in every worker it starts)."
    if 'PaddedCartPole-v1' not in gym.registry:
        gym.register('PaddedCartPole-v1', entry_point=lambda **kw: PadStep(gym.make('CartPole-v1', **kw)))

def cpu_s(pid) -> float:
    "CPU seconds (user + system) process `pid` has used, from /proc (every node of a loopback cluster is on this machine)."
    with open(f'/proc/{pid}/stat') as f: fields = f.read().rsplit(')', 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf('SC_CLK_TCK')

def peak_mb(pid=None) -> float:
    "Peak resident memory of this process (or of `pid`, from /proc) in MB."
    if pid is None: return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    with open(f'/proc/{pid}/status') as f:
        return next(int(line.split()[1]) for line in f if line.startswith('VmHWM')) / 1024

def run_learner(env_id, steps, collector=None):
    "The Learner in one process, or with `collector` ('process' or 'thread'): `fastrl_per train --collector`'s learner, its defaults included."
    from fastrl_per.learners.learner import Learner
    with Learner(env_id, seed=0, total_steps=steps, bs=64, collector=collector) as learner:
        source = learner.collector
        if source:
            source.setup = register_padded   # PaddedCartPole-v1 is registered at run time: in the worker too
            source.start(); source.receive()   # the worker's start-up (a process imports torch) is not timed, as Ray's is not
        start = time.perf_counter()
        updates = sum(1 for _ in learner.iterate(steps))
        seconds, peak = time.perf_counter() - start, peak_mb()
        worker = source.process if source else None   # None for a thread
        if worker is not None: peak += peak_mb(worker.pid)
    return dict(seconds=seconds, env_steps=learner.episodes.env_steps, updates=updates, peak_mb=peak)

def run_apex(env_id, steps, actors):
    import ray
    from fastrl_per.learners.apex import ApexRun, ray_get
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, runtime_env=dict(worker_process_setup_hook=register_padded))
    run = ApexRun(env_id, actors=actors, seed=0, total_steps=steps, bs=64, chunk=50, replay_ratio=1.).start()
    try:
        for i, a in enumerate(run.actors): ray_get(a.collect.remote(None, 0, 1), 120, f'actor {i}')   # started and warm
        start = time.perf_counter()
        updates = sum(1 for _ in run.iterate(steps))
        seconds = time.perf_counter() - start
        pids = [ray_get(a.collect.remote(None, 0, 1), 60, 'actor')['pid'] for a in run.actors] + run.stats()['pids']
        return dict(seconds=seconds, env_steps=run.episodes.env_steps, updates=updates, peak_mb=peak_mb() + sum(peak_mb(p) for p in pids))
    finally: run.close()

def one(mode, env_id, steps):
    "Run one mode in this process; its numbers as a dict."
    torch.set_num_threads(1)
    register_padded()
    if mode == 'single': return run_learner(env_id, steps)
    if mode in ('process', 'thread'): return run_learner(env_id, steps, collector=mode)
    return run_apex(env_id, steps, actors=int(mode[-1]))

def capacity(repeats=300):
    "µs per add of 64 and per sample of 256 plus its update, in process and through a Ray actor."
    import ray
    from fastrl_per.core import SimpleStep
    from fastrl_per.stages.envs import GymTransformBlock
    from fastrl_per.learners.apex import ReplayServer, ray_get
    steps = SimpleStep.from_steps(list(GymTransformBlock(None, n=64, seed=0)(['CartPole-v1']).unbatch().nstep(3, 0.99)))[:64]
    td = torch.rand(64)
    def timed(add, sample_update):
        for _ in range(40): add()       # fill past 256 stored
        t0 = time.perf_counter()
        for _ in range(repeats): add()
        t1 = time.perf_counter()
        for _ in range(repeats): sample_update()
        t2 = time.perf_counter()
        return 1e6 * (t1 - t0) / repeats, 1e6 * (t2 - t1) / repeats
    local = ReplayServer(max_sz=100_000, bs=256, seed=0)
    def local_sample_update():
        b, = local.draw([256])['batches']; local.update_priorities(b.idxs, torch.rand(256))
    rows = [('in process',) + timed(lambda: local.add(steps, td), local_sample_update)]
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        remote = ray.remote(ReplayServer).options(num_cpus=0).remote(100_000, 256, 0.6, 0.4, 1e-6, 0)
        def remote_sample_update():
            b, = ray_get(remote.draw.remote([256]), 60, 'replay')['batches']
            ray_get(remote.update_priorities.remote(b.idxs.numpy(), np.random.rand(256)), 60, 'replay')
        rows.append(('Ray actor, each call waited for',) + timed(lambda: ray_get(remote.add.remote(steps, td.numpy()), 60, 'replay'), remote_sample_update))
    finally: ray.shutdown()
    return rows

def shard_throughput(steps, cluster:bool, actors=8, actor_cpus=0.25):
    """Transitions/s into the replay and updates/s of Ape-X with `actors` light actors for 1, 2 and 4 shards, the CPU time
    the shards, the learner and the actors spent per transition and per update; their placement."""
    if cluster:   # before Ray is imported: its temp dir and loopback as this machine's address (see tests/test_apex.py)
        import tempfile
        os.environ.update(RAY_TMPDIR=tempfile.mkdtemp(prefix='rc', dir='/tmp'), RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER='0')
    import ray
    from fastrl_per.learners.apex import ApexRun, ray_get
    torch.set_num_threads(1)
    nodes = None
    if cluster:
        from ray.cluster_utils import Cluster
        node = dict(num_cpus=1, node_ip_address='127.0.0.1', include_dashboard=False)
        nodes = Cluster(initialize_head=True, head_node_args=node)
        nodes.add_node(**node)
        ray.init(address=nodes.address, log_to_driver=False)
    else: ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    rows = []
    try:
        for shards in (1, 2, 4):
            run = ApexRun('CartPole-v1', actors=actors, seed=0, total_steps=steps, bs=64, chunk=50, replay_ratio=0.25,
                          replay_shards=shards, actor_cpus=actor_cpus, timeout=120).start()
            try:
                for i, a in enumerate(run.actors): ray_get(a.collect.remote(None, 0, 1), 120, f'actor {i}')   # warm
                p, stats = run.placement, run.stats()
                shard_pids, actor_pids = stats['pids'], [a['pid'] for a in p['actors']]
                cpu = lambda: (sum(map(cpu_s, shard_pids)), time.process_time(), sum(map(cpu_s, actor_pids)))
                n0, cpu0, start = stats['n_added'], cpu(), time.perf_counter()
                updates = sum(1 for _ in run.iterate(steps))
                seconds, n1, cpu1 = time.perf_counter() - start, run.stats()['n_added'], cpu()
                (shard_s, learner_s, actor_s) = (b - a for a, b in zip(cpu0, cpu1))
                if [a['pid'] for a in run.placement['actors']] != actor_pids: raise RuntimeError('an actor restarted mid-row')
                beside = all(s['node_id'] == p['learner']['node_id'] for s in p['replay_shards'])
                rows.append(dict(shards=shards, transitions_s=(n1 - n0) / seconds, updates_s=updates / seconds,
                                 shard_us=1e6 * shard_s / (n1 - n0), shard_busy=shard_s / seconds / shards,
                                 learner_us=1e6 * learner_s / updates, actor_us=1e6 * actor_s / (n1 - n0),
                                 actor_nodes=len({a['node_id'] for a in p['actors']}), nodes=p['nodes'], beside=beside, placement=p))
            finally: run.close()
    finally:
        ray.shutdown()
        if nodes is not None:
            nodes.shutdown()
            import shutil; shutil.rmtree(os.environ['RAY_TMPDIR'], ignore_errors=True)
    return rows

def print_capacity():
    print("\n| replay | µs per add of 64 | µs per sample of 256 + update |\n|---|---:|---:|")
    for name, add, su in capacity(): print(f"| {name} | {add:.0f} | {su:.0f} |")

def gil_cost(updates=2000):
    "CPU and wall µs per update of the learner thread alone, and beside a thread stepping CartPole with its agent every ms (sleeping in between, as PadStep does)."
    import threading
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from overhead import HandLoop
    from fastrl_per.stages.envs import EnvRun
    from fastrl_per.learners.dqn import EpsilonGreedy, QNetwork
    torch.set_num_threads(1)
    loop = HandLoop(0, 20_000)
    loop.fit(2_000)
    def timed():
        w, c = time.perf_counter(), time.thread_time()
        for _ in range(updates): loop.update()
        return 1e6 * (time.thread_time() - c) / updates, 1e6 * (time.perf_counter() - w) / updates
    alone, stop = timed(), threading.Event()
    def step():
        env, agent = EnvRun('CartPole-v1', 1, 0), EpsilonGreedy(QNetwork(4, 2, layer_norm=True), 2, 0.1, 0.1, 1, seed=0)
        while not stop.is_set():
            time.sleep(PAD_S)
            env.step(agent)
    worker = threading.Thread(target=step)
    worker.start()
    try: beside = timed()
    finally: stop.set(); worker.join()
    return alone, beside

def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--steps', type=int, default=3_000, help='env steps per mode')
    p.add_argument('--shards', action='store_true', help='only the replay-shard throughput table')
    p.add_argument('--cluster', action='store_true', help='with --shards: on a two-node Ray cluster on loopback')
    p.add_argument('--one', nargs=2, metavar=('MODE', 'ENV'), help=argparse.SUPPRESS)   # a child process's job
    args = p.parse_args()
    if args.one:
        print(json.dumps(one(*args.one, args.steps)))
        return
    if args.shards:
        rows = shard_throughput(args.steps, args.cluster)
        where = 'a two-node Ray cluster on loopback (1 CPU a node)' if args.cluster else 'a local Ray of 2 CPUs'
        print(f"Ape-X, 8 actors of 0.25 CPU on CartPole-v1, {args.steps} env steps per row, replay ratio 0.25, batch 64, "
              f"on {where}; this machine: {os.cpu_count()} CPUs\n")
        print("| replay shards | transitions/s into replay | learner updates/s | shard CPU µs / transition | "
              "each shard busy | learner CPU µs / update | actor CPU µs / transition | actors on nodes | "
              "shards on the learner's node |\n|---:|---:|---:|---:|---:|---:|---:|---:|---|")
        for r in rows:
            print(f"| {r['shards']} | {r['transitions_s']:.0f} | {r['updates_s']:.0f} | {r['shard_us']:.0f} | "
                  f"{r['shard_busy']:.0%} | {r['learner_us']:.0f} | {r['actor_us']:.0f} | {r['actor_nodes']} of {r['nodes']} | "
                  f"{'yes' if r['beside'] else 'no'} |")
        p = rows[-1]['placement']
        short = lambda w: f"{w['node_id'][:8]}@{w['ip']}"
        print(f"\nplacement of the 4-shard run (node id prefix@IP; Ray {p['ray']} at {p['address']}): "
              f"learner {short(p['learner'])}; actors {', '.join(map(short, p['actors']))}; "
              f"replay shards {', '.join(map(short, p['replay_shards']))}; load average {os.getloadavg()[0]:.1f}")
        print_capacity()
        return
    modes = ['single', 'process', 'thread', 'ray1', 'ray2']
    names = {'single': '(a) single process', 'process': '(b) collector, worker process', 'thread': '(b) collector, worker thread',
             'ray1': '(c) Ray, 1 actor', 'ray2': '(c) Ray, 2 actors'}
    print(f"{args.steps} env steps per mode, one update per env step (batch 64), this machine: {os.cpu_count()} CPUs\n")
    print(f"| env | mode | env steps/s | updates/s | updates / env step | env steps/s vs (a) | peak MB |\n|---|---|---:|---:|---:|---:|---:|")
    for env_id in ('CartPole-v1', 'Acrobot-v1', 'PaddedCartPole-v1'):
        base = None
        for mode in modes:
            out = subprocess.run([sys.executable, __file__, '--steps', str(args.steps), '--one', mode, env_id], capture_output=True, text=True)
            if out.returncode: sys.exit(f"{mode} on {env_id} failed:\n{out.stderr[-3000:]}")
            r = json.loads(out.stdout.strip().splitlines()[-1])
            sps, ups = r['env_steps'] / r['seconds'], r['updates'] / r['seconds']
            base = base or sps
            print(f"| {env_id} | {names[mode]} | {sps:.0f} | {ups:.0f} | {r['updates'] / r['env_steps']:.2f} | {sps / base:.2f}x | {r['peak_mb']:.0f} |", flush=True)
    print_capacity()
    (cpu0, wall0), (cpu1, wall1) = gil_cost()
    print("\n| learner thread, per update (HandLoop.update, batch 128) | CPU µs | wall µs |\n|---|---:|---:|")
    print(f"| alone | {cpu0:.0f} | {wall0:.0f} |\n| beside a thread stepping CartPole every {PAD_S * 1e3:g} ms | {cpu1:.0f} ({cpu1 / cpu0 - 1:+.0%}) | {wall1:.0f} ({wall1 / wall0 - 1:+.0%}) |")

if __name__ == '__main__': main()
