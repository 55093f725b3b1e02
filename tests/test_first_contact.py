"What a new user sees of a run: run.json holds what a person reads, the checkpoint what a resume needs."
import json, os, re, shutil, signal, subprocess, sys, warnings
from pathlib import Path
import pytest
import numpy as np
import torch
from fastrl_per.all import ReplayBuffer, PrioritizedReplayBuffer
from fastrl_per.run.train import train
from fastrl_per.run.rundir import load_checkpoint
from conftest import scalars, wait_for_saved_steps

pytestmark = pytest.mark.usefixtures('one_thread')   # every test trains on one torch thread (conftest.py)

RUN = dict(env_id='CartPole-v1', eval_every=0, log_every=100, checkpoint_every=100, progress=False)

def numbers(value) -> int:
    "How many numbers `value` (a JSON value) holds in lists, at any depth."
    if isinstance(value, dict): return sum(numbers(v) for v in value.values())
    if isinstance(value, list): return sum(numbers(v) if isinstance(v, (list, dict)) else isinstance(v, (int, float)) for v in value)
    return 0

@pytest.fixture(scope='module')
def stopped_run(tmp_path_factory):
    "A run of 250 of 400 planned steps, as a Ctrl-C leaves one: checkpoint.pt at step 250, run.json beside it."
    out = tmp_path_factory.mktemp('runs') / 'run'
    train(out=str(out), total_steps=250, **RUN)
    return out

def test_run_json_holds_no_internal_state(stopped_run):
    manifest = json.loads((stopped_run / 'run.json').read_text())
    assert 'tb_pending' not in manifest
    assert numbers(manifest) < 40, f"run.json holds {numbers(manifest)} numbers in lists"
    board = load_checkpoint(stopped_run)['board']   # what the TensorBoard writer was averaging: the resume's
    assert board['last'] == 200 and len(board['rows']) > 0, board

def test_a_run_json_of_the_old_layout_still_resumes_exactly(stopped_run, tmp_path):
    "A run saved before the checkpoint kept the TensorBoard state (it was `tb_pending` in run.json) resumes as a new one."
    new, old = tmp_path / 'new', tmp_path / 'old'
    shutil.copytree(stopped_run, new); shutil.copytree(stopped_run, old)
    state = torch.load(old / 'checkpoint.pt', weights_only=True)
    manifest = json.loads((old / 'run.json').read_text())
    manifest['tb_pending'] = state.pop('board')
    torch.save(state, old / 'checkpoint.pt'); (old / 'run.json').write_text(json.dumps(manifest))
    for run in (new, old): train(resume=str(run), total_steps=400, progress=False)
    assert scalars(old) == scalars(new) and len(scalars(new)['train/loss']) == 4
    assert (old / 'metrics.csv').read_text() == (new / 'metrics.csv').read_text()
    assert 'tb_pending' not in json.loads((old / 'run.json').read_text())

COMMAND = str(Path(sys.executable).parent / 'fastrl_per')

