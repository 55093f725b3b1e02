"""Prioritized vs uniform replay with the `fastrl_per train` defaults but its training-mean stop rule
(`--solved-by train-mean`; the command's default stops on greedy play): env steps until the mean
return of 20 consecutive training episodes first reaches the env's threshold (475 on
CartPole-v1, -100 on Acrobot-v1), and the greedy score of the network `fastrl_per evaluate` plays.

Each run does what `fastrl_per train --solved-by train-mean` does: it trains until the mean of 20
reaches the threshold (or the step budget runs out; `--full`: always the whole budget),
evaluates greedily every 2,500 steps and at the end (10 episodes on the command's evaluation
seeds; one that beats the kept network's mean is confirmed on 30 more) and keeps the best network, as the
command's `BestNetwork` chooses it; that network then plays 10 greedy episodes as
`fastrl_per evaluate` does (seeds 10,000 on). Results vary a lot by seed, so every seed is
printed, with what the network had become: the largest mean of 20 on the way, the last
one, and Q-values and action gaps on 1,024 stored states.

    python benchmarks/learning.py --seeds 10 --jobs 2
    python benchmarks/learning.py --env Acrobot-v1 --steps 50000 --full --replay per
"""
import argparse, ast, copy, inspect, sys, time
from multiprocessing import Pool
import gymnasium as gym
import numpy as np
import torch
from fastrl_per.learners.learner import Learner
from fastrl_per.run.train import BestNetwork, greedy_returns, train, evaluate

def default(func, name): return inspect.signature(func).parameters[name].default
EVAL_EVERY, EVAL_EPISODES, CONFIRM_EPISODES, EVAL_SEED = (default(train, k) for k in ('eval_every', 'eval_episodes', 'confirm_episodes', 'eval_seed'))   # `fastrl_per train`'s
FINAL_EPISODES, FINAL_SEED = default(evaluate, 'episodes'), default(evaluate, 'seed')                              # `fastrl_per evaluate`'s

def q_stats(learner) -> dict:
    "Mean of the largest Q-value and of the gap between the two best actions over 1,024 stored states."
    batch = learner.replay.sample(min(1024, len(learner.replay)))
    with torch.no_grad(): q = learner.model(batch.state.float().to(learner.dqn_update.device))
    q = q.sort(dim=1, descending=True).values
    return dict(q_max=float(q[:, 0].mean()), q_gap=float((q[:, 0] - q[:, 1]).mean()))

