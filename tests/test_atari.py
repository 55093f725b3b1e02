"Atari envs: real `ALE/Pong-v5` observations, stacks that shift by one frame, episode boundaries, and the missing-extra message."
import importlib.util, re, sys
import numpy as np
import pytest
from fastrl_per.stages.atari import is_atari, make_atari_env, make_atari_vector_env, register_atari

needs_ale = pytest.mark.skipif(importlib.util.find_spec('ale_py') is None,
                               reason="ale-py is not installed: pip install 'fastrl_per[atari]'")

def test_missing_extra_names_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, 'ale_py', None)  # what `import ale_py` sees when it is not installed
    for make in (register_atari, lambda: make_atari_env('ALE/Pong-v5')):
        with pytest.raises(ValueError, match=r"pip install 'fastrl_per\[atari\]'"): make()

def test_is_atari_reads_only_the_id():
    assert is_atari('ALE/Breakout-v5') and not is_atari('CartPole-v1') and not is_atari(3)

@needs_ale
def test_pong_observations_are_stacks_of_84x84_uint8_frames_shifting_by_one():
    env = make_atari_env('ALE/Pong-v5')
    obs, _ = env.reset(seed=1)
    assert obs.shape == (4, 84, 84) and obs.dtype == np.uint8
    assert (obs == obs[0]).all()  # a new episode is padded with its first frame
    rng = np.random.default_rng(0)
    changed = 0
    for _ in range(60):
        nxt, reward, terminated, truncated, _ = env.step(int(rng.integers(env.action_space.n)))
        assert nxt.shape == (4, 84, 84) and nxt.dtype == np.uint8
        np.testing.assert_array_equal(nxt[:3], obs[1:])
        changed += not np.array_equal(nxt[3], obs[3])
        obs = nxt
    assert changed > 30  # the newest frame is a new screen, not a copy

@needs_ale
def test_episode_boundaries_in_the_vector_env():
    envs = make_atari_vector_env('ALE/Pong-v5', nenvs=2, max_episode_steps=5)
    envs.action_space.seed(0)   # the actions seeded as the reset is: random ones left the paddles still in about 1 run of 20, the frames then equal
    obs, _ = envs.reset(seed=0)
    for t in range(5):
        prev = obs
        obs, reward, terminated, truncated, _ = envs.step(envs.action_space.sample())
        np.testing.assert_array_equal(obs[:, :3], prev[:, 1:])
        assert truncated.tolist() == [t == 4] * 2 and not terminated.any()
    final = obs
    obs, reward, terminated, truncated, _ = envs.step(envs.action_space.sample())  # next-step autoreset
    assert reward.tolist() == [0., 0.] and not (terminated | truncated).any()
    for o, f in zip(obs, final):
        assert (o == o[0]).all()  # the new episode's stack holds no frame of the old one
        assert not np.array_equal(o[-1], f[-1])
    envs.close()

@needs_ale
def test_terminal_on_life_loss_ends_an_episode_when_a_life_is_lost():
    env = make_atari_env('ALE/Breakout-v5', terminal_on_life_loss=True)
    env.reset(seed=0)
    lives = env.unwrapped.ale.lives()
    for _ in range(2000):
        _, _, terminated, truncated, info = env.step(env.action_space.sample())
        if terminated or truncated: break
    assert terminated and info['lives'] == lives - 1

@needs_ale
@pytest.mark.parametrize('kwargs, message', [
    (dict(env_id='CartPole-v1'), 'not an Atari id'),
    (dict(env_id='ALE/NoSuchGame-v5'), 'unknown Atari env id'),
    (dict(env_id='ALE/Pong-v5', frame_skip=0), 'frame_skip'),
    (dict(env_id='ALE/Pong-v5', noop_max=-1), 'noop_max'),
    (dict(env_id='ALE/Pong-v5', stack=1.5), 'stack'),
    (dict(env_id='ALE/Pong-v5', max_episode_steps=0), 'max_episode_steps'),
])
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message): make_atari_env(**kwargs)
    with pytest.raises(ValueError, match=message): make_atari_vector_env(nenvs=2, **kwargs)


# The learner and the command on Atari ids

import csv, os, subprocess
from pathlib import Path
import torch
from fastrl_per.core import SimpleStep
from fastrl_per.replay.frames import FrameStorage
from fastrl_per.replay.memory import ReplayBuffer
from fastrl_per.replay.store import SavedArrays
from fastrl_per.replay.per import PrioritizedReplayBuffer
from fastrl_per.learners.learner import Learner
from fastrl_per.run.cli import main

COMMAND = [str(Path(sys.executable).parent / 'fastrl_per')]
ENV = dict(os.environ, OMP_NUM_THREADS='1')  # `evaluate` uses torch's default threads; one is fastest for these small batches


def run(*args, timeout=600):
    "Run the installed command niced; its CompletedProcess, which must have succeeded."
    done = subprocess.run(['nice', *COMMAND, *map(str, args)], capture_output=True, text=True, env=ENV, timeout=timeout)
    assert done.returncode == 0, (done.returncode, done.stdout[-2000:], done.stderr[-2000:])
    return done


def metric_rows(run_dir):
    with open(Path(run_dir) / 'metrics.csv', newline='') as f: return list(csv.DictReader(f))


