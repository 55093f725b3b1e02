"Atari envs: real `ALE/Pong-v5` observations, stacks that shift by one frame, episode boundaries, and the missing-extra message."
import importlib.util, sys
import numpy as np
import pytest
from fastrl_per.atari import is_atari, make_atari_env, make_atari_vector_env, register_atari

needs_ale = pytest.mark.skipif(importlib.util.find_spec('ale_py') is None,
                               reason="ale-py is not installed: pip install -e '.[atari]'")

def test_missing_extra_names_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, 'ale_py', None)  # what `import ale_py` sees when it is not installed
    for make in (register_atari, lambda: make_atari_env('ALE/Pong-v5')):
        with pytest.raises(ValueError, match=r"pip install -e '\.\[atari\]'"): make()

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