def run(args):
    env, replay, seed, steps, threshold, full, eval_episodes, kwargs = args
    torch.set_num_threads(1)
    learner = Learner(env, replay=replay, seed=seed, total_steps=steps, **kwargs)
    start, solved_at, peak, losses = time.process_time(), None, -np.inf, []
    choice, best_model, next_eval = BestNetwork(eval_episodes, CONFIRM_EPISODES, EVAL_SEED), None, EVAL_EVERY   # the command's choice of best.pt
    evaluated_at = None
    def evaluate(frame, recent):
        nonlocal best_model, next_eval, evaluated_at
        score, next_eval, evaluated_at = choice.evaluate(learner), (frame // EVAL_EVERY + 1) * EVAL_EVERY, frame
        if choice.keep(choice.confirm(learner, score)): best_model = copy.deepcopy(learner.model.state_dict())
        print(f"seed {seed} {replay}: step {frame:,}, mean-20 {recent:.1f}, greedy evaluation {score:.1f}", flush=True)
    recent = -np.inf
    for row in learner.iterate(steps):
        losses = losses[-999:] + [row['loss']]
        n = len(learner.episodes.returns)
        recent = learner.episodes.recent(20) if n >= 20 else -np.inf
        peak = max(peak, recent)
        if solved_at is None and recent >= threshold: solved_at = row['frame']
        last = row['frame'] >= steps or (solved_at is not None and not full)
        if row['frame'] >= next_eval or last: evaluate(row['frame'], recent)
        if last: break
    if evaluated_at != learner.episodes.env_steps: evaluate(learner.episodes.env_steps, recent)  # the budget ended between updates (n-step windows still open)
    cpu = time.process_time() - start
    final = dict(last=float(np.mean(greedy_returns(learner.agent, env, FINAL_EPISODES, FINAL_SEED))))
    learner.model.load_state_dict(best_model)
    greedy = float(np.mean(greedy_returns(learner.agent, env, FINAL_EPISODES, FINAL_SEED)))
    return dict(replay=replay, seed=seed, solved_at=solved_at, greedy=greedy, greedy_last=final['last'], frames=learner.episodes.env_steps,
                peak20=round(float(peak), 1), last20=round(float(learner.episodes.recent(20)), 1), loss=round(float(np.mean(losses)), 4),
                **{k: round(v, 3) for k, v in q_stats(learner).items()}, cpu_per_1k=1000 * cpu / learner.episodes.env_steps)

def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--env', default='CartPole-v1', help='a gymnasium env with discrete actions')
    p.add_argument('--seeds', type=int, default=10, help='seeds per replay kind (first-seed, first-seed + 1, ...)')
    p.add_argument('--first-seed', type=int, default=0, help='the first seed (e.g. 10 for held-out seeds 10..19)')
    p.add_argument('--steps', '--budget', type=int, default=30_000, help='env-step budget per run')
    p.add_argument('--solved', type=float, default=None, help="mean of 20 training returns that counts as solved; default: the env's threshold")
    p.add_argument('--full', action='store_true', help='train the whole budget instead of stopping once solved')
    p.add_argument('--jobs', type=int, default=2, help='runs in parallel (one CPU thread each)')
    p.add_argument('--replay', nargs='+', default=['per', 'uniform'])
    p.add_argument('--eval-episodes', type=int, default=EVAL_EPISODES, help=f"greedy episodes per evaluation during training (train's default: {EVAL_EPISODES})")
    p.add_argument('--stop-after', type=int, default=None, metavar='K', help='stop once K runs have not solved (a setting that clearly fails)')
    p.add_argument('--set', nargs='*', default=[], metavar='NAME=VALUE',
                   help="Learner arguments other than the defaults, e.g. --set n_step=3 dueling=True (values read as Python literals)")
    args = p.parse_args()
    print(f"command: python {' '.join(sys.argv)}\n")
    threshold = gym.spec(args.env).reward_threshold if args.solved is None else args.solved
    kwargs = {k: ast.literal_eval(v) for k, v in (kv.split('=', 1) for kv in args.set)}
    jobs = [(args.env, r, s, args.steps, threshold, args.full, args.eval_episodes, kwargs) for s in range(args.first_seed, args.first_seed + args.seeds) for r in args.replay]
    results = []
    with Pool(args.jobs) as pool:
        for r in pool.imap_unordered(run, jobs):  # each run as it finishes, so a stopped run still reports
            results.append(r)
            print(f"done: {r}", flush=True)
            if args.stop_after and sum(r['solved_at'] is None for r in results) >= args.stop_after:
                print(f"stopped: {args.stop_after} runs did not reach {threshold:g}", flush=True)
                pool.terminate()
                break
    print(f"\n{args.env}, {args.steps:,} env steps{'' if args.full else ' at most'}; " + (', '.join(args.set) or 'the defaults'))
    print(f"| replay | seed | steps to mean-20 ≥ {threshold:g} | best mean-20 | last mean-20 | greedy mean of 10 (best network) | greedy (last network) |")
    print("|---|---|--:|--:|--:|--:|--:|")
    for r in sorted(results, key=lambda r: (r['replay'], r['seed'])):
        solved = f"{r['solved_at']:,}" if r['solved_at'] is not None else f"not in {args.steps:,}"
        print(f"| {r['replay']} | {r['seed']} | {solved} | {r['peak20']:.1f} | {r['last20']:.1f} | {r['greedy']:.1f} | {r['greedy_last']:.1f} |")
    print(f"\n| replay | runs | reached {threshold:g} | median steps (unreached count as {args.steps:,}) | best network greedy ≥ {threshold:g} | CPU s / 1k steps |")
    print("|---|--:|--:|--:|--:|--:|")
    for replay in args.replay:
        rs = [r for r in results if r['replay'] == replay]
        if not rs: continue
        frames = [r['solved_at'] if r['solved_at'] is not None else args.steps for r in rs]
        print(f"| {replay} | {len(rs)} | {sum(r['solved_at'] is not None for r in rs)} | {int(np.median(frames)):,} | "
              f"{sum(r['greedy'] >= threshold for r in rs)} | {np.median([r['cpu_per_1k'] for r in rs]):.2f} |")

if __name__ == '__main__': main()
