"""The `fastrl_per` command end to end: real subprocesses of the installed command and of
`python -m fastrl_per`, real training runs of a few hundred env steps, real files."""
import csv
import inspect
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import fastrl_per
from fastrl_per.learners.learner import Learner
from fastrl_per.learners.recurrent_learner import RecurrentLearner
from fastrl_per.run.rundir import installed_version
from fastrl_per.run.train import command_name
from conftest import wait_for_saved_steps, release

ROOT = Path(__file__).resolve().parents[1]
COMMAND = [str(Path(sys.executable).parent / 'fastrl_per')]
MODULE = [sys.executable, '-m', 'fastrl_per']
ENV = dict(os.environ, COLUMNS='100')  # argparse wraps help to the terminal's width


def run(*args, command=COMMAND, check=None, timeout=300, env=None):
    "Run the command with `args` (and `env`'s variables); the CompletedProcess (text). `check`: the exit status it must have."
    done = subprocess.run([*command, *map(str, args)], capture_output=True, text=True, env=dict(ENV, **(env or {})), timeout=timeout)
    if check is not None: assert done.returncode == check, (done.returncode, done.stdout, done.stderr)
    return done


def assert_one_line_error(done, contains, code=1):
    "A failure: exit status `code` (2: a run directory refused) and one line on stderr naming `contains`, no traceback."
    assert done.returncode == code, (done.returncode, done.stderr)
    assert 'Traceback' not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and contains in lines[0], done.stderr


def assert_usage_error(done, contains, command='train'):
    "A usage error: exit 2, the subcommand's usage, then one line naming `contains`, no traceback."
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert 'Traceback' not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines[0].startswith(f'usage: fastrl_per {command} ') and lines[-1].startswith(f'fastrl_per {command}: error: ')
    assert contains in lines[-1], done.stderr


def metrics(run_dir, updates_only=True):
    "metrics.csv's rows; `updates_only`: without the rows of episodes that ended between updates."
    with open(Path(run_dir) / 'metrics.csv', newline='') as f: rows = list(csv.DictReader(f))
    return [r for r in rows if r['update'] or not updates_only]


def train_briefly(out, *args):
    "A 200-step run into `out` (one checkpoint on the way)."
    return run('train', '--out', out, '--steps', 200, '--checkpoint-every', 100, '--no-progress', *args, check=0)


@pytest.fixture(scope='module')
def short_run(tmp_path_factory):
    "A finished 200-step run that tests read and do not change."
    out = tmp_path_factory.mktemp('runs') / 'short'
    train_briefly(out)
    return out


# issue 16: first contact

@pytest.mark.parametrize('args, code', [([], 2), (['-h'], 0), (['--help'], 0)])
def test_top_level_help_lists_commands_with_examples(args, code):
    done = run(*args, check=code)
    text = done.stdout + done.stderr
    for name in ('train', 'evaluate'): assert f'e.g. fastrl_per {name}' in text
    assert 'exit codes:' in text and '0    success' in text and '130' in text and '143' in text


def test_the_runs_page_shows_the_current_help():
    assert '$ fastrl_per --help\n' + run('--help', check=0).stdout + '```' in (ROOT / 'docs' / 'runs.md').read_text()


CHAIN_MODULE = """
import gymnasium as gym
import numpy as np

class Chain(gym.Env):
    "Walk right along a chain of 6 states to the reward at its end."
    observation_space, action_space = gym.spaces.Box(0, 1, (6,), np.float32), gym.spaces.Discrete(2)
    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.i = 0
        return np.eye(6, dtype=np.float32)[self.i], {}
    def step(self, action):
        self.i = min(self.i + 1, 5) if action == 1 else max(self.i - 1, 0)
        return np.eye(6, dtype=np.float32)[self.i], float(self.i == 5), self.i == 5, False, {}

gym.register('Chain-v0', entry_point=Chain, max_episode_steps=30)
"""

