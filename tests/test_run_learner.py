"""The learner protocol (`RunLearner`): the three learners implement it, and a new learner is one class, one
registration in `LEARNERS` and this test."""
from types import MappingProxyType
import contextlib, csv, inspect
from dataclasses import dataclass, asdict
import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn
from fastrl_per.run import factories
from fastrl_per.run.cli import main
from fastrl_per.learners.dqn import EpisodeReturns, configured
from fastrl_per.run.factories import LEARNERS, Registered, learner_classes
from fastrl_per.learners.learner import Learner, CHECKPOINT_VERSION
from fastrl_per.learners.recurrent_learner import RecurrentLearner
from fastrl_per.learners.apex import ApexRun
from fastrl_per.run.rundir import RunLearner
from fastrl_per.state import Stateful


def test_the_three_learners_implement_the_protocol():
    learners = [Learner('CartPole-v1', total_steps=200), RecurrentLearner('CartPoleNoVelocity-v1', total_steps=200),
                ApexRun('CartPole-v1', actors=2, total_steps=200)]   # Ray starts only when it runs
    assert all(isinstance(learner, RunLearner) for learner in learners)
    assert [type(learner) for learner in learners] == list(learner_classes(models=False).values())
    assert [learner.describe() for learner in learners[:2]] == [None, None]   # in-process: nothing to say
    assert learners[0].start() is learners[0] and learners[2].workers() is learners[2]
    assert not isinstance(object(), RunLearner)
    methods = [n for n, f in vars(RunLearner).items() if inspect.isfunction(f) and not n.startswith('_')]
    assert len(methods) == 8
    for cls, name in [(type(learner), n) for learner in learners for n in methods]:   # the protocol's arguments
        assert list(inspect.signature(getattr(RunLearner, name)).parameters) == \
               list(inspect.signature(getattr(cls, name)).parameters), (cls.__name__, name)


# ---- a new learner: this class, one registration (`registered`), and the test after it ----
@dataclass(frozen=True)
class TinyConfig:
    "TinyQ's settings: each field a flag of `fastrl_per train --model tiny`, its comment the flag's help."
    env_id:str='CartPole-v1' # a gymnasium env with a flat Box observation and discrete actions
    total_steps:int=1_000 # env steps of the run
    lr:float=1e-3 # SGD learning rate
    explore:float=0.1 # probability of a random action
    seed:int=0 # seeds the network, the env and exploration
    def plain(self) -> dict: return asdict(self)


class TinyQ(Stateful):
    "Q-learning of a linear Q-function on each transition as it comes: no replay, no target network."
    replay = replay_nbytes = placement = None   # no replay; nothing runs outside this process
    configs = (TinyConfig,)
    def __init__(self, config:TinyConfig|str|None=None, **settings):
        self.config = c = configured(TinyConfig, config, settings)
        env_id, lr, seed = c.env_id, c.lr, c.seed
        self.env, self.episodes, self.rng = gym.make(env_id), EpisodeReturns(()), np.random.default_rng(seed)
        torch.manual_seed(seed)
        self.model = nn.Linear(self.env.observation_space.shape[0], int(self.env.action_space.n))
        self.agent, self.opt = self, torch.optim.SGD(self.model.parameters(), lr)
        self.obs, self.ret, self.goal = None, 0., 0

    def model_input(self, states): return states.float()   # the agent's part: `greedy_returns` plays `self`
    def q(self, obs): return self.model(torch.as_tensor(obs, dtype=torch.float32))

    def iterate(self, steps:int):
        self.goal = self.episodes.env_steps + steps
        while self.episodes.env_steps < self.goal:
            if self.obs is None: self.obs, _ = self.env.reset(seed=self.config.seed + self.episodes.env_steps)
            random = self.rng.random() < self.config.explore
            action = int(self.rng.integers(self.env.action_space.n)) if random else int(self.q(self.obs).argmax())
            obs, reward, terminated, truncated, _ = self.env.step(action)
            target = reward + (0. if terminated else 0.99 * self.q(obs).max().item())
            loss = (self.q(self.obs)[action] - target) ** 2
            self.opt.zero_grad(); loss.backward(); self.opt.step()
            done, self.ret = terminated or truncated, self.ret + float(reward)
            self.episodes.count(1, [self.ret] if done else ())
            self.obs, self.ret = (None, 0.) if done else (obs, self.ret)
            yield dict(frame=self.episodes.env_steps, loss=loss.item(), epsilon=self.config.explore, beta=1.)

    def stop(self): self.goal = self.episodes.env_steps
    def start(self): return self
    def workers(self): return contextlib.nullcontext()
    def describe(self, resumed:bool=False): return None
    def save_replay(self, save_id:str): raise ValueError("TinyQ keeps no replay")

    def state_dict(self, replay_save=None) -> dict:
        return dict(version=CHECKPOINT_VERSION, learner='TinyQ', config=self.config.plain(), model=self.model.state_dict(),
                    replay_save=None, fresh_episodes="TinyQ does not save its env", **self.episodes.state_dict())
    def check_state(self, state:dict) -> dict:
        if state.get('config') != self.config.plain(): raise ValueError(f"checkpoint config {state.get('config')} differs")
        episodes = dict(env_steps=state['env_steps'], returns=state['returns'])
        return dict(state, episodes=self.episodes.check_state(episodes))
    def assign(self, state:dict):
        self.model.load_state_dict(state['model']); self.episodes.assign(state['episodes'])


@pytest.fixture
def registered(monkeypatch):
    "The one registration: `LEARNERS` in nbs/07c_factories.ipynb with a line `'tiny': Registered(TinyQ, 'tiny')` added."
    monkeypatch.setattr(factories, 'LEARNERS', MappingProxyType({**LEARNERS, 'tiny': Registered(TinyQ, 'tiny')}))


def test_a_new_learner_trains_resumes_and_evaluates_through_the_command(registered, tmp_path, capsys):
    assert isinstance(TinyQ(), RunLearner)
    main(['train', '--model', 'tiny', '--explore', '0.2', '--steps', '400', '--out', str(tmp_path / 'run'),
          '--eval-every', '200', '--no-progress'])
    assert 'steps 400' in capsys.readouterr().out.replace(',', '')
    with open(tmp_path / 'run' / 'metrics.csv') as f: rows = list(csv.DictReader(f))
    assert [r['frame'] for r in rows if r['update']] == [str(i) for i in range(1, 401)]   # an update per env step
    assert sum(r['eval_return'] != '' for r in rows) == 2 and all(r['epsilon'] == '0.2' for r in rows)
    main(['train', '--resume', str(tmp_path / 'run'), '--steps', '600', '--no-progress'])
    assert 'resumed at step 400: the envs started fresh episodes' in capsys.readouterr().out
    main(['evaluate', str(tmp_path / 'run'), '--episodes', '2'])
    assert 'mean return over 2 greedy episodes' in capsys.readouterr().out
    with pytest.raises(SystemExit): main(['train', '--model', 'mlp', '--explore', '0.2', '--out', str(tmp_path / 'x')])
