#!/usr/bin/env python
"""What a learner step costs with rank-based prioritization beside proportional, in `fastrl_per`'s own buffer.

Run from the repository root:

    python benchmarks/rank_speed.py            # N = 2**17 and 2**20 CartPole-sized transitions
    python benchmarks/rank_speed.py --quick    # N = 2**14 only

For each N and batch size, a full `PrioritizedReplayBuffer` of each kind (`prioritization='proportional'`,
alpha 0.6, or `'rank'`, alpha 0.7), its priorities first set to random |TD errors|, times one learner step of a
pipeline: add one transition, sample a batch (with weights), update the batch's priorities with new random errors.
Times are this process's CPU time (`time.process_time`; the machine is shared), the median of `--repeats` rounds;
in each round the two kinds run back to back, the order alternating, and the ratio is taken within the round.

The rank kind also sorts its heap array after every N priority writes (`RankHeap.sort`); a timed round of a few
thousand steps may not hold one, so the sort is timed on its own and its share per step, sort time × (bs + 1) / N,
is added to the rank row ("+ sort").
"""
from __future__ import annotations
import argparse, gc, statistics, time

import numpy as np

from fastrl_per.core import SimpleStep
from fastrl_per.replay.per import PrioritizedReplayBuffer

KINDS = ('proportional', 'rank')


def cartpole_steps(n:int, rng) -> SimpleStep:
    "A batch of `n` CartPole-shaped transitions (every field of a `SimpleStep`)."
    z = np.zeros(n, np.int64)
    return SimpleStep(state=rng.standard_normal((n, 4), np.float32), action=rng.integers(0, 2, n),
                      next_state=rng.standard_normal((n, 4), np.float32), terminated=z.astype(bool), truncated=z.astype(bool),
                      reward=np.ones(n, np.float32), total_reward=np.ones(n, np.float32), env_id=z, step_n=z, episode_n=z,
                      n_steps=np.ones(n, np.int32))


def full_buffer(kind:str, n:int, bs:int, seed:int=0) -> PrioritizedReplayBuffer:
    "A buffer of `kind` holding `n` transitions with random priorities."
    rng = np.random.default_rng(seed)
    buf = PrioritizedReplayBuffer(max_sz=n, bs=bs, seed=seed, prioritization=kind)
    for start in range(0, n, 2 ** 16): buf.add(cartpole_steps(min(2 ** 16, n - start), rng))
    buf.update_priorities(np.arange(n), rng.exponential(size=n))
    return buf


def per_step(buf, rng, steps:int) -> float:
    "CPU seconds per learner step (add 1, sample, update), garbage collector off."
    one, td = cartpole_steps(1, rng)[0], rng.exponential(size=(steps, buf.bs))
    gc.disable()
    try:
        t0 = time.process_time()
        for i in range(steps):
            buf.add(one)
            batch = buf.sample()
            buf.update_priorities(batch.idxs, td[i])
        return (time.process_time() - t0) / steps
    finally: gc.enable()


def sort_time(buf) -> float:
    "CPU seconds of one full sort of the rank heap's array."
    heap = buf.prioritizer.kind
    t0 = time.process_time(); heap.sort()
    return time.process_time() - t0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument('--quick', action='store_true', help='N = 2**14 only, fewer steps')
    parser.add_argument('--repeats', type=int, default=5, help='timed rounds per row')
    args = parser.parse_args()
    sizes, steps = ([2 ** 14], 300) if args.quick else ([2 ** 17, 2 ** 20], 2000)
    rng = np.random.default_rng(1)
    print(f"{'N':>9} {'bs':>4} {'proportional us':>16} {'rank us':>9} {'rank + sort us':>15} {'rank / proportional':>28}")
    for n in sizes:
        for bs in (32, 256):
            bufs = {k: full_buffer(k, n, bs) for k in KINDS}
            for buf in bufs.values(): per_step(buf, rng, 20)      # warm-up: numba kernels, caches
            times, ratios = {k: [] for k in KINDS}, []
            for r in range(args.repeats):
                order = KINDS if r % 2 == 0 else KINDS[::-1]
                t = {k: per_step(bufs[k], rng, steps) for k in order}
                for k in KINDS: times[k].append(t[k])
                ratios.append(t['rank'] / t['proportional'])
            sort = statistics.median(sort_time(bufs['rank']) for _ in range(3)) * (bs + 1) / n
            p, rk = (statistics.median(times[k]) * 1e6 for k in KINDS)
            ratio = statistics.median(ratios)
            print(f"{n:>9,} {bs:>4} {p:>16.1f} {rk:>9.1f} {rk + sort * 1e6:>15.1f} "
                  f"{ratio:>7.2f}x [{min(ratios):.2f}x-{max(ratios):.2f}x]")


if __name__ == '__main__':
    main()
