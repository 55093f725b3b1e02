"""`fastrl_per.integrations.sb3`: PrioritizedDQN end to end with one and four envs, save/load with the buffer (pickled, and in the
directory format with no pickle), timeouts as SB3 stores them, the importance weights in the loss, the priorities fed
back, one seed fixing the run of every prioritized class, and SB3 kept an optional extra."""
import json, pickle, subprocess, sys
import numpy as np
import pytest
import torch

pytest.importorskip('stable_baselines3')
import gymnasium as gym
import torch.nn.functional as F
from stable_baselines3.common.buffers import ReplayBuffer as SB3ReplayBuffer
from stable_baselines3.common.env_util import make_vec_env
from fastrl_per.replay.per import PrioritizedReplayBuffer
from fastrl_per.integrations.sb3 import (PrioritizedDQN, PrioritizedSB3Buffer, PrioritizedSamples, PrioritizedSAC, PrioritizedTD3,
                            PrioritizedDDPG, PrioritizedQRDQN, PrioritizedTQC)
from conftest import assert_state_equal

CARTPOLE = gym.make('CartPole-v1')


def short_dqn(env='CartPole-v1', **kwargs):
    "A PrioritizedDQN that trains every 4 steps from step 500, seeded (its buffer too), on the CPU."
    kwargs = dict(dict(learning_starts=500, train_freq=4, seed=0, device='cpu', replay_buffer_kwargs=dict(seed=0)),
                  **kwargs)
    return PrioritizedDQN('MlpPolicy', env, **kwargs)


def test_one_env_learns_and_feeds_priorities_back(one_thread):
    model = short_dqn().learn(2000)
    buffer = model.replay_buffer
    assert buffer.size() == len(buffer.buffer) == 2000
    assert model._n_updates == (2000 - 500) // 4
    assert buffer.buffer.beta == 1.0   # annealed to final_beta over learn()'s 2000 steps
    first = buffer.buffer.max_priority
    changed = buffer.priorities != first
    assert changed.mean() > 0.3, f"only {changed.mean():.0%} of the priorities moved from the first, {first}"
    assert 0 < model.logger.name_to_value['train/mean_weight'] <= 1


def test_four_envs_share_one_tree(one_thread):
    env = make_vec_env('CartPole-v1', n_envs=4, seed=0)
    model = short_dqn(env, buffer_size=1000).learn(2000)
    buffer = model.replay_buffer
    assert (buffer.n_envs, buffer.buffer_size, buffer.buffer.max_sz) == (4, 250, 1000)   # SB3's capacity: 250 rows of 4
    assert buffer.full and buffer.size() == 250 and len(buffer.buffer) == 1000
    assert model._n_updates == len(range(512, 2001, 16))   # a rollout: 4 steps of 4 envs; trained from step 512
    assert len(np.unique(buffer.priorities)) > 500
    # the four envs' steps sit side by side: slot 4 r + e holds env e's step of row r, which follows on from
    # that env's previous step unless an episode ended there
    memory = buffer.buffer.memory[:]
    state, next_state, term = memory.state.numpy(), memory.next_state.numpy(), memory.terminated.numpy()
    follows = np.all(state[4:] == next_state[:-4], axis=1)
    assert follows.mean() > 0.8 and not follows[term[:-4]].any()


def test_save_and_load_keep_the_priorities(tmp_path, one_thread):
    model = short_dqn().learn(1000)
    model.save(tmp_path / 'model')
    model.save_replay_buffer(tmp_path / 'buffer.pkl')
    loaded = PrioritizedDQN.load(tmp_path / 'model', env=gym.make('CartPole-v1'), device='cpu')
    loaded.load_replay_buffer(tmp_path / 'buffer.pkl')
    a, b = model.replay_buffer, loaded.replay_buffer
    assert isinstance(b, PrioritizedSB3Buffer) and b.size() == a.size() == 1000
    np.testing.assert_array_equal(b.priorities, a.priorities)
    assert_state_equal(b.buffer.state_dict(), a.buffer.state_dict())   # storage, tree, max priority, sampler
    assert torch.equal(b.sample(16).idxs, a.sample(16).idxs)
    loaded.learn(200, reset_num_timesteps=False)   # training goes on from the loaded buffer
    assert b.size() == 1200


