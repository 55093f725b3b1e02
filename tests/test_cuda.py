"""The CUDA paths (issue #25): `sample(device='cuda')` through pinned memory, priorities from TD errors that live on
the GPU, the MLP learner, TD3's own loop and the command training there (its replay on the GPU too, and refused when
it does not fit), and the prepared benchmark capturing its DQN step in a CUDA graph. They run only where torch sees a
GPU and are skipped elsewhere (CI has none). On a GPU machine, with the table:
`python benchmarks/gpu_replay.py && python -m pytest -q tests/test_cuda.py`."""
import json, subprocess, sys
from pathlib import Path

import numpy as np
import pytest
import torch

from test_fields import KINDS, FRAME_PRIORITIZED, filled, flat, assert_same_state
from fastrl_per.learners.learner import Learner
from fastrl_per.replay.per import PrioritizedReplayBuffer
from fastrl_per.learners.td3 import td3

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a CUDA device')


def tensors(batch):
    "Every tensor of a sampled batch by path: each field (a dict field's keys), `idxs` and `weights`."
    return flat(dict(batch.as_dict(), idxs=batch.idxs, weights=batch.weights))


@pytest.mark.parametrize('kind', KINDS)
def test_a_cuda_sample_is_the_host_sample_on_the_gpu(kind):
    buf, _ = filled(kind)
    twin, _ = filled(kind)                 # the same seed and writes: the same draws
    gpu, host = buf.sample(8, device='cuda'), twin.sample(8)
    on_gpu, on_host = tensors(gpu), tensors(host)
    assert on_gpu.keys() == on_host.keys() and 'logp/' in on_gpu and len(gpu) == 8
    for path, t in on_gpu.items():
        assert t.device.type == 'cuda', path
        assert torch.equal(t.cpu(), on_host[path]), path
    assert_same_state(buf.state_dict(), twin.state_dict())   # the storage stays on the host, untouched


@pytest.mark.parametrize('kind', [PrioritizedReplayBuffer, FRAME_PRIORITIZED])
@pytest.mark.parametrize('column', [False, True])
def test_priorities_from_gpu_td_errors_equal_the_host_ones(kind, column):
    buf, _ = filled(kind)
    twin, _ = filled(kind)
    gpu, host = buf.sample(8, device='cuda'), twin.sample(8)
    td = torch.linspace(-2, 3, 8, dtype=torch.float64)
    buf.update_priorities(gpu.idxs, (td[:, None] if column else td).to('cuda', torch.float32))
    twin.update_priorities(host.idxs, td.float())
    np.testing.assert_array_equal(buf.priorities, twin.priorities)


def test_the_learner_trains_on_the_gpu():
    learner = Learner('CartPole-v1', seed=0, total_steps=600, device='cuda')
    rows = learner.fit(600)
    losses = [r['loss'] for r in rows if r.get('loss') is not None]
    assert losses and np.isfinite(losses).all()
    assert next(learner.model.parameters()).device.type == 'cuda'


def test_the_own_loop_td3_runs_on_the_gpu():
    curve = td3(env_steps=1_500, start_steps=500, eval_every=500, eval_episodes=2, device='cuda')
    assert len(curve) == 3 and all(np.isfinite(r) for _, r in curve)


def test_the_command_trains_with_device_auto_on_the_gpu(tmp_path):
    done = subprocess.run([sys.executable, '-m', 'fastrl_per', 'train', '--steps', '600', '--out', str(tmp_path / 'r'),
                           '--no-progress'], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    manifest = json.loads((tmp_path / 'r' / 'run.json').read_text())
    assert manifest['device'].startswith('cuda') and manifest['cuda'], manifest   # the default device='auto' chose it


def test_the_command_keeps_the_replay_on_the_gpu(tmp_path):
    done = subprocess.run([sys.executable, '-m', 'fastrl_per', 'train', '--steps', '600', '--out', str(tmp_path / 'r'),
                           '--device', 'cuda', '--replay-device', 'device', '--no-progress'],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    state = torch.load(tmp_path / 'r' / 'checkpoint.pt', weights_only=True)
    assert state['config']['replay_device'] == 'device' and state['env_steps'] == 600


def test_a_replay_bigger_than_the_gpus_free_memory_is_refused_naming_it():
    with pytest.raises(ValueError, match=r"needs 100\.0 GB, more than cuda:0's free .* or replay_device='host'"):
        Learner('CartPole-v1', device='cuda', replay_device='device', max_sz=1_250_000_000)   # 80 bytes a transition


def test_the_prepared_script_captures_the_atari_step():
    "`benchmarks/gpu_replay.py --quick` on the GPU: every Atari DQN row, captured ones included, is a time."
    script = str(Path(__file__).parent.parent / 'benchmarks' / 'gpu_replay.py')
    done = subprocess.run([sys.executable, script, '--device', 'cuda', '--quick'], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    rows = [r for r in done.stdout.splitlines() if r.startswith('Atari DQN')]
    assert len(rows) == 4 and all(float(r.split()[-1]) > 0 for r in rows), done.stdout
