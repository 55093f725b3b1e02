#!/usr/bin/env python
"""MinAtar learning table: prioritized (proportional) against uniform replay with `fastrl_per train`'s defaults for
MinAtar ids, on Breakout and SpaceInvaders, 3 seeds each, beside the published DQN and DQN + prioritized replay values.

Run from the repository root (the minatar and cli extras installed):

    .venv/bin/python benchmarks/minatar_learning.py --out runs/minatar --jobs 2    # the 12 runs, then the table
    .venv/bin/python benchmarks/minatar_learning.py --out runs/minatar --report    # the table of the runs made so far

**The runs** are the command a user types, nothing else: `fastrl_per train --env MinAtar/<Game>-v1 --replay <per |
uniform> --seed <s> --out <out>/<Game>-<replay>-<s> --no-progress`, every other flag at its default (the MinAtar ids'
defaults: Revisiting Rainbow's DQN settings, 1,000,000 env steps, an update every 4; see nbs/02c_atari). A run whose
checkpoint already reached its budget is not run again; `--jobs` runs go side by side.

**The table**, per game, replay and seed, from each run's own files:
- *last 100* at 250k / 500k / 1M: the mean return of the last 100 training episodes that ended by that env step
  (the checkpoint's episode record; training episodes explore at the run's epsilon, 0.01 after 250k steps);
- *mean 0-1M*: the mean return of every training episode that ended in the first 1,000,000 steps, the statistic of
  Revisiting Rainbow's first iteration;
- *best.pt at* 250k / 500k / 1M: the greedy score (10 episodes on the run's evaluation seeds, `--eval-every` 2,500)
  of the best network up to that step, which is what best.pt held then;
- *evaluate*: `fastrl_per evaluate <run>`, 10 greedy episodes of the final best.pt on the command's own seeds.

**Published values** (`PUBLISHED`) are read off figures (no paper gives a table of these); each row names its source
and how it was read. They come from settings that differ from ours (see the notes in `PUBLISHED`).

**Figures**: `<figures>/minatar_<Game>.png`, the mean of the last 100 training episodes against env steps, one line
per run, the per-replay mean over seeds bold, and the MinAtar paper's DQN readings as markers.
"""
from __future__ import annotations
import argparse, re, shlex, subprocess, sys, warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

GAMES, REPLAYS, SEEDS, STEPS = ('Breakout', 'SpaceInvaders'), ('per', 'uniform'), (0, 1, 2), 1_000_000
MARKS = (250_000, 500_000, 1_000_000)

# Published values (approximate readings of figures; MinAtar steps are frames: no frame skip).
#  Y&T: Young & Tian 2019, the MinAtar repository's README figure `img/learning_curves.gif` (kenjyoung/MinAtar,
#       commit 87c2bc8): DQN with uniform replay, an update every step, centred RMSProp, all 6 actions; moving average
#       of the last 100 training episodes, mean of 30 runs; read by pixel, about ±0.3 (Breakout), ±1-2 (SpaceInvaders).
#  RR:  Obando-Ceron & Castro 2021 (Revisiting Rainbow), the authors' figure `revisitingMinatar.png` (psc-g.github.io,
#       commit b8074b4): Dopamine DQN and DQN + prioritized replay (priorities sqrt(loss), fixed exponents 0.5), an
#       update every 4 steps, Adam, no hidden layer; the mean return of the training episodes of the first 1M steps
#       (their iteration 0); read by pixel, about ±0.1 (Breakout), ±0.5 (SpaceInvaders).
PUBLISHED = {
    ('Breakout', 'Y&T DQN, last 100 at 250k / 500k / 1M'): (6.7, 8.3, 9.2),
    ('SpaceInvaders', 'Y&T DQN, last 100 at 250k / 500k / 1M'): (21.0, 28.0, 32.5),
    ('Breakout', 'RR DQN, mean 0-1M'): (2.9,),
    ('Breakout', 'RR DQN + prioritized, mean 0-1M'): (3.0,),
    ('SpaceInvaders', 'RR DQN, mean 0-1M'): (15.8,),
    ('SpaceInvaders', 'RR DQN + prioritized, mean 0-1M'): (15.8,),
}


def run_dir(out: Path, game: str, replay: str, seed: int) -> Path: return out / f'{game}-{replay}-{seed}'


def command(exe: str, *args) -> list[str]: return [exe, *map(str, args)]


def checkpoint(path: Path) -> dict | None:
    "The run's checkpoint (its episode record and counters), or None before its first."
    try: return torch.load(path / 'checkpoint.pt', weights_only=True, map_location='cpu')
    except FileNotFoundError: return None


def finished(path: Path) -> bool:
    state = checkpoint(path)
    return state is not None and state['env_steps'] >= state['config']['total_steps']


def train(exe: str, out: Path, game: str, replay: str, seed: int) -> str:
    path = run_dir(out, game, replay, seed)
    if finished(path): return f'{path}: done before'
    cmd = command(exe, 'train', '--env', f'MinAtar/{game}-v1', '--replay', replay, '--seed', seed, '--out', path,
                  '--no-progress')
    if path.exists(): cmd = command(exe, 'train', '--resume', path, '--no-progress')   # a run stopped part way
    done = subprocess.run(cmd, capture_output=True, text=True)
    return f"{shlex.join(cmd)}: exit {done.returncode}\n{done.stdout}{done.stderr}"


def evaluate(exe: str, path: Path) -> float:
    "`fastrl_per evaluate`'s mean over its 10 greedy episodes of best.pt."
    shown = subprocess.run(command(exe, 'evaluate', path), capture_output=True, text=True, check=True).stdout
    return float(re.search(r'mean return over \d+ greedy episodes?: (-?[\d.]+)', shown)[1])


