#!/usr/bin/env python
"""The calls a user's own loop makes, timed against the buffers such a user would otherwise pick.

Run from the repository root:

    python benchmarks/client_speed.py            # ~2-4 minutes on 2 busy cores
    python benchmarks/client_speed.py --quick    # a smoke run, ~30 s

Each call is written the way a user writes it for that library, CartPole-shaped transitions (float32 (4,)
observations, a discrete action), in a buffer of 10,000 (CleanRL's `dqn.py` default), filled before timing:

- `add`, one transition of Python numbers from `env.step` (`obs` a float32 array, `action=1`, `reward=1.0`,
  `terminated=False`); SB3 takes arrays with a leading env axis, so its row wraps the numbers as its users do;
- `extend` of 1 and of 8 rows from a vector env of 1 and of 8 envs (numpy: float32 obs, int64 actions, float64
  rewards, bool terminations); tianshou takes them in a `VectorReplayBuffer` of as many sub-buffers;
- `add` of torch tensors (a policy's output: on the CPU, or on `--device`, e.g. a GPU): libraries that store numpy get
  `.cpu().numpy()` first;
- `sample` of 128, reading what a loss reads (the five fields, and the weights of the prioritized ones);
- a CleanRL-shaped loop, per env step: a `CartPole-v1` step of a 1-env vector env (its own env for each
  buffer), the `extend`/`add` of that row, and a sample of 128 every 10 steps.

Against Stable-Baselines3's `ReplayBuffer`, cpprb's `ReplayBuffer` and `PrioritizedReplayBuffer`, tianshou 2's
`ReplayBuffer`/`PrioritizedReplayBuffer` (and their `VectorReplayBuffer` forms), torchrl's `TensorDictReplayBuffer`
on a `LazyTensorStorage` and its prioritized form (skipped, with the reason, where torchrl's C++ sum tree is not
built for the installed torch). All are benchmark-only packages. One process, torch on one thread, garbage
collection off while timing; CPU time (`time.process_time`) of `--repeats` interleaved rounds, each round running
every library once per call in a rotating order; the table gives medians, in µs per call, and ratios of medians.
"""
from __future__ import annotations
import argparse, gc, os, platform, shlex, statistics, sys, time

import gymnasium as gym
import numpy as np
import torch

N, OBS, BS, ROWS = 10_000, 4, 128, 512
CALLS = ['add (Python numbers)', 'extend 1 row (1-env vector env)', 'extend 8 rows (8-env vector env)',
         'add (torch tensors)', 'sample 128', 'CleanRL-shaped loop, per env step']
GOALS = [('one PER add ≤ 0.5× cpprb PER', 0, 'ours PER', 'cpprb PER', 0.5),
         ('one uniform add ≤ 2× SB3', 0, 'ours', 'SB3', 2.0),
         ('8-row PER extend ≤ 0.5× cpprb PER', 2, 'ours PER', 'cpprb PER', 0.5),
         ('CleanRL-shaped loop, uniform ≤ 1.1× SB3', 5, 'ours', 'SB3', 1.1),
         ('CleanRL-shaped loop, PER ≤ 1.3× SB3', 5, 'ours PER', 'SB3', 1.3),
         ('uniform sample ≤ 0.5× SB3', 4, 'ours', 'SB3', 0.5)]


def data(rng, device='cpu'):
    """`ROWS` transitions in the forms users hold: single rows (numbers, arrays, tensors on `device`, as a policy there
    gives them) and vector-env blocks of 1 and 8."""
    obs = rng.standard_normal((ROWS + 8, OBS)).astype(np.float32)
    act, rew, done = rng.integers(0, 2, ROWS + 8), rng.random(ROWS + 8), rng.random(ROWS + 8) < 0.05
    single = [(obs[i], int(act[i]), float(rew[i]), obs[i + 1], bool(done[i])) for i in range(ROWS)]
    on = lambda x, **kw: torch.as_tensor(x, **kw).to(device)
    tensors = [(on(o), on(a), on(r, dtype=torch.float32), on(o2), on(d)) for o, a, r, o2, d in single]
    block = lambda k: [(obs[i:i + k], act[i:i + k], rew[i:i + k], obs[i + 1:i + k + 1], done[i:i + k])
                       for i in range(ROWS)]
    return dict(single=single, tensors=tensors, one=block(1), eight=block(8))


