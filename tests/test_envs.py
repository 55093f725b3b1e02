"""Episode-boundary transitions of `GymTransformBlock`, checked against hand-stepped gymnasium envs.

The stepper uses a `SyncVectorEnv` in next-step autoreset mode. Sub-env `i` of a vector env
reset with `seed=s` is reset with `seed=s+i`; when an episode ends, the vector env's autoreset
calls `env.reset()` WITHOUT a seed (gymnasium/vector/sync_vector_env.py, `step`), so the
sub-env continues its own RNG. A plain `gym.make` env reset once with the same seed, fed the
same actions and reset without a seed after each episode, must give the same transitions.
"""
import gymnasium as gym
import numpy as np
import pytest
import torch

from fastrl_per.core import SimpleStep
from fastrl_per.stages.envs import GymTransformBlock


def stream(env_id, n, seed, agent=None, nenvs=1):
    return list(GymTransformBlock(agent, n=n, seed=seed, nenvs=nenvs)([env_id]).unbatch())


def obs_tensor(obs):
    return torch.as_tensor(np.asarray(obs))


def hand_check(env_id, steps, seed):
    """Replay `steps`' actions in a plain env and compare every field of every step.

    Returns the indices of the steps that ended an episode."""
    env = gym.make(env_id)
    obs, _ = env.reset(seed=seed)
    ret, step_n, episode_n, ends = 0.0, 0, 0, []
    for i, s in enumerate(steps):
        assert isinstance(s, SimpleStep) and not s.is_batch
        assert torch.equal(s.state, obs_tensor(obs)), f"step {i}: state is not the previous observation"
        next_obs, reward, terminated, truncated, _ = env.step(s.action.item())
        ret += float(reward)
        step_n += 1
        assert torch.equal(s.next_state, obs_tensor(next_obs)), f"step {i}: next_state"
        assert s.reward.item() == pytest.approx(float(reward)), f"step {i}: reward"
        assert s.terminated.item() is bool(terminated), f"step {i}: terminated"
        assert s.truncated.item() is bool(truncated), f"step {i}: truncated"
        assert s.step_n.item() == step_n, f"step {i}: step_n"
        assert s.episode_n.item() == episode_n, f"step {i}: episode_n"
        assert s.total_reward.item() == pytest.approx(ret), f"step {i}: total_reward"
        if terminated or truncated:
            ends.append(i)
            obs, _ = env.reset()  # no seed: the vector env's autoreset continues the env's RNG
            ret, step_n, episode_n = 0.0, 0, episode_n + 1
        else:
            obs = next_obs
    env.close()
    return ends


@pytest.mark.parametrize("seed", [0, 7])
def test_cartpole_matches_hand_stepped_env_across_episodes(seed):
    steps = stream('CartPole-v1', 250, seed)
    assert len(steps) == 250
    ends = hand_check('CartPole-v1', steps, seed)
    assert len(ends) >= 4, "random CartPole should end several episodes in 250 steps"
    for i in ends[:-1]:
        nxt = steps[i + 1]
        assert nxt.step_n.item() == 1
        assert nxt.episode_n.item() == steps[i].episode_n.item() + 1
        assert nxt.total_reward.item() == nxt.reward.item()
        assert steps[i].total_reward.item() == pytest.approx(float(steps[i].step_n.item()))  # CartPole pays 1 per step


def test_agent_actions_are_used_and_appear_in_stream():
    calls = []

    def always_right(states):
        calls.append(states.shape)
        return torch.ones(len(states), dtype=torch.int64)

    steps = stream('CartPole-v1', 60, 3, agent=always_right)
    assert [s.action.item() for s in steps] == [1] * 60
    assert calls and all(tuple(c) == (1, 4) for c in calls)
    # pushing right all the time topples the pole within a few dozen steps: several episodes
    ends = hand_check('CartPole-v1', steps, 3)
    assert len(ends) >= 3
    assert all(steps[i].terminated.item() for i in ends)


