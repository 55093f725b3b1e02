#!/usr/bin/env python
"""SB3's Atari replay through its own interface: our frame buffers against SB3's `optimize_memory_usage=True` buffer.

Run from the repository root (the sb3 extra installed: `pip install 'fastrl_per[sb3]'`):

    python benchmarks/sb3_frames.py                   # sample cost at 20,000; peak memory at 200,000 and 100,000
    python benchmarks/sb3_frames.py --quick           # smoke run: every size divided by 20

The buffers are `fastrl_per.integrations.sb3.SB3Buffer` and `PrioritizedSB3Buffer` with `optimize_memory_usage=True` (each frame
kept once, in a `FrameStorage`) and SB3's `ReplayBuffer` with `optimize_memory_usage=True` (one stack a step, the next
observation read from the next row; SB3 allows it only with `handle_timeout_termination=False`). Each is filled through
`add`, as SB3's off-policy loop fills it, with Atari-shaped steps of `n_envs` envs: stacks of four 84×84 uint8 frames
that shift by one new frame a step, an episode ending every 400 steps of an env. Two tables:

- **sample cost**: microseconds per `sample(32)` (the batch SB3's Atari DQN draws, on the CPU), the median of 5 blocks
  of 200 calls (the buffers taking turns within a block), buffers of `--sample-size` transitions, for n_envs 1 and 4, all in one process;
- **memory**: bytes per transition, each buffer made and filled whole in a fresh child process: `allocated` (the
  `nbytes` of its arrays over its capacity) and `peak` (the process's peak resident set, `VmHWM`, reset after the imports, less
  what was resident then, over the capacity). Every array is linear in the capacity, so bytes per
  transition times 10^6 is the buffer of the Nature DQN paper; this machine's memory is shared, so ours is measured at
  `--ours-size` and SB3's at `--sb3-size` (its 10^6 buffer would need 28 GB).
"""
from __future__ import annotations
import argparse, json, statistics, subprocess, sys, time
import numpy as np

STACK, SIDE, N_ACTIONS, EPISODE = 4, 84, 6, 400
KINDS = ('SB3 optimize_memory_usage', 'SB3Buffer', 'PrioritizedSB3Buffer')


def make(kind:str, size:int, n_envs:int):
    "An empty buffer of `kind` for `size` transitions of `n_envs` Atari envs."
    from gymnasium import spaces
    from stable_baselines3.common.buffers import ReplayBuffer
    from fastrl_per.integrations.sb3 import SB3Buffer, PrioritizedSB3Buffer
    obs, act = spaces.Box(0, 255, (STACK, SIDE, SIDE), np.uint8), spaces.Discrete(N_ACTIONS)
    if kind == KINDS[0]:
        return ReplayBuffer(size, obs, act, device='cpu', n_envs=n_envs, optimize_memory_usage=True,
                            handle_timeout_termination=False)
    cls = SB3Buffer if kind == 'SB3Buffer' else PrioritizedSB3Buffer
    return cls(size, obs, act, device='cpu', n_envs=n_envs, optimize_memory_usage=True, seed=0)


def fill(buffer, steps:int, n_envs:int):
    "`steps` adds of one step of each env: each env's stack shifts by one new frame, a reset every EPISODE steps."
    frames = np.random.default_rng(0).integers(0, 256, (97, SIDE, SIDE), dtype=np.uint8)
    obs = np.stack([np.stack([frames[e]] * STACK) for e in range(n_envs)])
    actions, rewards, infos = np.zeros(n_envs, np.int64), np.zeros(n_envs, np.float32), [{}] * n_envs
    for t in range(steps):
        new = frames[(t * n_envs + np.arange(n_envs) + 11) % len(frames)]
        nxt = np.concatenate([obs[:, 1:], new[:, None]], axis=1)
        dones = np.full(n_envs, (t + 1) % EPISODE == 0)
        buffer.add(obs, nxt, actions, rewards, dones, infos)
        obs = np.stack([np.stack([f] * STACK) for f in new]) if dones[0] else nxt


def arrays_nbytes(buffer) -> int:
    "Bytes of every array the buffer holds."
    if hasattr(buffer, 'buffer'): return buffer.buffer.storage.nbytes()
    return sum(a.nbytes for a in (buffer.observations, buffer.actions, buffer.rewards, buffer.dones, buffer.timeouts))


