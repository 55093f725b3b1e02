"""The two normalisations of the importance weights, measured with the command: `fastrl_per train` at its
CartPole-v1 defaults for each seed and `--weight-norm`, then `fastrl_per evaluate` on its best network. Per run:
env steps until the mean return of 20 training episodes reached 475 (the command stops there), evaluate's greedy
mean of 10, and the mean importance weight over training (the mean of the run's TensorBoard `replay/mean_weight`
points, one per 100 env steps, each the mean over the updates since the last). Runs go one at a time, each on one
torch thread.

    python benchmarks/weight_norm.py --seeds 10 --out runs/weight_norm
    python benchmarks/weight_norm.py --seeds 10 --norms batch --set eps=0.01   # more flags for `fastrl_per train`
"""
import argparse, os, re, subprocess, sys
from pathlib import Path
import numpy as np

def run(cmd:list, env:dict) -> str:
    "The output of `cmd`, run niced; exits with its message if it fails."
    out = subprocess.run(['nice', '-n', '5', *cmd], env=env, capture_output=True, text=True)
    if out.returncode: sys.exit(f"{' '.join(cmd)} failed: {out.stderr.strip()[-500:]}")
    return out.stdout

def mean_weight(run_dir:Path) -> float:
    "The mean of the run's TensorBoard `replay/mean_weight` points."
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = EventAccumulator(str(run_dir / 'tb'), size_guidance={'scalars': 0}).Reload()
    return float(np.mean([e.value for e in events.Scalars('replay/mean_weight')]))

def solved_at(run_dir:Path, threshold:float=475.) -> int|None:
    "The env step at which the mean return of 20 consecutive training episodes first reached `threshold`."
    import csv
    with open(run_dir / 'metrics.csv') as f:
        ended = [(int(r['frame']), float(r['episode_return'])) for r in csv.DictReader(f) if r['episode_return']]
    returns = np.array([r for _, r in ended])
    means = np.convolve(returns, np.ones(20) / 20, 'valid')
    hit = np.flatnonzero(means >= threshold)
    return ended[hit[0] + 19][0] if len(hit) else None

def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--seeds', type=int, default=10); p.add_argument('--first-seed', type=int, default=0)
    p.add_argument('--norms', nargs='+', default=['buffer', 'batch'])
    p.add_argument('--env', default='CartPole-v1'); p.add_argument('--out', default='runs/weight_norm')
    p.add_argument('--set', nargs='*', default=[], help='more train flags as name=value (e.g. eps=0.01)')
    a = p.parse_args()
    env = dict(os.environ, OMP_NUM_THREADS='1')
    bin_dir = Path(sys.executable).parent
    extra = [x for kv in a.set for x in (f"--{kv.split('=')[0].replace('_', '-')}", kv.split('=', 1)[1])]
    print('| weight_norm | seed | steps to mean-20 ≥ 475 | evaluate (greedy mean of 10, best.pt) | mean weight |')
    print('|---|--:|--:|--:|--:|', flush=True)
    for seed in range(a.first_seed, a.first_seed + a.seeds):   # seed-major: a cut-short table stays paired
        for norm in a.norms:
            d = Path(a.out) / f"{norm}-{seed}"
            if not (d / 'best.pt').is_file():   # a run already made is evaluated, not made again
                run([str(bin_dir / 'fastrl_per'), 'train', '--env', a.env, '--seed', str(seed), '--weight-norm', norm,
                     '--out', str(d), '--no-progress', *extra], env)
            score = re.search(r'mean return over \d+ greedy episodes: (-?[\d.]+)',
                              run([str(bin_dir / 'fastrl_per'), 'evaluate', str(d)], env)).group(1)
            steps = solved_at(d)
            print(f"| {norm} | {seed} | {'—' if steps is None else f'{steps:,}'} | {score} | {mean_weight(d):.3f} |",
                  flush=True)

if __name__ == '__main__': main()