def test_mountaincar_truncates_at_200_with_true_final_observation():
    seed = 5
    steps = stream('MountainCar-v0', 230, seed)
    env = gym.make('MountainCar-v0')
    obs, _ = env.reset(seed=seed)
    for i in range(200):
        s = steps[i]
        assert torch.equal(s.state, obs_tensor(obs))
        obs, reward, terminated, truncated, _ = env.step(s.action.item())
        assert torch.equal(s.next_state, obs_tensor(obs))
        assert s.step_n.item() == i + 1
        assert not s.terminated.item()
        assert s.truncated.item() is (i == 199), f"step {i + 1}"
    assert truncated and not terminated
    last = steps[199]
    assert last.truncated.item() and not last.terminated.item()
    assert last.reward.item() == -1.0
    assert last.total_reward.item() == -200.0
    assert torch.equal(last.next_state, obs_tensor(obs)), "next_state must be the true final observation"
    reset_obs, _ = env.reset()
    assert not torch.equal(last.next_state, obs_tensor(reset_obs))
    first = steps[200]
    assert torch.equal(first.state, obs_tensor(reset_obs)), "the next step starts from the reset observation"
    assert first.step_n.item() == 1 and first.episode_n.item() == 1
    assert first.reward.item() == -1.0  # a real transition, not a reset row (reward 0)
    # the rest of the stream keeps matching the hand env
    assert hand_check('MountainCar-v0', steps, seed) == [199]


def test_no_reset_rows_in_stream():
    steps = stream('CartPole-v1', 400, 11)
    assert all(s.reward.item() == 1.0 for s in steps), "a reward-0 row is a leaked autoreset step"
    ends = [i for i, s in enumerate(steps) if s.terminated.item() or s.truncated.item()]
    assert len(ends) >= 5
    for i in ends:
        if i + 1 < len(steps):
            assert not torch.equal(steps[i + 1].state, steps[i].next_state)
            assert steps[i + 1].step_n.item() == 1
    for i in range(len(steps) - 1):
        if i not in ends:
            assert torch.equal(steps[i + 1].state, steps[i].next_state)
            assert steps[i + 1].step_n.item() == steps[i].step_n.item() + 1


def test_three_envs_rows_and_consistent_substreams():
    seed, nenvs = 2, 3
    batches = list(GymTransformBlock(None, n=120, seed=seed, nenvs=nenvs)(['CartPole-v1']))
    assert len(batches[0]) == 3 and batches[0].env_id.tolist() == [0, 1, 2]
    steps = [s for b in batches for s in b]
    assert {s.env_id.item() for s in steps} == {0, 1, 2}
    for k in range(nenvs):
        sub = [s for s in steps if s.env_id.item() == k]
        assert len(sub) > 100
        for a, b in zip(sub, sub[1:]):
            if a.terminated.item() or a.truncated.item():
                assert b.step_n.item() == 1 and b.episode_n.item() == a.episode_n.item() + 1
            else:
                assert torch.equal(b.state, a.next_state)
                assert b.step_n.item() == a.step_n.item() + 1
        # sub-env k of a vector env reset with seed s is seeded s + k
        ends = hand_check('CartPole-v1', sub, seed + k)
        assert ends, f"env {k} should end an episode"
    # the sub-envs are seeded differently
    firsts = [next(s for s in steps if s.env_id.item() == k).state for k in range(nenvs)]
    assert not torch.equal(firsts[0], firsts[1]) and not torch.equal(firsts[1], firsts[2])


def test_same_seed_same_stream_different_seed_different():
    a, b, c = stream('CartPole-v1', 80, 4), stream('CartPole-v1', 80, 4), stream('CartPole-v1', 80, 5)
    assert a == b
    assert a != c
    assert not torch.equal(a[0].state, c[0].state)


def test_second_iterator_continues_the_stream():
    pipe = GymTransformBlock(None, n=40, seed=9)(['CartPole-v1']).unbatch()
    first, second, third = list(pipe), list(pipe), list(pipe)
    assert len(first) == len(second) == len(third) == 40
    assert first + second + third == stream('CartPole-v1', 120, 9)
