#!/usr/bin/env python
"""Does the own-loop TD3 of `nbs/14_own_loop.ipynb` learn `Pendulum-v1`, with prioritized and with uniform replay?

Run from the repository root:

    python benchmarks/td3_own_loop.py                  # seeds 0 1 2, both buffers, 20,000 env steps (CPU minutes per run)
    python benchmarks/td3_own_loop.py --env-steps 3000 --seeds 0   # a smoke run

Each run is `fastrl_per.td3.td3` with its defaults, the same for both buffers (nothing is tuned
for either): every `--eval-every` env steps the greedy policy plays 10 episodes, and the table
gives the first env step at which their mean return reached the goal (-200), the best and the
last mean return. One torch thread per run; runs go one after the other.
"""
from __future__ import annotations
import argparse, time
import torch
from fastrl_per.td3 import td3

GOAL = -200.

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--seeds', type=int, nargs='+', default=[0, 1, 2])
    ap.add_argument('--env-steps', type=int, default=20_000)
    ap.add_argument('--eval-every', type=int, default=1_000)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    rows = []
    for seed in args.seeds:
        for prioritized in (True, False):
            t0 = time.process_time()
            curve = td3(env_steps=args.env_steps, prioritized=prioritized, seed=seed, eval_every=args.eval_every)
            reached = next((s for s, r in curve if r >= GOAL), None)
            rows.append((seed, 'prioritized' if prioritized else 'uniform', reached, max(r for _, r in curve), curve[-1][1],
                         time.process_time() - t0))
            print(f'# seed {seed} {rows[-1][1]}: ' + ' '.join(f'{s}:{r:.0f}' for s, r in curve), flush=True)
    print(f'\n## TD3 on Pendulum-v1, {args.env_steps:,} env steps, greedy mean return over 10 episodes (goal >= {GOAL:.0f})\n')
    print('| seed | replay | first env step at goal | best | last | CPU s |')
    print('|---|---|---|---|---|---|')
    for seed, kind, reached, best, last, cpu in rows:
        print(f"| {seed} | {kind} | {'—' if reached is None else f'{reached:,}'} | {best:.1f} | {last:.1f} | {cpu:.0f} |")
    for kind in ('prioritized', 'uniform'):
        ok = [r for r in rows if r[1] == kind and r[2] is not None]
        print(f'\n{kind}: reached the goal on {len(ok)} of {len(args.seeds)} seeds')

if __name__ == '__main__': main()
