"""`examples/cleanrl_dqn_per.py` (CleanRL's DQN with fastrl_per's buffers) over seeds and replay settings: per seed
the mean return of the last 20 episodes, SPS and the mean importance weight over training, then the mean over seeds
of each setting. Runs go one at a time, niced, on one torch thread; CleanRL's defaults but `--steps` env steps and
`learning_starts` scaled with them (10,000 of 500,000: 600 of 30,000).

    python benchmarks/cleanrl_per.py --seeds 1 2 3 4 5 --steps 30000 --out runs/cleanrl
"""
import argparse, json, os, subprocess, sys
from pathlib import Path
import numpy as np

SETTINGS = {   # name: the example's flags
    'per, buffer, eps 1e-6': ['--replay', 'per', '--weight-norm', 'buffer', '--eps', '1e-6'],
    'per, batch, eps 1e-6': ['--replay', 'per', '--weight-norm', 'batch', '--eps', '1e-6'],
    'per, buffer, eps 1e-2': ['--replay', 'per', '--weight-norm', 'buffer', '--eps', '1e-2'],
    'per, batch, eps 1e-2': ['--replay', 'per', '--weight-norm', 'batch', '--eps', '1e-2'],
    'uniform': ['--replay', 'uniform'],
    'sb3': ['--replay', 'sb3'],
}
EXAMPLE = Path(__file__).resolve().parent.parent / 'examples' / 'cleanrl_dqn_per.py'

def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--seeds', type=int, nargs='+', default=[1, 2, 3, 4, 5])
    p.add_argument('--steps', type=int, default=30_000); p.add_argument('--env', default='CartPole-v1')
    p.add_argument('--settings', nargs='+', default=list(SETTINGS), choices=list(SETTINGS), metavar='SETTING')
    p.add_argument('--out', default='runs/cleanrl')
    a = p.parse_args()
    env, starts = dict(os.environ, OMP_NUM_THREADS='1'), round(10_000 * a.steps / 500_000)
    print(f"{a.env}, {a.steps:,} steps, learning_starts {starts:,}; per seed: last-20 return / SPS / mean weight")
    print('| setting | ' + ' | '.join(f'seed {s}' for s in a.seeds) + ' | mean last-20 | mean SPS | mean weight |')
    print('|---|' + '--:|' * (len(a.seeds) + 3))
    runs = {}   # seed-major: a run cut short still leaves every setting measured on the same seeds
    for seed in a.seeds:
        for name in a.settings:
            out = Path(a.out) / f"{name.replace(', ', '-').replace(' ', '')}-{seed}"
            if not (out / 'summary.json').is_file():   # a run already made is read, not made again
                cmd = ['nice', '-n', '5', sys.executable, str(EXAMPLE), '--seed', str(seed), '--env-id', a.env,
                       '--total-timesteps', str(a.steps), '--learning-starts', str(starts), '--out', str(out),
                       *SETTINGS[name]]
                done = subprocess.run(cmd, env=env, capture_output=True, text=True)
                if done.returncode: sys.exit(f"{' '.join(cmd)} failed: {done.stderr.strip()[-500:]}")
            runs.setdefault(name, []).append(json.loads((out / 'summary.json').read_text()))
    for name, done in runs.items():
        cells = [f"{r['last20_return']:.1f} / {r['sps']:.0f} / {r['mean_weight']:.3f}" for r in done]
        means = [np.mean([r[k] for r in done]) for k in ('last20_return', 'sps', 'mean_weight')]
        print(f"| {name} | " + ' | '.join(cells) + f" | {means[0]:.1f} | {means[1]:.0f} | {means[2]:.3f} |")

if __name__ == '__main__': main()
