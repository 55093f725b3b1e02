"""SB3's Atari agents with frames stored once: `SB3Buffer`/`PrioritizedSB3Buffer(optimize_memory_usage=True)` fed a real
Pong rollout of two envs, episodes cut by a time limit, store what SB3's own buffer stores, in under a third of the
bytes of SB3's `optimize_memory_usage` buffer; SB3's `DQN` and our `PrioritizedDQN` train from them."""
import numpy as np
import pytest
import torch

pytest.importorskip('stable_baselines3')
pytest.importorskip('ale_py')
import gymnasium as gym
from stable_baselines3 import DQN
from stable_baselines3.common.buffers import ReplayBuffer as SB3ReplayBuffer
from stable_baselines3.common.env_util import make_atari_env
from stable_baselines3.common.vec_env import VecFrameStack, VecTransposeImage
from fastrl_per.integrations.sb3 import SB3Buffer, PrioritizedSB3Buffer, PrioritizedDQN


def pong(n_envs=2, max_episode_steps=60):
    "Pong as SB3's Atari agents see it: AtariWrapper, 4 frames stacked, the stack axis first; episodes cut short."
    env = make_atari_env('PongNoFrameskip-v4', n_envs=n_envs, seed=0, env_kwargs=dict(max_episode_steps=max_episode_steps))
    return VecTransposeImage(VecFrameStack(env, 4))


def rollout(env, buffers, steps, seed=0):
    "Random actions, each step handed to every buffer as SB3's off-policy loop hands it (the true final observation)."
    rng, obs = np.random.default_rng(seed), env.reset()
    for _ in range(steps):
        actions = rng.integers(0, env.action_space.n, env.num_envs)
        new_obs, rewards, dones, infos = env.step(actions)
        next_obs = new_obs.copy()
        for i, done in enumerate(dones):
            if done: next_obs[i] = infos[i]['terminal_observation']
        for b in buffers: b.add(obs, next_obs, actions, rewards, dones, infos)
        obs = new_obs


@pytest.mark.parametrize('cls', [SB3Buffer, PrioritizedSB3Buffer])
def test_frames_stored_once_give_back_what_sb3_stores(cls):
    env = pong()
    spaces = env.observation_space, env.action_space
    ours = cls(400, *spaces, device='cpu', n_envs=2, optimize_memory_usage=True)
    sb3 = SB3ReplayBuffer(400, *spaces, device='cpu', n_envs=2)   # plain: every stack kept as given
    rollout(env, [ours, sb3], 150)   # 300 transitions, five episode ends per env, all timeouts
    rows, envs = np.divmod(np.arange(300), 2)
    stored = ours.buffer.memory[:]
    assert sb3.timeouts.sum() >= 8   # the comparison covers episode starts
    np.testing.assert_array_equal(stored.state.numpy(), sb3.observations[rows, envs])
    np.testing.assert_array_equal(stored.next_state.numpy(), sb3.next_observations[rows, envs])
    np.testing.assert_array_equal(stored.action.numpy(), sb3.actions[rows, envs])
    want = sb3.dones[rows, envs] * (1 - sb3.timeouts[rows, envs])   # a timeout is not terminal
    np.testing.assert_array_equal(stored.terminated.numpy(), want.astype(bool))
    assert ours.buffer.storage.n_frames < 300 * 1.5   # one new frame a transition, four at an episode start; not eight
    batch = ours.sample(32)
    assert batch.observations.shape == (32, 4, 84, 84) and batch.observations.dtype == torch.uint8


def test_a_third_of_the_bytes_of_sb3_optimize_memory_usage():
    "Bytes allocated per transition, both buffers filled to 5,000 transitions of two Pong envs."
    env = pong(max_episode_steps=500)
    spaces = env.observation_space, env.action_space
    ours = SB3Buffer(5000, *spaces, device='cpu', n_envs=2, optimize_memory_usage=True)
    sb3 = SB3ReplayBuffer(5000, *spaces, device='cpu', n_envs=2, optimize_memory_usage=True,
                          handle_timeout_termination=False)   # SB3 allows no timeout handling with it
    rollout(env, [ours, sb3], 2500)
    sb3_bytes = sum(a.nbytes for a in (sb3.observations, sb3.actions, sb3.rewards, sb3.dones, sb3.timeouts))
    ours_bytes = ours.buffer.storage.nbytes()
    assert ours_bytes <= sb3_bytes / 3, f"{ours_bytes / 5000:.0f} bytes a transition against SB3's {sb3_bytes / 5000:.0f}"


@pytest.mark.parametrize('algo, buffer_class', [(DQN, SB3Buffer), (PrioritizedDQN, PrioritizedSB3Buffer)])
def test_dqn_trains_from_frames_stored_once(algo, buffer_class, one_thread):
    model = algo('CnnPolicy', pong(), buffer_size=2000, learning_starts=200, train_freq=8, batch_size=16, seed=0,
                 device='cpu', optimize_memory_usage=True, replay_buffer_class=buffer_class)
    before = [p.detach().clone() for p in model.q_net.parameters()]
    model.learn(400)
    assert model._n_updates > 5 and model.replay_buffer.optimize_memory_usage
    assert any(not torch.equal(a, b) for a, b in zip(before, model.q_net.parameters()))
    assert model.replay_buffer.buffer.storage.n_frames < 1.5 * model.replay_buffer.size() * 2   # two envs


def test_optimize_memory_usage_refuses_what_is_not_a_frame_stack():
    box = gym.spaces.Box(0, 1, (4,), np.float32)
    with pytest.raises(ValueError, match=r"uint8 image stacks .* shape \(4,\) and dtype float32"):
        SB3Buffer(100, box, gym.spaces.Discrete(2), optimize_memory_usage=True)
