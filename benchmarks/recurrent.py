"""Recurrent Q network with prioritized sequence replay, measured on CPU: cost of the parts
(initialisation, data preparation, warmed forward, training update, memory, parameter bytes)
for `RecurrentQNetwork` next to the feed-forward `QNetwork`, then learning curves of
`RecurrentLearner` and the feed-forward `Learner` (prioritized replay) on CartPoleNoVelocity-v1.

Follows the "Reproduction and measurement protocol" of the recurrent-Q/PER article: resolved
versions, backend, dtype, seed, input shapes, batch size and source revision first; each part
timed separately; peak process memory and torch allocation reported apart; parameter bytes
exclude activations, gradients, optimiser state and inputs. One CPU thread per process.
Nothing here claims convergence: the tables are what was measured in these runs.

    python benchmarks/recurrent.py            # the default run (a few minutes on 2 cores)
    python benchmarks/recurrent.py --quick    # a smoke run (under 2 minutes)
"""
import argparse, json, os, platform, resource, statistics, subprocess, sys, tempfile, time, warnings
from copy import deepcopy
from itertools import islice, repeat
import multiprocessing as mp

ENV_ID = 'CartPoleNoVelocity-v1'   # registered on import of fastrl_per.recurrent_learner

# --------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------

def setup_torch():
    import torch
    torch.set_num_threads(1)
    try: torch.set_num_interop_threads(1)
    except RuntimeError: pass   # already set in this process
    return torch

def peak_rss_bytes():
    "Peak resident set size of this process (ru_maxrss is KiB on Linux, bytes on macOS)."
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r if sys.platform == 'darwin' else r * 1024

def quantiles(xs):
    xs = sorted(xs)
    q = statistics.quantiles(xs, n=4, method='inclusive') if len(xs) > 1 else [xs[0]] * 3
    return dict(median=statistics.median(xs), p25=q[0], p75=q[2], n=len(xs), first=None)

def timed(fn, warmup, repeats):
    "Median and quartiles of `repeats` timed calls of `fn` after `warmup` untimed ones (seconds)."
    for _ in range(warmup): fn()
    ts = []
    for _ in range(repeats):
        t = time.perf_counter(); fn(); ts.append(time.perf_counter() - t)
    return quantiles(ts)

def fmt_bytes(b):
    if b is None: return 'n/a'
    for unit, k in (('GiB', 2**30), ('MiB', 2**20), ('KiB', 2**10)):
        if abs(b) >= k: return f"{b / k:.2f} {unit}"
    return f"{b} B"

def fmt_ms(q):
    return f"{1e3 * q['median']:.3f} ms (IQR {1e3 * q['p25']:.3f}–{1e3 * q['p75']:.3f}, n={q['n']})"

def tensor_bytes(tensors): return sum(t.numel() * t.element_size() for t in tensors)

def source_fingerprint():
    "Short hash of the fastrl_per sources this process imports (other people may edit them during a run)."
    import hashlib, fastrl_per
    h = hashlib.sha256()
    d = os.path.dirname(fastrl_per.__file__)
    for name in sorted(os.listdir(d)):
        if name.endswith('.py'):
            with open(os.path.join(d, name), 'rb') as f: h.update(name.encode() + f.read())
    return h.hexdigest()[:12]

