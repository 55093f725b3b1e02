#!/usr/bin/env python
"""The Blind Cliffwalk with a linear learner (the paper's Figure 2, right panel, in this library's setting).

Run from the repository root (about a minute on a shared 2-core machine):

    python benchmarks/cliffwalk_linear.py            # n = 2, 4, ..., 12, seeds 0-9
    python benchmarks/cliffwalk_linear.py --quick    # n = 2, 4, 6, seeds 0-2

Q(s, a) = w[s, a] + b: features one-hot in (s, a) plus a constant 1, so every update also moves every other value
through b (the table of `nbs/15_cliffwalk.ipynb` with one shared weight added). Uniform replay, the library's
proportional and rank-based `Priorities` core and greedy TD-error prioritization, the page's settings otherwise;
the one-step oracle is left out (it stalls with this learner, see the page). Prints the table (median [min-max]
updates until the MSE of the Q values to Q* is below 1e-3) and saves the counts in
nbs/data/cliffwalk_linear_updates.json, which the page draws.
"""
import argparse, json
from pathlib import Path

import numpy as np

from fastrl_per.replay.cliffwalk import cliffwalk_table

METHODS = ('uniform', 'proportional', 'rank', 'greedy')


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument('--quick', action='store_true', help='n up to 6, three seeds, nothing saved')
    args = parser.parse_args()
    ns, seeds = (range(2, 7, 2), 3) if args.quick else (range(2, 13, 2), 10)
    table = cliffwalk_table(ns, METHODS, seeds, linear=True)
    print(f"{'method':<13}{'n':>3}{'memory':>9}{'median':>10}{'min':>10}{'max':>10}")
    for m, runs in table.items():
        for n, c in runs.items():
            print(f"{m:<13}{n:>3}{2 ** (n + 1) - 2:>9}{int(np.median(c)):>10}{min(c):>10}{max(c):>10}")
    if args.quick: return
    kept = {m: {str(n): c for n, c in r.items()} for m, r in table.items()}
    path = Path(__file__).resolve().parent.parent / 'nbs' / 'data' / 'cliffwalk_linear_updates.json'
    path.write_text(json.dumps(kept))


if __name__ == '__main__':
    main()
