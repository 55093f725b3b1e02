"""Does prioritizing pay? Uniform, proportional, rank-based and LAP replay at `fastrl_per train`'s defaults
(nothing tuned for one kind) on a list of envs and seeds.

Each run is the command's own `train` with `solved=0`, so every run goes its whole budget: the final greedy return
(the command's evaluation at the last step: 10 episodes on its evaluation seeds), the area under its greedy learning
curve (the mean return over the run's evaluations, every 2,500 env steps and at the end: 1 is a curve at the
threshold throughout) and its CPU per env step (the worker's process time, evaluations and checkpoints included).
Rows are appended to a CSV as runs finish; a run already there is not run again, so seeds and envs can be added on
later days. The summary per env and over all of them (scores normalised: a random policy 0, the env's threshold 1)
gives the interquartile mean (IQM) with 95 % stratified bootstrap intervals and the probability that a kind beats
uniform replay, as rliable defines them (Agarwal et al., NeurIPS 2021), written here in numpy: rliable 1.2 needs
arch, whose releases for rliable (< 8) do not import with the pandas 3 in the venv. A figure shows each env's
learning curves (mean over seeds, shaded: the interquartile range).

    python benchmarks/when_per_pays.py --envs CartPole-v1 Acrobot-v1 --seeds 3 --jobs 2
    python benchmarks/when_per_pays.py --summarise   # the tables and the figure from the CSV alone
"""
import argparse, csv, sys, tempfile, time
from multiprocessing import Pool
from pathlib import Path
import gymnasium as gym
import numpy as np
import torch

KINDS = ('uniform', 'proportional', 'rank', 'lap')
COLUMNS = ('env', 'kind', 'seed', 'steps', 'final', 'auc', 'cpu_s_per_1k', 'curve')
RANDOM_EPISODES = 100


def run(job) -> dict:
    "One run of `train` at the defaults but `solved=0`: its row (the curve as `frame:return` pairs)."
    from fastrl_per.run.rundir import read_metrics
    from fastrl_per.run.train import train
    env, kind, seed, steps = job
    replay = dict(replay='uniform') if kind == 'uniform' else dict(replay='per', prioritization=kind)
    with tempfile.TemporaryDirectory() as d:
        start = time.process_time()
        train(out=f"{d}/run", env_id=env, seed=seed, solved=0, progress=False,
              **replay, **({} if steps is None else dict(total_steps=steps)))
        cpu = time.process_time() - start
        m = read_metrics(f"{d}/run")
    evaluated = ~np.isnan(m['eval_return'])
    frames, returns = m['frame'][evaluated].astype(int), m['eval_return'][evaluated]
    done = int(m['frame'][-1])
    return dict(env=env, kind=kind, seed=seed, steps=done, final=round(float(returns[-1]), 2),
                auc=round(float(returns.mean()), 2), cpu_s_per_1k=round(1000 * cpu / done, 3),
                curve=' '.join(f"{f}:{r:.2f}" for f, r in zip(frames, returns)))


def read_rows(path:Path) -> list[dict]:
    "The CSV's rows, numbers as numbers."
    if not path.exists(): return []
    with open(path, newline='') as f: rows = list(csv.DictReader(f))
    for r in rows:
        r.update(seed=int(r['seed']), steps=int(r['steps']), final=float(r['final']), auc=float(r['auc']),
                 cpu_s_per_1k=float(r['cpu_s_per_1k']))
    return rows


def random_return(env:str) -> float:
    "The mean return of uniformly random actions over `RANDOM_EPISODES` seeded episodes: a score of 0."
    e, rng, total = gym.make(env), np.random.default_rng(0), 0.
    for i in range(RANDOM_EPISODES):
        e.reset(seed=i)
        e.action_space.seed(int(rng.integers(2**31)))
        done = False
        while not done:
            _, r, term, trunc, _ = e.step(e.action_space.sample())
            total, done = total + r, term or trunc
    return total / RANDOM_EPISODES


def iqm(x) -> float:
    "The mean of the middle half of `x` (a quarter cut from each end, as scipy's `trim_mean(x, 0.25)`)."
    x = np.sort(np.ravel(x))
    cut = int(0.25 * len(x))
    return float(x[cut:len(x) - cut].mean())


def improvement(x, y) -> float:
    "P(X > Y) for a run of `x` against one of `y` (ties count a half), averaged over tasks: lists of arrays."
    return float(np.mean([((a[:, None] > b[None]) + 0.5 * (a[:, None] == b[None])).mean() for a, b in zip(x, y)]))


def bootstrap(stat, tasks, reps:int=2000, seed:int=0) -> tuple:
    ("`stat` of `tasks` (per task, a tuple of arrays of runs) with its 95 % stratified bootstrap interval: each "
     "replicate draws every array's runs again with replacement, task by task.")
    rng = np.random.default_rng(seed)
    draws = [stat([[a[rng.integers(len(a), size=len(a))] for a in t] for t in tasks]) for _ in range(reps)]
    return stat(tasks), *np.percentile(draws, [2.5, 97.5])