def source_revision():
    "HEAD of the repository and whether the package or notebooks differ from it."
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        head = subprocess.run(['git', 'rev-parse', 'HEAD'], cwd=root, capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(['git', 'status', '--porcelain', '--', 'fastrl_per', 'nbs', 'benchmarks/recurrent.py'],
                               cwd=root, capture_output=True, text=True, check=True).stdout.split('\n')
        dirty = [l.strip() for l in dirty if l.strip()]
        return head, dirty
    except (OSError, subprocess.CalledProcessError) as e:
        return f"unknown ({e})", []

# --------------------------------------------------------------------------------------
# torch allocation on CPU: the profiler's memory timeline of one call
# --------------------------------------------------------------------------------------

def profiled_allocation(torch, fn):
    """Run `fn` once under torch.profiler with profile_memory=True.

    Returns the peak of live torch tensor bytes over the call (the profiler's memory
    timeline, tensors alive before the call included), its breakdown by the profiler's
    categories at that peak, and the sum of positive `self_cpu_memory_usage` (bytes the
    ops allocated, freed or not). None where the profiler could not give a number."""
    from torch.profiler import profile, ProfilerActivity
    out = dict(peak=None, at_peak={}, allocated=None, note='')
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        sys.stderr.flush(); saved = os.dup(2)   # kineto logs start/stop lines to fd 2: keep them out of the report
        try:
            with open(os.devnull, 'w') as null: os.dup2(null.fileno(), 2)
            with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True) as prof:
                fn()
        finally: os.dup2(saved, 2); os.close(saved)
        try:
            out['allocated'] = sum(e.self_cpu_memory_usage for e in prof.key_averages() if e.self_cpu_memory_usage > 0)
        except Exception as e: out['note'] += f"key_averages failed: {e!r}; "
        try:
            from torch.profiler import _memory_profiler as mprof
            names = ['?'] * (len(mprof._CATEGORY_TO_INDEX) + 1)
            for cat, i in mprof._CATEGORY_TO_INDEX.items():
                names[i + 1] = 'unknown' if cat is None else cat.name.lower()
            with tempfile.TemporaryDirectory() as d:
                path = os.path.join(d, 'timeline.json')
                prof.export_memory_timeline(path, device='cpu')
                with open(path) as f: times, sizes = json.load(f)
            totals = [sum(s) for s in sizes]
            k = max(range(len(totals)), key=totals.__getitem__)
            out['peak'] = totals[k]
            out['at_peak'] = {names[i]: v for i, v in enumerate(sizes[k]) if v}
        except Exception as e: out['note'] += f"memory timeline failed: {e!r}"
    return out

# --------------------------------------------------------------------------------------
# part 1: one network, measured in its own (spawned) process
# --------------------------------------------------------------------------------------

