"""Prioritized vs uniform replay on CartPole-v1: frames until the mean return of 20
consecutive episodes first reaches 475, then a greedy evaluation over 10 fresh episodes.

Each run trains until it reaches 475 (or the frame budget runs out) and is evaluated
greedily at that point. Results vary a lot by seed on CartPole, so every seed is printed
with the medians.

    python benchmarks/learning.py --seeds 10 --jobs 2
"""
import argparse, sys, time
from multiprocessing import Pool
import numpy as np
import torch
from fastrl_per.learner import Learner
from fastrl_per.train import greedy_returns

SOLVED = 475

def run(args):
    replay, seed, budget, kwargs = args
    torch.set_num_threads(1)
    learner = Learner('CartPole-v1', replay=replay, seed=seed, total_steps=budget, **kwargs)
    start, solved_at, n_seen = time.process_time(), None, 0
    for row in learner.iterate(budget):
        returns = learner.episodes.returns
        if len(returns) != n_seen and len(returns) >= 20:
            n_seen = len(returns)
            if np.mean([r for _, r in returns[-20:]]) >= SOLVED:
                solved_at = row['frame']
                break
    cpu = time.process_time() - start
    greedy = float(np.mean(greedy_returns(learner.agent, 'CartPole-v1', episodes=10, seed=100_000 + seed)))
    return dict(replay=replay, seed=seed, solved_at=solved_at, greedy=greedy, frames=learner.episodes.frames,
                cpu_per_1k=1000 * cpu / learner.episodes.frames)

def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--seeds', type=int, default=10, help='seeds per replay kind (0..seeds-1)')
    p.add_argument('--budget', type=int, default=30_000, help='frame budget per run')
    p.add_argument('--jobs', type=int, default=2, help='runs in parallel (one CPU thread each)')
    p.add_argument('--replay', nargs='+', default=['per', 'uniform'])
    args = p.parse_args()
    print(f"command: python {' '.join(sys.argv)}\n")
    jobs = [(r, s, args.budget, {}) for s in range(args.seeds) for r in args.replay]
    results = []
    with Pool(args.jobs) as pool:
        for r in pool.imap_unordered(run, jobs):  # each run as it finishes, so a stopped run still reports
            results.append(r)
            print(f"done: {r}", flush=True)
    print(f"| replay | seed | frames to mean-20 ≥ {SOLVED} | greedy mean of 10 | CPU s / 1k frames |")
    print("|---|---|---|---|---|")
    for r in sorted(results, key=lambda r: (r['replay'], r['seed'])):
        solved = r['solved_at'] if r['solved_at'] is not None else f"not in {args.budget:,}"
        print(f"| {r['replay']} | {r['seed']} | {solved} | {r['greedy']:.1f} | {r['cpu_per_1k']:.2f} |")
    print(f"\n| replay | solved (of {args.seeds}) | median frames (unsolved count as {args.budget:,}) | solved with greedy 500 |")
    print("|---|---|---|---|")
    for replay in args.replay:
        rs = [r for r in results if r['replay'] == replay]
        frames = [r['solved_at'] if r['solved_at'] is not None else args.budget for r in rs]
        solved = [r for r in rs if r['solved_at'] is not None]
        print(f"| {replay} | {len(solved)} | {int(np.median(frames)):,} | {sum(r['greedy'] >= 500 for r in solved)} |")

if __name__ == '__main__': main()