def test_an_env_of_the_users_own_module_trains_evaluates_and_resumes(tmp_path):
    "`--env module:EnvId` imports the module, as gym.make does; run.json keeps the id, so evaluate and --resume import it again."
    (tmp_path / 'mymod.py').write_text(CHAIN_MODULE)
    env, out = dict(PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get('PYTHONPATH', '')])), tmp_path / 'chain'
    done = run('train', '--env', 'mymod:Chain-v0', '--steps', 500, '--out', out, '--no-progress', env=env, check=0)
    assert '500 steps' in done.stdout
    assert json.loads((out / 'run.json').read_text())['config']['env_id'] == 'mymod:Chain-v0'
    assert 'mean return over 2 greedy episodes' in run('evaluate', out, '--episodes', 2, env=env, check=0).stdout
    assert '700 steps' in run('train', '--resume', out, '--steps', 700, '--no-progress', env=env, check=0).stdout
    assert_usage_error(run('evaluate', out), "cannot import module 'mymod' of env id 'mymod:Chain-v0'", 'evaluate')
    assert_usage_error(run('train', '--env', 'Chain-v0', '--out', tmp_path / 'x', env=env), "unknown gymnasium env id 'Chain-v0'")
    assert not (tmp_path / 'x').exists()


@pytest.mark.parametrize('env_id, says', [('cartpole-v1', "did you mean 'CartPole-v1'?"), ('Acrobot-v2', "did you mean 'Acrobot-v1'"),
                                          ('nomodule:CartPole-v1', "cannot import module 'nomodule'")])
def test_a_wrong_env_id_is_a_usage_error_with_the_nearest_ids(env_id, says, tmp_path):
    assert_usage_error(run('train', '--env', env_id, '--out', tmp_path / 'run'), says)
    assert not (tmp_path / 'run').exists()


def test_version():
    for command in (COMMAND, MODULE): assert run('--version', command=command, check=0).stdout.strip() == f'fastrl_per {fastrl_per.__version__}'


@pytest.mark.parametrize('args', [['--help'], ['train', '--help'], ['train', '--steps', 'many']])
def test_python_m_behaves_as_the_command(args):
    a, b = run(*args), run(*args, command=MODULE)
    assert (a.returncode, a.stdout, a.stderr) == (b.returncode, b.stdout, b.stderr)


@pytest.mark.parametrize('name', ['train', 'evaluate'])
def test_subcommand_help_ends_with_examples(name):
    lines = run(name, '--help', check=0).stdout.strip().splitlines()
    examples = lines[lines.index('examples:') + 1:]
    assert 1 <= len(examples) <= 2 and all(l.strip().startswith(f'fastrl_per {name} ') for l in examples)


def test_every_learner_argument_is_a_train_flag_with_its_default():
    text = ' '.join(run('train', '--help-all', check=0).stdout.split()).replace('--no- ', '--no-')  # argparse may wrap after a hyphen
    renamed = dict(env_id='--env', total_steps='--steps', max_sz='--buffer-size', nenvs='--envs')
    for cls in (Learner, RecurrentLearner):
        for name, p in inspect.signature(*cls.configs).parameters.items():   # each setting of its config
            option = renamed.get(name, '--' + name.replace('_', '-'))
            assert option in text, (cls.__name__, name)
            if isinstance(p.default, bool): shown = option if p.default else '--no-' + option[2:]
            else: shown = 'none' if p.default is None else str(p.default)
            assert f'{shown})' in text or f'{shown};' in text, (cls.__name__, name, shown)
    assert '--seed INT seeds the network, envs, exploration and sampling (default: 0)' in text
    assert '--progress, --no-progress show a progress bar (default: --progress)' in text
    assert '--double, --no-double double DQN targets' in text


# issue 44: first contact, round two