def test_the_buffer_core_pickles_cleanly():
    buf = PrioritizedReplayBuffer(64, bs=8, seed=0)
    buf.extend(state=np.random.rand(40, 3).astype(np.float32), action=np.arange(40), reward=np.ones(40, np.float32),
               next_state=np.random.rand(40, 3).astype(np.float32), terminated=np.zeros(40, bool))
    batch = buf.sample()
    buf.update_priorities(batch.idxs, torch.arange(8.))
    again = pickle.loads(pickle.dumps(buf))
    assert_state_equal(again.state_dict(), buf.state_dict())
    assert torch.equal(again.sample().idxs, buf.sample().idxs)
    again.update_priorities(again.sample().idxs, torch.ones(8))   # the lock came back


@pytest.mark.parametrize('handle', [True, False])
def test_timeouts_are_stored_as_sb3_stores_them(handle):
    "The same random steps of 3 envs into SB3's buffer and ours: every (row, env) gives the same done."
    rng = np.random.default_rng(0)
    spaces = CARTPOLE.observation_space, CARTPOLE.action_space
    sb3 = SB3ReplayBuffer(30, *spaces, device='cpu', n_envs=3, handle_timeout_termination=handle)
    ours = PrioritizedSB3Buffer(30, *spaces, device='cpu', n_envs=3, handle_timeout_termination=handle)
    for _ in range(10):
        obs, next_obs = rng.random((2, 3, 4), dtype=np.float32)
        done = rng.random(3) < 0.5
        infos = [{'TimeLimit.truncated': True} if d and rng.random() < 0.5 else {} for d in done]
        action, reward = rng.integers(0, 2, 3), rng.random(3)
        for b in (sb3, ours): b.add(obs, next_obs, action, reward, done, infos)
    rows, envs = np.divmod(np.arange(30), 3)
    want = sb3.dones[rows, envs] * (1 - sb3.timeouts[rows, envs]) if handle else sb3.dones[rows, envs]
    assert 0 < want.sum() < sb3.dones.sum() or not handle
    np.testing.assert_array_equal(ours.buffer.memory[:].terminated.numpy(), want.astype(bool))
    np.testing.assert_array_equal(ours.buffer.memory[:].state.numpy(), sb3.observations[rows, envs])
    np.testing.assert_array_equal(ours.buffer.memory[:].action.numpy(), sb3.actions[rows, envs])
    np.testing.assert_array_equal(ours.buffer.memory[:].reward.numpy(), sb3.rewards[rows, envs])


def test_a_timeout_bootstraps_end_to_end(one_thread):
    "CartPole cut at 12 steps: only steps that left the pole's bounds are terminal, the cut ones are not."
    env = make_vec_env('CartPole-v1', n_envs=2, seed=0, env_kwargs=dict(max_episode_steps=12))
    model = short_dqn(env, learning_starts=10_000).learn(600)   # random actions: stored, not trained on
    memory = model.replay_buffer.buffer.memory[:]
    x, theta = memory.next_state[:, 0].numpy(), memory.next_state[:, 2].numpy()
    fell = (np.abs(x) > 2.4) | (np.abs(theta) > 12 * 2 * np.pi / 360)
    term = memory.terminated.numpy()
    assert (term == fell).all()
    assert term.sum() < model._episode_num   # some episodes ended by the cut, and were not stored as terminal


def test_the_weights_scale_each_sample_loss():
    model = short_dqn()
    obs = torch.randn(6, 4)
    weights = torch.tensor([[1.], [0.5], [0.], [0.25], [1.], [0.1]])
    batch = PrioritizedSamples(obs, torch.randint(0, 2, (6, 1)), torch.randn(6, 4), torch.zeros(6, 1),
                               torch.ones(6, 1), None, torch.arange(6), weights)
    td, loss = model.td_loss(batch)
    with torch.no_grad():
        target = 1 + model.gamma * model.q_net_target(batch.next_observations).max(dim=1).values[:, None]
    current = model.q_net(obs).gather(1, batch.actions)
    torch.testing.assert_close(td, (current - target).detach())
    per_sample = F.smooth_l1_loss(current, target, reduction='none')
    torch.testing.assert_close(loss, (weights * per_sample).mean())
    ones = batch._replace(weights=torch.ones(6, 1))   # weights of one: SB3's own loss
    torch.testing.assert_close(model.td_loss(ones)[1], F.smooth_l1_loss(current, target))