def last_100(returns: list, step: int) -> float:
    ended = [r for at, r in returns if at <= step][-100:]
    return float(np.mean(ended)) if ended else float('nan')


def best_so_far(path: Path, step: int) -> float:
    "The best greedy evaluation up to `step` (what best.pt held then), from metrics.csv's eval_return column."
    frame, score = np.loadtxt(path / 'metrics.csv', delimiter=',', skiprows=1, usecols=(0, 6), ndmin=2,
                              converters={6: lambda s: float(s or 'nan')}).T
    seen = score[(frame <= step) & ~np.isnan(score)]
    return float(seen.max()) if len(seen) else float('nan')


def measure(exe: str, path: Path) -> dict | None:
    state = checkpoint(path)
    if state is None: return None
    returns, steps = state['returns'], state['env_steps']
    row = dict(steps=steps, last=[last_100(returns, m) if steps >= m else float('nan') for m in MARKS],
               best=[best_so_far(path, m) if steps >= m else float('nan') for m in MARKS],
               mean_1m=float(np.mean([r for at, r in returns if at <= STEPS])) if steps >= STEPS else float('nan'),
               returns=returns, evaluate=evaluate(exe, path) if finished(path) else float('nan'))
    return row


def fmt(x: float) -> str: return '—' if np.isnan(x) else f'{x:.1f}'


def table(results: dict) -> list[str]:
    lines = ['| game | replay | seed | env steps | last 100 at 250k / 500k / 1M | mean 0-1M | best.pt at 250k / 500k / 1M '
             '| `evaluate` best.pt |', '|---|---|--:|--:|---|--:|---|--:|']
    for (game, replay, seed), r in results.items():
        lines.append(f"| {game} | {replay} | {seed} | {r['steps']:,} | {' / '.join(map(fmt, r['last']))} "
                     f"| {fmt(r['mean_1m'])} | {' / '.join(map(fmt, r['best']))} | {fmt(r['evaluate'])} |")
    lines += ['', '| game | replay | finished runs | last 100 at 250k / 500k / 1M, mean [min–max] | mean 0-1M '
              '| `evaluate` best.pt, mean [min–max] |', '|---|---|--:|---|--:|--:|']
    for game in GAMES:
        for replay in REPLAYS:
            rs = [r for (g, p, _), r in results.items() if (g, p) == (game, replay) and r['steps'] >= STEPS]
            if not rs: continue
            def agg(values):
                v = [x for x in values if not np.isnan(x)]
                return f'{np.mean(v):.1f} [{min(v):.1f}–{max(v):.1f}]' if v else '—'
            lasts = ' / '.join(agg([r['last'][i] for r in rs]) for i in range(len(MARKS)))
            lines.append(f"| {game} | {replay} | {len(rs)} | {lasts} | {agg([r['mean_1m'] for r in rs])} "
                         f"| {agg([r['evaluate'] for r in rs])} |")
    lines += ['', '| game | published | values |', '|---|---|---|']
    lines += [f'| {game} | {what} | {" / ".join(map(str, v))} |' for (game, what), v in PUBLISHED.items()]
    return lines


def figure(results: dict, game: str, path: Path):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.2))
    grid = np.arange(10_000, STEPS + 1, 10_000)
    for replay, colour in zip(REPLAYS, ('tab:red', 'tab:blue')):
        curves = []
        for (g, p, seed), r in results.items():
            if (g, p) != (game, replay): continue
            curve = np.array([last_100(r['returns'], s) if s <= r['steps'] else np.nan for s in grid])
            ax.plot(grid, curve, color=colour, alpha=0.35, lw=0.8)
            curves.append(curve)
        if curves:
            name = 'prioritized (proportional)' if replay == 'per' else 'uniform'
            with warnings.catch_warnings():   # steps no run has reached yet: nan
                warnings.simplefilter('ignore', RuntimeWarning)
                mean = np.nanmean(curves, axis=0)
            ax.plot(grid, mean, color=colour, lw=2.2, label=f'{name}, mean of {len(curves)} seeds')
    yt = PUBLISHED[(game, 'Y&T DQN, last 100 at 250k / 500k / 1M')]
    ax.plot(MARKS, yt, 'k^', label='MinAtar paper DQN (read off its figure; an update per step)')
    ax.set(xlabel='env steps', ylabel='mean return, last 100 training episodes', title=f'MinAtar/{game}-v1')
    ax.legend(fontsize=8, loc='lower right')
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--out', type=Path, default=Path('runs/minatar'), help='where the run directories go')
    p.add_argument('--jobs', type=int, default=2, help='runs side by side')
    p.add_argument('--report', action='store_true', help='no runs: the table and figures of the runs made so far')
    p.add_argument('--figures', type=Path, default=Path('docs'), help='where minatar_<Game>.png go')
    p.add_argument('--exe', default=str(Path(sys.executable).with_name('fastrl_per')), help='the fastrl_per command')
    a = p.parse_args(argv)
    print(f"command: `{shlex.join([sys.executable, *sys.argv])}`\n")
    keys = [(g, r, s) for s in SEEDS for g in GAMES for r in REPLAYS]
    if not a.report:
        with ThreadPoolExecutor(a.jobs) as pool:
            for said in pool.map(lambda k: train(a.exe, a.out, *k), keys): print(said.splitlines()[0], flush=True)
    results = {k: r for k in keys if (r := measure(a.exe, run_dir(a.out, *k))) is not None}
    print('\n'.join(table(results)))
    for game in GAMES:
        if any(g == game for g, _, _ in results):
            figure(results, game, a.figures / f'minatar_{game}.png')
            print(f'\nwrote {a.figures / f"minatar_{game}.png"}')


if __name__ == '__main__': main()