def host(t:torch.Tensor) -> np.ndarray:
    "A tensor as numpy, the way users of a numpy buffer write it: `.cpu()` (a no-op on the host), then `.numpy()`."
    return t.cpu().numpy()


def reader(*names, keyed:bool=False):
    ("Read `names` of a sampled batch as a loss does: by key (a dict, a `Batch`, a `TensorDict`) or by attribute. "
     "Which one is fixed per library, not probed on every read (a `hasattr` probe costs a failed lookup per field).")
    if keyed: return lambda batch: [batch[n] for n in names]
    return lambda batch: [getattr(batch, n) for n in names]


def ours(per):
    from fastrl_per.replay.memory import ReplayBuffer
    from fastrl_per.replay.per import PrioritizedReplayBuffer
    kind = PrioritizedReplayBuffer if per else ReplayBuffer
    make = lambda envs: kind(N, bs=BS, seed=0)
    read = reader('state', 'action', 'reward', 'next_state', 'terminated', *(['weights'] if per else []))
    def ops(rb):
        return dict(add=lambda o, a, r, o2, d: rb.add(state=o, action=a, reward=r, next_state=o2, terminated=d),
                    extend=lambda O, A, R, O2, D: rb.extend(state=O, action=A, reward=R, next_state=O2, terminated=D),
                    torch=lambda o, a, r, o2, d: rb.add(state=o, action=a, reward=r, next_state=o2, terminated=d),
                    sample=lambda: read(rb.sample(BS)))
    return make, ops


