"""What `fastrl_per train --compile` costs and saves: the compile time, the time per env step compiled and not, and the
run length after which the compile has paid for itself, for the CartPole Learner (prioritized replay, an update each
env step) on one torch thread. Each row is a fresh process; 'cold' compiles into an empty inductor cache, 'warm'
finds the cold run's kernels there (torch's on-disk cache, $TORCHINDUCTOR_CACHE_DIR).
Usage: python benchmarks/compile_cost.py [--device cpu] [--hidden 128 512] [--steps 3000] [--quick]"""
import argparse, json, os, platform, subprocess, sys, tempfile, time

import torch

FIRST = 400   # env steps timed first: the warmup and the updates that compile


def one(compile:bool, hidden:int, steps:int, device:str) -> dict:
    ("Seconds of the first `FIRST` env steps (with any compile) and microseconds per env step of `steps` after them "
     "(the fastest of three chunks).")
    from fastrl_per.learners.learner import Learner
    torch.set_num_threads(1)
    learner = Learner('CartPole-v1', seed=0, total_steps=FIRST + steps, hidden=hidden, device=device, compile=compile)
    t = time.perf_counter()
    learner.fit(FIRST)
    first = time.perf_counter() - t
    chunks = []   # the fastest of three chunks: on a shared machine the others' load only slows a chunk down
    for _ in range(3):
        t = time.perf_counter()
        learner.fit(steps // 3)
        chunks.append((time.perf_counter() - t) * 1e6 / (steps // 3))
    return dict(first=first, per_step=min(chunks))


def measured(mode:str, hidden:int, steps:int, device:str, cache:str) -> dict:
    "`one` in a fresh process whose inductor cache is the directory `cache`."
    args = [sys.executable, __file__, '--one', mode, '--hidden', str(hidden), '--steps', str(steps), '--device', device]
    env = {**os.environ, 'TORCHINDUCTOR_CACHE_DIR': cache}
    out = subprocess.run(args, capture_output=True, text=True, check=True, env=env)
    return json.loads(out.stdout.splitlines()[-1])


def pays_after(compile_s:float, plain_us:float, compiled_us:float) -> str:
    "The env steps after which a compile of `compile_s` seconds has paid, or 'never' if compiled steps are no faster."
    saved = plain_us - compiled_us
    return f"{compile_s * 1e6 / saved:,.0f}" if saved > 0 else 'never'


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--device', default='cpu')
    p.add_argument('--hidden', type=int, nargs='+', default=[128, 512], help="the MLP's hidden units")
    p.add_argument('--steps', type=int, default=3000, help='env steps timed after the first %d' % FIRST)
    p.add_argument('--quick', action='store_true', help='hidden 16, 200 steps: a check that the script runs')
    p.add_argument('--one', choices=['plain', 'compiled'], help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.one: return print(json.dumps(one(a.one == 'compiled', a.hidden[0], a.steps, a.device)))
    hidden, steps = ([16], 200) if a.quick else (a.hidden, a.steps)
    with open('/proc/cpuinfo') as f:
        cpu = next((l.split(':', 1)[1].strip() for l in f if l.startswith('model name')), platform.processor())
    print(f"device {a.device} ({cpu}, {os.cpu_count()} cores), torch {torch.__version__}, "
          f"python {platform.python_version()}; CartPole-v1 Learner, 1 torch thread, "
          f"first {FIRST} env steps then {steps} timed")
    print(f"{'hidden':>6}  {'update':<16}{'first steps s':>14}{'us/env step':>13}{'compile s':>11}"
          f"{'pays after steps':>18}")
    for h in hidden:
        with tempfile.TemporaryDirectory() as cache:
            plain = measured('plain', h, steps, a.device, cache)
            print(f"{h:>6}  {'plain':<16}{plain['first']:>14.2f}{plain['per_step']:>13.0f}{'':>11}{'':>18}")
            for label in ('compiled, cold', 'compiled, warm'):   # the second finds the first's kernels on disk
                got = measured('compiled', h, steps, a.device, cache)
                cost = got['first'] - plain['first']
                print(f"{h:>6}  {label:<16}{got['first']:>14.2f}{got['per_step']:>13.0f}{cost:>11.1f}"
                      f"{pays_after(cost, plain['per_step'], got['per_step']):>18}")


if __name__ == '__main__': main()