def measure(cfg):
    torch = setup_torch()
    import numpy as np
    import torch.nn.functional as F
    from torch.utils.data.datapipes.iter import IterableWrapper
    import fastrl_per.recurrent_learner as rl   # registers CartPoleNoVelocity-v1
    from fastrl_per.recurrent import RecurrentQNetwork, recurrent_param_count
    from fastrl_per.dqn import QNetwork, OnlineQ, TDTargets, WeightedLoss, OptimizerStep, TargetUpdate, max_by_id
    from fastrl_per.envs import GymTransformBlock
    from fastrl_per.sequence import EpisodeAssembler, PrioritizedSequenceReplay
    from fastrl_per.per import PrioritizedReplayBuffer

    kind, seed, bs, T = cfg['kind'], cfg['seed'], cfg['bs'], cfg['length']
    obs_dim, n_actions = 2, 2
    recurrent = kind == 'recurrent'
    res = dict(kind=kind, rss_after_imports=peak_rss_bytes(), threads=torch.get_num_threads(), source=source_fingerprint())

    # ---- initialisation: network + target + Adam --------------------------------------------
    def build():
        torch.manual_seed(seed)
        net = RecurrentQNetwork(obs_dim, n_actions) if recurrent else QNetwork(obs_dim, n_actions)
        target = deepcopy(net)
        target.requires_grad_(False)
        opt = torch.optim.Adam(net.parameters(), lr=1e-3)
        return net, target, opt
    torch.manual_seed(seed)
    t0 = time.perf_counter()
    net = RecurrentQNetwork(obs_dim, n_actions) if recurrent else QNetwork(obs_dim, n_actions)
    t1 = time.perf_counter(); target = deepcopy(net); target.requires_grad_(False)
    t2 = time.perf_counter(); opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    t3 = time.perf_counter()
    res['init_parts'] = (t1 - t0, t2 - t1, t3 - t2)
    q = timed(build, 0, cfg['init_repeats']); q['first'] = t3 - t0
    res['init'] = q
    net, target, opt = build()
    res['rss_after_init'] = peak_rss_bytes()

    # ---- data preparation: real episodes from random steps --------------------------------
    steps = GymTransformBlock(None, seed=seed)([ENV_ID]).unbatch()
    t = time.perf_counter()
    episodes = list(islice(EpisodeAssembler(steps), cfg['episodes']))
    res['collect_s'] = time.perf_counter() - t
    lengths = [len(e) for e in episodes]
    res['n_transitions'], res['n_episodes'] = sum(lengths), len(episodes)
    res['ep_len'] = (min(lengths), statistics.median(lengths), max(lengths))
    res['eligible'] = sum(n >= T for n in lengths)
    if recurrent:
        buffer = PrioritizedSequenceReplay(capacity=cfg['capacity'], alpha=0.6, beta=0.4, epsilon=1e-6, seed=seed)
        t = time.perf_counter()
        for e in episodes: buffer.add(e)
        res['fill_s'] = time.perf_counter() - t
        def draw(): return rl.last_step_windows(buffer.sample_prioritized(bs, T))
    else:
        buffer = PrioritizedReplayBuffer(max_sz=cfg['capacity'], bs=bs, alpha=0.6, beta=0.4, eps=1e-6, seed=seed)
        t = time.perf_counter()
        for e in episodes: buffer.add(e.steps)
        res['fill_s'] = time.perf_counter() - t
        def draw(): return buffer.sample(bs)
    t = time.perf_counter(); batch = draw(); res['sample_first_s'] = time.perf_counter() - t
    res['sample'] = timed(draw, 2, cfg['sample_repeats'])
    res['state_shape'] = tuple(batch.state.shape)
    res['state_dtype'] = str(batch.state.dtype)
    res['param_dtype'] = str(next(net.parameters()).dtype)
    batch = draw()

    # ---- hidden state declaration check (recurrent only) ----------------------------------
    if recurrent:
        with torch.no_grad():
            full, alone = net(batch.state), torch.cat([net(batch.state[i:i + 1]) for i in range(4)])
            again = net(batch.state)
        res['state_check'] = (float((full[:4] - alone).abs().max()), float((full - again).abs().max()))

    # ---- warmed forward pass under no_grad -----------------------------------------------
    def forward():
        with torch.no_grad(): return net(batch.state)
    res['forward'] = timed(forward, cfg['warmup'], cfg['fwd_repeats'])

    # ---- training update: the library's stages over the same batch --------------------------
    # OnlineQ -> TDTargets -> WeightedLoss -> OptimizerStep -> TargetUpdate(tau): forward, TD target
    # (plain max, target net under no_grad), importance-weighted smooth-L1, backward, Adam, soft update.
    pipe = TDTargets(OnlineQ(IterableWrapper(repeat(batch), deepcopy=False), net), target, cfg['gamma'])
    pipe = WeightedLoss(pipe)
    pipe = OptimizerStep(pipe, opt)
    pipe = TargetUpdate(pipe, net, target, tau=cfg['tau'])
    it = iter(pipe)
    t = time.perf_counter(); ts = next(it); res['update_first_s'] = time.perf_counter() - t   # allocates Adam state
    last = {}
    def update(): last['ts'] = next(it)
    res['update'] = timed(update, cfg['warmup'], cfg['upd_repeats'])
    ts = last['ts']

    # ---- priority feedback (not part of the update row) -----------------------------------
    if recurrent:
        def feedback():
            ids, errors = max_by_id(ts.batch.idxs.numpy(), ts.td.abs().numpy())
            buffer.update_priorities(ids, errors)
    else:
        def feedback(): buffer.update_priorities(ts.batch.idxs, ts.td.abs())
    res['feedback'] = timed(feedback, 2, cfg['sample_repeats'])

    # ---- bytes ---------------------------------------------------------------------------
    params = list(net.parameters())
    res['n_params'] = sum(p.numel() for p in params)
    res['param_bytes'] = tensor_bytes(params)
    res['target_bytes'] = tensor_bytes(target.parameters())
    res['closed_form'] = recurrent_param_count(obs_dim, n_actions) if recurrent else None
    res['grad_bytes'] = tensor_bytes(p.grad for p in params if p.grad is not None)
    res['adam_bytes'] = tensor_bytes(v for s in opt.state.values() for v in s.values() if torch.is_tensor(v))
    res['input_bytes'] = tensor_bytes([batch.state, batch.next_state])
    res['buffer_bytes'] = buffer.storage.nbytes()

    res['rss_before_profiler'] = peak_rss_bytes()
    # ---- torch allocation of one update / one forward (after warm-up) ------------------------
    res['alloc_update'] = profiled_allocation(torch, update)
    res['alloc_forward'] = profiled_allocation(torch, forward)
    res['rss_end'] = peak_rss_bytes()
    return res

# --------------------------------------------------------------------------------------
# part 2: one learning run, in its own (spawned) process
# --------------------------------------------------------------------------------------

