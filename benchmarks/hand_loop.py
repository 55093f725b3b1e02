"""The env side of the benchmarks' hand-written DQN loops on one env: the transitions an agent makes, counted.

A `HandLoop` (`minatar_speed.py`'s and `atari_speed.py`'s) subclasses `EnvSteps` and takes its transitions from it: its `fit` only stores
them and updates.
"""
from __future__ import annotations


class EnvSteps:
    """Steps `env` (a one-env `fastrl_per.stages.envs.EnvRun`) with `agent`; `frames`: env steps so far, `returns`: the
    (env step, return) of each finished episode, as `Learner.episodes.returns` records them."""
    def __init__(self, env, agent):
        self.env, self.agent, self.frames, self.returns = env, agent, 0, []

    def transitions(self, steps: int):
        "The next `steps` transitions (autoreset rows are not transitions), each counted before it is yielded."
        end = self.frames + steps
        while self.frames < end:
            step = self.env.step(self.agent)
            if not len(step): continue  # an autoreset row: not a transition
            step = step[0]
            self.frames += 1
            if step.terminated or step.truncated: self.returns.append((self.frames, step.total_reward.item()))
            yield step
