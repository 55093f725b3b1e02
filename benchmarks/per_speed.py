#!/usr/bin/env python
"""Speed and memory of `fastrl_per`'s `PrioritizedReplayBuffer` next to four other prioritized buffers.

Run from the repository root:

    python benchmarks/per_speed.py                 # N = 2**20, the issue's setting (a few minutes)
    python benchmarks/per_speed.py --quick         # smoke run at N = 2**14

In one process, at N CartPole-sized transitions (alpha 0.6, beta 0.4), it times

- per-step add (one transition a call), a 1,000-step batch add,
- a sample of 256 and of 1,024 with importance weights,
- an update of 256 priorities (each call with TD errors its slots do not hold yet: cpprb's tree skips
  the walk above a node whose value did not change), and a learner step (sample 256, then update those 256),
- a pipeline step: add one transition, then a learner step, which is what each item of a
  `PrioritizedExperienceReplay` pipeline costs (ours stages single adds and writes them on
  the next read, so this row shows the add's deferred cost too),
- the shell over the core: ours' `sample` + `update_priorities` against its own priority
  core's `draw` + `update`, at batch sizes 1 and 256 (what the buffer adds to the core's work),

for

- (a) **ours**: `fastrl_per.replay.per.PrioritizedReplayBuffer`, fed `SimpleStep`s (all ten fields:
  the CartPole ones plus our bookkeeping fields). A sampled batch of ours makes a field's tensor
  when it is first read, so its samples and learner steps here read the five CartPole fields and
  the weights, what the peers hand out;
- (b) **cpprb**: `cpprb.PrioritizedReplayBuffer` (C++ segment tree, 5 fields), if installed. It is a
  benchmark-only package, not a project dependency: `pip install --no-deps cpprb`;
- (c) **tianshou**: `tianshou.data.PrioritizedReplayBuffer` (numba segment tree, 6 fields), if
  installed; benchmark-only like cpprb (`pip install tianshou`; it leaves torch and numpy as they
  are). It adds one transition a call (a `Batch`), so its 1,000-step batch add is 1,000 single
  adds, and a fill of N that way would take over a minute: the fill writes its columns and tree
  directly, and only the operations are timed. It adds float32's eps (1.2e-7) to |td| where the
  others add 1e-6, draws its `u` uniformly over the total (not stratified), and normalises the
  weights by the largest in the batch;
- (d) **plain-Python**: numpy columns with sum and min segment trees kept as Python lists and
  updated/searched one element at a time in Python loops, the design of the seed notebook
  (`shared/seeds/per_dqn_cartpole_notebook.txt`), written anew here. Its total is the root, so it
  covers every slot including the last. Building its trees one element at a time at N = 2**20 would
  take minutes, so they are built by a fast path (numpy, level by level, then `.tolist()`); only the
  operations are timed, and these all run the per-element Python loops;
- (e) **np.random.choice**: no tree at all: `np.random.choice(N, bs, p=p**alpha / sum)` over the whole
  priority array, the same weight formula, a gather of the 5 CartPole columns; an update is a plain
  array assignment. It has no add.

The machine this runs on is shared and noisy, so times are this process's CPU time
(`time.process_time`, all its threads): wall time would also count the turns of other processes
that preempt it. Every operation is timed in `--repeats` rounds.
In each round every implementation runs the same operation back to back (the order rotates
between rounds), and each ratio is taken within a round and reported as the median over
rounds, with its range. Times are medians too. Garbage collection is off while timing.

It also reports the bytes per stored transition that ours holds, the time the sum tree's numba
kernels take on their first call in a fresh process (compiling them into an empty cache, then
loading them from that cache), and checks the result against the issue's goals.
"""
from __future__ import annotations
import argparse, gc, itertools, math, os, platform, random, shlex, statistics, subprocess, sys, tempfile, time, tracemalloc

import numpy as np
import torch

ALPHA, BETA, EPS = 0.6, 0.4, 1e-6
OPS = ['per-step add', '1,000-step batch add', 'sample 256 (+weights)', 'sample 1,024 (+weights)',
       'update 256 priorities', 'learner step (sample 256 + update 256)',
       'pipeline step (add 1 + sample 256 + update 256)']
IMPLS = ['ours', 'cpprb', 'tianshou', 'plain-Python', 'np.random.choice']
PEERS = ['cpprb', 'tianshou']  # the compiled peers: ours / theirs time is reported for each
UPDATE_TDS = 1021              # TD sets of the update op, a prime: see `update` below