def learn(job):
    torch = setup_torch()
    import numpy as np
    import fastrl_per.recurrent_learner as rl
    from fastrl_per.learner import Learner
    from fastrl_per.train import greedy_returns

    kind, seed, frames, every, settings = job['kind'], job['seed'], job['frames'], job['every'], job['settings']
    source = source_fingerprint()
    t = time.process_time()
    if kind == 'recurrent': learner = rl.RecurrentLearner(ENV_ID, seed=seed, total_steps=frames, **settings)
    else: learner = Learner(ENV_ID, replay='per', seed=seed, total_steps=frames, **settings)
    init_cpu = time.process_time() - t

    cpu0, wall0, updates, checkpoints, losses = time.process_time(), time.perf_counter(), 0, [], []
    done = 0
    while done < frames:
        chunk = min(every, frames - done)
        for row in learner.iterate(chunk):
            updates += 1
            losses.append(row['loss'])
        done += chunk
        returns = learner.episodes.returns
        last20 = [r for _, r in returns[-20:]]
        checkpoints.append(dict(frame=learner.episodes.frames, updates=updates, episodes=len(returns),
                                mean20=float(np.mean(last20)) if last20 else float('nan'),
                                loss=float(np.mean(losses[-100:])) if losses else float('nan'),
                                cpu=time.process_time() - cpu0))
        losses = losses[-100:]
    train_cpu, train_wall = time.process_time() - cpu0, time.perf_counter() - wall0
    extra = {}
    if kind == 'recurrent':
        # which steps train as a window's last step, vs which steps the agent acted on a padded window
        T = learner.config['length']
        last = np.concatenate([learner.replay.sample_prioritized(256, T, pad=True).chunks.step_n[:, -1].numpy()
                               for _ in range(20)])   # sampled as the learner's SequenceSampler samples
        lengths = [r for _, r in learner.episodes.returns]   # CartPole pays 1 per step: return = episode length
        extra = dict(T=T, min_last_step_n=int(last.min()),
                     padded_frames=int(sum(min(n, T - 1) for n in lengths)), ended_frames=int(sum(lengths)))
    t = time.process_time()
    greedy = greedy_returns(learner.agent, ENV_ID, episodes=job['eval_episodes'], seed=job['eval_seed'] + seed)
    eval_cpu = time.process_time() - t
    return dict(kind=kind, seed=seed, frames=learner.episodes.frames, updates=updates, episodes=len(learner.episodes.returns),
                checkpoints=checkpoints, greedy=greedy, init_cpu=init_cpu, train_cpu=train_cpu, train_wall=train_wall,
                eval_cpu=eval_cpu, cpu_per_1k=1000 * train_cpu / max(1, learner.episodes.frames),
                epsilon=learner.agent.epsilon, beta=getattr(learner.replay, 'beta', None), rss=peak_rss_bytes(),
                config={k: v for k, v in learner.config.items()}, source=source, **extra)

# --------------------------------------------------------------------------------------
# printing
# --------------------------------------------------------------------------------------