def test_train_applies_the_weights(one_thread):
    "Weights of zero leave no gradient: the loss that trains the network is the weighted one."
    model = short_dqn().learn(600)
    sample = model.replay_buffer.sample

    def zero_weights(batch_size, env=None):
        batch = sample(batch_size, env)
        return batch._replace(weights=torch.zeros_like(batch.weights))
    grads = lambda: [p.grad for p in model.q_net.parameters()]
    model.replay_buffer.sample = zero_weights
    model.train(gradient_steps=1, batch_size=32)
    assert all(g is not None and not g.any() for g in grads())
    model.replay_buffer.sample = sample
    model.train(gradient_steps=1, batch_size=32)
    assert all(g.any() for g in grads())


def test_beta_follows_learn_progress():
    model = short_dqn(replay_buffer_kwargs=dict(beta=0.4, seed=0), final_beta=0.8, learning_starts=100)
    betas = []
    model.learn(1000, callback=lambda *a: betas.append(model.replay_buffer.buffer.beta) or True)   # True: go on
    assert betas[0] == pytest.approx(0.4, abs=0.01) and betas[-1] == pytest.approx(0.8, abs=0.01)
    assert np.all(np.diff(betas) >= 0)
    model.replay_buffer.anneal_beta(1.0069, 0.8)   # SB3's progress can overshoot 1: held at final
    assert model.replay_buffer.buffer.beta == pytest.approx(0.8)


@pytest.mark.parametrize('kwargs, message', [
    (dict(replay_buffer_class=SB3ReplayBuffer), 'has no priorities'),
    (dict(optimize_memory_usage=True, replay_buffer_kwargs=dict(handle_timeout_termination=False)),
     'optimize_memory_usage'),
    (dict(replay_buffer_kwargs=dict(alpha=-1)), 'alpha'),
])
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message): short_dqn(**kwargs)


def test_sb3_stays_an_optional_extra():
    "`fastrl_per.all` never imports SB3; without it, `fastrl_per.integrations.sb3` is one line naming the extra."
    all_ = "import sys, fastrl_per.all; assert 'stable_baselines3' not in sys.modules"
    subprocess.run([sys.executable, '-c', all_], check=True, timeout=120)
    for missing in ('stable_baselines3', 'sb3_contrib'):
        blocked = f"import sys; sys.modules[{missing!r}] = None; import fastrl_per.integrations.sb3"
        r = subprocess.run([sys.executable, '-c', blocked], capture_output=True, text=True, timeout=120)
        assert r.returncode != 0
        assert r.stderr.strip().splitlines()[-1] == ("ImportError: fastrl_per.integrations.sb3 needs Stable-Baselines3 and "
                                                     "sb3-contrib, which are not installed: pip install 'fastrl_per[sb3]'")


@pytest.mark.parametrize('env_id', ['FrozenLake-v1', 'MountainCarContinuous-v0'])
def test_discrete_observations_and_box_actions_are_stored_as_sb3_stores_them(env_id):
    "FrozenLake's Discrete observations; a Box action (what SAC or TD3 would store): the same rows as SB3's buffer."
    env = gym.make(env_id)
    spaces = env.observation_space, env.action_space
    sb3 = SB3ReplayBuffer(40, *spaces, device='cpu', n_envs=2)
    ours = PrioritizedSB3Buffer(40, *spaces, device='cpu', n_envs=2)
    for _ in range(20):
        obs, next_obs, action = (np.array([space.sample() for _ in range(2)]) for space in (spaces[0], *spaces))
        for b in (sb3, ours): b.add(obs, next_obs, action, np.ones(2), np.zeros(2, bool), [{}, {}])
    rows, envs = np.divmod(np.arange(40), 2)
    memory = ours.buffer.memory[:]
    np.testing.assert_array_equal(memory.state.numpy(), sb3.observations[rows, envs])
    np.testing.assert_array_equal(memory.action.numpy(), sb3.actions[rows, envs])
    batch = ours.sample(8)
    assert batch.observations.dtype == torch.as_tensor(sb3.observations).dtype
    assert batch.actions.dtype == torch.as_tensor(sb3.actions).dtype


