#!/usr/bin/env python
"""Sampling stacked Atari transitions from our `FrameStorage` against gathering them from a plain array of stacks.

Run from the repository root:

    python benchmarks/atari_speed.py            # a full 1,000,000-transition FrameStorage (about 7.2 GB, a few minutes to fill)
    python benchmarks/atari_speed.py --quick    # smoke run: 20,000 transitions

The storage is filled through its real `write` path with a stream shaped like a training run's:
`--nenvs` sub-envs stepped in lockstep, each observation a stack of four 84×84 uint8 frames,
episodes ending at random (mean length `--episode`). Its frames are random bytes (the content
does not change the cost). Then, in `--repeats` rounds, the same 32 distinct sampleable
transitions are

- (a) **ours**: mapped to slots with `valid_slots` and gathered with `FrameStorage.gather`, which
  follows each row's frame chain and rebuilds `state` and `next_state` (a `SimpleStep` batch);
- (b) **plain**: gathered (`np.take`) from two plain arrays of stacked `state` and `next_state`,
  what a storage that keeps both stacks does. A million such rows would take 56 GB, so these
  arrays hold `--plain-capacity` rows (default 50,000, 2.8 GB) and the indices are taken modulo
  that; both stores are far larger than the CPU caches, so both gathers read from memory.

The two run back to back in each round (alternating which goes first); the ratio is taken
within each round and reported as the median over rounds. The goal: (a) at most 1.5× (b).
The cost of a whole training step on Pong (env steps per second against a hand-written loop)
is not measured here: that needs the learner's Atari support.
"""
from __future__ import annotations
import argparse, gc, statistics, time

import numpy as np

from fastrl_per.core import STEP_FIELDS
from fastrl_per.frames import FrameStorage

STACK, SIDE, BS, GOAL = 4, 84, 32, 1.5


def fill(storage: FrameStorage, n: int, nenvs: int, episode: int, seed: int = 0):
    "Write `n` transitions of `nenvs` lockstep sub-envs with frame-stacked random observations."
    rng = np.random.default_rng(seed)
    frames = lambda k: rng.integers(0, 256, (k, SIDE, SIDE), dtype=np.uint8)
    obs = np.repeat(frames(nenvs)[:, None], STACK, axis=1)  # each sub-env starts padded with its first frame
    env_id, step_n, episode_n = np.arange(nenvs), np.zeros(nenvs, np.int64), np.zeros(nenvs, np.int64)
    for _ in range(n // nenvs):
        nxt = np.concatenate([obs[:, 1:], frames(nenvs)[:, None]], axis=1)
        ended = rng.random(nenvs) < 1 / episode
        step_n += 1
        storage.write(dict(state=obs, next_state=nxt, action=rng.integers(6, size=nenvs), terminated=ended,
                           truncated=np.zeros(nenvs, bool), reward=np.zeros(nenvs, np.float32), total_reward=np.zeros(nenvs, np.float32),
                           env_id=env_id, step_n=step_n.copy(), episode_n=episode_n.copy(),
                           n_steps=np.ones(nenvs, np.int32)))
        obs = nxt
        if ended.any():
            obs[ended] = np.repeat(frames(int(ended.sum()))[:, None], STACK, axis=1)
            step_n[ended], episode_n[ended] = 0, episode_n[ended] + 1


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--capacity', type=int, default=1_000_000, help='transitions in our (full) FrameStorage')
    p.add_argument('--plain-capacity', type=int, default=50_000, help='rows of the plain arrays of stacks')
    p.add_argument('--nenvs', type=int, default=4)
    p.add_argument('--episode', type=int, default=1000, help='mean episode length, in agent steps')
    p.add_argument('--repeats', type=int, default=500)
    p.add_argument('--quick', action='store_true', help='20,000 transitions, 10,000 plain rows, 200 rounds')
    a = p.parse_args(argv)
    if a.quick: a.capacity, a.plain_capacity, a.repeats = 20_000, 10_000, 200
    storage = FrameStorage(a.capacity)
    t = time.perf_counter()
    fill(storage, a.capacity, a.nenvs, a.episode)
    filled = time.perf_counter() - t
    rng = np.random.default_rng(1)
    plain_state = rng.integers(0, 256, (a.plain_capacity, STACK, SIDE, SIDE), dtype=np.uint8)
    plain_next = rng.integers(0, 256, (a.plain_capacity, STACK, SIDE, SIDE), dtype=np.uint8)
    ours = lambda pos: storage.gather(storage.valid_slots(pos))
    plain = lambda pos: (np.take(plain_state, pos % a.plain_capacity, 0), np.take(plain_next, pos % a.plain_capacity, 0))
    times, ratios = {'ours': [], 'plain': []}, []
    gc.disable()
    for r in range(a.repeats):
        pos = rng.choice(storage.n_valid, BS, replace=False)
        took = {}
        for name, f in (('ours', ours), ('plain', plain)) if r % 2 else (('plain', plain), ('ours', ours)):
            t = time.perf_counter(); f(pos); took[name] = time.perf_counter() - t
        for name in took: times[name].append(took[name])
        ratios.append(took['ours'] / took['plain'])
    gc.enable()
    batch = ours(pos)
    assert batch.state.shape == (BS, STACK, SIDE, SIDE) and batch.next_state.shape == batch.state.shape
    assert all(len(getattr(batch, n)) == BS for n in STEP_FIELDS)
    med = lambda xs: statistics.median(xs) * 1e6
    print(f"FrameStorage of {storage.sz:,} transitions ({storage.n_valid:,} sampleable, {storage.nbytes() / 1e9:.1f} GB), "
          f"filled in {filled:.0f} s ({filled / a.capacity * 1e6:.0f} µs a transition); {a.nenvs} sub-envs, mean episode {a.episode}; "
          f"plain arrays of {a.plain_capacity:,} rows; {a.repeats} rounds\n")
    print(f"| batch of {BS} stacked transitions (state + next_state) | median µs | ratio to plain (median [10%, 90%]) |")
    print('|---|---:|---:|')
    q = statistics.quantiles(ratios, n=10)
    print(f"| ours: valid_slots + FrameStorage.gather (SimpleStep, all fields) | {med(times['ours']):,.0f} | {statistics.median(ratios):.2f}× [{q[0]:.2f}, {q[-1]:.2f}] |")
    print(f"| plain: np.take from arrays of stacks (state and next_state only) | {med(times['plain']):,.0f} | 1.00× |")
    print(f"\ngoal: ours ≤ {GOAL}× plain: {statistics.median(ratios):.2f}× -> {'met' if statistics.median(ratios) <= GOAL else 'NOT met'}")


if __name__ == '__main__': main()