def print_measurements(r, f, cfg):
    rec, ff = r, f
    print(f"## 1. Measurements: one network, batch {cfg['bs']}, window length {cfg['length']} "
          f"(feed-forward: single observations)\n")
    print(f"Each network measured in its own freshly spawned process (1 thread). Times are wall-clock "
          f"`time.perf_counter`; CPU ops are synchronous, so no device synchronisation is needed. "
          f"Medians of repeats after {cfg['warmup']} untimed warm-up calls unless marked *single*.\n")
    rows = []
    def row(name, a, b): rows.append((name, a, b))
    row('network', f"`RecurrentQNetwork(obs_dim=2, n_actions=2)`", "`QNetwork(2, 2)` (MLP 2→128→128→2)")
    row('input shape `state` (dtype)', f"{rec['state_shape']} ({rec['state_dtype']})", f"{ff['state_shape']} ({ff['state_dtype']})")
    row('parameter dtype', rec['param_dtype'], ff['param_dtype'])
    parts = lambda x: '{:.1f} ms (network {:.1f} + target deepcopy {:.1f} + Adam {:.1f})'.format(1e3 * x['init']['first'], *(1e3 * v for v in x['init_parts']))
    row('initialisation: net + deepcopy target + Adam, *single* first call in a fresh process (includes torch lazy set-up)', parts(rec), parts(ff))
    row('initialisation: median of later calls', fmt_ms(rec['init']), fmt_ms(ff['init']))
    row(f"data: {rec['n_episodes']} random-action episodes (env steps + EpisodeAssembler), *single*",
        f"{rec['collect_s']:.3f} s ({rec['n_transitions']} transitions)", f"{ff['collect_s']:.3f} s ({ff['n_transitions']} transitions)")
    row('data: episode lengths min / median / max', '{} / {} / {}'.format(*rec['ep_len']), '{} / {} / {}'.format(*ff['ep_len']))
    row('data: fill buffer, *single*', f"{1e3 * rec['fill_s']:.2f} ms: PrioritizedSequenceReplay.add per episode "
        f"({rec['eligible']} of {rec['n_episodes']} episodes ≥ {cfg['length']} steps, so drawable)",
        f"{1e3 * ff['fill_s']:.2f} ms: PrioritizedReplayBuffer.add per episode")
    row('data: first batch, *single*', f"{1e3 * rec['sample_first_s']:.3f} ms (sample_prioritized + last_step_windows)",
        f"{1e3 * ff['sample_first_s']:.3f} ms (PrioritizedReplayBuffer.sample)")
    row('data: one batch, median', fmt_ms(rec['sample']), fmt_ms(ff['sample']))
    row('warmed forward, `torch.no_grad`', fmt_ms(rec['forward']), fmt_ms(ff['forward']))
    row('training update, *single* first (allocates Adam state)', f"{1e3 * rec['update_first_s']:.3f} ms", f"{1e3 * ff['update_first_s']:.3f} ms")
    row('training update: forward + TD target + weighted loss + backward + Adam + soft update (τ '
        f"{cfg['tau']}), median", fmt_ms(rec['update']), fmt_ms(ff['update']))
    row('priority feedback (not in the update row)', fmt_ms(rec['feedback']) + ', max_by_id + update_priorities',
        fmt_ms(ff['feedback']) + ', update_priorities')
    row('peak RSS after imports (ru_maxrss)', fmt_bytes(rec['rss_after_imports']), fmt_bytes(ff['rss_after_imports']))
    row('peak RSS after initialisation (first Adam construction imports more of torch)', fmt_bytes(rec['rss_after_init']), fmt_bytes(ff['rss_after_init']))
    row('peak RSS after data, forward and update timing, before profiling (ru_maxrss)', fmt_bytes(rec['rss_before_profiler']), fmt_bytes(ff['rss_before_profiler']))
    row('… growth over imports', fmt_bytes(rec['rss_before_profiler'] - rec['rss_after_imports']), fmt_bytes(ff['rss_before_profiler'] - ff['rss_after_imports']))
    row('peak RSS after the profiled calls too (the profiler itself costs memory)', fmt_bytes(rec['rss_end']), fmt_bytes(ff['rss_end']))
    for key, what in (('alloc_update', 'one training update'), ('alloc_forward', 'one no_grad forward')):
        a, b = rec[key], ff[key]
        row(f"torch allocation, {what}: peak live tensor bytes (profiler memory timeline, incl. params/optimiser state alive before)",
            fmt_bytes(a['peak']), fmt_bytes(b['peak']))
        def brk(x): return ', '.join(f"{k} {fmt_bytes(v)}" for k, v in sorted(x['at_peak'].items(), key=lambda kv: -kv[1])) or 'n/a'
        row(f"… breakdown at that peak (profiler's categories)", brk(a), brk(b))
        row(f"torch allocation, {what}: bytes allocated by ops (sum of positive `self_cpu_memory_usage`)",
            fmt_bytes(a['allocated']), fmt_bytes(b['allocated']))
    row('parameters (numel)', f"{rec['n_params']:,}", f"{ff['n_params']:,}")
    row('parameter bytes: Σ numel × element_size', f"{rec['param_bytes']:,} B ({fmt_bytes(rec['param_bytes'])})",
        f"{ff['param_bytes']:,} B ({fmt_bytes(ff['param_bytes'])})")
    row('closed form `recurrent_param_count(2, 2)` × 4 B', f"{rec['closed_form']:,} × 4 = {4 * rec['closed_form']:,} B "
        f"({'matches' if 4 * rec['closed_form'] == rec['param_bytes'] else 'DIFFERS'})", 'n/a')
    row('parameter bytes, network + target', f"{rec['param_bytes'] + rec['target_bytes']:,} B ({fmt_bytes(rec['param_bytes'] + rec['target_bytes'])})",
        f"{ff['param_bytes'] + ff['target_bytes']:,} B ({fmt_bytes(ff['param_bytes'] + ff['target_bytes'])})")
    row('not in parameter bytes: gradients', fmt_bytes(rec['grad_bytes']), fmt_bytes(ff['grad_bytes']))
    row('not in parameter bytes: Adam state (exp_avg, exp_avg_sq, step)', fmt_bytes(rec['adam_bytes']), fmt_bytes(ff['adam_bytes']))
    row('not in parameter bytes: one batch `state` + `next_state`', fmt_bytes(rec['input_bytes']), fmt_bytes(ff['input_bytes']))
    row('not in parameter bytes: replay storage (allocated columns)', fmt_bytes(rec['buffer_bytes']), fmt_bytes(ff['buffer_bytes']))
    print("| quantity | recurrent | feed-forward |\n|---|---|---|")
    for name, a, b in rows: print(f"| {name} | {a} | {b} |")
    notes = [x['alloc_update']['note'] or x['alloc_forward']['note'] for x in (rec, ff)]
    for n in notes:
        if n: print(f"\nprofiler note: {n}")
    d1, d2 = rec['state_check']
    print(f"\nHidden state: `RecurrentQNetwork.forward` passes no (h0, c0), so the LSTM state is zero at the start of "
          f"every sampled window, in training and in acting; nothing is carried between windows or calls. Checked here: "
          f"the first 4 windows scored alone vs inside the batch of {cfg['bs']} differ by at most {d1:.2e}; two calls on "
          f"the same batch differ by {d2:.2e}.")
    print(f"\nThe update row uses the same update for both networks (plain max TD target, no gradient clipping, soft "
          f"update with τ {cfg['tau']}, as RecurrentLearner does) so that only the network differs; the feed-forward "
          f"`Learner` itself trains with its own defaults, {learner_defaults()}. Peak RSS (the whole process: Python, "
          "torch, gymnasium, buffers) and torch's tensor allocation are different quantities; on CPU torch has no "
          "allocator statistics, so the allocation rows come from `torch.profiler` (`profile_memory=True`), measured "
          "on one call after warm-up; the timeline's categories are the profiler's heuristic attribution.")

