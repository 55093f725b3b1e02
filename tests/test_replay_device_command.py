"""`fastrl_per train --replay-device device`: the real command with the replay as torch tensors on `--device cpu`.

On the same seed its metrics.csv is byte for byte a host-replay run's: the device tree draws what the host tree draws
from the same uniforms (tests/test_device_replay.py), and the uniform buffer draws the same slots, so every draw of
the run is meant to be equal, for prioritized and uniform replay alike."""
import signal, subprocess, sys
from pathlib import Path
import pytest
import torch
from conftest import wait_for_saved_steps
from test_resume import assert_same, run_state, LOOP_FLAGS
from fastrl_per.learners.learner import Learner
from fastrl_per.run.factories import resume_learner

pytestmark = pytest.mark.usefixtures('one_thread')

COMMAND = [str(Path(sys.executable).parent / 'fastrl_per'), 'train']
DEVICE = ['--device', 'cpu', '--replay-device', 'device']

def run(*flags, timeout=600) -> subprocess.CompletedProcess:
    "The command run with `flags` to its end."
    return subprocess.run([*COMMAND, *flags], capture_output=True, text=True, timeout=timeout)

def test_interrupted_and_resumed_equals_the_run_never_stopped_and_the_host_replay(tmp_path):
    stopped, whole, host = tmp_path / 'stopped', tmp_path / 'whole', tmp_path / 'host'
    flags = ['--steps', '600', *LOOP_FLAGS]
    proc = subprocess.Popen([*COMMAND, '--out', str(stopped), *DEVICE, *flags], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    wait_for_saved_steps(proc, stopped, 100)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 130, stderr
    steps = torch.load(stopped / 'checkpoint.pt', weights_only=True)['env_steps']
    assert 100 <= steps < 600, steps
    resumed = run('--resume', str(stopped), *LOOP_FLAGS)   # the run keeps its replay on the device
    assert resumed.returncode == 0, resumed.stderr
    assert f'resumed at step {steps}: the envs continued their episodes exactly' in resumed.stdout
    for out, device in [(whole, DEVICE), (host, ['--device', 'cpu'])]:
        done = run('--out', str(out), *device, *flags)
        assert done.returncode == 0, done.stderr
    assert (stopped / 'metrics.csv').read_text() == (whole / 'metrics.csv').read_text()
    assert_same(run_state(stopped), run_state(whole))
    assert run_state(stopped)['config']['replay_device'] == 'device'
    assert (whole / 'metrics.csv').read_bytes() == (host / 'metrics.csv').read_bytes()

def test_uniform_replay_on_the_device_trains_as_on_the_host(tmp_path):
    flags = ['--steps', '600', '--replay', 'uniform', *LOOP_FLAGS]
    for out, device in [('device', DEVICE), ('host', ['--device', 'cpu'])]:
        done = run('--out', str(tmp_path / out), *device, *flags)
        assert done.returncode == 0, done.stderr
    assert (tmp_path / 'device' / 'metrics.csv').read_bytes() == (tmp_path / 'host' / 'metrics.csv').read_bytes()

@pytest.mark.parametrize('flags, says', [
    (['--prioritization', 'rank'],
     "--replay-device 'device' draws 'proportional' priorities, got --prioritization 'rank'"),
    (['--prioritization', 'lap'], "got --prioritization 'lap'"),
    (['--replay-storage', 'disk'], "not --replay-storage 'disk'"),
    (['--model', 'recurrent'], "--replay-device does not apply to --model 'recurrent'"),
    (['--actors', '2'], "--replay-device does not apply to --actors"),
    (['--replay-device', 'gpu'], "argument --replay-device: invalid choice: 'gpu'"),
], ids=['rank', 'lap', 'disk', 'recurrent', 'actors', 'unknown'])
def test_what_the_device_storage_refuses_is_a_usage_error_that_writes_nothing(tmp_path, flags, says):
    out = tmp_path / 'run'
    done = run('--out', str(out), *DEVICE, '--steps', '100', *flags)
    assert done.returncode == 2 and says in done.stderr, done.stderr
    assert not out.exists()

def test_a_replay_bigger_than_the_memory_is_refused_naming_the_sizes(tmp_path):
    out = tmp_path / 'run'
    done = run('--out', str(out), *DEVICE, '--steps', '100', '--buffer-size', str(10**11))
    assert done.returncode == 1, done.stderr
    assert "a replay buffer of 100,000,000,000 transitions needs 8000.0 GB, more than this machine's" in done.stderr
    assert not out.exists()

def test_a_checkpoint_from_before_replay_device_resumes_with_the_replay_on_the_host(tmp_path):
    "A checkpoint whose config has no `replay_device` (written before it existed) is a host-replay run."
    learner = Learner('CartPole-v1', seed=0, total_steps=300)
    learner.fit(150)
    state = learner.state_dict()
    del state['config']['replay_device']
    torch.save(state, tmp_path / 'checkpoint.pt')
    resumed, _, notes = resume_learner(tmp_path, None, dict(replay_device='host'))
    assert resumed.config == learner.config and resumed.replay.buffer.device is None, notes
    assert_same(resumed.state_dict(), learner.state_dict())
    with pytest.raises(ValueError, match=r"replay_device='device' \(the run has 'host'\)"):
        resume_learner(tmp_path, None, dict(replay_device='device'))
