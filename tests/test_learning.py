"""The learning-rate schedule of `Learner` and `RecurrentLearner` (`lr_end`): where the rate is after a given number
of env steps, that a resumed run continues the schedule, bad values, the command's `--lr-end`; and
benchmarks/learning.py run end to end on a short budget."""
import subprocess, sys
from pathlib import Path

import pytest
import torch

from fastrl_per.learners.learner import Learner
from fastrl_per.learners.recurrent_learner import RecurrentLearner

ROOT = Path(__file__).parent.parent


def lr(learner): return learner.dqn_update.optimizer.param_groups[0]['lr']


def test_lr_moves_linearly_to_lr_end_over_total_steps_then_stays():
    learner = Learner('CartPole-v1', seed=0, total_steps=400, lr=1e-3, lr_end=2e-4, bs=32)   # updates from step 32 on
    assert lr(learner) == 1e-3
    learner.fit(100)
    assert lr(learner) == pytest.approx(1e-3 * 0.75 + 2e-4 * 0.25)   # set after the update of env step 100
    learner.fit(400)                                                 # past total_steps: the floor
    assert lr(learner) == pytest.approx(2e-4)


def test_without_lr_end_the_rate_stays():
    learner = Learner('CartPole-v1', seed=0, total_steps=400, lr=1e-3)
    learner.fit(200)
    assert lr(learner) == 1e-3


def test_a_resumed_learner_continues_the_schedule():
    config = dict(seed=0, total_steps=400, lr=1e-3, lr_end=2e-4, bs=32)
    first = Learner('CartPole-v1', **config)
    first.fit(150)
    resumed = Learner('CartPole-v1', **config)
    resumed.load_state_dict(first.state_dict())
    assert lr(resumed) == pytest.approx(lr(first))
    resumed.fit(50)
    assert lr(resumed) == pytest.approx(1e-3 * 0.5 + 2e-4 * 0.5)


@pytest.mark.parametrize('make', [Learner, RecurrentLearner])
@pytest.mark.parametrize('bad', [0., -1e-4, float('nan')])
def test_bad_lr_end_is_named(make, bad):
    with pytest.raises(ValueError, match='lr_end'): make(seed=0, total_steps=100, lr_end=bad)


@pytest.mark.parametrize('make', [Learner, RecurrentLearner])
@pytest.mark.parametrize('bad', [0., -1e-3, float('inf')])
def test_bad_lr_is_named(make, bad):
    "A learning rate of 0 would train nothing and say nothing."
    with pytest.raises(ValueError, match=rf'^lr={bad!r} is not a finite number > 0'): make(seed=0, total_steps=100, lr=bad)


def test_the_recurrent_command_anneals_to_lr_end(tmp_path):
    run = tmp_path / 'rec'
    done = subprocess.run([sys.executable, '-m', 'fastrl_per', 'train', '--model', 'recurrent', '--steps', '600',
                           '--warmup', '200', '--lr-end', '1e-4', '--out', str(run), '--no-progress'],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    checkpoint = torch.load(run / 'checkpoint.pt', weights_only=False)
    assert checkpoint['config']['lr_end'] == 1e-4
    # 600 of 600 planned steps: the end of the schedule
    assert checkpoint['optimizer']['param_groups'][0]['lr'] == pytest.approx(1e-4)


def test_learning_benchmark_prints_a_row_per_run_and_a_summary():
    done = subprocess.run([sys.executable, str(ROOT / 'benchmarks' / 'learning.py'), '--seeds', '2', '--jobs', '1', '--steps', '300',
                           '--solved', '15', '--replay', 'uniform', '--set', 'lr_end=1e-4'],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    rows = [l for l in done.stdout.splitlines() if l.startswith('| uniform |')]
    assert [r.split('|')[2].strip() for r in rows[:2]] == ['0', '1']
    assert rows[2].split('|')[2].strip() == '2'          # the summary: two runs
    assert 'lr_end=1e-4' in done.stdout