def learner_defaults():
    "The feed-forward Learner's update-related defaults, read from its signature (they are not fixed here)."
    import inspect
    from fastrl_per.learner import Learner
    ps = inspect.signature(Learner.__init__).parameters
    keys = ('bs', 'double', 'max_grad_norm', 'target_every', 'tau')
    return ', '.join(f"{k}={ps[k].default!r}" for k in keys if k in ps)

def median(xs):
    import math
    xs = [x for x in xs if x == x]
    return statistics.median(xs) if xs else float('nan')

def print_learning(results, args, settings):
    import numpy as np
    print(f"\n## 2. Learning curves on {ENV_ID}: {args.frames:,} env steps (frames) per run, seeds 0..{args.seeds - 1}\n")
    print("Settings passed to the constructors (everything else is the class default; the full resolved config follows):\n")
    for kind in ('recurrent', 'feedforward'):
        cls = 'RecurrentLearner' if kind == 'recurrent' else "Learner(replay='per')"
        cfg = next(r['config'] for r in results if r['kind'] == kind)
        print(f"- {cls}: passed `{settings[kind]}`; resolved `{cfg}`")
    if settings['recurrent'].get('bs') != 128:
        print(f"\nThe article's batch is 128; this run uses bs={settings['recurrent']['bs']} "
              f"(RecurrentLearner's default is 64, half the CPU per update; `--rec-bs 128` for the article's).")
    print(f"\nRuns: multiprocessing Pool({args.jobs}) of spawned processes, one torch thread each, one run per process. "
          f"'mean of last 20' is the mean return of the last 20 *training* episodes (epsilon-greedy) ended by that frame; "
          f"'updates' counts gradient steps, separately from env steps. Greedy evaluation: "
          f"`greedy_returns(learner.agent, '{ENV_ID}', episodes={args.eval_episodes}, seed={args.eval_seed}+seed)` after the last frame. "
          f"CPU s / 1k frames is the training process's CPU time (env steps + updates, not evaluation) per 1000 frames.\n")
    kinds = [k for k in ('recurrent', 'feedforward') if any(r['kind'] == k for r in results)]
    cps = [c['frame'] for c in results[0]['checkpoints']]
    head = ' | '.join(f"mean of last 20 @ {c:,}" for c in cps)
    print(f"| learner | seed | {head} | episodes | updates | greedy mean (min–max) of {args.eval_episodes} | CPU s / 1k frames | eval CPU s | peak RSS |")
    print('|' + '---|' * (len(cps) + 8))
    for kind in kinds:
        rs = sorted((r for r in results if r['kind'] == kind), key=lambda r: r['seed'])
        for r in rs:
            cells = ' | '.join(f"{c['mean20']:.1f} ({c['episodes']} ep)" for c in r['checkpoints'])
            g = r['greedy']
            print(f"| {kind} | {r['seed']} | {cells} | {r['episodes']} | {r['updates']:,} | {np.mean(g):.1f} ({min(g):.0f}–{max(g):.0f}) "
                  f"| {r['cpu_per_1k']:.2f} | {r['eval_cpu']:.2f} | {fmt_bytes(r['rss'])} |")
        cells = ' | '.join(f"{median([r['checkpoints'][i]['mean20'] for r in rs]):.1f}" for i in range(len(cps)))
        print(f"| **{kind} median** | {len(rs)} seeds | {cells} | {median([r['episodes'] for r in rs]):.0f} "
              f"| {median([r['updates'] for r in rs]):,.0f} | {median([np.mean(r['greedy']) for r in rs]):.1f} "
              f"| {median([r['cpu_per_1k'] for r in rs]):.2f} | {median([r['eval_cpu'] for r in rs]):.2f} | |")
    rs = sorted((r for r in results if r['kind'] == 'recurrent'), key=lambda r: r['seed'])
    if rs:
        T = rs[0]['T']
        print(f"\nRecurrent learner, acting vs training windows (window length T = {T}). The agent acts at episode step t "
              f"on the last T observations, the first one repeated while t < T; training windows (sampled with pad=True) "
              f"end at any step and are padded the same way, so their last step's step_n goes down to 1:\n")
        print("| seed | smallest step_n of a sampled window's last step (20 batches of 256, after training) | frames acted on a padded window (t < T), of the frames in ended episodes |")
        print("|---|---|---|")
        for r in rs:
            print(f"| {r['seed']} | {r['min_last_step_n']} | {r['padded_frames']:,} of {r['ended_frames']:,} "
                  f"({100 * r['padded_frames'] / max(1, r['ended_frames']):.0f}%) |")
    print("\nTraining loss (mean of the last 100 updates before each checkpoint), per seed:\n")
    print(f"| learner | seed | " + ' | '.join(f"@ {c:,}" for c in cps) + " | final epsilon | final beta |")
    print('|' + '---|' * (len(cps) + 4))
    for kind in kinds:
        for r in sorted((r for r in results if r['kind'] == kind), key=lambda r: r['seed']):
            print(f"| {kind} | {r['seed']} | " + ' | '.join(f"{c['loss']:.4g}" for c in r['checkpoints'])
                  + f" | {r['epsilon']:.3g} | {r['beta']:.3g} |")
    print(f"\nWhat this is: {len(results) // max(1, len(kinds))} seed(s) × {args.frames:,} frames per learner. CartPole "
          f"returns are capped at 500. No convergence or ranking is claimed from these numbers; runs this short and "
          f"this few say how each learner behaved here, not how it behaves in general.")

