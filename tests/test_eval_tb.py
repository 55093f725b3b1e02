"""Evaluation during training and best.pt, TensorBoard event files read back, the stale-drop
count of the priority core, and the one-line errors for envs whose extra is missing: real
`fastrl_per` subprocesses, real envs, real files."""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from fastrl_per.checks import install_line

from fastrl_per.core import SimpleStep
from fastrl_per.replay.per import PrioritizedExperienceReplay
from fastrl_per.run.monitor import RunBoard
from conftest import scalars
from test_cli import metrics   # metrics.csv rows, the update rows by default

COMMAND = [str(Path(sys.executable).parent / 'fastrl_per')]
EARLY = ('--bs', 64)   # the first update, and so the first metrics row an evaluation lands on, at step 64: before the first evaluation at 100


def run(*args, command=COMMAND, check=None):
    done = subprocess.run([*command, *map(str, args)], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, COLUMNS='100'))
    if check is not None: assert done.returncode == check, (done.returncode, done.stdout, done.stderr)
    return done


def without(module):
    "The command run by a Python that finds `module` missing (None in sys.modules stops its import)."
    return [sys.executable, '-c', f'import sys; sys.modules[{module!r}] = None; from fastrl_per.run.cli import main; main()']



def point_steps(frames, every, start=0):
    "The env steps of the rows that open a new `every`-long interval: where the training scalars get a point."
    return [f for prev, f in zip([start] + frames, frames) if f // every != prev // every]


def chosen(evals, confirmed):
    """The frame best.pt should hold: an evaluation (frame, score) that beats the kept network's mean is confirmed
    (`confirmed`: frame → its mean over the confirming episodes too); it is kept if that still beats the kept mean,
    so the first of equals stays. Also checks that exactly those evaluations were confirmed."""
    best, candidates = None, []
    for frame, score in evals:
        if best is not None and score <= best[1]: continue
        candidates.append(frame)
        if best is None or confirmed[frame] > best[1]: best = (frame, confirmed[frame])
    assert sorted(confirmed) == candidates
    return best[0]


@pytest.fixture(scope='module')
def evaluated_run(tmp_path_factory):
    "A 300-step run evaluated every 100 env steps, logging every 50."
    out = tmp_path_factory.mktemp('runs') / 'run'
    run('train', '--out', out, '--steps', 300, '--eval-every', 100, '--eval-episodes', 2, '--log-every', 50, '--no-progress', *EARLY, check=0)
    return out


def test_evaluations_go_to_metrics_and_the_best_to_best_pt(evaluated_run):
    rows = metrics(evaluated_run)
    evals = [(int(r['frame']), float(r['eval_return'])) for r in rows if r['eval_return']]
    assert [f for f, _ in evals] == [100, 200, 300]
    best = torch.load(evaluated_run / 'best.pt', weights_only=True)
    confirmed = dict(scalars(evaluated_run)['return/confirmed'])
    assert best['frame'] == chosen(evals, confirmed)
    assert best['eval_return'] == pytest.approx(dict(evals)[best['frame']], rel=1e-5)
    assert best['confirmed_return'] == pytest.approx(confirmed[best['frame']], rel=1e-5)
    assert (best['eval_episodes'], best['confirm_episodes'], best['eval_seed'], best['learner']) == \
        (2, 30, 10 ** 9, 'Learner')
    assert (evaluated_run / 'plot.png').exists()


def test_tensorboard_has_every_scalar_with_its_points(evaluated_run):
    rows, got = metrics(evaluated_run), scalars(evaluated_run)
    manifest = json.loads((evaluated_run / 'run.json').read_text())
    frames = [int(r['frame']) for r in rows]
    steps = point_steps(frames, 50)
    for tag in ('train/loss', 'train/epsilon', 'train/beta', 'train/updates',
                'replay/mean_priority', 'replay/max_priority', 'replay/stale_dropped', 'replay/mean_weight'):
        assert [s for s, _ in got[tag]] == steps, tag
    assert [v for _, v in got['train/updates']] == [frames.index(s) + 1 for s in steps]  # update count of that row
    assert len(got['return/episode']) == manifest['episodes']
    ended = [float(r['episode_return']) for r in metrics(evaluated_run, updates_only=False) if r['episode_return']]
    assert [pytest.approx(v) for _, v in got['return/episode']] == ended   # every episode has its row
    assert [(s, pytest.approx(v, rel=1e-5)) for s, v in got['return/eval']] == \
        [(int(r['frame']), float(r['eval_return'])) for r in rows if r['eval_return']]
    assert all(m >= mean > 0 for (_, mean), (_, m) in zip(got['replay/mean_priority'], got['replay/max_priority']))
    assert all(0 < w <= 1 for _, w in got['replay/mean_weight'])  # importance weights only scale updates down


def test_uniform_replay_logs_no_priorities(tmp_path):
    out = tmp_path / 'run'
    run('train', '--out', out, '--steps', 150, '--replay', 'uniform', '--eval-every', 0, '--log-every', 50, '--no-progress', check=0)
    got = scalars(out)
    assert not any(tag.startswith('replay/') for tag in got) and 'return/eval' not in got and 'train/loss' in got
    assert not (out / 'best.pt').exists() and not any(r['eval_return'] for r in metrics(out))
    done = run('evaluate', out, '--episodes', 1, check=0)
    assert 'network: checkpoint.pt (the latest, step 150; the run has no best.pt)' in done.stdout


def test_resume_keeps_the_best_so_far(tmp_path):
    out = tmp_path / 'run'
    args = ('--eval-every', 100, '--eval-episodes', 2, '--no-progress', *EARLY)
    run('train', '--out', out, '--steps', 200, *args, check=0)
    first = torch.load(out / 'best.pt', weights_only=True)
    run('train', '--resume', out, '--steps', 400, *args, check=0)
    evals = [(int(r['frame']), float(r['eval_return'])) for r in metrics(out) if r['eval_return']]
    assert [f for f, _ in evals] == [100, 200, 300, 400]
    best = torch.load(out / 'best.pt', weights_only=True)
    assert best['frame'] == chosen(evals, dict(scalars(out)['return/confirmed']))   # the first leg's best competes
    assert best['confirmed_return'] >= first['confirmed_return']


def test_evaluate_plays_best_pt_unless_latest(evaluated_run, tmp_path):
    "A best.pt whose network always pushes right: evaluate must play exactly that policy."
    run_dir = tmp_path / 'run'
    subprocess.run(['cp', '-r', str(evaluated_run), str(run_dir)], check=True)
    best = torch.load(run_dir / 'best.pt', weights_only=True)
    last = max(k for k in best['model'] if k.endswith('.weight'))
    best['model'][last] = torch.zeros_like(best['model'][last])
    best['model'][last.replace('weight', 'bias')] = torch.tensor([0., 1.])
    best['eval_return'], best['frame'] = 12.5, 100
    torch.save(best, run_dir / 'best.pt')
    env, right = gym.make('CartPole-v1'), []
    for i in range(2):
        env.reset(seed=10_000 + i)
        total, done = 0., False
        while not done:
            _, reward, terminated, truncated, _ = env.step(1)
            total, done = total + reward, terminated or truncated
        right.append(total)
    done = run('evaluate', run_dir, '--episodes', 2, check=0)
    assert f'greedy episodes: {np.mean(right):.1f} ' in done.stdout, done.stdout
    assert 'network: best.pt (the best evaluation, 12.5 at step 100)' in done.stdout
    latest = run('evaluate', run_dir, '--episodes', 2, '--latest', check=0)
    assert 'network: checkpoint.pt (the latest, step 300)' in latest.stdout


def test_a_bad_eval_setting_is_a_usage_error_and_writes_nothing(tmp_path):
    for args, message in [(('--eval-seed', 100), '--eval-seed 100 would evaluate on the training env'),
                          (('--eval-episodes', 0), '--eval-episodes 0 is not an int >= 1'),
                          (('--confirm-episodes', -1), '--confirm-episodes -1 is not an int >= 0'),
                          (('--eval-every', -1), '--eval-every -1 is not an int >= 0'),
                          (('--log-every', 0), '--log-every 0 is not an int >= 1')]:
        done = run('train', '--out', tmp_path / 'run', '--steps', 100, *args)
        # a usage error: train's usage, then one line naming the flag, exit 2
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and message in lines[-1] and len(lines) == 2, done.stderr
    assert not (tmp_path / 'run').exists() or not any((tmp_path / 'run').iterdir())


def test_a_resumed_board_hides_the_points_past_its_checkpoint(tmp_path):
    board = RunBoard(tmp_path, every=100)
    for step in (100, 200, 300): board.add('return/eval', step / 100, step)
    board.close()
    board = RunBoard(tmp_path, every=100, start=200)   # resumed from a checkpoint at step 200
    board.add('return/eval', 30., 300)
    board.close()
    assert scalars(tmp_path)['return/eval'] == [(100, 1.), (200, 2.), (300, 30.)]


def test_the_buffer_counts_stale_updates_and_saves_the_count():
    steps = [SimpleStep(state=[float(i)], action=0, next_state=[float(i)], terminated=False, truncated=False, reward=0.,
                        total_reward=0., env_id=0, step_n=i, episode_n=0) for i in range(6)]
    buf = PrioritizedExperienceReplay(None, bs=4, max_sz=4, seed=0)
    buf.add(SimpleStep.from_steps(steps[:4]))
    idxs = buf.sample().idxs
    buf.add(SimpleStep.from_steps(steps[4:]))                    # slots 0 and 1 get new steps
    buf.update_priorities(idxs, torch.ones(len(idxs)))
    assert buf.stale_dropped == int(np.isin(idxs.numpy(), [0, 1]).sum()) > 0
    other = PrioritizedExperienceReplay(None, bs=4, max_sz=4)
    other.load_state_dict(buf.state_dict())
    assert other.stale_dropped == buf.stale_dropped
    with pytest.raises(AttributeError): buf.stale_dropped = 0  # read-only


# envs that need an extra

def test_box2d_missing_names_the_box2d_extra(tmp_path):
    done = run('train', '--env', 'LunarLander-v3', '--out', tmp_path / 'run', command=without('Box2D'))
    assert done.returncode == 1 and 'Traceback' not in done.stderr, done.stderr
    # in this clone the line names the clone's editable install first, then the registry's form
    assert done.stderr.strip() == f"fastrl_per train: error: LunarLander-v3 needs Box2D, which is not installed: {install_line('box2d')}"
    assert not (tmp_path / 'run').exists()


def test_fastprogress_missing_names_the_cli_extra(tmp_path):
    done = run('train', '--out', tmp_path / 'run', command=without('fastprogress'))
    assert done.returncode == 1 and 'Traceback' not in done.stderr, done.stderr
    assert done.stderr.strip() == ("fastrl_per train: error: train shows progress, plots and writes TensorBoard events "
                                   f"with fastprogress, which is not installed: {install_line('cli')}")
    assert not (tmp_path / 'run').exists()


def test_a_cli_package_failing_to_import_is_named_with_its_error(tmp_path):
    "A fastprogress that is there but lacks a dependency of its own (as 1.1 without fasthtml) is not 'not installed'."
    package = tmp_path / 'site' / 'fastprogress'
    package.mkdir(parents=True)
    (package / '__init__.py').write_text('import fastrl_per_test_missing_dependency\n')
    path = os.pathsep.join(p for p in (str(tmp_path / 'site'), os.environ.get('PYTHONPATH')) if p)
    done = subprocess.run([*COMMAND, 'train', '--out', str(tmp_path / 'run')], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, PYTHONPATH=path))
    assert done.returncode == 1 and 'Traceback' not in done.stderr, done.stderr
    assert done.stderr.strip() == (
        "fastrl_per train: error: train needs fastprogress (ModuleNotFoundError: No module named "
        f"'fastrl_per_test_missing_dependency'), installed but failing to import: {install_line('cli')} "
        "installs what it needs")
    assert not (tmp_path / 'run').exists()