def test_a_3000_step_run_shows_each_tenth_once(tmp_path):
    "The plain progress lines (stdout not a terminal) of the issue's 3,000-step run: 10%, 20%, ..., 100%, none skipped."
    done = subprocess.run([COMMAND, 'train', '--steps', '3000', '--solved', '0', '--eval-every', '0', '--out', str(tmp_path / 'run')],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    shown = re.findall(r'^step ([\d,]+) of 3,000 \((\d+)%\)', done.stdout, re.MULTILINE)
    assert [pct for _, pct in shown] == [str(p) for p in range(10, 101, 10)], done.stdout
    assert [step for step, _ in shown] == [f'{s:,}' for s in range(300, 3001, 300)], done.stdout

def venv_clone(tmp_path) -> Path:
    "A directory holding `.venv/bin/fastrl_per`, a link to this command, as a clone's venv holds it."
    clone = tmp_path / 'clone'; (clone / '.venv' / 'bin').mkdir(parents=True)
    (clone / '.venv' / 'bin' / 'fastrl_per').symlink_to(COMMAND)
    return clone

@pytest.mark.parametrize('on_path', [False, True])
def test_the_ctrl_c_line_resumes_as_the_user_typed_the_command(tmp_path, on_path):
    "Started as `.venv/bin/fastrl_per` with the venv off PATH, the line says `.venv/bin/fastrl_per`; on PATH, `fastrl_per`."
    clone = venv_clone(tmp_path)
    path = os.pathsep.join(p for p in os.environ['PATH'].split(os.pathsep) if not (Path(p) / 'fastrl_per').exists())
    env = dict(os.environ, PATH=(f"{clone / '.venv' / 'bin'}{os.pathsep}" if on_path else '') + path)
    typed = 'fastrl_per' if on_path else '.venv/bin/fastrl_per'
    proc = subprocess.Popen(f"exec {typed} train --steps 100000 --solved 0 --checkpoint-every 50 --no-progress --out runs/x",
                            shell=True, cwd=clone, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_saved_steps(proc, clone / 'runs' / 'x', 50, seconds=240)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert stderr.strip().endswith(f'resume with: {typed} train --resume runs/x'), stderr
    resumed = subprocess.run(f"{typed} train --resume runs/x --steps 300 --no-progress", shell=True, cwd=clone, env=env,
                             capture_output=True, text=True, timeout=600)   # the line, typed where the user was
    assert resumed.returncode == 0 and 'resumed at step' in resumed.stdout, resumed.stderr

def test_the_missing_extra_line_installs_from_a_clone_as_typed(tmp_path):
    "In the clone's root the line reads `.venv/bin/pip install -e '.[box2d]'`, then the registry's form."
    root = Path(__file__).resolve().parent.parent
    line = subprocess.run([sys.executable, '-c', 'from fastrl_per.checks import install_line; print(install_line("box2d"))'],
                          cwd=root, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(root))).stdout.strip()
    pip = os.path.relpath(Path(sys.executable).parent / 'pip', root)
    assert line == f"{pip} install -e '.[box2d]' (pip install 'fastrl_per[box2d]' outside a clone)"

def one_transition(state_size=4):
    return dict(state=np.zeros(state_size, np.float32), action=0, reward=1., next_state=np.zeros(4, np.float32), terminated=False)

@pytest.mark.parametrize('cls', [ReplayBuffer, PrioritizedReplayBuffer])
def test_a_schema_error_lists_the_fields_the_user_gave(cls):
    buffer = cls(100, bs=8, seed=0)
    buffer.add(**one_transition())
    with pytest.raises(ValueError) as e: buffer.add(**one_transition(3))
    given, filled = str(e.value).split('schema ')[1].split(' and the fields a SimpleStep fills in: ')
    assert given == '{state: float32[4], action: int64[], next_state: float32[4], terminated: bool[], reward: float32[]}'
    assert filled == 'truncated, total_reward, env_id, step_n, episode_n, n_steps'
    assert len(buffer) == 1   # the refused write stored nothing

def test_a_uniform_batch_larger_than_the_buffer_is_an_error_naming_both_sizes():
    buffer = ReplayBuffer(100, bs=8, seed=0)
    buffer.add(**one_transition())
    with pytest.raises(ValueError, match='cannot sample 8 distinct steps from a buffer holding 1 sampleable: .* at most 1'):
        buffer.sample()
    assert len(buffer.sample(1).idxs) == 1

def test_a_prioritized_batch_larger_than_the_buffer_repeats_its_steps_and_says_so():
    "Prioritized replay draws with replacement (DESIGN's PER rules): eight draws of one step are valid, and warned of."
    buffer = PrioritizedReplayBuffer(100, bs=8, seed=0)
    buffer.add(**one_transition())
    with pytest.warns(UserWarning, match='sampling 8 from a prioritized buffer holding 1 sampleable steps: the batch repeats'):
        batch = buffer.sample()
    assert batch.idxs.tolist() == [0] * 8
    for _ in range(7): buffer.add(**one_transition())
    with warnings.catch_warnings():
        warnings.simplefilter('error')   # as many steps as the batch: no warning
        buffer.sample()