def summary(rows:list[dict], kinds, envs) -> list[str]:
    ("The markdown tables: per env, then all envs normalised; the runs whose final return reaches the env's "
     "threshold, IQM [95 % CI] of final return and AUC, P(> uniform), the median CPU (and its ratio to uniform's).")
    lows = {e: random_return(e) for e in envs}
    highs = {e: gym.spec(e).reward_threshold for e in envs}
    def scores(kind, env, key, norm):
        x = np.array([r[key] for r in rows if r['kind'] == kind and r['env'] == env])
        return (x - lows[env]) / (highs[env] - lows[env]) if norm else x
    fmt = lambda v, lo, hi, d: f"{v:.{d}f} [{lo:.{d}f}, {hi:.{d}f}]"
    lines = []
    for group, norm in [*[([e], False) for e in envs], (envs, True)]:
        name = group[0] if not norm else f"the {len(envs)} envs pooled, normalised (random 0, threshold 1)"
        d = 2 if norm else 1
        lines += ['', f"**{name}**", '',
                  "| replay | runs | final ≥ threshold | IQM final greedy return | IQM AUC | P(final > uniform's) "
                  "| P(AUC > uniform's) | CPU s / 1k env steps |", "|---|--:|--:|--:|--:|--:|--:|--:|"]
        for kind in kinds:
            runs = [r for r in rows if r['kind'] == kind and r['env'] in group]
            if not runs: continue
            cells = [fmt(*bootstrap(lambda t: iqm(np.concatenate([a for a, in t])),
                                    [(scores(kind, e, key, norm),) for e in group]), d) for key in ('final', 'auc')]
            for key in ('final', 'auc'):
                pairs = [(scores(kind, e, key, norm), scores('uniform', e, key, norm)) for e in group]
                ok = kind != 'uniform' and all(len(a) and len(b) for a, b in pairs)
                cells.append(fmt(*bootstrap(lambda t: improvement(*zip(*t)), pairs), 2) if ok else '')
            cpu = np.median([r['cpu_s_per_1k'] for r in runs])
            base = [r['cpu_s_per_1k'] for r in rows if r['kind'] == 'uniform' and r['env'] in group]
            ratio = f" ({cpu / np.median(base):.2f}×)" if base and kind != 'uniform' else ''
            solved = sum(r['final'] >= highs[r['env']] for r in runs)
            lines.append(f"| {kind} | {len(runs)} | {solved} | {' | '.join(cells)} | {cpu:.2f}{ratio} |")
    return lines


def figure(rows:list[dict], kinds, envs, path:Path):
    "Each env's greedy learning curves: the mean over seeds per kind, the interquartile range shaded."
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(envs), figsize=(5 * len(envs), 3.6), squeeze=False)
    for ax, env in zip(axes[0], envs):
        for kind in kinds:
            curves = [np.array([p.split(':') for p in r['curve'].split()], float)
                      for r in rows if r['env'] == env and r['kind'] == kind]
            if not curves: continue
            n = min(len(c) for c in curves)   # evaluations are matched by their order: a run's k-th evaluation may
            frames = np.median([c[:n, 0] for c in curves], 0)   # fall an env step or two after another's
            y = np.array([c[:n, 1] for c in curves])
            ax.plot(frames, y.mean(0), label=f"{kind} ({len(curves)})")
            ax.fill_between(frames, *np.percentile(y, [25, 75], axis=0), alpha=0.2)
        ax.axhline(gym.spec(env).reward_threshold, color='grey', lw=0.8, ls='--')
        ax.set(title=env, xlabel='env steps', ylabel='greedy return (10 episodes)')
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--envs', nargs='+', default=['CartPole-v1', 'Acrobot-v1'])
    p.add_argument('--kinds', nargs='+', default=list(KINDS), choices=KINDS)
    p.add_argument('--seeds', type=int, default=10, help='seeds first-seed, first-seed + 1, ...')
    p.add_argument('--first-seed', type=int, default=0)
    p.add_argument('--steps', type=int, default=None, help="env steps per run (default: the command's)")
    p.add_argument('--jobs', type=int, default=2, help='runs in parallel (one torch thread each)')
    p.add_argument('--csv', type=Path, default=Path('runs/when_per_pays.csv'), help='rows are appended here')
    p.add_argument('--figure', type=Path, default=Path('runs/when_per_pays.png'))
    p.add_argument('--summarise', action='store_true', help='run nothing: the tables and figure of the CSV')
    args = p.parse_args()
    print(f"command: python {' '.join(sys.argv)}", flush=True)
    torch.set_num_threads(1)
    rows = read_rows(args.csv)
    have = {(r['env'], r['kind'], r['seed']) for r in rows}
    jobs = [(e, k, s, args.steps) for s in range(args.first_seed, args.first_seed + args.seeds)
            for e in args.envs for k in args.kinds if (e, k, s) not in have]
    if jobs and not args.summarise:
        args.csv.parent.mkdir(parents=True, exist_ok=True)
        new = not args.csv.exists()
        with open(args.csv, 'a', newline='') as f, Pool(args.jobs) as pool:
            out = csv.DictWriter(f, COLUMNS)
            if new: out.writeheader()
            for r in pool.imap_unordered(run, jobs):   # each row as its run ends: a stopped benchmark keeps them
                out.writerow(r)
                f.flush()
                print(f"done: {r['env']} {r['kind']} seed {r['seed']}: final {r['final']}, auc {r['auc']}, "
                      f"{r['cpu_s_per_1k']} CPU s / 1k", flush=True)
        rows = read_rows(args.csv)
    envs = [e for e in args.envs if any(r['env'] == e for r in rows)]
    print('\n'.join(summary(rows, args.kinds, envs)))
    figure(rows, args.kinds, envs, args.figure)
    print(f"\nfigure: {args.figure}")


if __name__ == '__main__': main()