@pytest.mark.parametrize('columns, most', [(80, 100), (100, 90)])
def test_train_help_shows_the_common_flags_first_in_at_most_100_lines(columns, most):
    "`train --help`: the run's flags, then the learner's; the recurrent model's, the collector's and Ape-X's only in --help-all."
    short = run('train', '--help', env=dict(COLUMNS=str(columns)), check=0).stdout
    lines = short.splitlines()
    assert len(lines) <= most, f'{len(lines)} lines at {columns} columns'
    assert '--help-all' in '\n'.join(lines[:8]), lines[:8]   # the first lines say where the rest is
    headings = [l for l in lines if l and not l[0].isspace() and l.endswith(':')]
    assert headings[:3] == ['options:', 'the run:', 'the learner (a flag marked "mlp only": --model mlp alone):'], headings
    for hidden in ('--length', '--burn-in', '--recurrent-state', '--collector', '--actors', '--chunk', 'MinAtar ids:',
                   '--replay-device', '--compile'):
        assert hidden not in short.split('options:')[1], hidden
    full = run('train', '--help-all', env=dict(COLUMNS=str(columns)), check=0).stdout
    sections = [l for l in full.splitlines() if l and not l[0].isspace() and l.endswith(':')]
    assert sections == ['options:', 'the run:', 'the learner (a flag marked "mlp only": --model mlp alone):',
                        'the recurrent model only (--model recurrent):', 'the background collector (--collector; mlp only):',
                        'the replay and the update on the device (--replay-device, --compile; mlp only):',
                        'Ape-X on Ray (--actors N; the ray extra):',
                        'the names Stable-Baselines3 and CleanRL use, taken as well:', 'examples:'], sections
    assert full.index('--length INT') > full.index('the recurrent model only') and full.index('--chunk INT') > full.index('Ape-X')


def test_train_help_names_the_choices_and_refuses_others():
    text = ' '.join(run('train', '--help-all', check=0).stdout.split())
    for choice in ('--replay {per,uniform}', '--model {mlp,recurrent}', '--prioritization {proportional,rank,lap}',
                   '--collector {process,thread}', '--recurrent-state {stored,zero}'):
        assert choice in text, choice
    done = run('train', '--replay', 'greedy', check=2)
    assert "argument --replay: invalid choice: 'greedy' (choose from per, uniform)" in done.stderr, done.stderr
    assert "invalid choice: 'lstm' (choose from mlp, recurrent)" in run('train', '--model', 'lstm', check=2).stderr


def test_the_runs_page_says_where_the_other_flags_are():
    page = (ROOT / 'docs' / 'runs.md').read_text()
    assert 'fastrl_per train --help-all' in page


def test_usage_error_exits_2():
    done = run('train', '--steps', 'many', check=2)
    assert "invalid int value: 'many'" in done.stderr


# issue 13: run directories protect the user's files

def test_out_refuses_a_file_and_a_users_directory(tmp_path):
    users = tmp_path / 'mine'
    users.mkdir()
    (users / 'metrics.csv').write_text('my numbers\n')
    (users / 'plot.png').write_bytes(b'\x89PNG mine')
    before = {p.name: p.read_bytes() for p in users.iterdir()}
    assert_one_line_error(run('train', '--out', users, '--steps', 100), 'not a fastrl_per run', 2)
    assert {p.name: p.read_bytes() for p in users.iterdir()} == before
    assert_one_line_error(run('train', '--out', users / 'plot.png', '--steps', 100), 'is a file', 2)
    assert {p.name: p.read_bytes() for p in users.iterdir()} == before
    debug = run('train', '--out', users, '--steps', 100, '--debug')
    assert debug.returncode == 1 and 'Traceback' in debug.stderr


def test_resume_rejects_contradicting_flags_and_changes_nothing(short_run):
    before = {p.name: p.read_bytes() for p in short_run.iterdir() if p.is_file() and p.name != '.lock'}   # its holder's pid
    done = run('train', '--resume', short_run, '--seed', 3, '--alpha', 0.7, '--steps', 300, '--no-progress')
    assert_one_line_error(done, '--seed 3 (the run has 0); --alpha 0.7 (the run has 0.6)')
    assert_one_line_error(run('train', '--resume', short_run, '--out', short_run.parent / 'elsewhere'), 'contradicts --resume', 2)
    assert_one_line_error(run('train', '--resume', short_run, '--model', 'recurrent'), "--model 'recurrent'")
    assert_one_line_error(run('train', '--resume', short_run), 'already has 200 steps')
    assert {p.name: p.read_bytes() for p in short_run.iterdir() if p.is_file() and p.name != '.lock'} == before


