"""Each prioritized SB3 class's `train()` is a copy of upstream's with the weighting added. Kept honest two ways: with
weights of one and the batches drawn at the same slots, N updates leave every parameter (and optimiser state) equal to
upstream's algorithm's, bit for bit; and the installed upstream sources hash to what the copies were made from."""
import numpy as np
import pytest
import torch

pytest.importorskip('stable_baselines3')
pytest.importorskip('sb3_contrib')
from stable_baselines3 import DQN, SAC, TD3, DDPG
from sb3_contrib import QRDQN, TQC
from stable_baselines3.common.buffers import ReplayBuffer as SB3ReplayBuffer
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.logger import configure
from stable_baselines3.common.type_aliases import ReplayBufferSamples
import fastrl_per.integrations.sb3 as sb3
from fastrl_per.integrations.sb3 import (PrioritizedDQN, PrioritizedSAC, PrioritizedTD3, PrioritizedDDPG, PrioritizedQRDQN,
                            PrioritizedTQC, PrioritizedSB3Buffer, upstream_changes, source_hash)

PAIRS = [(PrioritizedDQN, DQN, 'CartPole-v1', {}), (PrioritizedQRDQN, QRDQN, 'CartPole-v1', {}),
         (PrioritizedSAC, SAC, 'Pendulum-v1', {}), (PrioritizedTD3, TD3, 'Pendulum-v1', {}),
         (PrioritizedDDPG, DDPG, 'Pendulum-v1', {}),
         (PrioritizedTQC, TQC, 'Pendulum-v1', dict(n_quantiles=5, n_critics=2))]


class Recording(PrioritizedSB3Buffer):
    "Our buffer, keeping the slots and weights of every batch it hands out."
    def __init__(self, *args, drawn:list, **kwargs):
        super().__init__(*args, **kwargs)
        self.drawn = drawn

    def sample(self, batch_size, env=None):
        batch = super().sample(batch_size, env)
        self.drawn.append((batch.idxs.numpy().copy(), batch.weights.numpy().copy()))
        return batch


class Replaying(SB3ReplayBuffer):
    "SB3's own buffer, drawing its batches at the given slots (slot = row * n_envs + env, as our buffer lays them)."
    def __init__(self, *args, slots:list, **kwargs):
        super().__init__(*args, **kwargs)
        self.slots = iter(slots)

    def sample(self, batch_size, env=None):
        rows, envs = np.divmod(next(self.slots), self.n_envs)
        data = (self.observations[rows, envs], self.actions[rows, envs], self.next_observations[rows, envs],
                (self.dones[rows, envs] * (1 - self.timeouts[rows, envs])).reshape(-1, 1),
                self.rewards[rows, envs].reshape(-1, 1))
        return ReplayBufferSamples(*map(self.to_torch, data))


def fill(buffer, env, rows=120, seed=0):
    "The same random steps, some terminal and some timeouts, into any SB3-style buffer."
    rng, n = np.random.default_rng(seed), env.num_envs
    space = env.observation_space
    for _ in range(rows):
        obs, next_obs = (np.stack([space.sample() for _ in range(n)]) for _ in range(2))
        action = np.stack([env.action_space.sample() for _ in range(n)])
        done = rng.random(n) < 0.1
        infos = [{'TimeLimit.truncated': True} if d and rng.random() < 0.5 else {} for d in done]
        buffer.add(obs, next_obs, action, rng.random(n).astype(np.float32), done, infos)


def model(cls, env_id, buffer_class, buffer_kwargs, policy_kwargs):
    env = make_vec_env(env_id, n_envs=2, seed=0)
    env.observation_space.seed(0); env.action_space.seed(0)
    m = cls('MlpPolicy', env, seed=0, device='cpu', learning_starts=0, buffer_size=1000,
            replay_buffer_class=buffer_class, replay_buffer_kwargs=buffer_kwargs,
            policy_kwargs=dict(net_arch=[32, 32], **policy_kwargs))
    m.set_logger(configure(None, []))
    fill(m.replay_buffer, env)
    return m