def test_ale_py_missing_names_the_atari_extra(tmp_path):
    done = run('train', '--env', 'ALE/Pong-v5', '--out', tmp_path / 'run', command=without('ale_py'))
    assert done.returncode == 1 and 'Traceback' not in done.stderr, done.stderr
    assert done.stderr.strip() == f"fastrl_per train: error: Atari envs need ale-py and OpenCV: {install_line('atari')}"
    assert not (tmp_path / 'run').exists()


@pytest.mark.parametrize('learner', [EARLY, ('--model', 'recurrent', '--env', 'CartPoleNoVelocity-v1', '--warmup', 1,
                                                    '--train-every', 2)])
def test_evaluating_leaves_training_as_it_was(tmp_path, learner):
    "The same seed with and without evaluations: the same losses, returns and schedules (the training agent, its window and RNGs untouched)."
    runs = {}
    for every in (0, 100):
        out = tmp_path / f'every{every}'
        run('train', '--out', out, '--steps', 250, '--eval-every', every, '--eval-episodes', 2, '--no-progress', *learner, check=0)
        runs[every] = metrics(out)
    columns = ('frame', 'update', 'loss', 'epsilon', 'beta', 'episode_return')
    assert [[r[c] for c in columns] for r in runs[0]] == [[r[c] for c in columns] for r in runs[100]]
    assert [r['frame'] for r in runs[100] if r['eval_return']] == ['100', '200', '250']
    assert (tmp_path / 'every100' / 'best.pt').exists() and not (tmp_path / 'every0' / 'best.pt').exists()