def test_vec_normalize_normalises_the_sampled_batch(one_thread):
    from stable_baselines3.common.vec_env import VecNormalize
    env = VecNormalize(make_vec_env('CartPole-v1', n_envs=2, seed=0), gamma=0.99)
    model = short_dqn(env, learning_starts=200).learn(400)
    buffer = model.replay_buffer
    stored = buffer.buffer.memory[:].state.numpy()   # the original observations, as SB3 stores them
    batch = buffer.sample(16, env)
    raw = stored[batch.idxs.numpy()]
    assert not np.allclose(batch.observations.numpy(), raw)
    np.testing.assert_allclose(batch.observations.numpy(), env.normalize_obs(raw), rtol=1e-5)


CLASSES = [(PrioritizedDQN, 'CartPole-v1', {}), (PrioritizedQRDQN, 'CartPole-v1', dict(n_quantiles=5)),
           (PrioritizedSAC, 'Pendulum-v1', {}), (PrioritizedTD3, 'Pendulum-v1', {}), (PrioritizedDDPG, 'Pendulum-v1', {}),
           (PrioritizedTQC, 'Pendulum-v1', dict(n_quantiles=5))]


def parameters(model) -> dict:
    "Every tensor of a model's policy and optimisers (and SAC's and TQC's entropy coefficient), by name."
    flat = {}
    def walk(prefix, value):
        if isinstance(value, dict): [walk(f'{prefix}.{k}', v) for k, v in value.items()]
        elif isinstance(value, (list, tuple)): [walk(f'{prefix}.{i}', v) for i, v in enumerate(value)]
        elif isinstance(value, torch.Tensor): flat[prefix] = value.detach().clone()
    walk('', model.get_parameters())
    if getattr(model, 'log_ent_coef', None) is not None: flat['log_ent_coef'] = model.log_ent_coef.detach().clone()
    return flat


@pytest.mark.parametrize('cls, env_id, policy_kwargs', CLASSES, ids=[c[0].__name__ for c in CLASSES])
def test_one_seed_fixes_the_run(cls, env_id, policy_kwargs, one_thread):
    "Two runs of one seed (no buffer seed given) end with every parameter equal; another seed differs."
    def run(seed):
        env = make_vec_env(env_id, n_envs=2, seed=seed)
        model = cls('MlpPolicy', env, learning_starts=60, seed=seed, device='cpu', buffer_size=1000,
                    policy_kwargs=dict(net_arch=[16], **policy_kwargs))
        return parameters(model.learn(180)), model.replay_buffer.priorities
    (a, prio_a), (b, prio_b), (c, _) = run(0), run(0), run(1)
    differ = [k for k in a if not torch.equal(a[k], b[k])]
    assert not differ, f"{cls.__name__}: two runs of seed 0 differ in {differ[:4]}"
    np.testing.assert_array_equal(prio_a, prio_b)
    assert len(np.unique(prio_a)) > 50   # the draws were by priority, and fed back
    assert any(not torch.equal(a[k], c[k]) for k in a), f"{cls.__name__}: seeds 0 and 1 gave the same parameters"


def sampler_state(model):
    return json.loads(model.replay_buffer.buffer.state_dict(columns=False)['rng'])


def test_set_random_seed_restarts_the_sampler_and_a_buffer_seed_wins():
    fresh = lambda seed: np.random.default_rng(seed).bit_generator.state
    model = PrioritizedSAC('MlpPolicy', 'Pendulum-v1', seed=3, device='cpu')
    assert sampler_state(model) == fresh(3)
    model.set_random_seed(11)
    assert sampler_state(model) == fresh(11)
    own = PrioritizedTD3('MlpPolicy', 'Pendulum-v1', seed=3, device='cpu', replay_buffer_kwargs=dict(seed=5))
    assert sampler_state(own) == fresh(5)
    own.set_random_seed(11)
    assert sampler_state(own) == fresh(5)