def sb3():
    from stable_baselines3.common.buffers import ReplayBuffer
    space, acts = gym.spaces.Box(-np.inf, np.inf, (OBS,), np.float32), gym.spaces.Discrete(2)
    make = lambda envs: ReplayBuffer(N // (envs or 1), space, acts, device='cpu', n_envs=envs or 1)
    read = lambda b: (b.observations, b.actions, b.rewards, b.next_observations, b.dones)
    def ops(rb):
        infos = [{}] * rb.n_envs
        return dict(add=lambda o, a, r, o2, d: rb.add(o[None], o2[None], np.array([a]), np.array([r]), np.array([d]),
                                                      infos),
                    extend=lambda O, A, R, O2, D: rb.add(O, O2, A, R, D, infos),
                    torch=lambda o, a, r, o2, d: rb.add(host(o)[None], host(o2)[None], host(a)[None],
                                                        host(r)[None], host(d)[None], infos),
                    sample=lambda: read(rb.sample(BS)))
    return make, ops


def cpprb_(per):
    import cpprb
    spec = dict(obs=dict(shape=OBS), act=dict(dtype=np.int64), rew={}, next_obs=dict(shape=OBS), done={})
    make = (lambda envs: cpprb.PrioritizedReplayBuffer(N, spec, alpha=0.6, eps=1e-6)) if per else \
        (lambda envs: cpprb.ReplayBuffer(N, spec))
    def ops(rb):
        read = reader('obs', 'act', 'rew', 'next_obs', 'done', *(['weights'] if per else []), keyed=True)
        sample = (lambda: read(rb.sample(BS, 0.4))) if per else (lambda: read(rb.sample(BS)))
        return dict(add=lambda o, a, r, o2, d: rb.add(obs=o, act=a, rew=r, next_obs=o2, done=d),
                    extend=lambda O, A, R, O2, D: rb.add(obs=O, act=A, rew=R, next_obs=O2, done=D),
                    torch=lambda o, a, r, o2, d: rb.add(obs=host(o), act=host(a), rew=host(r),
                                                        next_obs=host(o2), done=host(d)),
                    sample=sample)
    return make, ops


def tianshou_(per):
    from tianshou.data import (Batch, ReplayBuffer, PrioritizedReplayBuffer, VectorReplayBuffer,
                               PrioritizedVectorReplayBuffer)
    def make(envs=None):
        if envs is None: return PrioritizedReplayBuffer(N, alpha=0.6, beta=0.4) if per else ReplayBuffer(N)
        return PrioritizedVectorReplayBuffer(N, envs, alpha=0.6, beta=0.4) if per else VectorReplayBuffer(N, envs)
    read = reader('obs', 'act', 'rew', 'obs_next', 'terminated', *(['weight'] if per else []), keyed=True)
    def ops(rb):
        one = lambda o, a, r, o2, d: rb.add(Batch(obs=o, act=a, rew=r, terminated=d, truncated=False, obs_next=o2,
                                                  info={}))
        return dict(add=one,
                    extend=lambda O, A, R, O2, D: rb.add(Batch(obs=O, act=A, rew=R, terminated=D, truncated=D & False,
                                                               obs_next=O2, info={})),
                    torch=lambda o, a, r, o2, d: one(host(o), host(a), host(r), host(o2), host(d)),
                    sample=lambda: read(rb.sample(BS)[0]))
    return make, ops


def torchrl_(per):
    from tensordict import TensorDict
    from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer, TensorDictPrioritizedReplayBuffer
    make = (lambda envs: TensorDictPrioritizedReplayBuffer(alpha=0.6, beta=0.4, eps=1e-6, storage=LazyTensorStorage(N),
                                                           batch_size=BS)) if per else \
        (lambda envs: TensorDictReplayBuffer(storage=LazyTensorStorage(N), batch_size=BS))
    read = reader('obs', 'action', 'reward', 'next_obs', 'done', *(['_weight'] if per else []), keyed=True)
    t = torch.as_tensor
    def ops(rb):
        one = lambda o, a, r, o2, d: rb.add(TensorDict(obs=o, action=a, reward=r, next_obs=o2, done=d))
        return dict(add=lambda o, a, r, o2, d: one(t(o), t(a), t(r, dtype=torch.float32), t(o2), t(d)),
                    extend=lambda O, A, R, O2, D: rb.extend(TensorDict(
                        obs=t(O), action=t(A), reward=t(R, dtype=torch.float32), next_obs=t(O2), done=t(D),
                        batch_size=[len(A)])),
                    torch=one, sample=lambda: read(rb.sample()))
    return make, ops


LIBRARIES = {'ours PER': lambda: ours(True), 'ours': lambda: ours(False), 'SB3': sb3,
             'cpprb PER': lambda: cpprb_(True), 'cpprb': lambda: cpprb_(False),
             'tianshou PER': lambda: tianshou_(True), 'tianshou': lambda: tianshou_(False),
             'torchrl PER': lambda: torchrl_(True), 'torchrl': lambda: torchrl_(False)}


def build(name, d):
    """Each call of library `name` as `f(i)`, on buffers of its own filled the way each call writes (single adds, or
    vector envs of 1 and of 8), and the CleanRL-shaped loop on a 1-env vector env of its own."""
    make, ops = LIBRARIES[name]()
    single, one, eight, looped = (ops(make(envs)) for envs in (None, 1, 8, 1))
    for i in range(N):
        single['add'](*d['single'][i % ROWS]); one['extend'](*d['one'][i % ROWS]); looped['extend'](*d['one'][i % ROWS])
        if i % 8 == 0: eight['extend'](*d['eight'][i % ROWS])
    env = gym.make_vec('CartPole-v1', num_envs=1, vectorization_mode='sync')
    state, rng = dict(obs=env.reset(seed=0)[0]), np.random.default_rng(0)
    def loop(i):
        a = rng.integers(0, 2, 1)
        nxt, r, term, trunc, _ = env.step(a)
        looped['extend'](state['obs'], a, r, nxt, term)
        state['obs'] = nxt
        if i % 10 == 9: looped['sample']()
    return [lambda i: single['add'](*d['single'][i % ROWS]), lambda i: one['extend'](*d['one'][i % ROWS]),
            lambda i: eight['extend'](*d['eight'][i % ROWS]), lambda i: single['torch'](*d['tensors'][i % ROWS]),
            lambda i: single['sample'](), loop]


def timed(f, n):
    "CPU µs per call of `n` calls of `f(i)`."
    gc.disable()
    try:
        start = time.process_time()
        for i in range(n): f(i)
        return 1e6 * (time.process_time() - start) / n
    finally: gc.enable()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--repeats', type=int, default=7, help='interleaved rounds (median reported)')
    ap.add_argument('--target-ms', type=float, default=40., help='about how long one timing of one library lasts')
    ap.add_argument('--quick', action='store_true', help='smoke run: 3 rounds of short timings')
    ap.add_argument('--only', nargs='*', help='libraries to time (default: all that import)')
    ap.add_argument('--device', default='cpu', help="where the tensors of 'add (torch tensors)' live (a policy's)")
    args = ap.parse_args(argv)
    if args.quick: args.repeats, args.target_ms = 3, 8.
    torch.set_num_threads(1)
    d = data(np.random.default_rng(0), args.device)
    print(f"command: `{shlex.join(['python', *sys.argv])}`")
    print(f"python {platform.python_version()}, numpy {np.__version__}, torch {torch.__version__}, "
          f"{os.cpu_count()} CPUs, load average at start {os.getloadavg()[0]:.2f}; tensors on {args.device}; "
          f"{args.repeats} rounds, ~{args.target_ms:g} ms a timing\n")
    calls, skipped = {}, {}
    for name in args.only or LIBRARIES:
        try: calls[name] = build(name, d)
        except (ImportError, RuntimeError) as e: skipped[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
    counts = {}
    for name, fs in calls.items():   # calls per timing, from a short trial
        counts[name] = [max(5, int(args.target_ms * 1e3 / max(timed(f, 20), 0.5))) for f in fs]
    times = {(name, j): [] for name in calls for j in range(len(CALLS))}
    order = list(calls)
    for r in range(args.repeats):
        for j in range(len(CALLS)):
            for name in order[r % len(order):] + order[:r % len(order)]:
                times[name, j].append(timed(calls[name][j], counts[name][j]))
    med = {k: statistics.median(v) for k, v in times.items()}
    names = list(calls)
    print('| call | ' + ' | '.join(names) + ' | ours / SB3 | ours PER / cpprb PER | ours PER / tianshou PER |'
          ' ours / torchrl |')
    print('|---|' + '--:|' * (len(names) + 4))
    ratio = lambda j, a, b: f"{med[a, j] / med[b, j]:.2f}×" if (a, j) in med and (b, j) in med else '–'
    for j, call in enumerate(CALLS):
        cells = ' | '.join(f"{med[n, j]:,.1f}" for n in names)
        print(f"| {call} | {cells} | {ratio(j, 'ours', 'SB3')} | {ratio(j, 'ours PER', 'cpprb PER')} | "
              f"{ratio(j, 'ours PER', 'tianshou PER')} | {ratio(j, 'ours', 'torchrl')} |")
    print('\nµs of CPU per call (the loop: per env step, its env step included), median of the rounds.')
    for name, why in skipped.items(): print(f"\n{name}: skipped ({why})")
    print('\n| goal | measured | met |\n|---|--:|:-:|')
    for goal, j, a, b, limit in GOALS:
        if (a, j) not in med or (b, j) not in med: print(f"| {goal} | – | not run |"); continue
        v = med[a, j] / med[b, j]
        print(f"| {goal} | {v:.2f}× | {'yes' if v <= limit else '**no**'} |")
    print(f"\nload average at end {os.getloadavg()[0]:.2f}")


if __name__ == '__main__':
    main()
