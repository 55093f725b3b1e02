"""The stop rule through the real command: `fastrl_per train` stops at `--solved` only when a confirmed greedy
evaluation reaches it and the network plays it on `evaluate`'s own episodes too (100 of them, and the first 10, which
`evaluate` plays by default), says what decided, and `fastrl_per evaluate` of the network it keeps plays at the
threshold; a run that ends on its budget says so, and why. CartPole-v1, a few thousand env steps: about two minutes."""
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fastrl_per.run.rundir import load_best, read_metrics
from conftest import scalars

COMMAND = str(Path(sys.executable).parent / 'fastrl_per')
# the 07d notebook's example: 1,000 random warm-up transitions, whose episodes' training mean reaches 15 at the first
# update (step 1,002) while the greedy network of that update plays 9.2
QUICK = ['--steps', 2000, '--warmup', 1000, '--eval-every', 250, '--eval-episodes', 5, '--confirm-episodes', 5,
         '--no-progress']
FIRST_UPDATE = 1002


def command(*args) -> str:
    "Run `fastrl_per` with `args` in a subprocess; its stdout (it must succeed)."
    done = subprocess.run([COMMAND, *map(str, args)], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, COLUMNS='100'))
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr)
    return done.stdout


def evaluated(run_dir, episodes:int=10) -> float:
    "The mean return `fastrl_per evaluate` plays with `run_dir`'s kept network (best.pt), on its own episodes."
    out = command('evaluate', run_dir, '--episodes', episodes)
    found = re.search(rf'mean return over {episodes} greedy episodes: (-?[\d.]+)', out)
    assert found and 'network: best.pt' in out, out
    return float(found.group(1))


def training_mean(metrics:dict, step:int) -> float:
    "The mean of the last 20 training episodes that ended by env step `step`."
    done = ~np.isnan(metrics['episode_return']) & (metrics['frame'] <= step)
    return float(metrics['episode_return'][done][-20:].mean())


def end_line(out:str) -> str:
    "The summary's line saying why the run ended: its second."
    return out.splitlines()[1]


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
    "The summaries of a greedy-rule and a training-mean-rule run with the same quick settings and threshold 15."
    d = tmp_path_factory.mktemp('solved')
    return d, {by: command('train', '--out', d / by, '--solved', 15, '--solved-by', by, *QUICK)
               for by in ('greedy', 'train-mean')}


def test_training_mean_alone_does_not_stop(runs):
    d, out = runs
    mean = read_metrics(d / 'train-mean')
    assert mean['frame'][-1] == FIRST_UPDATE and training_mean(mean, FIRST_UPDATE) >= 15   # the old rule stops here
    assert end_line(out['train-mean']).startswith('solved by the training mean: the last 20 training episodes reached')
    greedy = read_metrics(d / 'greedy')
    assert training_mean(greedy, FIRST_UPDATE) >= 15   # the same draws: the training mean reached 15 at step 1,002
    at_first = greedy['eval_return'][greedy['frame'] == FIRST_UPDATE]
    assert len(at_first) == 1 and at_first[0] < 15     # greedy play did not,
    assert greedy['frame'][-1] > FIRST_UPDATE           # so the run went on


def test_greedy_threshold_stops_and_kept_network_plays_it(runs):
    d, out = runs
    best, m = load_best(d / 'greedy'), read_metrics(d / 'greedy')
    assert m['frame'][-1] < 2000 and best['frame'] == m['frame'][-1]   # stopped before its budget, on the kept network
    hundred, ten = evaluated(d / 'greedy', 100), evaluated(d / 'greedy')
    assert end_line(out['greedy']) == (
        f"solved at step {best['frame']:,}: the greedy network played {best['eval_return']:.1f} over 5 episodes, "
        f"{best['confirmed_return']:.1f} over 10 with its confirm episodes, and {hundred:.1f} over 100 of evaluate's "
        f"episodes (seeds 10,000 to 10,099; {ten:.1f} over the first 10, which evaluate plays) (threshold 15); "
        "best.pt keeps it")
    assert min(best['eval_return'], best['confirmed_return'], hundred, ten) >= 15
    # what the training-mean rule handed over with the same draws: a network that does not play the threshold
    assert evaluated(d / 'train-mean') < 15