def test_a_budget_ending_on_open_n_step_windows_still_evaluates_the_final_network(tmp_path):
    "With 3-step returns the first two steps of an episode store nothing: a run whose budget ends there evaluates on its last update's row."
    from fastrl_per.learners.learner import Learner
    from fastrl_per.run.train import train
    torch.set_num_threads(1)
    probe = Learner('CartPole-v1', seed=0, total_steps=400, bs=16, n_step=3)
    probe.fit(400)
    end = next(frame for frame, _ in probe.episodes.returns if frame > 150)   # an episode ends at step `end`: step end + 1 opens a window only
    out = tmp_path / 'run'
    train(out=str(out), total_steps=end + 1, bs=16, n_step=3, eval_every=100, eval_episodes=2, confirm_episodes=0,
          solved=0, progress=False)   # the best evaluation alone chooses best.pt
    rows = metrics(out)
    assert int(rows[-1]['frame']) == end and rows[-1]['eval_return'] != ''   # the final evaluation, on the last update's row
    assert len(rows) == int(rows[-1]['update'])                               # still one row per update
    evals = [int(r['frame']) for r in rows if r['eval_return']]
    assert evals == [*range(100, end, 100), end] and [s for s, _ in scalars(out)['return/eval']] == evals
    best = torch.load(out / 'best.pt', weights_only=True)
    assert best['eval_return'] == pytest.approx(max(float(r['eval_return']) for r in rows if r['eval_return']), rel=1e-5)