# ---------------------------------------------------------------------------------------------
# (d) the plain-Python segment-tree buffer
# ---------------------------------------------------------------------------------------------
class PlainPythonPER:
    "Numpy columns; sum and min segment trees as Python lists, set and searched per element in Python."
    def __init__(self, size, alpha=ALPHA, eps=EPS, seed=0):
        cap = 1
        while cap < size: cap *= 2
        self.size, self.cap, self.alpha, self.eps = size, cap, alpha, eps
        self.sum_tree, self.min_tree = [0.0] * (2 * cap), [math.inf] * (2 * cap)  # node i: children 2i, 2i+1
        self.obs, self.next_obs = np.zeros((size, 4), np.float32), np.zeros((size, 4), np.float32)
        self.act, self.rew, self.done = np.zeros(size, np.int64), np.zeros(size, np.float32), np.zeros(size, bool)
        self.ptr = self.len = 0
        self.max_priority = 1.0
        self.random = random.Random(seed)

    def _set(self, i, value):
        "Set leaf `i` in both trees and recompute its ancestors, one level at a time."
        s, m = self.sum_tree, self.min_tree
        i += self.cap
        s[i] = m[i] = value
        i >>= 1
        while i:
            left = 2 * i
            s[i] = s[left] + s[left + 1]
            m[i] = min(m[left], m[left + 1])
            i >>= 1

    def _retrieve(self, u):
        "The leaf whose prefix-sum interval holds `u`; never steps into an empty right subtree."
        s, i = self.sum_tree, 1
        while i < self.cap:
            left = 2 * i
            if s[left] > u or s[left + 1] <= 0: i = left
            else: u -= s[left]; i = left + 1
        return i - self.cap

    def build(self, obs, act, rew, next_obs, done, leaves):
        "Fast path for the benchmark's fill: columns by slice, trees by numpy level sums, then `.tolist()`."
        n = len(leaves)
        self.obs[:n], self.act[:n], self.rew[:n], self.next_obs[:n], self.done[:n] = obs, act, rew, next_obs, done
        s, m = np.zeros(2 * self.cap), np.full(2 * self.cap, math.inf)
        s[self.cap:self.cap + n] = m[self.cap:self.cap + n] = leaves
        lo = self.cap
        while lo > 1:
            lo //= 2
            s[lo:2 * lo] = s[2 * lo:4 * lo:2] + s[2 * lo + 1:4 * lo:2]
            m[lo:2 * lo] = np.minimum(m[2 * lo:4 * lo:2], m[2 * lo + 1:4 * lo:2])
        self.sum_tree, self.min_tree = s.tolist(), m.tolist()
        self.ptr, self.len = n % self.size, n

    def store(self, obs, act, rew, next_obs, done):
        p = self.ptr
        self.obs[p], self.act[p], self.rew[p], self.next_obs[p], self.done[p] = obs, act, rew, next_obs, done
        self._set(p, self.max_priority ** self.alpha)
        self.ptr, self.len = (p + 1) % self.size, min(self.len + 1, self.size)

    def sample(self, bs, beta=BETA):
        total, n = self.sum_tree[1], self.len
        segment = total / bs
        max_weight = (self.min_tree[1] / total * n) ** -beta
        idxs, weights = [], []
        for k in range(bs):
            i = self._retrieve(self.random.uniform(segment * k, segment * (k + 1)))
            idxs.append(i)
            weights.append((self.sum_tree[i + self.cap] / total * n) ** -beta / max_weight)
        idxs = np.array(idxs)
        return dict(obs=self.obs[idxs], act=self.act[idxs], rew=self.rew[idxs], next_obs=self.next_obs[idxs],
                    done=self.done[idxs], weights=np.array(weights, np.float32), indexes=idxs)

    def update_priorities(self, idxs, td):
        for i, d in zip(np.asarray(idxs).tolist(), np.asarray(td).tolist()):
            p = d + self.eps
            self._set(i, p ** self.alpha)
            if p > self.max_priority: self.max_priority = p


