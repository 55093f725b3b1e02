#!/usr/bin/env python
"""Does `fastrl_per train` stop solved, and does the network it keeps play the threshold? Seeds through the command.

Run from the repository root (the cli extra installed; box2d for LunarLander):

    python benchmarks/solved.py --env LunarLander-v3 --steps 100000 --seeds 10 --jobs 2
    python benchmarks/solved.py --seeds 10                       # CartPole-v1 at every default
    python benchmarks/solved.py --env LunarLander-v3 --table-only

For each seed S it runs `fastrl_per train --env ENV --seed S --out OUT/ENV-S --no-progress` (plus `--steps` and any
`--flags` given; every other setting at the command's default), then `fastrl_per evaluate OUT/ENV-S` (10 greedy
episodes, seeds 10,000 on) and `fastrl_per evaluate OUT/ENV-S --episodes 100`. Each seed's row is appended to `--csv`
as it ends, so an interrupted benchmark keeps what it finished and a second call runs only the seeds the file lacks.
The table: where each run stopped and why (its summary's line), what decided it, what `evaluate` plays, its CPU time.
"""
from __future__ import annotations
import argparse, csv, os, re, subprocess, sys, tempfile, threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

COMMAND = str(Path(sys.executable).parent / 'fastrl_per')
COLUMNS = ['env', 'seed', 'steps', 'flags', 'threshold', 'solved', 'stopped_at', 'evaluation', 'confirmed', 'check', 'check_first',
           'evaluate_10', 'evaluate_10_min', 'evaluate_10_max', 'evaluate_100', 'evaluate_100_min', 'evaluate_100_max',
           'training_mean', 'cpu_s', 'end_line']
EVALUATED = re.compile(r'mean return over \d+ greedy episodes?: (-?[\d.]+) \(min (-?\d+), max (-?\d+)\)')
SOLVED = re.compile(r'solved at step ([\d,]+): the greedy network played (-?[\d.]+) over \d+ episodes, (-?[\d.]+) over '
                    r'\d+ with its confirm episodes, and (-?[\d.]+) over \d+ of evaluate\'s episodes \(seeds [\d,]+ to '
                    r'[\d,]+; (-?[\d.]+) over the first')

def command(*args) -> tuple[str, float]:
    "Run `fastrl_per args` (it must succeed); its stdout and the CPU seconds it used (its own, beside other jobs')."
    with tempfile.TemporaryFile('w+') as out, tempfile.TemporaryFile('w+') as err:
        proc = subprocess.Popen([COMMAND, *map(str, args)], stdout=out, stderr=err, text=True,
                                env=dict(os.environ, COLUMNS='200'))
        _, status, usage = os.wait4(proc.pid, 0)   # this child's resource use alone
        out.seek(0); err.seek(0)
        if os.waitstatus_to_exitcode(status):
            raise RuntimeError(f"fastrl_per {' '.join(map(str, args))} failed:\n{err.read()}")
        return out.read(), usage.ru_utime + usage.ru_stime

def run_seed(env:str, seed:int, steps:int|None, flags:list[str], out:Path) -> dict:
    "One seed: train, evaluate on 10 and on 100 episodes; the row of `COLUMNS`."
    run_dir = out / f"{env.replace('/', '_')}-{seed}"
    summary, cpu = command('train', '--env', env, '--seed', seed, '--out', run_dir, '--no-progress',
                           *(['--steps', steps] if steps else []), *flags)
    lines = summary.splitlines()
    end = next(line for line in lines if line.startswith(('solved', 'ended on its budget')))
    stopped = int(lines[0].split(' steps')[0].replace(',', ''))
    found = re.search(r'threshold (?:of )?(-?[\d.]+)', end)   # what the run stopped at: --solved, else the env's
    row = dict(env=env, seed=seed, steps=steps or '', flags=' '.join(flags), threshold=found and float(found.group(1)),
               solved=end.startswith('solved'), stopped_at=stopped, end_line=end, cpu_s=round(cpu, 1),
               training_mean=float(lines[0].rsplit(': ', 1)[1]))   # of the last 20 training episodes, at the stop
    decided = SOLVED.match(end)
    if decided: row.update(zip(['evaluation', 'confirmed', 'check', 'check_first'], map(float, decided.groups()[1:])))
    for episodes in (10, 100):
        found = EVALUATED.search(command('evaluate', run_dir, '--episodes', episodes)[0])
        row.update(zip([f'evaluate_{episodes}', f'evaluate_{episodes}_min', f'evaluate_{episodes}_max'],
                       map(float, found.groups())))
    return row

