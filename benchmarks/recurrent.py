"""CPU cost per env step of the recurrent learner next to the feed-forward one, both at their defaults, side by side.

`RecurrentLearner` (R2D2-style: one LSTM step per env step with a carried state, sequences of burn_in + length
steps trained every `train_every` env steps) and `Learner` (the MLP Q-network, one update per env step) on the same
env, CartPoleNoVelocity-v1, in the same process, one torch thread. Each learner first runs `--warmup` env steps
untimed (past its first update), then rounds of `--steps` env steps are timed in turn, mlp then recurrent, so that
both see the same load of a shared machine. CPU is this process's user + system time (`time.process_time`).

Two rows per learner: the whole run (acting, storing, sampling, updates), and acting + storing only (the same
learner built with a warmup it never reaches, so it never updates). The ratio column divides by the MLP's row.

    python benchmarks/recurrent.py              # the default run (about two minutes on an idle core)
    python benchmarks/recurrent.py --quick      # a smoke run
"""
import argparse, statistics, time
import torch

ENV_ID = 'CartPoleNoVelocity-v1'   # registered on import of fastrl_per.learners.recurrent_learner


def learners(never_updates:bool) -> dict:
    "A fresh learner of each kind at its defaults on `ENV_ID`; with `never_updates`, one that only acts and stores."
    from fastrl_per.learners.learner import Learner
    from fastrl_per.learners.recurrent_learner import RecurrentLearner
    never = dict(warmup=10**9) if never_updates else {}
    return dict(mlp=Learner(ENV_ID, **never), recurrent=RecurrentLearner(ENV_ID, **never))


def measure(steps:int, rounds:int, warmup:int, never_updates:bool) -> dict:
    "Per learner kind: CPU seconds and updates of each timed round of `steps` env steps."
    runs = learners(never_updates)
    for learner in runs.values(): learner.fit(warmup)
    out = {name: dict(cpu=[], updates=[]) for name in runs}
    for _ in range(rounds):
        for name, learner in runs.items():
            start = time.process_time()
            rows = learner.fit(steps)
            out[name]['cpu'].append(time.process_time() - start)
            out[name]['updates'].append(len(rows))
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument('--steps', type=int, default=2_000, help='env steps per timed round')
    p.add_argument('--rounds', type=int, default=5, help='timed rounds per learner, alternating')
    p.add_argument('--warmup', type=int, default=2_000, help='untimed env steps first (past the first update)')
    p.add_argument('--quick', action='store_true', help='a smoke run: 2 rounds of 500 steps')
    args = p.parse_args()
    if args.quick: args.steps, args.rounds = 500, 2
    torch.set_num_threads(1)
    rows = []
    for label, never in (('', False), (', acting + storing only', True)):
        result = measure(args.steps, args.rounds, args.warmup, never)
        per_k = {name: [1000 * c / args.steps for c in r['cpu']] for name, r in result.items()}
        base = statistics.median(per_k['mlp'])
        for name, r in result.items():
            cost, updates = statistics.median(per_k[name]), 1000 * sum(r['updates']) / (args.steps * args.rounds)
            spread = f"{min(per_k[name]):.2f}–{max(per_k[name]):.2f}"
            rows.append(f"| {name}{label} | {cost:.2f} ({spread}) | {updates:.0f} | {cost / base:.2f} |")
    print(f"CPU per env step at the defaults, {ENV_ID}, 1 torch thread, {args.rounds} rounds of {args.steps:,} "
          f"env steps after {args.warmup:,} untimed (torch {torch.__version__})\n")
    print("| learner | CPU s per 1,000 env steps (median; min–max) | updates per 1,000 env steps | × the mlp's |")
    print("|---|---|---|---|")
    print('\n'.join(rows))

if __name__ == '__main__': main()