# ---------------------------------------------------------------------------------------------
# (e) np.random.choice over the whole priority array
# ---------------------------------------------------------------------------------------------
class ChoicePER:
    "No tree: `np.random.choice` with `p = p**alpha / sum` on every sample; an update is an array assignment."
    def __init__(self, size, alpha=ALPHA, eps=EPS, seed=0):
        self.size, self.alpha, self.eps, self.rs = size, alpha, eps, np.random.RandomState(seed)
        self.pa = np.zeros(size)  # p ** alpha

    def build(self, obs, act, rew, next_obs, done, leaves):
        self.obs, self.act, self.rew, self.next_obs, self.done = obs, act, rew, next_obs, done  # shared, read-only
        self.pa[:len(leaves)] = leaves

    def sample(self, bs, beta=BETA):
        probs = self.pa / self.pa.sum()
        idxs = self.rs.choice(self.size, bs, p=probs)
        weights = (self.size * probs[idxs]) ** -beta / (self.size * probs.min()) ** -beta
        return dict(obs=self.obs[idxs], act=self.act[idxs], rew=self.rew[idxs], next_obs=self.next_obs[idxs],
                    done=self.done[idxs], weights=weights.astype(np.float32), indexes=idxs)

    def update_priorities(self, idxs, td): self.pa[idxs] = (td + self.eps) ** self.alpha


# ---------------------------------------------------------------------------------------------
# measuring
# ---------------------------------------------------------------------------------------------
def rss_bytes():
    "Resident set size of this process (Linux), or None."
    try:
        with open('/proc/self/status') as f:
            for line in f:
                if line.startswith('VmRSS:'): return int(line.split()[1]) * 1024
    except OSError: return None

def per_call(fn, number):
    "CPU seconds of this process per call of `fn(i)` for i in range(number), garbage collector off."
    was = gc.isenabled(); gc.disable()
    try:
        t0 = time.process_time()
        for i in range(number): fn(i)
        return (time.process_time() - t0) / number
    finally:
        if was: gc.enable()

def calibrate(fn, target_s, max_number):
    "Calls per timing so that one timing lasts about `target_s` (after two warm-up calls)."
    fn(0); t = per_call(fn, 2)
    return max(1, min(max_number, int(target_s / max(t, 1e-9))))

def arrays_of(obj, name:str, depth:int=2) -> dict:
    "The numpy arrays `obj` holds, and (`depth` levels down) those of the objects it holds: {dotted name: nbytes}."
    found = {}
    for k, v in vars(obj).items():
        if isinstance(v, np.ndarray): found[f'{name}.{k}'] = v.nbytes
        elif depth > 1 and hasattr(v, '__dict__') and not isinstance(v, type):
            found.update(arrays_of(v, f'{name}.{k}', depth - 1))
    return found

def fmt_us(s): return '—' if s is None else (f'{s * 1e6:,.1f}' if s < 1e-3 else f'{s * 1e6:,.0f}')
def fmt_x(r): return '—' if r is None else (f'{r:.3g}×' if r < 100 else f'{r:,.0f}×')
def med_range(rs):
    if not rs: return None, '—'
    m = statistics.median(rs)
    return m, f'{fmt_x(m)} [{fmt_x(min(rs))}–{fmt_x(max(rs))}]'


FIRST_CALLS = """
import time
t0 = time.perf_counter()
import numpy as np
from fastrl_per.replay.sumtree import SumTree
t1, c1 = time.perf_counter(), time.process_time()
t = SumTree(100)
t.update([1, 2, 2], [1., 2., 3.]); t.update_unchecked(np.arange(3), np.ones(3)); t.set_range(5, [4.])
t.find([0.5, 2.5]); t.find_unchecked(np.array([1.]))
t2, c2 = time.perf_counter(), time.process_time()
t.update([1, 2], [1., 2.]); t.set_range(5, [4.]); t.find([0.5, 2.5])
print(t1 - t0, t2 - t1, c2 - c1, time.perf_counter() - t2)
"""