@needs_ale
def test_train_resume_and_evaluate_on_pong(tmp_path):
    "The real command on ALE/Pong-v5: updates after a small warm-up, a checkpoint that resumes, an evaluation of the run."
    out = tmp_path / 'pong'
    first = run('train', '--env', 'ALE/Pong-v5', '--steps', 200, '--buffer-size', 250, '--warmup', 60, '--eval-every', 0,
                '--checkpoint-every', 100, '--out', out)
    assert 'replay buffer: 250 transitions, 1.8 MB once full' in first.stdout  # 250 × ~7.3 kB
    assert '200 steps, 36 updates' in first.stdout  # one update every 4 env steps from step 60: (200 - 60) / 4 + 1
    checkpoint = torch.load(out / 'checkpoint.pt', weights_only=True)
    config = checkpoint['config']
    assert (config['bs'], config['train_every'], config['target_every'], config['lr'], config['explore_steps']) == (32, 4, 2_500, 6.25e-5, 1_000_000)
    replay = SavedArrays(out / 'replay').read()   # the replay is saved beside checkpoint.pt, which names the save
    assert checkpoint['replay'] is None and checkpoint['replay_save'] == replay['save_id']
    assert (config['max_sz'], config['warmup'], replay['kind'], replay['storage']) == (250, 60, 'PrioritizedReplayBuffer', 'FrameStorage')
    assert 'conv' not in str(checkpoint['model'].keys()) and 'features.0.weight' in checkpoint['model']  # the Nature network
    rows = metric_rows(out)
    assert len(rows) == 36 and not (out / 'best.pt').exists()
    manifest = (out / 'run.json').read_text()
    assert '"observation_shape": [\n    4,\n    84,\n    84\n  ]' in manifest and '"replay_bytes"' in manifest
    # one evaluation episode, not confirmed: Pong episodes are long, and confirmation is tested on CartPole (test_eval_tb)
    resumed = run('train', '--resume', out, '--steps', 280, '--no-progress', '--eval-every', 10_000, '--eval-episodes', 1,
                  '--confirm-episodes', 0)
    assert '280 steps, 56 updates' in resumed.stdout and 'best network (best.pt): greedy' in resumed.stdout
    assert torch.load(out / 'checkpoint.pt', weights_only=True)['env_steps'] == 280
    rows = metric_rows(out)
    assert [int(r['update']) for r in rows] == list(range(1, 57)) and int(rows[-1]['frame']) == 280 and rows[-1]['eval_return'] != ''
    done = run('evaluate', out, '--episodes', 1)
    assert 'mean return over 1 greedy episode' in done.stdout and 'best.pt' in done.stdout


@needs_ale
def test_rewards_are_clipped_for_training_only(one_thread):
    "Space Invaders scores 5 to 30 points an invader: the buffer trains on +1, the returns keep the score."
    learner = Learner('ALE/SpaceInvaders-v5', seed=0, bs=8, max_sz=400, warmup=8, train_every=100, n_step=1)   # 1-step, as the Atari defaults
    learner.fit(400)
    stored = learner.replay.memory[:]
    assert set(stored.reward.tolist()) == {0., 1.}
    assert stored.total_reward.max() >= 10 and stored.total_reward.max() > (stored.reward > 0).sum()


def frame_step(frames, shape=(4, 6, 6), dtype=np.uint8):
    stack = np.full(shape, frames, dtype)
    return SimpleStep(state=stack, action=0, next_state=np.concatenate([stack[1:], np.full((1, *shape[1:]), frames + 1, dtype)]))


@pytest.mark.parametrize('make', [lambda: ReplayBuffer(bs=2, storage=FrameStorage(8)), lambda: PrioritizedReplayBuffer(bs=2, storage=FrameStorage(8))])
@pytest.mark.parametrize('bad, message', [
    (frame_step(1, shape=(4, 6, 7)), 'the storage holds stacks of (4, 6, 6)'),
    (frame_step(1, dtype=np.float32), 'must hold uint8 frames'),
])
def test_bad_frames_are_refused_before_anything_is_written(make, bad, message):
    buf = make()
    buf.add(frame_step(0))
    before = (len(buf), buf.storage.n_frames, buf.storage.frames.copy())
    with pytest.raises(ValueError, match=re.escape(message)): buf.add(bad)
    with pytest.raises(ValueError): buf.add([frame_step(1), bad])  # a batch: its good step is not written either
    assert (len(buf), buf.storage.n_frames) == before[:2] and np.array_equal(buf.storage.frames, before[2])


def test_the_learner_and_the_command_name_the_extra_without_ale_py(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, 'ale_py', None)
    with pytest.raises(ValueError, match=r"pip install 'fastrl_per\[atari\]'"): Learner('ALE/Pong-v5')
    with pytest.raises(SystemExit) as e: main(['train', '--env', 'ALE/Pong-v5', '--out', str(tmp_path / 'run')])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 1 and len(err) == 1 and "pip install 'fastrl_per[atari]'" in err[0]
    assert not (tmp_path / 'run').exists()


@needs_ale
def test_a_buffer_larger_than_the_machine_is_refused(capsys, tmp_path):
    with pytest.raises(ValueError, match=r'a replay buffer of 100,000,000 transitions needs 7\d\d\.\d GB.*`max_sz`'):
        Learner('ALE/Pong-v5', max_sz=100_000_000)
    with pytest.raises(SystemExit) as e:   # the command names its flag
        main(['train', '--env', 'ALE/Pong-v5', '--buffer-size', '100000000', '--out', str(tmp_path / 'run')])
    assert e.value.code == 1 and 'choose a smaller --buffer-size' in capsys.readouterr().err
