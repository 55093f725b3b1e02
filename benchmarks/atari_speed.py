#!/usr/bin/env python
"""Atari speed: sampling stacked transitions from our `FrameStorage` against a plain array of stacks, and
env steps per second of the whole `Learner` pipeline on ALE/Pong-v5 against a hand-written loop.

Run from the repository root:

    .venv/bin/python benchmarks/atari_speed.py                        # both halves (sampling from a full 1,000,000-transition FrameStorage: about 7.2 GB)
    .venv/bin/python benchmarks/atari_speed.py --quick                # smoke run of both: 20,000 transitions; a few hundred Pong steps
    .venv/bin/python benchmarks/atari_speed.py --part sampling        # the sampling half only
    .venv/bin/python benchmarks/atari_speed.py --part pipeline [--frames 4000] [--runs 3] [--block 500] [--warmup 250] [--buffer 10000]

**Sampling** (`--part sampling`). The storage is filled through its real `write` path with a stream
shaped like a training run's: `--nenvs` sub-envs stepped in lockstep, each observation a stack of
four 84×84 uint8 frames, episodes ending at random (mean length `--episode`). Its frames are random
bytes (the content does not change the cost). Then, in `--repeats` rounds, the same 32 distinct
sampleable transitions are

- (a) **ours**: mapped to slots with `valid_slots` and gathered with `FrameStorage.gather`, which
  follows each row's frame chain and rebuilds `state` and `next_state` (a `SimpleStep` batch);
- (b) **plain**: gathered (`np.take`) from two plain arrays of stacked `state` and `next_state`,
  what a storage that keeps both stacks does. A million such rows would take 56 GB, so these
  arrays hold `--plain-capacity` rows (default 50,000, 2.8 GB) and the indices are taken modulo
  that; both stores are far larger than the CPU caches, so both gathers read from memory.

The two run back to back in each round (alternating which goes first); the ratio is taken
within each round and reported as the median over rounds. The goal: (a) at most 1.5× (b).

**Training pipeline** (`--part pipeline`). ALE/Pong-v5 on the CPU, one process, torch on one thread
(`torch.set_num_threads(1)`: the cores are shared, and more threads than free cores slows both sides
by an amount that has nothing to do with the pipeline). The pipeline is
`Learner('ALE/Pong-v5', replay='per', ...)` with the command's Atari defaults (`atari_defaults`: an
update of a batch of 32 every 4 env steps, 1-step double-DQN targets, hard target copies every
`target_every` updates, `NatureQNetwork`, a `PrioritizedReplayBuffer` given a `FrameStorage`, rewards sign-clipped for
training) except for a short run's numbers, passed to both sides: a `--buffer` of 10,000 transitions,
a `--warmup` of 250 and epsilon already at its end value 0.1 (the model acts on nearly every step, as
through most of a long run, not only in the updates). The hand-written loop (`HandLoop`, cleanrl style)
does the same work with the same parts in one plain loop: `EnvRun` with the same `make_env`
preprocessing, `EpsilonGreedy`, sign-clipped rewards, the same buffer (`PrioritizedReplayBuffer` + `FrameStorage`), the same
network, double-DQN target, importance-weighted smooth L1 loss, gradient-norm clipping, fused `adam`,
hard target copy, priority update and beta annealed over the updates the Learner plans. Before timing,
`check_same_work` runs both for 300 env steps from one seed (with `target_every` 10, so that hard
copies happen) and asserts identical metric rows (loss, epsilon, beta, weight, frame) and episode returns.

Each timed run starts a fresh pipeline and a fresh loop, steps each `--warmup` env steps untimed (so
that updates are running), then times `--frames` env steps of each, alternating turns of `--block`
env steps (pipeline, loop, loop, pipeline, ...) so that both see the same load. The ratio of their
times is taken within each run; the report gives the median over `--runs` runs. The goal: the
pipeline's time per env step at most 1.1× the loop's.
"""
from __future__ import annotations
import argparse, gc, shlex, statistics, sys, time
from copy import deepcopy
from pathlib import Path

import numpy as np
import torch

from fastrl_per.stages.atari import atari_defaults
from fastrl_per.learners.conv import NatureQNetwork
from fastrl_per.core import STEP_FIELDS
from fastrl_per.learners.dqn import EpsilonGreedy, adam, discrete_env_dims
from fastrl_per.stages.envs import EnvRun
from fastrl_per.replay.frames import FrameStorage
from fastrl_per.learners.learner import Learner
from fastrl_per.replay.per import PrioritizedReplayBuffer