def read_rows(path:Path) -> list[dict]:
    "The rows `path` holds (none if it is not there)."
    if not path.exists(): return []
    with path.open(newline='') as f: return list(csv.DictReader(f))

def table(rows:list[dict]) -> str:
    "A markdown table of the rows, a seed a line, and a line counting the solved runs and those `evaluate` agrees with."
    head = ("| seed | how it ended | at step | decided by: evaluation / with confirm / 100 of evaluate's (first 10) "
            "| `evaluate`, 10 episodes (min–max) | `evaluate`, 100 episodes (min–max) | training mean of 20 at the stop "
            "| CPU min |\n|--:|---|--:|--:|--:|--:|--:|--:|")
    lines, solved, agree = [head], 0, 0
    for r in sorted(rows, key=lambda r: int(r['seed'])):
        is_solved = str(r['solved']) == 'True'
        decided = (f"{float(r['evaluation']):.1f} / {float(r['confirmed']):.1f} / {float(r['check']):.1f} "
                   f"({float(r['check_first']):.1f})" if is_solved else '–')
        lines.append(f"| {r['seed']} | {'solved' if is_solved else 'budget'} | {int(r['stopped_at']):,} | {decided} "
                     f"| {float(r['evaluate_10']):.1f} ({float(r['evaluate_10_min']):.0f}–"
                     f"{float(r['evaluate_10_max']):.0f}) "
                     f"| {float(r['evaluate_100']):.1f} ({float(r['evaluate_100_min']):.0f}–"
                     f"{float(r['evaluate_100_max']):.0f}) | {float(r['training_mean']):.1f} "
                     f"| {float(r['cpu_s']) / 60:.1f} |")
        solved += is_solved
        agree += is_solved and min(float(r['evaluate_10']), float(r['evaluate_100'])) >= float(r['threshold'])
    lines.append(f"\n{solved} of {len(rows)} stopped solved; `evaluate` of the kept network plays the threshold on 10 "
                 f"and on 100 episodes for {agree} of those {solved}.")
    return '\n'.join(lines)

def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--env', default='CartPole-v1')
    p.add_argument('--steps', type=int, help="--steps of each run (default: the command's)")
    p.add_argument('--seeds', type=int, default=10, help="seeds 0 to N-1")
    p.add_argument('--jobs', type=int, default=1, help="runs at a time (each uses one torch thread)")
    p.add_argument('--flags', nargs=argparse.REMAINDER, default=[], help="more flags for train, after all others")
    p.add_argument('--out', default='runs/solved', help="the run directories go here")
    p.add_argument('--csv', help="the rows (default: benchmarks/results/solved_ENV.csv)")
    p.add_argument('--table-only', action='store_true', help="print the table of the rows in --csv; run nothing")
    a = p.parse_args()
    path = Path(a.csv or f"benchmarks/results/solved_{a.env.replace('/', '_')}.csv")
    done = {int(r['seed']) for r in read_rows(path)}
    todo = [s for s in range(a.seeds) if s not in done]
    if not a.table_only and todo:
        path.parent.mkdir(parents=True, exist_ok=True)
        writing = threading.Lock()
        def one(seed):
            row = run_seed(a.env, seed, a.steps, a.flags, Path(a.out))
            with writing, path.open('a', newline='') as f:
                w = csv.DictWriter(f, COLUMNS)
                if not f.tell(): w.writeheader()
                w.writerow(row)
            print(f"seed {seed}: {row['end_line']}", flush=True)
        with ThreadPoolExecutor(a.jobs) as pool: list(pool.map(one, todo))
    print(table(read_rows(path)))

if __name__ == '__main__':
    main()