def first_call_times(repeats=3):
    "Median seconds of (import, first call of every kernel: wall and CPU, the calls again) in fresh processes: cold cache, then warm."
    out = {}
    with tempfile.TemporaryDirectory() as warm_dir:
        for kind in ('cold', 'warm'):
            runs = []
            for _ in range(repeats):
                with tempfile.TemporaryDirectory() as cold_dir:
                    env = dict(os.environ, NUMBA_CACHE_DIR=cold_dir if kind == 'cold' else warm_dir)
                    if kind == 'warm' and not os.listdir(warm_dir):   # fill the warm cache once
                        subprocess.run([sys.executable, '-c', FIRST_CALLS], env=env, check=True, capture_output=True)
                    res = subprocess.run([sys.executable, '-c', FIRST_CALLS], env=env, check=True, capture_output=True, text=True)
                    runs.append([float(x) for x in res.stdout.split()])
            out[kind] = [statistics.median(col) for col in zip(*runs)]
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--n', type=int, default=2 ** 20, help='transitions stored (buffer capacity), default 2**20')
    ap.add_argument('--repeats', type=int, default=11, help='timing rounds per operation (median reported)')
    ap.add_argument('--target-ms', type=float, default=80., help='about how long one timing of one implementation lasts')
    ap.add_argument('--quick', action='store_true', help='smoke run: N=2**14, 3 repeats, short timings')
    ap.add_argument('--seed', type=int, default=0)
    ap.add_argument('--cpprb-check-for-update', action='store_true',
                    help="build cpprb with check_for_update=True: it then drops stale priority updates, as ours always does")
    ap.add_argument('--cycled-updates', action='store_true',
                    help="the update op as it was: slot set i %% 64 always with TD set i %% 64, so after 64 calls every "
                         "update writes the values its slots already hold (cpprb's tree then skips its walk)")
    args = ap.parse_args(argv)
    if args.quick: args.n, args.repeats, args.target_ms = min(args.n, 2 ** 14), 3, 5.
    N, target = args.n, args.target_ms / 1e3
    t_start = time.perf_counter()

    print(f'command: `{shlex.join(sys.orig_argv)}`  (cwd {os.getcwd()})')
    print(f'python {platform.python_version()}, numpy {np.__version__}, torch {torch.__version__}, '
          f'{os.cpu_count()} CPUs, load average at start {os.getloadavg()[0]:.2f}')

    from fastrl_per.core import SimpleStep, STEP_FIELDS
    from fastrl_per.replay.per import PrioritizedReplayBuffer
    import numba
    try:
        import tianshou
        from tianshou.data import Batch, PrioritizedReplayBuffer as TianshouPER
        tianshou_skip = None
    except Exception as e:
        tianshou, tianshou_skip = None, f'tianshou not importable ({type(e).__name__}: {e}); pip install tianshou'
    print(f'numba {numba.__version__}; '
          + (f'tianshou {tianshou.__version__}' if tianshou else f'tianshou: SKIPPED, {tianshou_skip}'))
    try:
        import cpprb
        cpprb_version, cpprb_skip = getattr(cpprb, '__version__', None), None
        if cpprb_version is None:
            from importlib.metadata import version; cpprb_version = version('cpprb')
    except Exception as e:  # not installed, or built for another numpy
        cpprb, cpprb_skip = None, f'cpprb not importable ({type(e).__name__}: {e}); pip install --no-deps cpprb'
    print(f'cpprb {cpprb_version}, check_for_update={args.cpprb_check_for_update}' if cpprb else f'cpprb: SKIPPED, {cpprb_skip}')
    print(f'N = {N:,} transitions, alpha = {ALPHA}, beta = {BETA}, eps = {EPS}, repeats = {args.repeats}, '
          f'~{args.target_ms:g} ms per timing; update op: '
          + ('64 slot sets cycled with 64 TD sets (--cycled-updates)\n' if args.cycled_updates else
             f'64 slot sets with {UPDATE_TDS} TD sets, a new pair each call\n'))

    # --- the data: one set of CartPole-like transitions and |td| errors shared by every implementation
    rng = np.random.default_rng(args.seed)
    obs = rng.standard_normal((N, 4), dtype=np.float32)
    next_obs = rng.standard_normal((N, 4), dtype=np.float32)
    act = rng.integers(0, 2, N).astype(np.int64)
    rew = np.ones(N, np.float32)
    done = rng.random(N) < 0.05
    td0 = rng.exponential(1.0, N)                  # initial |td| for every slot: a non-uniform distribution
    leaves = (td0 + EPS) ** ALPHA

    def read_fields(batch):
        "The five CartPole fields and the weights of a sampled batch of ours, as a learner reads them."
        return batch.state, batch.action, batch.reward, batch.next_state, batch.terminated, batch.weights

    def step_batch(lo, hi):
        "Slots lo..hi-1 as one SimpleStep batch with all ten fields."
        k = hi - lo
        return SimpleStep(state=torch.from_numpy(obs[lo:hi]), action=torch.from_numpy(act[lo:hi]),
                          next_state=torch.from_numpy(next_obs[lo:hi]), terminated=torch.from_numpy(done[lo:hi]),
                          truncated=torch.zeros(k, dtype=torch.bool), reward=torch.from_numpy(rew[lo:hi]),
                          total_reward=torch.from_numpy(rew[lo:hi]), env_id=torch.zeros(k, dtype=torch.int64),
                          step_n=torch.arange(lo, hi), episode_n=torch.zeros(k, dtype=torch.int64))

    # --- (a) ours: build and fill, measuring memory as we go
    gc.collect()
    rss0 = rss_bytes(); tracemalloc.start()
    ours = PrioritizedReplayBuffer(max_sz=N, bs=256, alpha=ALPHA, beta=BETA, eps=EPS, seed=args.seed)
    chunk = min(N, 2 ** 16)
    for lo in range(0, N, chunk): ours.add(step_batch(lo, min(N, lo + chunk)))
    ours.update_priorities(np.arange(N), td0)     # never-sampled slots: every update applies
    traced, traced_peak = tracemalloc.get_traced_memory(); tracemalloc.stop()
    rss_ours = None if rss0 is None else rss_bytes() - rss0
    assert len(ours) == N and math.isclose(ours.kind.total, leaves.sum(), rel_tol=1e-9)

    # --- (b) cpprb
    impl = {'ours': ours}
    skip = {'cpprb': cpprb_skip, 'tianshou': tianshou_skip, 'plain-Python': None, 'np.random.choice': None}
    rss_other = {}
    if cpprb is not None:
        r0 = rss_bytes()
        cp = cpprb.PrioritizedReplayBuffer(N, env_dict={'obs': {'shape': 4}, 'act': {'dtype': np.int64}, 'rew': {},
                                                        'next_obs': {'shape': 4}, 'done': {}}, alpha=ALPHA, eps=EPS,
                                    check_for_update=args.cpprb_check_for_update)
        for lo in range(0, N, chunk):
            hi = min(N, lo + chunk)
            cp.add(obs=obs[lo:hi], act=act[lo:hi], rew=rew[lo:hi], next_obs=next_obs[lo:hi], done=done[lo:hi])
        cp.update_priorities(np.arange(N), td0 + EPS)
        impl['cpprb'] = cp
        rss_other['cpprb'] = None if r0 is None else rss_bytes() - r0

    # --- (c) tianshou: one add builds its columns; then columns, size and tree are written directly
    if tianshou is not None:
        r0 = rss_bytes()
        ts = TianshouPER(N, alpha=ALPHA, beta=BETA)
        ts.add(Batch(obs=obs[0], act=int(act[0]), rew=float(rew[0]), terminated=bool(done[0]), truncated=False,
                     obs_next=next_obs[0]))
        m = ts._meta
        m.obs[:], m.act[:], m.rew[:], m.obs_next[:] = obs, act, rew, next_obs
        m.terminated[:], m.truncated[:], m.done[:] = done, False, done
        ts._size, ts._insertion_idx, ts.last_index = N, 0, np.array([N - 1])
        ts.update_weight(np.arange(N), td0)
        assert len(ts) == N and math.isclose(ts.weight.reduce(), ((td0 + np.finfo(np.float32).eps) ** ALPHA).sum(), rel_tol=1e-9)
        impl['tianshou'] = ts
        rss_other['tianshou'] = None if r0 is None else rss_bytes() - r0

    # --- (d) plain Python, (e) np.random.choice
    r0 = rss_bytes()
    plain = PlainPythonPER(N, seed=args.seed); plain.build(obs, act, rew, next_obs, done, leaves)
    rss_other['plain-Python'] = None if r0 is None else rss_bytes() - r0
    assert math.isclose(plain.sum_tree[1], leaves.sum(), rel_tol=1e-9) and plain.min_tree[1] == leaves.min()
    choice = ChoicePER(N, seed=args.seed); choice.build(obs, act, rew, next_obs, done, leaves)
    impl['plain-Python'], impl['np.random.choice'] = plain, choice
    print(f'set-up (data and fills) took {time.perf_counter() - t_start:.1f} s\n')

    # --- inputs for the operations, built before any timing
    n_single = 4096
    singles = [step_batch(i, i + 1)[0] for i in range(n_single)]                 # single SimpleSteps
    rows = [(obs[i], int(act[i]), float(rew[i]), next_obs[i], bool(done[i])) for i in range(n_single)]
    ts_add = lambda b, o, a, r, no, d: b.add(Batch(obs=o, act=a, rew=r, terminated=d, truncated=False, obs_next=no))
    n_batches = 16
    batches = [step_batch(1000 * b, 1000 * (b + 1)) for b in range(n_batches)]
    tds = [torch.from_numpy(rng.exponential(1.0, 256)) for _ in range(64)]        # a learner hands back tensors
    tds_np = [t.numpy() for t in tds]

    def add_single(name):
        b = impl[name]
        if name == 'ours': return lambda i: b.add(singles[i % n_single])
        if name == 'cpprb':
            def f(i):
                o, a, r, no, d = rows[i % n_single]; b.add(obs=o, act=a, rew=r, next_obs=no, done=d)
            return f
        if name == 'tianshou': return lambda i: ts_add(b, *rows[i % n_single])
        if name == 'plain-Python': return lambda i: b.store(*rows[i % n_single])

    def add_batch(name):
        b = impl[name]
        if name == 'ours': return lambda i: b.add(batches[i % n_batches])
        if name == 'cpprb':
            def f(i):
                lo = 1000 * (i % n_batches); s = slice(lo, lo + 1000)
                b.add(obs=obs[s], act=act[s], rew=rew[s], next_obs=next_obs[s], done=done[s])
            return f
        if name == 'tianshou':
            def f(i):
                lo = 1000 * (i % n_batches)
                for j in range(lo, lo + 1000): ts_add(b, obs[j], int(act[j]), float(rew[j]), next_obs[j], bool(done[j]))
            return f
        if name == 'plain-Python':
            def f(i):
                lo = 1000 * (i % n_batches)
                for j in range(lo, lo + 1000): b.store(obs[j], act[j], rew[j], next_obs[j], done[j])
            return f

    def sample(bs):
        def make(name):
            b = impl[name]
            if name == 'ours': return lambda i: read_fields(b.sample(bs))
            if name == 'tianshou': return lambda i: b.sample(bs)   # tianshou's weights: batch.weight
            return lambda i: b.sample(bs, BETA)
        return make

    def learner(name):
        b = impl[name]
        if name == 'ours':   # reads what the peers hand out: ours makes a field's tensor when it is first read
            def f(i):
                batch = b.sample(256); read_fields(batch); b.update_priorities(batch.idxs, tds[i % 64])
        elif name == 'tianshou':
            def f(i):
                batch, idxs = b.sample(256); b.update_weight(idxs, tds_np[i % 64])
        else:
            def f(i):
                s = b.sample(256, BETA)
                b.update_priorities(s['indexes'], tds_np[i % 64] + (EPS if name == 'cpprb' else 0.))
        return f

    def pipeline(name):
        if name == 'np.random.choice': return None
        add, learn = add_single(name), learner(name)
        def f(i): add(i); learn(i)
        return f

    idx_sets = []  # filled just before the update op: slots our buffer sampled, so our updates are not stale
    # The update op pairs slot set c % 64 with TD set c % UPDATE_TDS on its c-th call, counted across rounds: a pair
    # comes back only after 64 * UPDATE_TDS calls, so every call writes values its slots do not already hold.
    # cpprb's segment tree stops walking up at the first node whose value did not change: cycling the same 64 pairs
    # (as this op did before) let every cpprb update after the first 64 skip its walk, and timed almost none of it.
    update_tds = [rng.exponential(1.0, 256) for _ in range(UPDATE_TDS)]
    td_sets = 64 if args.cycled_updates else UPDATE_TDS
    def update(name):
        b, calls = impl[name], itertools.count()
        if name == 'ours':
            td = [torch.from_numpy(t) for t in update_tds]   # a learner hands back tensors
            def f(i): c = next(calls); b.update_priorities(idx_sets[c % 64], td[c % td_sets])
            return f
        idx_np = [t.numpy() for t in idx_sets]
        if name == 'cpprb':
            td = [t + EPS for t in update_tds]   # cpprb adds no eps of its own
            def f(i): c = next(calls); b.update_priorities(idx_np[c % 64], td[c % td_sets])
        elif name == 'tianshou':
            def f(i): c = next(calls); b.update_weight(idx_np[c % 64], update_tds[c % td_sets])
        else:
            def f(i): c = next(calls); b.update_priorities(idx_np[c % 64], update_tds[c % td_sets])
        return f

    makers = {OPS[0]: add_single, OPS[1]: add_batch, OPS[2]: sample(256), OPS[3]: sample(1024),
              OPS[4]: update, OPS[5]: learner, OPS[6]: pipeline}
    max_number = {OPS[0]: 20000, OPS[1]: 200}
    results, ratios, ratios_plain = {}, {peer: {} for peer in PEERS}, {}
    for op in OPS:
        if op == OPS[4]: idx_sets[:] = [ours.sample(256).idxs for _ in range(64)]
        fns = {}
        for name in IMPLS:
            if name not in impl: continue
            fn = makers[op](name)
            if fn is not None: fns[name] = fn
        numbers = {name: calibrate(fn, target, max_number.get(op, 100000)) for name, fn in fns.items()}
        times = {name: [] for name in fns}
        names = list(fns)
        for r in range(args.repeats):
            for name in names[r % len(names):] + names[:r % len(names)]:
                times[name].append(per_call(fns[name], numbers[name]))
        if op == OPS[4]:  # every update of ours landed (fresh slots), so it did the full work
            last = idx_sets[-1].numpy()
            assert (ours.sampled_at[last] == ours.writes[last]).all()
        results[op] = {name: statistics.median(ts) for name, ts in times.items()}
        for peer in PEERS: ratios[peer][op] = [o / c for o, c in zip(times['ours'], times[peer])] if peer in times else []
        ratios_plain[op] = [p / o for o, p in zip(times['ours'], times['plain-Python'])] if 'plain-Python' in times else []
        print(f'  timed {op:<40} calls per timing: {numbers}', file=sys.stderr)

    # --- the table
    print('## Time per call (µs, median of rounds)\n')
    print('| operation | ours | cpprb | tianshou | plain-Python | np.random.choice | ours / cpprb time '
          '| ours / tianshou time | ours vs plain-Python speed-up |')
    print('|---|--:|--:|--:|--:|--:|--:|--:|--:|')
    for op in OPS:
        res = results[op]
        cells = [fmt_us(res.get(name)) if name in impl else 'skipped' for name in IMPLS]
        print(f'| {op} | ' + ' | '.join(cells) + f' | {med_range(ratios["cpprb"][op])[1]} '
              f'| {med_range(ratios["tianshou"][op])[1]} | {med_range(ratios_plain[op])[1]} |')
    for name in PEERS:
        if skip[name]: print(f'\n{name} skipped: {skip[name]}')
    print('\nRatios: median over rounds [smallest–largest]. tianshou adds one transition a call: its batch add is 1,000 '
          'single adds. (e) np.random.choice has no add: "—". Its sample includes p/sum over all N slots, as it must '
          'after any update.')
    rate_ratios = [1 / r for r in ratios['cpprb'][OPS[0]]]
    print(f'\nper-step add rate, ours / cpprb: {med_range(rate_ratios)[1]} '
          f'(ours {1 / results[OPS[0]]["ours"]:,.0f} steps/s'
          + (f', cpprb {1 / results[OPS[0]]["cpprb"]:,.0f} steps/s)' if 'cpprb' in results[OPS[0]] else ')'))

    # --- the shell over the core: what the buffer adds to the priority core's own draw and update
    core, core_rng = ours.prioritizer, np.random.default_rng(args.seed + 1)
    def core_step(bs):
        td = [t[:bs] for t in tds_np]   # sliced before timing, as for the buffer: neither times the slicing
        def f(i):
            keys, _ = core.draw(core_rng, bs); core.update(keys, td[i % 64])
        return f
    def shell_step(bs, read=False):
        td = [t[:bs] for t in tds]
        def f(i):
            batch = ours.sample(bs)
            if read: read_fields(batch)
            ours.update_priorities(batch.idxs, td[i % 64])
        return f
    shell = {}
    for bs in (1, 256):
        fns = {'core': core_step(bs), 'shell': shell_step(bs), 'shell + fields': shell_step(bs, read=True)}
        numbers = {name: calibrate(fn, target, 100000) for name, fn in fns.items()}
        times = {name: [] for name in fns}
        for r in range(args.repeats):
            names = list(fns)
            for name in names[r % len(names):] + names[:r % len(names)]:
                times[name].append(per_call(fns[name], numbers[name]))
        shell[bs] = {name: statistics.median(ts) for name, ts in times.items()}
        shell[bs]['ratios'] = {name: [o / c for o, c in zip(times[name], times['core'])]
                                for name in ('shell', 'shell + fields')}
    print('\n## The shell over the priority core (µs per call, median of rounds)\n')
    print('| batch size | core: draw + update | buffer: sample + update_priorities | shell / core '
          '| buffer, reading the 5 fields and weights | that / core |')
    print('|--:|--:|--:|--:|--:|--:|')
    for bs, res in shell.items():
        print(f"| {bs} | {fmt_us(res['core'])} | {fmt_us(res['shell'])} | {med_range(res['ratios']['shell'])[1]} "
              f"| {fmt_us(res['shell + fields'])} | {med_range(res['ratios']['shell + fields'])[1]} |")
    print('\nThe core is the buffer\'s own `Priorities`, drawn with its own generator and updated with float64 numpy '
          'TD errors; the buffer gets float64 torch tensors, as from a learner. A sampled batch makes each field\'s '
          'tensor when it is first read, so the last two columns include that.')

    # --- memory of ours
    raw = sum(getattr(singles[0], n).element_size() * getattr(singles[0], n).numel() for n in STEP_FIELDS)
    core = ours.prioritizer
    tree_arrays = arrays_of(core.kind, 'tree')
    parts = {'storage (packed records, one per slot)': ours.storage.nbytes(),
             'per-slot record of the priority core (raw priority, writes, sampled_at)': core.keyed.nbytes,
             'in-the-draw flags': core.active.nbytes,
             f'tree arrays ({", ".join(tree_arrays)})': sum(tree_arrays.values())}
    total = sum(parts.values())
    cap = 1 << (N - 1).bit_length()
    ref_sum_min, ref_sum = 2 * (2 * cap * 8) / N, 2 * cap * 8 / N  # float64 heap trees, 2·cap nodes each
    print('\n## Memory of ours, bytes per stored transition\n')
    print('| part | bytes / transition |\n|---|--:|')
    for k, v in parts.items(): print(f'| {k} | {v / N:.2f} |')
    print(f'| **total** | **{total / N:.2f}** |')
    print(f'| raw field bytes of one SimpleStep ({len(STEP_FIELDS)} fields) | {raw} |')
    print(f'| raw + tree, tree = float64 sum + min heaps of 2·{cap:,} nodes (the seed\'s two trees) | {raw + ref_sum_min:.2f} |')
    print(f'| raw + tree, tree = one float64 sum heap | {raw + ref_sum:.2f} |')
    print(f'\nours / raw = {total / N / raw:.3f}; ours / (raw + sum&min tree) = {total / N / (raw + ref_sum_min):.3f}; '
          f'ours / (raw + sum tree) = {total / N / (raw + ref_sum):.3f}')
    print(f'tracemalloc while building + filling ours: {traced / N:.1f} B/transition held, peak {traced_peak / N:.1f}')
    if rss_ours is not None:
        print(f'RSS growth: ours {rss_ours / N:.1f} B/transition'
              + ''.join(f', {k} {v / N:.1f}' for k, v in rss_other.items() if v is not None)
              + ' (plain-Python: its trees are Python lists of float objects)')

    # --- the kernels' first call in a fresh process
    first = first_call_times()
    print('\n## First call of the sum tree\'s numba kernels, in a fresh process (median of 3 processes)\n')
    print('| numba cache | import fastrl_per.replay.sumtree, wall s | first call of every kernel, wall s | the same, CPU s '
          '| the same calls again, ms |')
    print('|---|--:|--:|--:|--:|')
    for kind, label in (('cold', 'empty (compiles, then writes the cache)'), ('warm', 'warm (loads the cache)')):
        imp, call, call_cpu, again = first[kind]
        print(f'| {label} | {imp:.2f} | {call:.2f} | {call_cpu:.2f} | {again * 1e3:.2f} |')

    # --- goals
    def goal(label, value, ok, shown):
        return f'| {label} | {shown} | {"—" if value is None else ("yes" if ok else "**no**")} |'
    lr_ts = med_range(ratios['tianshou'][OPS[5]])[0]; lr_cp = med_range(ratios['cpprb'][OPS[5]])[0]
    s1k = med_range(ratios['cpprb'][OPS[3]])[0]; rate = med_range(rate_ratios)[0]
    print('\n## The issue\'s goals\n')
    print('| goal | measured (median [range]) | met |\n|---|--:|:-:|')
    print(goal('learner step ≤ 0.5× tianshou\'s time', lr_ts, lr_ts is not None and lr_ts <= 0.5,
               med_range(ratios['tianshou'][OPS[5]])[1]))
    print(goal('learner step ≤ 0.3× cpprb\'s time', lr_cp, lr_cp is not None and lr_cp <= 0.3,
               med_range(ratios['cpprb'][OPS[5]])[1]))
    print(goal('sample of 1,024 ≤ 0.2× cpprb\'s time', s1k, s1k is not None and s1k <= 0.2,
               med_range(ratios['cpprb'][OPS[3]])[1]))
    print(goal('per-step add rate ≥ 4× cpprb\'s', rate, rate is not None and rate >= 4, med_range(rate_ratios)[1]))
    for bs, res in shell.items():
        r = med_range(res['ratios']['shell'])
        print(goal(f'batch {bs}: sample + update_priorities ≤ 1.5× the core\'s draw + update', r[0], r[0] <= 1.5, r[1]))
    per_t = total / N
    print(goal('memory per CartPole transition ≤ 112 B (before this change)', per_t, per_t <= 112, f'{per_t:.2f} B'))
    print(f'\nload average at end {os.getloadavg()[0]:.2f}; wall time {time.perf_counter() - t_start:.0f} s')


if __name__ == '__main__':
    main()
