#!/usr/bin/env python
"""Bytes per stored Atari transition: our `FrameStorage` against a plain storage of stacked states and SB3's `ReplayBuffer`.

Run from the repository root:

    python benchmarks/atari_memory.py                  # FrameStorage at 1,000,000 transitions (about 7.2 GB touched)
    python benchmarks/atari_memory.py --quick          # smoke run: every capacity divided by 100

A transition is an `ALE/Pong-v5` one after the standard preprocessing: `state` and `next_state`
are stacks of four 84×84 uint8 frames, the action an int64, plus our bookkeeping fields
(terminated, truncated, reward, total_reward, env_id, step_n, episode_n). For each storage it
reports, per stored transition,

- **allocated**: the `nbytes` of every array the storage holds, divided by its capacity;
- **RSS**: the growth of the process's resident set after allocating the storage and writing
  every byte of its arrays (`fill`), divided by its capacity. Each storage is measured in a
  fresh child process, after its imports, so one measurement cannot reuse another's pages;

for

- (a) **ours**: `fastrl_per.replay.frames.FrameStorage`, each frame once, at `--capacity` (default
  1,000,000, the buffer of the Nature DQN paper and of Schaul et al. 2016);
- (b) **stacked**: `fastrl_per.replay.memory.RingStorage`, one packed row holding both stacks. At one
  million transitions it would need 56 GB, so its 1,000,000 figure is computed from its row
  type, and it is measured (allocated and RSS) at `--stacked-capacity` (10,000);
- (c) **SB3** and (d) **SB3 optimised**: stable-baselines3's `ReplayBuffer` without and with
  `optimize_memory_usage` (which keeps one stack per step and reads the next observation from
  the next row; it needs `handle_timeout_termination=False`). A benchmark-only package, not a
  project dependency: `pip install stable-baselines3` (check that torch did not move). This
  machine's memory is shared, so SB3 is measured at `--sb3-capacity` (50,000); its arrays are
  linear in the capacity, so bytes per transition scale exactly.

If the machine has less memory available than ours needs at `--capacity`, the capacity is
halved until it fits, and the table says so. The goals checked at the end: ours at most
1.05 × 84 · 84 = 7,409 bytes per transition, and at least 3.5× smaller than SB3's optimised
buffer.
"""
from __future__ import annotations
import argparse, json, subprocess, sys

import numpy as np

STACK, SIDE, N_ACTIONS = 4, 84, 6
GOAL_BYTES, GOAL_RATIO = 1.05 * SIDE * SIDE, 3.5


def rss() -> int:
    "Resident set size of this process, in bytes (Linux)."
    with open('/proc/self/status') as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith('VmRSS:'))


def available() -> int:
    "Memory the machine can still give, in bytes (Linux)."
    with open('/proc/meminfo') as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith('MemAvailable:'))


def one_transition() -> dict:
    "Columns of one Atari-shaped transition."
    stacks = np.random.default_rng(0).integers(0, 256, (1, STACK + 1, SIDE, SIDE), dtype=np.uint8)
    return dict(state=stacks[:, :-1], next_state=stacks[:, 1:], action=np.zeros(1, np.int64),
                terminated=np.zeros(1, bool), truncated=np.zeros(1, bool), reward=np.zeros(1, np.float32),
                total_reward=np.zeros(1, np.float32), env_id=np.zeros(1, np.int64), step_n=np.zeros(1, np.int64),
                episode_n=np.zeros(1, np.int64), n_steps=np.ones(1, np.int32))


def storage_arrays(kind: str, capacity: int) -> list:
    "Allocate one storage of `kind` for `capacity` transitions; return its arrays."
    if kind == 'ours':
        from fastrl_per.replay.frames import FrameStorage
        s, columns = FrameStorage(capacity), one_transition()
        s.write(columns)
        return [getattr(s, name) for name in s.layout(columns)]   # every ring it holds: records, row links, frames
    if kind == 'stacked':
        from fastrl_per.replay.memory import RingStorage
        s = RingStorage(capacity)
        s.write(one_transition())
        return [s.rows]
    from gymnasium import spaces
    from stable_baselines3.common.buffers import ReplayBuffer
    optimised = kind == 'SB3 optimised'
    b = ReplayBuffer(capacity, spaces.Box(0, 255, (STACK, SIDE, SIDE), np.uint8), spaces.Discrete(N_ACTIONS), device='cpu',
                     optimize_memory_usage=optimised, handle_timeout_termination=not optimised)
    return [b.observations, b.actions, b.rewards, b.dones, b.timeouts] + ([] if optimised else [b.next_observations])


