#!/usr/bin/env python
"""MinAtar speed: env steps per second and CPU per update of the whole `Learner` pipeline on MinAtar Breakout and
SpaceInvaders, prioritized and uniform replay, against a hand-written loop doing the same work; and the env step alone.

Run from the repository root (the minatar extra: `.venv/bin/pip install -e '.[minatar]'`):

    .venv/bin/python benchmarks/minatar_speed.py             # 3 runs of 3,000 timed env steps per game and replay
    .venv/bin/python benchmarks/minatar_speed.py --quick     # smoke run: 1 run of 200 env steps after 100
    .venv/bin/python benchmarks/minatar_speed.py [--games Breakout SpaceInvaders] [--frames 3000] [--runs 3]

**The env step alone.** `--env-steps` steps of the game's gymnasium env (`make_env`, the `-v1` id with sticky actions
0.1 and difficulty ramping) with random actions, resetting at each episode's end: what any agent pays per step.

**The training pipeline.** `Learner('MinAtar/<game>-v1', replay=...)` with the command's MinAtar defaults
(`id_defaults`: Revisiting Rainbow's update of a batch of 32 every 4 env steps, plain one-step DQN targets, hard
target copies every 250 updates, `MinAtarQNetwork`, no gradient clipping, Adam at 2.5e-4; bool grids in the ring)
except for a short run's numbers, given to both sides: a `--warmup` of 500 and epsilon already at its end value 0.01 (the network acts on
99 steps in 100, as through most of a run). The hand-written loop (`HandLoop`, cleanrl style) does the same work
with the same parts in one plain loop: `EnvRun`, `EpsilonGreedy`, the `PrioritizedReplayBuffer` or `ReplayBuffer`
core, the same network, the target max_a Q_target(s', a), importance-weighted smooth L1 loss, fused `adam`, the hard
target copy, and for prioritized replay the priority update and beta annealed over the updates the Learner plans.
Before timing, `check_same_work` runs both for 300 env steps from one seed (`target_every` 10, so copies happen) and
asserts identical metric rows (loss, epsilon, beta, weight, frame) and episode returns.

Each timed run starts a fresh pipeline and loop, steps each `--warmup` env steps untimed, then times `--frames` env
steps of each in alternating turns of `--block` (pipeline, loop, loop, pipeline, ...), so both see the same load; the
ratio is taken within each run and the median over `--runs` is reported. torch runs on one thread. "CPU ms per
env step" is CPU time over the timed env steps: the env step, the acting, and a quarter of an update.
"""
from __future__ import annotations
import argparse, shlex, statistics, sys, time
from copy import deepcopy
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from fastrl_per.stages.atari import id_defaults, make_env
from fastrl_per.learners.conv import MinAtarQNetwork
from fastrl_per.learners.dqn import EpsilonGreedy, adam, discrete_env_dims
from fastrl_per.stages.envs import EnvRun
from fastrl_per.learners.learner import Learner
from fastrl_per.replay.memory import ReplayBuffer
from fastrl_per.stages.nstep import nstep_discount
from fastrl_per.replay.per import PrioritizedReplayBuffer
from fastrl_per.replay.priorities import kind_defaults

sys.path.insert(0, str(Path(__file__).parent))
from overhead import alternate  # noqa: E402   (turns of equal load, shared with the CartPole and Pong benchmarks)
from hand_loop import EnvSteps  # noqa: E402   (the loop's transitions, counted as the Learner counts them)

GOAL, CHECK_STEPS, REPLAYS = 1.1, 300, ('per', 'uniform')