def status(field:str) -> int:
    "A size from /proc/self/status (VmRSS: resident now, VmHWM: the peak), in bytes (Linux)."
    with open('/proc/self/status') as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ':'))


def memory(kind:str, size:int, n_envs:int) -> dict:
    "Allocated and peak bytes per transition of one buffer made and filled in this process (a child)."
    fill(make(kind, 64, n_envs), 64, n_envs)   # the imports and first allocations, before the baseline
    with open('/proc/self/clear_refs', 'w') as f: f.write('5')   # the peak restarts from what is resident now
    base = status('VmRSS')
    buffer = make(kind, size, n_envs)
    fill(buffer, size // n_envs, n_envs)
    if hasattr(buffer, 'flush'): buffer.flush()
    return dict(allocated=arrays_nbytes(buffer) / size, peak=(status('VmHWM') - base) / size)


def in_child(kind:str, size:int, n_envs:int) -> dict:
    "`memory` in a fresh process, so that no buffer reuses another's pages."
    out = subprocess.run([sys.executable, __file__, '--one', kind, str(size), str(n_envs)], capture_output=True,
                         text=True)
    if out.returncode: raise RuntimeError(f"measuring {kind} at {size:,} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def sample_costs(size:int, n_envs:int, batch:int=32, calls:int=200, blocks:int=5) -> dict:
    ("Microseconds per `sample(batch)` of each kind filled with `size` transitions: the median over `blocks`, the "
     "kinds taking turns within each block, so that a busy machine slows them alike.")
    buffers = {k: make(k, size, n_envs) for k in KINDS}
    for b in buffers.values():
        fill(b, size // n_envs, n_envs)
        b.sample(batch)   # the staged rows flushed, first allocations made
    per_call = {k: [] for k in KINDS}
    for _ in range(blocks):
        for k, b in buffers.items():
            start = time.perf_counter()
            for _ in range(calls): b.sample(batch)
            per_call[k].append((time.perf_counter() - start) / calls * 1e6)
    return {k: statistics.median(v) for k, v in per_call.items()}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--sample-size', type=int, default=20_000, help='transitions in the buffers timed')
    p.add_argument('--ours-size', type=int, default=200_000, help='transitions in our buffers measured for memory')
    p.add_argument('--sb3-size', type=int, default=100_000, help="transitions in SB3's buffer measured for memory")
    p.add_argument('--quick', action='store_true', help='every size divided by 20')
    p.add_argument('--one', nargs=3, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.one: return print(json.dumps(memory(a.one[0], int(a.one[1]), int(a.one[2]))))
    import torch
    torch.set_num_threads(1)
    div = 20 if a.quick else 1
    sizes = {KINDS[0]: a.sb3_size // div, 'SB3Buffer': a.ours_size // div, 'PrioritizedSB3Buffer': a.ours_size // div}
    print(f"sample(32) on the CPU, buffers of {a.sample_size // div:,} Atari transitions ({STACK}×{SIDE}×{SIDE} uint8)\n")
    print('| buffer | µs per sample, n_envs 1 | × SB3 | µs per sample, n_envs 4 | × SB3 |\n|---|---:|---:|---:|---:|')
    by_envs = [sample_costs(a.sample_size // div, n) for n in (1, 4)]
    costs = {k: [c[k] for c in by_envs] for k in KINDS}
    for k, (one, four) in costs.items():
        print(f"| {k} | {one:,.0f} | {one / costs[KINDS[0]][0]:.2f}× | {four:,.0f} | {four / costs[KINDS[0]][1]:.2f}× |")
    print("\nbytes per transition, each buffer filled whole through add in its own process, n_envs 4\n")
    print('| buffer | measured at | allocated | peak RSS | allocated at 10^6 | × ours |\n|---|---:|---:|---:|---:|---:|')
    rows = {k: in_child(k, size, 4) for k, size in sizes.items()}
    ours = rows['SB3Buffer']['allocated']
    for k, r in rows.items():
        print(f"| {k} | {sizes[k]:,} | {r['allocated']:,.0f} | {r['peak']:,.0f} | {r['allocated'] * 1e6 / 1e9:.1f} GB "
              f"| {r['allocated'] / ours:.2f}× |")
    ratio = rows[KINDS[0]]['allocated'] / ours
    print(f"\ngoal: ours ≤ 1/3 of SB3's optimize_memory_usage: {1 / ratio:.3f} -> {'met' if ratio >= 3 else 'NOT met'}")


if __name__ == '__main__': main()