# --------------------------------------------------------------------------------------

def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument('--quick', action='store_true', help='smoke run: fewer repeats, 1 seed, 3,000 frames (< 2 minutes)')
    p.add_argument('--seed', type=int, default=0, help='seed of the measurements (part 1)')
    p.add_argument('--bs', type=int, default=128, help='batch size of the measurements (part 1)')
    p.add_argument('--length', type=int, default=8, help='window length T of the measurements (part 1)')
    p.add_argument('--episodes', type=int, default=200, help='random-action episodes put into the buffer (part 1)')
    p.add_argument('--repeats', type=int, default=50, help='timed repeats of forward / update (part 1)')
    p.add_argument('--frames', type=int, default=20_000, help='env steps per learning run (part 2)')
    p.add_argument('--seeds', type=int, default=2, help='learning runs per learner, seeds 0..seeds-1 (part 2)')
    p.add_argument('--every', type=int, default=5_000, help='frames between checkpoints (part 2)')
    p.add_argument('--jobs', type=int, default=2, help='learning runs in parallel, one thread each (part 2)')
    p.add_argument('--eval-episodes', type=int, default=10, help='greedy evaluation episodes per run (part 2)')
    p.add_argument('--eval-seed', type=int, default=100_000, help='evaluation env seed offset (part 2)')
    p.add_argument('--rec-bs', type=int, default=64,
                   help="RecurrentLearner bs (windows per batch), its default; the article's 128 costs about twice the CPU")
    p.add_argument('--rec-train-every', type=int, default=1, help='RecurrentLearner train_every (env steps per update), its default')
    p.add_argument('--rec-length', type=int, default=8, help='RecurrentLearner window length')
    p.add_argument('--skip-measure', action='store_true', help='only part 2')
    p.add_argument('--skip-learn', action='store_true', help='only part 1')
    args = p.parse_args()
    if args.quick:
        args.episodes, args.repeats, args.frames, args.seeds, args.every = 60, 15, 3_000, 1, 1_000
        args.eval_episodes = min(args.eval_episodes, 5)
    start = time.perf_counter()

    torch = setup_torch()
    import numpy, gymnasium
    import fastrl_per
    head, dirty = source_revision()
    fp0 = source_fingerprint()
    print(f"command: `{' '.join([os.path.basename(sys.executable)] + sys.argv)}`\n")
    print("| setting | value |\n|---|---|")
    print(f"| python | {platform.python_version()} ({sys.executable}) |")
    print(f"| torch / numpy / gymnasium / fastrl_per | {torch.__version__} / {numpy.__version__} / {gymnasium.__version__} / {fastrl_per.__version__} |")
    print(f"| backend | cpu (torch.cuda.is_available() = {torch.cuda.is_available()}; not used) |")
    print(f"| machine | {platform.platform()}, {platform.processor() or platform.machine()}, os.cpu_count() = {os.cpu_count()}, load average at start {', '.join(f'{x:.2f}' for x in os.getloadavg())} |")
    print(f"| threads | torch.set_num_threads(1) in every process |")
    print(f"| dtype | float32 parameters and observations |")
    print(f"| seed | measurements {args.seed}; learning runs 0..{args.seeds - 1}; greedy evaluation envs {args.eval_seed}+seed |")
    print(f"| input shapes (part 1) | recurrent B×T×d = {args.bs}×{args.length}×2; feed-forward B×d = {args.bs}×2 |")
    print(f"| batch size (part 1) | {args.bs} |")
    print(f"| env | {ENV_ID} (CartPole-v1 observing cart position and pole angle) |")
    print(f"| source revision | {head}{'; uncommitted changes in: ' + ', '.join(dirty) if dirty else '; package and notebooks clean'}; "
          f"fastrl_per/*.py fingerprint {fp0} |")
    print()
    sys.stdout.flush()

    ctx, out, results = mp.get_context('spawn'), {}, []
    if not args.skip_measure:
        cfg = dict(seed=args.seed, bs=args.bs, length=args.length, episodes=args.episodes, capacity=50_000, gamma=0.99,
                   tau=0.005, warmup=10, init_repeats=max(5, args.repeats // 5), sample_repeats=max(10, args.repeats // 2),
                   fwd_repeats=args.repeats, upd_repeats=max(10, args.repeats // 2))
        for kind in ('recurrent', 'feedforward'):   # one after the other, each in a fresh process
            with ctx.Pool(1) as pool: out[kind] = pool.apply(measure, (dict(cfg, kind=kind),))
        print_measurements(out['recurrent'], out['feedforward'], cfg)
        sys.stdout.flush()

    if not args.skip_learn:
        settings = dict(recurrent=dict(bs=args.rec_bs, train_every=args.rec_train_every, length=args.rec_length),
                        feedforward=dict())
        jobs = [dict(kind=k, seed=s, frames=args.frames, every=args.every, settings=settings[k],
                     eval_episodes=args.eval_episodes, eval_seed=args.eval_seed)
                for k in ('recurrent', 'feedforward') for s in range(args.seeds)]   # slow runs first
        with ctx.Pool(args.jobs, maxtasksperchild=1) as pool: results = pool.map(learn, jobs, chunksize=1)
        print_learning(results, args, settings)

    seen = {fp0} | ({out[k]['source'] for k in out} if not args.skip_measure else set()) \
        | ({r['source'] for r in results} if not args.skip_learn else set())
    if seen != {fp0}:
        print(f"\nWARNING: the fastrl_per sources changed during this invocation (fingerprints {sorted(seen)}; "
              f"{fp0} at the start): someone edited the package while it ran, so the processes did not all run the same code. "
              f"Per process: " + ', '.join([f"measure/{k} {out[k]['source']}" for k in out] if not args.skip_measure else [])
              + ('; ' if not args.skip_measure and not args.skip_learn else '')
              + ', '.join([f"{r['kind']}/{r['seed']} {r['source']}" for r in results] if not args.skip_learn else []))
    else:
        print(f"\nfastrl_per sources fingerprint {fp0} (sha256 of fastrl_per/*.py), the same in every process of this invocation.")
    print(f"\ntotal wall time of this invocation: {time.perf_counter() - start:.0f} s")

if __name__ == '__main__': main()