def env_step_us(env_id: str, steps: int, seed: int = 0) -> float:
    "Median over 5 rounds of µs per `env.step` of `env_id` with random actions, resetting at each episode's end."
    env = make_env(env_id)
    env.reset(seed=seed); env.action_space.seed(seed)
    rounds = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(steps // 5):
            _, _, terminated, truncated, _ = env.step(env.action_space.sample())
            if terminated or truncated: env.reset()
        rounds.append((time.perf_counter() - t) / (steps // 5) * 1e6)
    env.close()
    return statistics.median(rounds)


def settings(env_id: str, total_steps: int, warmup: int, target_every: int | None = None) -> dict:
    "The MinAtar defaults for a run of `total_steps`, with a short run's warm-up and epsilon at its end value."
    c = id_defaults(env_id, total_steps)
    return dict(c, warmup=warmup, explore_start=c['explore_end'], target_every=target_every or c['target_every'], eps=1e-6)


class HandLoop(EnvSteps):
    "DQN on a MinAtar game as one plain loop (cleanrl style): the same work as `Learner`, prioritized or uniform."
    def __init__(self, env_id: str, replay: str, seed: int, c: dict):
        assert c['n_step'] == 1 and not c['double'] and c['max_grad_norm'] is None and c['gradient_steps'] == 1
        self.c, self.per = c, replay == 'per'
        obs, n_actions = discrete_env_dims(env_id, images=True)
        torch.manual_seed(seed)
        self.model = MinAtarQNetwork(obs[-1], n_actions, side=obs[0])
        self.target = deepcopy(self.model).requires_grad_(False)
        self.opt, self.params = adam(self.model, c['lr']), list(self.model.parameters())
        self.agent = EpsilonGreedy(self.model, n_actions, c['explore_start'], c['explore_end'], c['explore_steps'], seed=seed)
        super().__init__(EnvRun(env_id, 1, seed), self.agent)
        if self.per:
            alpha, beta = kind_defaults('proportional', None, None)
            self.buf = PrioritizedReplayBuffer(max_sz=c['max_sz'], bs=c['bs'], alpha=alpha, beta=beta, eps=c['eps'],
                                               seed=seed)
        else: self.buf = ReplayBuffer(max_sz=c['max_sz'], bs=c['bs'], seed=seed)
        self.updates = self.items = 0
        self.start = max(c['bs'], c['warmup'])   # transitions stored before the first update
        self.planned = (c['total_steps'] - self.start) // c['train_every'] + 1   # as the Learner plans beta

    def fit(self, steps: int) -> list[dict]:
        rows = []
        for step in self.transitions(steps):
            self.buf.add(step)
            self.items += 1
            if self.items % self.c['train_every'] == 0 and len(self.buf) >= self.start: rows.append(self.update())
        return rows

    def update(self) -> dict:
        c, model, b = self.c, self.model, self.buf.sample()
        with torch.no_grad():
            y = b.reward + nstep_discount(b, c['gamma']) * self.target(b.next_state).max(-1).values * (~b.terminated)
        q = model(b.state).gather(-1, b.action.long().unsqueeze(-1)).squeeze(-1)
        loss = (F.smooth_l1_loss(q, y, reduction='none') * b.weights).mean()
        for p in self.params: p.grad = None
        loss.backward()
        self.opt.step()
        self.updates += 1
        if self.updates % c['target_every'] == 0: self.target.load_state_dict(model.state_dict())
        if self.per:
            self.buf.update_priorities(b.idxs, (y - q).detach().abs())
            self.buf.anneal_beta(min(1., self.updates / self.planned))
        return dict(loss=loss.item(), epsilon=self.agent.epsilon, beta=self.buf.beta if self.per else 1.0,
                    weight=b.weights.mean().item(), frame=self.frames)


def pipeline(env_id: str, replay: str, seed: int, c: dict) -> Learner:
    return Learner(env_id, replay=replay, seed=seed, device='cpu', **c)


def check_same_work(env_id: str, replay: str, seed: int, frames: int = CHECK_STEPS, warmup: int = 100) -> int:
    "Same seed, same metric rows and episode returns from pipeline and loop. Returns the rows compared."
    c = settings(env_id, frames, warmup, target_every=10)   # hard target copies within the check
    a, b = pipeline(env_id, replay, seed, c), HandLoop(env_id, replay, seed, c)
    ra, rb = a.fit(frames), b.fit(frames)
    assert len(ra) == len(rb) == frames // c['train_every'] - warmup // c['train_every'] + 1, (len(ra), len(rb))
    for x, y in zip(ra, rb): assert x == y, (x, y)
    assert a.episodes.returns == b.returns
    return len(ra)


def timed_pair(env_id: str, replay: str, seed: int, c: dict, warmup: int, frames: int, block: int) -> dict:
    """(env steps/s wall, CPU ms per env step) of `frames` timed env steps for a fresh pipeline and a fresh loop, each
    stepped `warmup` env steps first; turns of `block` env steps alternate."""
    learners = dict(pipeline=pipeline(env_id, replay, seed, c), loop=HandLoop(env_id, replay, seed, c))
    for l in learners.values(): l.fit(warmup)
    spent = alternate({k: l.fit for k, l in learners.items()}, frames, block)
    assert learners['pipeline'].episodes.env_steps == learners['loop'].frames == warmup + frames
    assert spent['pipeline'][2] == spent['loop'][2] > 0, spent   # the same updates on both sides
    return {k: (frames / w, cpu * 1000 / frames) for k, (w, cpu, n) in spent.items()}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--games', nargs='+', default=['Breakout', 'SpaceInvaders'],
                   help='MinAtar games (ids MinAtar/<game>-v1)')
    p.add_argument('--frames', type=int, default=3000, help='timed env steps per run, each side')
    p.add_argument('--runs', type=int, default=3, help='timed runs of each side, per game and replay')
    p.add_argument('--block', type=int, default=500, help='env steps per turn when pipeline and loop alternate')
    p.add_argument('--warmup', type=int, default=500,
                   help="the replay's warm-up and the untimed env steps of each run (>= 32)")
    p.add_argument('--env-steps', type=int, default=20_000, help='steps of the env-alone timing')
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--quick', action='store_true',
                   help='smoke run: 1 run of 200 env steps after 100, 2,000 env-alone steps')
    a = p.parse_args(argv)
    if a.quick: a.frames, a.runs, a.block, a.warmup, a.env_steps = 200, 1, 100, 100, 2_000
    if min(a.frames, a.runs, a.block, a.env_steps) < 1 or a.warmup < 32:
        p.error('need frames, runs, block, env-steps >= 1, warmup >= 32')
    torch.set_num_threads(1)
    print(f"command: `{shlex.join([sys.executable, *sys.argv])}`\n")
    print(f"torch {torch.__version__} on one thread, CPU; MinAtar defaults (an update of 32 every 4 env steps, target "
          f"copy every 250 updates) with warm-up {a.warmup} and epsilon 0.01; {a.frames:,} timed env steps per run after "
          f"{a.warmup} untimed, in turns of {a.block}; runs: {a.runs}\n")
    rows = []
    for game in a.games:
        env_id = f'MinAtar/{game}-v1'
        alone = env_step_us(env_id, a.env_steps, a.seed)
        for replay in REPLAYS:
            n = check_same_work(env_id, replay, a.seed)
            c = settings(env_id, a.warmup + a.frames, a.warmup)
            runs = [timed_pair(env_id, replay, a.seed + r, c, a.warmup, a.frames, a.block) for r in range(a.runs)]
            med = lambda side, i: statistics.median(run[side][i] for run in runs)
            ratios = [run['loop'][0] / run['pipeline'][0] for run in runs]   # pipeline time per env step / loop's
            print(f"  {env_id} {replay}: same work ({n} identical rows); pipeline/loop per run: "
                  f"{', '.join(f'{x:.3f}' for x in ratios)}", flush=True)
            rows.append((env_id, replay, alone, med('pipeline', 0), med('pipeline', 1), med('loop', 0), med('loop', 1),
                         statistics.median(ratios)))
    print(f"\n| game | replay | env step alone, µs | pipeline env steps/s | pipeline CPU ms / env step | "
          f"loop env steps/s | "
          f"loop CPU ms / env step | pipeline / loop (time per env step) |")
    print('|---|---|--:|--:|--:|--:|--:|--:|')
    for env_id, replay, alone, ps, pc, ls, lc, ratio in rows:
        print(f"| {env_id} | {replay} | {alone:.1f} | {ps:.0f} | {pc:.2f} | {ls:.0f} | {lc:.2f} | **{ratio:.3f}×** |")
    print('\n| game | prioritized / uniform, pipeline CPU per env step | prioritized / uniform, loop |')
    print('|---|--:|--:|')
    for per, uni in zip(rows[::2], rows[1::2]):
        print(f"| {per[0]} | {per[4] / uni[4]:.3f}× | {per[6] / uni[6]:.3f}× |")
    worst = max(r[-1] for r in rows)
    print(f"\ngoal: pipeline ≤ {GOAL}× loop in every row: worst {worst:.3f}× -> {'met' if worst <= GOAL else 'MISSED'}")


if __name__ == '__main__': main()
