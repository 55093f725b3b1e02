"""benchmarks/when_per_pays.py: its statistics (the interquartile mean, the probability of improvement, the stratified
bootstrap) on arrays whose answers are known, and the script end to end on a short budget: a row per run lands in
the CSV, a second call runs nothing already there, and the tables and figure come from the CSV."""
import csv, importlib.util, subprocess, sys
from pathlib import Path

import numpy as np
from hypothesis import given, strategies as st
from hypothesis.extra.numpy import arrays

ROOT = Path(__file__).parent.parent
SCRIPT = ROOT / 'benchmarks' / 'when_per_pays.py'
spec = importlib.util.spec_from_file_location('when_per_pays', SCRIPT)
wpp = importlib.util.module_from_spec(spec)
spec.loader.exec_module(wpp)

runs = arrays(np.float64, st.integers(4, 40), elements=st.floats(-1e3, 1e3))


@given(runs)
def test_iqm_ignores_the_outer_quarters(x):
    far = np.sort(x)
    cut = len(x) // 4
    far[:cut], far[len(x) - cut:] = -1e9, 1e9          # the quarters cut off, moved as far as can be
    assert wpp.iqm(far) == wpp.iqm(x)
    assert np.percentile(x, 25) - 1e-9 <= wpp.iqm(x) <= np.percentile(x, 75) + 1e-9


def test_iqm_of_few_runs_is_their_mean():
    assert wpp.iqm([1., 2., 6.]) == 3.
    assert wpp.iqm([1., 2., 3., 100.]) == 2.5           # a quarter of 4: one run from each end


@given(runs, runs)
def test_improvement_of_x_over_y_and_of_y_over_x_add_to_one(x, y):
    assert np.isclose(wpp.improvement([x], [y]) + wpp.improvement([y], [x]), 1.)


def test_improvement_counts_ties_a_half_and_averages_over_tasks():
    assert wpp.improvement([np.array([500.])], [np.array([500.])]) == 0.5
    a, b = np.array([1., 3.]), np.array([2., 2.])
    assert wpp.improvement([a], [b]) == 0.5
    assert wpp.improvement([a, np.array([9.])], [b, np.array([0.])]) == 0.75   # (0.5 + 1) / 2


def test_bootstrap_of_runs_that_agree_has_no_width_and_repeats_with_its_seed():
    same = [(np.full(6, 2.),), (np.full(3, 2.),)]
    assert wpp.bootstrap(lambda t: wpp.iqm(np.concatenate([a for a, in t])), same, reps=50) == (2., 2., 2.)
    spread = [(np.arange(8.),)]
    stat = lambda t: wpp.iqm(t[0][0])
    first, again = wpp.bootstrap(stat, spread, reps=200), wpp.bootstrap(stat, spread, reps=200)
    assert first == again and first[1] < first[0] < first[2]


def test_the_script_appends_a_row_per_run_skips_those_there_and_summarises(tmp_path):
    table, figure = tmp_path / 'wpp.csv', tmp_path / 'wpp.png'
    command = [sys.executable, str(SCRIPT), '--envs', 'CartPole-v1', '--kinds', 'uniform', 'rank', '--seeds', '1',
               '--steps', '300', '--jobs', '1', '--csv', str(table), '--figure', str(figure)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    with open(table, newline='') as f: rows = list(csv.DictReader(f))
    assert sorted((r['env'], r['kind'], r['seed'], r['steps']) for r in rows) == [
        ('CartPole-v1', 'rank', '0', '300'), ('CartPole-v1', 'uniform', '0', '300')]
    assert done.stdout.count('done: ') == 2 and figure.stat().st_size > 0
    written = table.read_text()
    again = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert again.returncode == 0, again.stderr
    assert 'done: ' not in again.stdout and table.read_text() == written
    summary = [l for l in again.stdout.splitlines() if l.startswith('| rank |')]
    assert len(summary) == 2                              # CartPole's table and the normalised one
    assert summary[0].split('|')[2].strip() == '1'        # one run