def test_threshold_the_training_mean_never_reaches(tmp_path):
    "A threshold far above the training episodes' returns: greedy play alone reaches it, and evaluate agrees."
    out = command('train', '--out', tmp_path / 'run', '--solved', 150, *QUICK)
    best, m = load_best(tmp_path / 'run'), read_metrics(tmp_path / 'run')
    assert end_line(out).startswith(f"solved at step {best['frame']:,}: the greedy network played")
    assert m['frame'][-1] < 2000 and training_mean(m, m['frame'][-1]) < 150
    assert evaluated(tmp_path / 'run') >= 150


def test_confirmed_network_that_misses_on_evaluates_episodes_does_not_stop(tmp_path):
    ("Threshold 180: a network plays it on its evaluation and with its confirm episodes, then not on 100 of "
     "`evaluate`'s; the run goes on to one that does, and `evaluate` agrees on 10 and 100 episodes.")
    out = command('train', '--out', tmp_path / 'run', '--solved', 180, *QUICK)
    tb, best = scalars(tmp_path / 'run'), load_best(tmp_path / 'run')
    evals, confirmed, checks = (dict(tb[f'return/{t}']) for t in ('eval', 'confirmed', 'solve_check'))
    missed = [step for step, mean in checks.items() if mean < 180]
    assert missed, checks   # the case this test is for: a check that failed
    assert all(min(evals[step], confirmed[step]) >= 180 for step in missed)   # the old rule stopped there
    assert read_metrics(tmp_path / 'run')['frame'][-1] == best['frame'] > max(missed)
    assert end_line(out).startswith(f"solved at step {best['frame']:,}: ")
    assert checks[best['frame']] >= 180 and min(evaluated(tmp_path / 'run'), evaluated(tmp_path / 'run', 100)) >= 180


def test_budget_end_after_a_failed_check_says_what_it_played(tmp_path):
    ("Seed 3, threshold 200: the last network plays it with its confirm episodes and on the first 10 of `evaluate`'s, "
     "not on 100; the run ends on its budget, and says so with the numbers `evaluate` gives.")
    out = command('train', '--out', tmp_path / 'run', '--seed', 3, '--solved', 200, *QUICK)
    best = load_best(tmp_path / 'run')
    hundred, ten = evaluated(tmp_path / 'run', 100), evaluated(tmp_path / 'run')
    assert hundred < 200 <= min(ten, best['confirmed_return'], best['eval_return'])
    assert end_line(out) == (
        f"ended on its budget of 2,000 steps: the greedy network of step {best['frame']:,} reached the threshold of 200 "
        f"with its confirm episodes ({best['confirmed_return']:.1f}) but played {hundred:.1f} over 100 of evaluate's "
        f"episodes (seeds 10,000 to 10,099; {ten:.1f} over the first 10, which evaluate plays)")


@pytest.mark.parametrize('flags,line', [
    (['--solved', 150], "ended on its budget of 1,100 steps: no greedy evaluation reached the threshold of 150 with its "
                        "confirm episodes"),
    (['--solved', 0], "ended on its budget of 1,100 steps"),
    (['--solved', 15, '--eval-every', 0], "ended on its budget of 1,100 steps (threshold 15: no greedy evaluation ran "
                                          "to reach it)"),
])
def test_budget_end_says_so(tmp_path, flags, line):
    out = command('train', '--out', tmp_path / 'run', *QUICK, '--steps', 1100, *flags)
    assert end_line(out) == line, out
    assert read_metrics(tmp_path / 'run')['frame'][-1] == 1100