def imports(kind: str):
    "Import what `kind` needs before the baseline RSS is read."
    import torch, gymnasium  # noqa: F401  (both storages' dependencies)
    if kind.startswith('SB3'): import stable_baselines3  # noqa: F401
    else: import fastrl_per.replay.frames  # noqa: F401


def measure(kind: str, capacity: int) -> dict:
    "Allocated and resident bytes per transition of one storage (run in a child process)."
    imports(kind)
    base = rss()
    arrays = storage_arrays(kind, capacity)
    for a in arrays: a.view(np.uint8).fill(1)  # write every byte, so every page is resident
    return dict(allocated=sum(a.nbytes for a in arrays) / capacity, rss=(rss() - base) / capacity)


def in_child(kind: str, capacity: int) -> dict:
    out = subprocess.run([sys.executable, __file__, '--one', kind, '--capacity', str(capacity)], capture_output=True, text=True)
    if out.returncode: raise RuntimeError(f"measuring {kind} at {capacity:,} failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def stacked_row_bytes() -> int:
    "Bytes of one `RingStorage` row of an Atari transition, from its row type (nothing allocated)."
    from fastrl_per.replay.memory import packed_dtype
    return packed_dtype(one_transition()).itemsize


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--capacity', type=int, default=1_000_000, help='transitions in our FrameStorage')
    p.add_argument('--stacked-capacity', type=int, default=10_000, help='transitions in the measured stacked storage')
    p.add_argument('--sb3-capacity', type=int, default=50_000, help="transitions in SB3's buffers")
    p.add_argument('--quick', action='store_true', help='divide every capacity by 100')
    p.add_argument('--one', help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.one: return print(json.dumps(measure(a.one, a.capacity)))
    caps = {k: c // (100 if a.quick else 1) for k, c in
            dict(ours=a.capacity, stacked=a.stacked_capacity, SB3=a.sb3_capacity, **{'SB3 optimised': a.sb3_capacity}).items()}
    notes = []
    while caps['ours'] * GOAL_BYTES * 1.25 > available() and caps['ours'] > 1000:
        caps['ours'] //= 2
    if caps['ours'] < a.capacity // (100 if a.quick else 1): notes.append(f"ours measured at {caps['ours']:,}: too little memory available for {a.capacity:,}")
    try: import stable_baselines3  # noqa: F401
    except ImportError:
        notes.append('stable-baselines3 is not installed: its rows are left out (pip install stable-baselines3)')
        del caps['SB3'], caps['SB3 optimised']
    rows = {kind: dict(capacity=cap, **in_child(kind, cap)) for kind, cap in caps.items()}
    ours = rows['ours']['allocated']
    print(f"Bytes per stored Atari transition ({STACK}×{SIDE}×{SIDE} uint8 stacks); each storage measured in its own process\n")
    print('| storage | measured at | allocated B/transition | RSS B/transition | at 1,000,000 | × ours |')
    print('|---|---:|---:|---:|---:|---:|')
    for kind, r in rows.items():
        print(f"| {kind} | {r['capacity']:,} | {r['allocated']:,.0f} | {r['rss']:,.0f} | {r['allocated'] * 1e6 / 1e9:,.1f} GB | {r['allocated'] / ours:.2f}× |")
    stacked = stacked_row_bytes()
    print(f"| stacked, computed from its row type | 1,000,000 | {stacked:,} | — | {stacked * 1e6 / 1e9:,.1f} GB | {stacked / ours:.2f}× |")
    for note in notes: print(f"\nnote: {note}")
    print(f"\ngoal: ours ≤ {GOAL_BYTES:,.0f} B per transition: allocated {ours:,.0f}, RSS {rows['ours']['rss']:,.0f} -> "
          f"{'met' if max(ours, rows['ours']['rss']) <= GOAL_BYTES else 'NOT met'}")
    if 'SB3 optimised' in rows:
        ratio = rows['SB3 optimised']['allocated'] / ours
        print(f"goal: ≥ {GOAL_RATIO}× smaller than SB3 optimised: {ratio:.2f}× -> {'met' if ratio >= GOAL_RATIO else 'NOT met'}")


if __name__ == '__main__': main()