def state(m) -> dict:
    "Every parameter and optimiser state of a model, SAC's and TQC's entropy coefficient too, as flat tensors."
    flat = {}
    def walk(prefix, value):
        if isinstance(value, dict): [walk(f'{prefix}.{k}', v) for k, v in value.items()]
        elif isinstance(value, (list, tuple)): [walk(f'{prefix}.{i}', v) for i, v in enumerate(value)]
        elif isinstance(value, torch.Tensor): flat[prefix] = value.detach().clone()
    walk('', m.get_parameters())
    if getattr(m, 'log_ent_coef', None) is not None: flat['log_ent_coef'] = m.log_ent_coef.detach().clone()
    return flat


@pytest.mark.parametrize('ours, theirs, env_id, policy_kwargs', PAIRS, ids=[p[1].__name__ for p in PAIRS])
def test_weights_of_one_give_upstream_parameters_bit_for_bit(ours, theirs, env_id, policy_kwargs, one_thread):
    drawn = []
    per = model(ours, env_id, Recording, dict(drawn=drawn, alpha=0.0), policy_kwargs)   # alpha 0: all weights one
    up = model(theirs, env_id, Replaying, dict(slots=[]), policy_kwargs)
    before = state(per)
    assert before.keys() == state(up).keys() and all(torch.equal(before[k], v) for k, v in state(up).items())
    per.set_random_seed(1); per.train(gradient_steps=12, batch_size=32)
    assert len(drawn) == 12 and all((w == 1).all() for _, w in drawn)
    up = model(theirs, env_id, Replaying, dict(slots=[idxs for idxs, _ in drawn]), policy_kwargs)
    up.set_random_seed(1); up.train(gradient_steps=12, batch_size=32)
    ours_now, theirs_now = state(per), state(up)
    moved = [k for k in before if not torch.equal(before[k], ours_now[k])]
    assert len(moved) > len(before) // 3, "the updates changed almost nothing: the comparison would prove nothing"
    differ = [k for k in ours_now if not torch.equal(ours_now[k], theirs_now[k])]
    assert not differ, f"{ours.__name__} differs from {theirs.__name__} after 12 updates in {differ[:5]}"


@pytest.mark.parametrize('ours, theirs, env_id, policy_kwargs', PAIRS[:3], ids=[p[1].__name__ for p in PAIRS[:3]])
def test_other_weights_give_other_parameters(ours, theirs, env_id, policy_kwargs, one_thread):
    "The same comparison with alpha 0.6: the weights differ from one, and so do the parameters (the test can fail)."
    drawn = []
    per = model(ours, env_id, Recording, dict(drawn=drawn, alpha=0.6), policy_kwargs)
    per.set_random_seed(1); per.train(gradient_steps=12, batch_size=32)
    assert any((w < 1).any() for _, w in drawn)
    up = model(theirs, env_id, Replaying, dict(slots=[idxs for idxs, _ in drawn]), policy_kwargs)
    up.set_random_seed(1); up.train(gradient_steps=12, batch_size=32)
    ours_now, theirs_now = state(per), state(up)
    assert any(not torch.equal(ours_now[k], theirs_now[k]) for k in ours_now)


def test_the_installed_upstream_is_the_one_copied():
    changed = upstream_changes()
    assert not changed, ("upstream changed since our train() copies were made; re-copy and re-prove: "
                         + ", ".join(changed))


def test_a_changed_upstream_is_named(monkeypatch):
    "If SB3's `SAC.train` were another function, the check names it and both hashes."
    def train(self, gradient_steps, batch_size=64): pass
    monkeypatch.setattr(SAC, 'train', train)
    changed = upstream_changes()
    assert len(changed) == 1 and changed[0].startswith('SAC.train (installed ')
    assert source_hash(train) in changed[0] and sb3.UPSTREAM_HASHES['SAC.train'] in changed[0]