def test_run_json_manifest(short_run):
    m = json.loads((short_run / 'run.json').read_text())
    for key in ('fastrl_per', 'git', 'python', 'packages', 'device', 'backend', 'dtype', 'torch_threads', 'cpu', 'cpu_count',
                'config', 'observation_shape', 'action_space', 'legs', 'started', 'ended', 'env_steps', 'updates', 'episodes'):
        assert key in m, key
    assert m['packages']['torch'] == installed_version('torch') and m['config']['seed'] == 0 and m['env_steps'] == 200
    assert release(m['torch_build']) == release(torch.__version__)   # the module's version, with a CUDA build's label
    assert m['updates'] == len(metrics(short_run)) and m['ended'] and 'train --out' in m['legs'][0]['command']
    assert len({p.stat().st_mode for p in short_run.iterdir() if p.is_file()}) == 1


# issue 10: checkpoints that survive Ctrl-C; issue 13: resume, orphans, modes

def interrupt(out, sig, *args):
    "Start a long run, stop it with `sig` once it has checkpointed past 100 steps; the finished process."
    proc = subprocess.Popen([*COMMAND, 'train', '--out', str(out), '--steps', '100000', '--solved', '0', '--checkpoint-every', '50',
                             '--no-progress', *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    wait_for_saved_steps(proc, out, 100, seconds=240)
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=120)
    return proc.returncode, stdout, stderr


def test_sigint_checkpoints_and_resume_continues(tmp_path):
    out = tmp_path / 'run'
    code, _, stderr = interrupt(out, signal.SIGINT)
    assert code == 130, stderr
    assert 'Traceback' not in stderr and len(stderr.strip().splitlines()) == 1
    assert f'resume with: {command_name(COMMAND[0])} train --resume {out}' in stderr   # as the test typed it
    saved = json.loads((out / 'run.json').read_text())
    frames = torch.load(out / 'checkpoint.pt', weights_only=True)['env_steps']
    assert saved['env_steps'] == frames >= 100 and (out / 'plot.png').exists()
    saved['packages']['numpy'] = '0.0.1'  # as if written by another install: the resumed run warns
    (out / 'run.json').write_text(json.dumps(saved))
    (out / 'checkpoint.pt12ab.tmp').write_bytes(b'orphan of a killed save')
    done = run('train', '--resume', out, '--steps', frames + 100, '--no-progress', check=0)
    assert "beta's annealing to 1 is re-planned over" in done.stdout
    assert 'warning: the run was written with numpy 0.0.1' in done.stderr
    assert not list(out.glob('*.tmp'))
    rows = metrics(out)
    assert [int(r['frame']) for r in rows] == sorted(int(r['frame']) for r in rows)
    # the last update's row: at the final step, or up to n_step - 1 = 2 steps before it when an episode ended there
    # (the new episode's first steps only open 3-step windows, storing nothing to update on)
    assert frames + 100 - 2 <= int(rows[-1]['frame']) <= frames + 100
    assert [int(r['update']) for r in rows] == list(range(1, len(rows) + 1))
    resumed = json.loads((out / 'run.json').read_text())
    assert resumed['env_steps'] == frames + 100 and resumed['updates'] == len(rows) and len(resumed['legs']) == 2
    assert float(rows[-1]['beta']) == pytest.approx(1.0)
    assert len({p.stat().st_mode for p in out.iterdir() if p.is_file()}) == 1


def test_sigterm_exits_143_with_a_checkpoint(tmp_path):
    out = tmp_path / 'run'
    code, _, stderr = interrupt(out, signal.SIGTERM, '--replay', 'uniform')
    assert code == 143 and 'stopped by SIGTERM' in stderr and 'Traceback' not in stderr, stderr
    assert torch.load(out / 'checkpoint.pt', weights_only=True)['env_steps'] >= 100


def test_diverging_run_stops_at_a_step_and_keeps_the_checkpoint(tmp_path):
    out = tmp_path / 'run'
    done = run('train', '--out', out, '--steps', 300, '--lr', 1e30, '--no-progress')
    assert_one_line_error(done, 'training stopped at step')
    assert 'checkpoint.pt keeps step 0' in done.stderr
    assert torch.load(out / 'checkpoint.pt', weights_only=True)['env_steps'] == 0


# issue 14: video and version warnings

def test_evaluate_video_records_each_step(short_run, tmp_path):
    import imageio_ffmpeg
    run_dir = tmp_path / 'run'
    shutil.copytree(short_run, run_dir)
    done = run('evaluate', run_dir, '--episodes', 1, '--video', check=0)
    steps = float(done.stdout.split('greedy episode: ')[1].split()[0])  # CartPole: a reward of 1 per step
    video = Path(done.stdout.split('video: ')[1].strip())
    assert video == run_dir / 'videos' / 'greedy-seed10000-episode-0.mp4'
    frames, _ = imageio_ffmpeg.count_frames_and_secs(str(video))
    # RecordVideo captures the reset frame and one per step; moviepy's encoder computes the clip's duration as
    # frames / fps in floating point and, for some lengths, drops the last frame
    assert steps <= frames <= steps + 1


def test_evaluate_video_without_the_extra_names_it(short_run):
    block = 'import sys; sys.modules["moviepy"] = None; from fastrl_per.run.cli import main; main()'
    done = run('evaluate', short_run, '--video', command=[sys.executable, '-c', block])
    assert_one_line_error(done, "pip install 'fastrl_per[video]'")
    assert not (short_run / 'videos').exists()


def test_evaluate_warns_when_versions_differ(short_run, tmp_path):
    run_dir = tmp_path / 'run'
    shutil.copytree(short_run, run_dir)
    m = json.loads((run_dir / 'run.json').read_text())
    m['packages']['torch'], m['git'] = '0.0.1', dict(revision='0' * 40, dirty=False)
    (run_dir / 'run.json').write_text(json.dumps(m))
    done = run('evaluate', run_dir, '--episodes', 1, check=0)
    assert f"fastrl_per: warning: the run was written with torch 0.0.1, this is {installed_version('torch')}" in done.stderr
    assert 'fastrl_per: warning: the run was written at git revision 0000' in done.stderr


# issue 55: first contact, round three

@pytest.mark.parametrize('args, says', [
    (('--stpes', 10), 'unrecognized arguments: --stpes 10; did you mean --steps'),
    (('--batchsize', 64), 'unrecognized arguments: --batchsize 64; did you mean --bs?'),
    (('--steps', 100, '--target-network-frequency', 500), 'use --target-every (in updates, not env steps)'),
    (('--target-update-interval=500',), 'use --target-every (in updates, not env steps)'),
    (('--exploration-fraction', 0.5), 'use --explore-steps (in env steps, not a fraction of --steps)'),
    (('--zzz',), '`fastrl_per train --help` lists the flags'),
    (('--seed', 'abc'), "argument --seed: invalid int value: 'abc'"),
    (('--env', 'cartpole-v1'), "did you mean 'CartPole-v1'?"),
    (('--env', 'Pendulum-v1'), "DQN needs a discrete action space; 'Pendulum-v1' has Box"),
    (('--steps', 0), '--steps 0 is not an int >= 1'),
    (('--batch-size', 0), '--bs 0 is not an int >= 1'),
    (('--model', 'recurrent', '--replay', 'uniform'), "--replay does not apply to --model 'recurrent'")])
def test_a_usage_error_shows_trains_usage_and_exits_2_as_help_says(args, says, tmp_path):
    assert_usage_error(run('train', '--out', tmp_path / 'run', *args), says)
    assert not (tmp_path / 'run').exists()
    assert '  2    a usage error' in run('train', '--help', check=0).stdout + run('--help', check=0).stdout


def test_evaluate_names_the_nearest_flag(tmp_path):
    assert_usage_error(run('evaluate', tmp_path, '--epsiodes', 3), 'did you mean --episodes?', 'evaluate')


@pytest.mark.parametrize('names', [('--eps-start', '--eps-end', '--eps-decay-steps'),
                                   ('--explore-start', '--explore-end', '--explore-steps')], ids=['former', 'today'])
def test_the_exploration_flags_keep_their_former_names(tmp_path, names):
    "`--eps-start`, `--eps-end` and `--eps-decay-steps` set what `--explore-start`, `--explore-end`, `--explore-steps` do."
    out, (start, end, steps) = tmp_path / 'run', names
    run('train', '--out', out, '--steps', 100, '--bs', 16, '--warmup', 50, start, 0.9, end, 0.2, steps, 40,
        '--eval-every', 0, '--solved', 0, '--no-progress', check=0)
    config = json.loads((out / 'run.json').read_text())['config']
    assert {k: config[k] for k in ('explore_start', 'explore_end', 'explore_steps')} == \
        dict(explore_start=0.9, explore_end=0.2, explore_steps=40)
    assert [k for k in config if k.startswith('eps_')] == []


def test_the_help_names_the_exploration_flags_and_lists_their_former_names():
    short, full = run('train', '--help', check=0).stdout, ' '.join(run('train', '--help-all', check=0).stdout.split())
    assert '--explore-end' in short and '--eps-end' not in short
    for name, former in (('start', 'start'), ('end', 'end'), ('steps', 'decay-steps')):
        assert f'--explore-{name}: --eps-{former}' in full, name
    assert '--explore-base: --eps-base' in full


def test_the_names_sb3_and_cleanrl_use_are_flags_too(tmp_path):
    out = tmp_path / 'run'
    run('train', '--out', out, '--total-timesteps', 200, '--batch-size', 16, '--learning-rate', 0.001,
        '--learning-starts', 50, '--train-freq', 2, '--exploration-final-eps', 0.1, '--eval-every', 0, '--solved', 0,
        '--no-progress', check=0)
    config = json.loads((out / 'run.json').read_text())['config']
    assert {k: config[k] for k in ('total_steps', 'bs', 'lr', 'warmup', 'train_every', 'explore_end')} == \
        dict(total_steps=200, bs=16, lr=0.001, warmup=50, train_every=2, explore_end=0.1)
    listed = ' '.join(run('train', '--help-all', check=0).stdout.split())
    for alias in ('--total-timesteps', '--batch-size', '--learning-rate', '--learning-starts', '--train-freq'):
        assert alias in listed, alias


def test_the_runs_page_shows_what_a_mistyped_flag_prints():
    done = run('train', '--stpes', 10, check=2)
    assert '$ fastrl_per train --stpes 10\n' + done.stderr + '```' in (ROOT / 'docs' / 'runs.md').read_text()


def test_the_plot_is_a_two_by_two_grid_readable_shrunk(tmp_path):
    "plot.png: four panels in a 2 x 2 grid (not one wide row), each with both axes labelled, and the kept network marked."
    import matplotlib.image
    out = tmp_path / 'run'
    done = run('train', '--out', out, '--steps', 600, '--eval-every', 300, '--eval-episodes', 2, '--confirm-episodes', 0,
               '--solved', 0, '--no-progress', check=0)
    assert done.stdout.strip().splitlines()[-1].endswith('checkpoint.pt, best.pt, replay/')   # what it wrote, all of it
    assert (out / 'replay').is_dir()
    height, width = matplotlib.image.imread(out / 'plot.png').shape[:2]
    assert (width, height) == (1000, 750)
    from fastrl_per.run.monitor import plot_metrics
    import matplotlib.pyplot as plt
    seen = {}
    original = plt.Figure.savefig
    def keep(fig, *a, **k): seen['axes'] = fig.axes; return original(fig, *a, **k)
    plt.Figure.savefig = keep
    try: plot_metrics(out)
    finally: plt.Figure.savefig = original
    axes = seen['axes']
    assert len(axes) == 4 and all(ax.get_xlabel() and ax.get_ylabel() for ax in axes)
    labels = [t.get_text() for t in axes[0].get_legend().get_texts()]
    assert 'kept (best.pt)' in labels and axes[1].get_yscale() == 'log'