@pytest.mark.parametrize('n_envs', [1, 4])
def test_the_replay_saves_to_a_directory_and_loads_without_pickle(tmp_path, n_envs, one_thread):
    env = make_vec_env('CartPole-v1', n_envs=n_envs, seed=0)
    model = short_dqn(env, buffer_size=800, learning_starts=300).learn(1200)   # the ring has wrapped
    model.save(tmp_path / 'model')
    model.save_replay(tmp_path / 'replay')
    loaded = PrioritizedDQN.load(tmp_path / 'model', env=make_vec_env('CartPole-v1', n_envs=n_envs), device='cpu')
    loaded.load_replay(tmp_path / 'replay')
    a, b = model.replay_buffer, loaded.replay_buffer
    assert (b.pos, b.full, b.size()) == (a.pos, a.full, a.size()) and a.full
    np.testing.assert_array_equal(b.priorities, a.priorities)
    assert_state_equal(b.buffer.state_dict(), a.buffer.state_dict())
    assert torch.equal(b.sample(16).idxs, a.sample(16).idxs)
    loaded.learn(200, reset_num_timesteps=False)   # training goes on from the loaded replay
    assert b.buffer.storage.n_added == a.buffer.storage.n_added + loaded.num_timesteps - model.num_timesteps > 0


def test_sac_saves_and_loads_with_its_replay(tmp_path, one_thread):
    model = PrioritizedSAC('MlpPolicy', make_vec_env('Pendulum-v1', n_envs=2, seed=0), learning_starts=100, seed=0,
                           device='cpu', policy_kwargs=dict(net_arch=[16])).learn(300)
    model.save(tmp_path / 'sac')
    model.save_replay(tmp_path / 'replay')
    loaded = PrioritizedSAC.load(tmp_path / 'sac', env=make_vec_env('Pendulum-v1', n_envs=2), device='cpu')
    loaded.load_replay(tmp_path / 'replay')
    assert isinstance(loaded.replay_buffer, PrioritizedSB3Buffer) and loaded.final_beta == model.final_beta
    np.testing.assert_array_equal(loaded.replay_buffer.priorities, model.replay_buffer.priorities)
    for k, v in parameters(model).items(): assert torch.equal(parameters(loaded)[k], v), k


class Payload:
    "Unpickling this creates the file `path`: what a crafted replay would do."
    def __init__(self, path): self.path = str(path)
    def __reduce__(self): return (open, (self.path, 'w'))


def test_a_crafted_pickle_is_refused_and_never_run(tmp_path, one_thread):
    marker = tmp_path / 'ran'
    pickle.loads(pickle.dumps(Payload(marker), protocol=2))
    assert marker.exists(), "the payload does not run when unpickled: the test would prove nothing"
    marker.unlink()
    model = short_dqn(learning_starts=100).learn(300)
    model.save_replay(tmp_path / 'replay')
    before = model.replay_buffer.buffer.state_dict()
    (tmp_path / 'crafted.pkl').write_bytes(pickle.dumps(Payload(marker), protocol=2))   # a pickle in place of a save
    crafted_dir = tmp_path / 'crafted'
    crafted_dir.mkdir()
    torch.save(Payload(marker), crafted_dir / 'state.pt')   # a directory whose state is the payload
    spliced = tmp_path / 'spliced'   # a real save, its state.pt swapped for the payload
    spliced.mkdir()
    for f in (tmp_path / 'replay').iterdir(): (spliced / f.name).write_bytes(f.read_bytes())
    torch.save(Payload(marker), spliced / 'state.pt')
    for path, named in [(tmp_path / 'crafted.pkl', 'crafted.pkl'), (crafted_dir, 'state.pt'), (spliced, 'state.pt')]:
        with pytest.raises(ValueError, match=named): model.load_replay(path)
        assert not marker.exists(), f"loading {path} ran the payload"
    assert_state_equal(model.replay_buffer.buffer.state_dict(), before)   # nothing changed


@pytest.mark.parametrize('other, message', [
    (dict(env='Acrobot-v1'), 'holds state of dtype and shape'),
    (dict(buffer_size=500), 'max_sz'),
])
def test_load_replay_refuses_another_model_s_replay(tmp_path, other, message, one_thread):
    short_dqn(learning_starts=100, buffer_size=300).learn(300).save_replay(tmp_path / 'replay')
    model = short_dqn(**dict(dict(buffer_size=300), **other)).learn(120)
    before = model.replay_buffer.buffer.state_dict()
    with pytest.raises(ValueError, match=message): model.load_replay(tmp_path / 'replay')
    assert_state_equal(model.replay_buffer.buffer.state_dict(), before)
    assert model.replay_buffer.size() == 120