sys.path.insert(0, str(Path(__file__).parent))
from overhead import alternate, hand_update  # noqa: E402   (turns of equal load and the plain loop's update, shared with the CartPole benchmarks)
from hand_loop import EnvSteps  # noqa: E402   (the loop's transitions, counted as the Learner counts them)

STACK, SIDE, BS, GOAL = 4, 84, 32, 1.5
ENV, PIPELINE_GOAL, CHECK_STEPS = 'ALE/Pong-v5', 1.1, 300


def fill(storage: FrameStorage, n: int, nenvs: int, episode: int, seed: int = 0):
    "Write `n` transitions of `nenvs` lockstep sub-envs with frame-stacked random observations."
    rng = np.random.default_rng(seed)
    frames = lambda k: rng.integers(0, 256, (k, SIDE, SIDE), dtype=np.uint8)
    obs = np.repeat(frames(nenvs)[:, None], STACK, axis=1)  # each sub-env starts padded with its first frame
    env_id, step_n, episode_n = np.arange(nenvs), np.zeros(nenvs, np.int64), np.zeros(nenvs, np.int64)
    for _ in range(n // nenvs):
        nxt = np.concatenate([obs[:, 1:], frames(nenvs)[:, None]], axis=1)
        ended = rng.random(nenvs) < 1 / episode
        step_n += 1
        storage.write(dict(state=obs, next_state=nxt, action=rng.integers(6, size=nenvs), terminated=ended,
                           truncated=np.zeros(nenvs, bool), reward=np.zeros(nenvs, np.float32), total_reward=np.zeros(nenvs, np.float32),
                           env_id=env_id, step_n=step_n.copy(), episode_n=episode_n.copy(),
                           n_steps=np.ones(nenvs, np.int32)))
        obs = nxt
        if ended.any():
            obs[ended] = np.repeat(frames(int(ended.sum()))[:, None], STACK, axis=1)
            step_n[ended], episode_n[ended] = 0, episode_n[ended] + 1


def sampling(a):
    "The sampling half: time `FrameStorage` gathers against plain-array gathers, and print its table."
    storage = FrameStorage(a.capacity)
    t = time.perf_counter()
    fill(storage, a.capacity, a.nenvs, a.episode)
    filled = time.perf_counter() - t
    rng = np.random.default_rng(1)
    plain_state = rng.integers(0, 256, (a.plain_capacity, STACK, SIDE, SIDE), dtype=np.uint8)
    plain_next = rng.integers(0, 256, (a.plain_capacity, STACK, SIDE, SIDE), dtype=np.uint8)
    ours = lambda pos: storage.gather(storage.valid_slots(pos))
    plain = lambda pos: (np.take(plain_state, pos % a.plain_capacity, 0), np.take(plain_next, pos % a.plain_capacity, 0))
    times, ratios = {'ours': [], 'plain': []}, []
    gc.disable()
    for r in range(a.repeats):
        pos = rng.choice(storage.n_valid, BS, replace=False)
        took = {}
        for name, f in (('ours', ours), ('plain', plain)) if r % 2 else (('plain', plain), ('ours', ours)):
            t = time.perf_counter(); f(pos); took[name] = time.perf_counter() - t
        for name in took: times[name].append(took[name])
        ratios.append(took['ours'] / took['plain'])
    gc.enable()
    batch = ours(pos)
    assert batch.state.shape == (BS, STACK, SIDE, SIDE) and batch.next_state.shape == batch.state.shape
    assert all(len(getattr(batch, n)) == BS for n in STEP_FIELDS)
    med = lambda xs: statistics.median(xs) * 1e6
    print(f"FrameStorage of {storage.sz:,} transitions ({storage.n_valid:,} sampleable, {storage.nbytes() / 1e9:.1f} GB), "
          f"filled in {filled:.0f} s ({filled / a.capacity * 1e6:.0f} µs a transition); {a.nenvs} sub-envs, mean episode {a.episode}; "
          f"plain arrays of {a.plain_capacity:,} rows; {a.repeats} rounds\n")
    print(f"| batch of {BS} stacked transitions (state + next_state) | median µs | ratio to plain (median [10%, 90%]) |")
    print('|---|---:|---:|')
    q = statistics.quantiles(ratios, n=10)
    print(f"| ours: valid_slots + FrameStorage.gather (SimpleStep, all fields) | {med(times['ours']):,.0f} | {statistics.median(ratios):.2f}× [{q[0]:.2f}, {q[-1]:.2f}] |")
    print(f"| plain: np.take from arrays of stacks (state and next_state only) | {med(times['plain']):,.0f} | 1.00× |")
    print(f"\ngoal: ours ≤ {GOAL}× plain: {statistics.median(ratios):.2f}× -> {'met' if statistics.median(ratios) <= GOAL else 'NOT met'}")


def settings(total_steps: int, warmup: int, buffer: int, target_every: int | None = None) -> dict:
    """The command's Atari defaults for a run of `total_steps` env steps with a short run's buffer and warm-up, epsilon
    already at its end value, and the Learner defaults the loop relies on spelled out: both sides get these numbers."""
    c = atari_defaults(total_steps)
    return dict(c, max_sz=buffer, warmup=warmup, explore_start=c['explore_end'], target_every=target_every or c['target_every'],
                gamma=0.99, eps=1e-6, max_grad_norm=10.)


class HandLoop(EnvSteps):
    "DQN with prioritized replay on Atari as one plain loop (cleanrl style): the same work as `Learner`."
    def __init__(self, seed: int, c: dict):
        assert c['n_step'] == 1 and c['double'] and c['target_every'], 'the loop does 1-step double DQN with hard target copies'
        self.c = c
        obs, n_actions = discrete_env_dims(ENV, images=True)
        torch.manual_seed(seed)
        self.model = NatureQNetwork(obs[0], n_actions, frame_size=obs[-1])
        self.target = deepcopy(self.model).requires_grad_(False)
        self.opt, self.params = adam(self.model, c['lr']), list(self.model.parameters())
        self.agent = EpsilonGreedy(self.model, n_actions, c['explore_start'], c['explore_end'], c['explore_steps'], seed=seed)
        super().__init__(EnvRun(ENV, 1, seed), self.agent)
        self.buf = PrioritizedReplayBuffer(bs=c['bs'], alpha=c.get('alpha'), beta=c.get('beta'), eps=c['eps'], seed=seed,
                                           storage=FrameStorage(c['max_sz']))
        self.updates = 0
        self.start = max(c['bs'], c['warmup'])   # transitions stored before the first update
        self.planned = (c['total_steps'] - self.start) // c['train_every'] + 1   # updates in the run, as the Learner plans beta

    def fit(self, steps: int) -> list[dict]:
        rows = []
        for step in self.transitions(steps):
            step.reward = step.reward.sign()  # clipped for training; total_reward keeps the game's score
            self.buf.add(step)
            if self.frames % self.c['train_every'] == 0 and len(self.buf) >= self.start: rows.append(self.update())
        return rows

    def update(self) -> dict:
        c, model = self.c, self.model
        b = self.buf.sample()
        loss, td = hand_update(model, self.target, self.params, self.opt, b, c['gamma'], c['max_grad_norm'])
        self.updates += 1
        if self.updates % c['target_every'] == 0: self.target.load_state_dict(model.state_dict())
        self.buf.update_priorities(b.idxs, td.abs())
        self.buf.anneal_beta(min(1., self.updates / self.planned))
        return dict(loss=loss.item(), epsilon=self.agent.epsilon, beta=self.buf.beta, weight=b.weights.mean().item(), frame=self.frames)


def pipeline(seed: int, c: dict) -> Learner: return Learner(ENV, replay='per', seed=seed, device='cpu', **c)


def check_same_work(seed: int, frames: int = CHECK_STEPS, warmup: int = 100, buffer: int = 10_000) -> int:
    "Same seed, same metric rows and episode returns from pipeline and loop: the two do the same computation. Returns the rows compared."
    c = settings(frames, warmup, buffer, target_every=10)   # hard target copies within the check
    a, b = pipeline(seed, c), HandLoop(seed, c)
    ra, rb = a.fit(frames), b.fit(frames)
    assert len(ra) == len(rb) == (frames - warmup) // c['train_every'] + 1, (len(ra), len(rb))
    for x, y in zip(ra, rb): assert x == y, (x, y)
    assert a.episodes.returns == b.returns
    return len(ra)


def timed_pair(seed: int, c: dict, warmup: int, frames: int, block: int) -> dict:
    """Env steps per second (wall) and CPU seconds per 1,000 env steps of `frames` timed env steps for a fresh pipeline
    and a fresh loop, each stepped `warmup` env steps first; turns of `block` env steps alternate (pipeline, loop, loop, ...)."""
    learners = dict(pipeline=pipeline(seed, c), loop=HandLoop(seed, c))
    for l in learners.values(): l.fit(warmup)
    spent = alternate({k: l.fit for k, l in learners.items()}, frames, block)
    assert learners['pipeline'].episodes.env_steps == learners['loop'].frames == warmup + frames
    assert spent['pipeline'][2] == spent['loop'][2] == frames // c['train_every'], spent   # the same updates for the same env steps
    return {k: (frames / w, cpu * 1000 / frames) for k, (w, cpu, _) in spent.items()}


def training_pipeline(a):
    "The pipeline half: check that pipeline and loop do the same work, time them in alternating turns, and print the table."
    torch.set_num_threads(1)
    c = settings(a.warmup + a.frames, a.warmup, a.buffer)
    print(f"{ENV} on the CPU, torch {torch.__version__} on one thread; Atari defaults with buffer {a.buffer:,}, warm-up {a.warmup}, "
          f"epsilon {c['explore_start']}, update of {c['bs']} every {c['train_every']} env steps, target copy every {c['target_every']:,} updates; "
          f"{a.frames:,} timed env steps per run after {a.warmup} untimed, in turns of {a.block}; runs: {a.runs}\n")
    n = check_same_work(a.seed)
    print(f"same work: {n} updates over {CHECK_STEPS} env steps give identical loss/epsilon/beta/weight/frame rows (and episode returns) in both\n")
    runs = []
    for r in range(a.runs):
        runs.append(timed_pair(a.seed + r, c, a.warmup, a.frames, a.block))
        p, l = runs[-1]['pipeline'], runs[-1]['loop']
        print(f"  run {r + 1}: pipeline {p[0]:.1f} env steps/s ({p[1]:.2f} CPU s / 1k), loop {l[0]:.1f} env steps/s ({l[1]:.2f} CPU s / 1k), "
              f"ratio {l[0] / p[0]:.3f}×", flush=True)
    ratios = [run['loop'][0] / run['pipeline'][0] for run in runs]   # pipeline time per env step / loop's, within each run
    cpu_ratios = [run['pipeline'][1] / run['loop'][1] for run in runs]
    med = lambda name, i: statistics.median(run[name][i] for run in runs)
    print(f"\n| {ENV}, CPU, one process | env steps/s (median) | CPU s / 1,000 env steps (median) | all runs, env steps/s |")
    print('|---|---:|---:|---|')
    for name, label in (('pipeline', '`Learner` pipeline'), ('loop', 'hand-written loop')):
        print(f"| {label} | {med(name, 0):.1f} | {med(name, 1):.2f} | {', '.join(f'{run[name][0]:.1f}' for run in runs)} |")
    ratio = statistics.median(ratios)
    print(f"| **ratio pipeline / loop** (time per env step, within each run) | **{ratio:.3f}×** | {statistics.median(cpu_ratios):.3f}× | "
          f"{', '.join(f'{x:.3f}' for x in ratios)} |")
    print(f"\ngoal: pipeline ≤ {PIPELINE_GOAL}× loop: {ratio:.3f}× -> {'met' if ratio <= PIPELINE_GOAL else 'MISSED'}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--part', choices=('sampling', 'pipeline', 'both'), default='both', help='which half to run')
    p.add_argument('--quick', action='store_true', help='smoke run: sampling 20,000 transitions, 10,000 plain rows, 200 rounds; '
                                                        'pipeline 1 run of 200 env steps after 100')
    s = p.add_argument_group('sampling')
    s.add_argument('--capacity', type=int, default=1_000_000, help='transitions in our (full) FrameStorage')
    s.add_argument('--plain-capacity', type=int, default=50_000, help='rows of the plain arrays of stacks')
    s.add_argument('--nenvs', type=int, default=4)
    s.add_argument('--episode', type=int, default=1000, help='mean episode length, in agent steps')
    s.add_argument('--repeats', type=int, default=500, help='sampling rounds')
    t = p.add_argument_group('training pipeline')
    t.add_argument('--frames', type=int, default=4000, help='timed env steps per run, each side')
    t.add_argument('--runs', type=int, default=3, help='timed runs of each side')
    t.add_argument('--block', type=int, default=500, help='env steps per turn when pipeline and loop alternate')
    t.add_argument('--warmup', type=int, default=250, help="the replay's warm-up, and the untimed env steps before each timed run (>= 32)")
    t.add_argument('--buffer', type=int, default=10_000, help='replay capacity, transitions')
    t.add_argument('--seed', type=int, default=0)
    a = p.parse_args(argv)
    if a.quick: a.capacity, a.plain_capacity, a.repeats, a.frames, a.runs, a.block, a.warmup = 20_000, 10_000, 200, 200, 1, 100, 100
    if min(a.frames, a.runs, a.block) < 1 or a.warmup < BS or a.buffer < a.warmup:
        p.error(f"need frames, runs and block >= 1, warmup >= {BS} and buffer >= warmup")
    print(f"command: `{shlex.join([sys.executable, *sys.argv])}`\n")
    if a.part in ('sampling', 'both'): sampling(a)
    if a.part == 'both': print()
    if a.part in ('pipeline', 'both'): training_pipeline(a)


if __name__ == '__main__': main()
