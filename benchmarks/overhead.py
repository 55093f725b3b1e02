"""Overhead of the `Learner` pipeline against a hand-written DQN loop doing the same work.

Both sides: CartPole-v1 through `fastrl_per.stages.envs.EnvRun` (next-step autoreset, reset rows
dropped), epsilon-greedy with `fastrl_per.learners.dqn.EpsilonGreedy`, 3-step returns from
`fastrl_per.stages.nstep.NStepTransitions` (the loop hands it each env step), the
`fastrl_per.replay.per.PrioritizedReplayBuffer` core, the same `QNetwork` (LayerNorm in its hidden layers), batch size, double-DQN
target with the n-step discount, importance-weighted smooth L1 loss, gradient-norm clipping at 10, fused Adam, one-call soft target update
(`SoftUpdate`, parameter lists gathered once), gradients set to None directly, priority update and beta
anneal, and one metrics row (with `loss.item()` and the mean weight) per update. With the same seed the two produce
the same losses, which the script checks before timing: the work is identical, only the
plumbing differs.

Each run starts a fresh pipeline and a fresh loop, warms both up (`--warmup` env steps, untimed, so
that updates are running), then times `--frames` env steps of each. The two alternate in turns of
`--block` frames (pipeline, loop, loop, pipeline, ...), so both see the same load from whatever
else shares the machine; the medians over `--repeats` runs are reported per 10,000 frames. torch runs on one thread in both
(`torch.set_num_threads(1)`): the machine's cores are shared, and more threads than free cores
slows both sides by an amount that has nothing to do with the pipeline.

    .venv/bin/python benchmarks/overhead.py [--frames 10000] [--repeats 3] [--warmup 500] [--block 1000]
"""
import argparse
import shlex
import statistics
import sys
import time
from copy import deepcopy

import torch
import torch.nn as nn
import torch.nn.functional as F

from fastrl_per.stages.envs import EnvRun
from fastrl_per.learners.dqn import EpsilonGreedy, QNetwork, SoftUpdate, adam, discrete_env_dims
from fastrl_per.learners.learner import Learner
from fastrl_per.stages.nstep import NStepTransitions, nstep_discount
from fastrl_per.replay.per import PrioritizedReplayBuffer

ENV = 'CartPole-v1'
GOAL = 1.1
# Learner's defaults, spelled out so the loop uses the very same numbers
CONFIG = dict(bs=128, max_sz=50_000, lr=5e-4, gamma=0.99, alpha=0.6, beta=0.4, eps=1e-6, tau=0.01, n_step=3,
              explore_start=1.0, explore_end=0.01, explore_steps=5_000, hidden=128, layer_norm=True, max_grad_norm=10.)


def hand_update(model, target, params, opt, b, gamma, max_grad_norm):
    """One DQN update written out as a plain loop would: the double-DQN n-step target, the importance-weighted smooth L1
    loss, gradients set to None, backward, norm clipping, the optimiser step. The loss and the TD errors (detached)."""
    with torch.no_grad():
        a_star = model(b.next_state).argmax(-1, keepdim=True)
        y = b.reward + nstep_discount(b, gamma) * target(b.next_state).gather(-1, a_star).squeeze(-1) * (~b.terminated)
    q = model(b.state).gather(-1, b.action.long().unsqueeze(-1)).squeeze(-1)
    loss = (F.smooth_l1_loss(q, y, reduction='none') * b.weights).mean()
    for p in params: p.grad = None
    loss.backward()
    nn.utils.clip_grad_norm_(params, max_grad_norm)
    opt.step()
    return loss, (y - q).detach()


class HandLoop:
    "DQN with prioritized replay as one plain loop (cleanrl style): the same work as `Learner`."
    def __init__(self, seed, total_steps):
        c = self.c = CONFIG
        obs_dim, n_actions = discrete_env_dims(ENV)
        torch.manual_seed(seed)
        self.model = QNetwork(obs_dim, n_actions, c['hidden'], layer_norm=c['layer_norm'])
        self.target = deepcopy(self.model).requires_grad_(False)
        self.opt = adam(self.model, c['lr'])
        self.params, self.soft_update = list(self.model.parameters()), SoftUpdate(self.target, self.model, c['tau'])
        self.agent = EpsilonGreedy(self.model, n_actions, c['explore_start'], c['explore_end'], c['explore_steps'], seed=seed)
        self.env = EnvRun(ENV, 1, seed)
        self.buf = PrioritizedReplayBuffer(max_sz=c['max_sz'], bs=c['bs'], alpha=c['alpha'], beta=c['beta'],
                                           eps=c['eps'], seed=seed)
        self.new_steps = []   # the env step the n-step stage reads next; it keeps its open windows between reads
        self.nstep = NStepTransitions(self.new_steps, c['n_step'], c['gamma'], keep_open=True)
        self.total_steps, self.frames, self.updates, self.returns = total_steps, 0, 0, []
        self.planned = total_steps - (c['n_step'] - 1) - c['bs'] + 1   # updates in the run, as the Learner plans beta

    def fit(self, steps):
        rows, end = [], self.frames + steps
        while self.frames < end:
            step = self.env.step(self.agent)
            if not len(step): continue  # an autoreset row: not a transition
            self.frames += 1
            if step.terminated[0] or step.truncated[0]: self.returns.append((self.frames, step.total_reward[0].item()))
            self.new_steps[:] = [step[0]]
            for transition in self.nstep:
                self.buf.add(transition)
                if len(self.buf) >= self.c['bs']: rows.append(self.update())
        return rows

    def update(self):
        c = self.c
        b = self.buf.sample(c['bs'])
        loss, td = hand_update(self.model, self.target, self.params, self.opt, b, c['gamma'], c['max_grad_norm'])
        self.updates += 1
        self.soft_update()
        self.buf.update_priorities(b.idxs, td.abs())
        self.buf.anneal_beta(min(1., self.updates / max(1, self.planned)))
        return dict(loss=loss.item(), epsilon=self.agent.epsilon, beta=self.buf.beta,
                    weight=b.weights.mean().item(), frame=self.frames)


def pipeline(seed, total_steps): return Learner(ENV, replay='per', seed=seed, total_steps=total_steps, **CONFIG)


def alternate(jobs, total, block):
    """Wall and CPU seconds each of `jobs` (name → callable(n), returning what it produced or None) spends on `total`
    units, and how many items it returned, in turns of `block` units (a, b, b, a, ...): each sees the same load from
    whatever else runs on the machine."""
    spent, done, order = {k: [0., 0., 0] for k in jobs}, 0, list(jobs)
    while done < total:
        n = min(block, total - done)
        for name in order:
            w, c = time.perf_counter(), time.process_time()
            out = jobs[name](n)
            spent[name][0] += time.perf_counter() - w
            spent[name][1] += time.process_time() - c
            spent[name][2] += len(out or ())
        done, order = done + n, order[::-1]
    return spent


def timed_pair(seed, warmup, frames, block):
    """Seconds (wall, CPU) per 10,000 of `frames` env steps for a fresh pipeline and a fresh loop, each warmed up first,
    taking turns of `block` frames."""
    learners = dict(pipeline=pipeline(seed, warmup + frames), loop=HandLoop(seed, warmup + frames))
    for l in learners.values(): l.fit(warmup)
    spent = alternate({k: l.fit for k, l in learners.items()}, frames, block)
    assert learners['pipeline'].episodes.env_steps == learners['loop'].frames == warmup + frames
    assert spent['pipeline'][2] == spent['loop'][2] > 0, spent   # the same updates for the same env steps
    return {k: (w * 10_000 / frames, c * 10_000 / frames) for k, (w, c, _) in spent.items()}


def check_same_work(seed, frames=400):
    "Same seed, same losses, betas, epsilons and episode returns: the two do the same computation."
    a, b = pipeline(seed, frames), HandLoop(seed, frames)
    ra, rb = a.fit(frames), b.fit(frames)
    assert len(ra) == len(rb) > 0, (len(ra), len(rb))
    for x, y in zip(ra, rb): assert x == y, (x, y)
    assert a.episodes.returns == b.returns
    return len(ra)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--frames', type=int, default=10_000, help='timed env steps per run')
    p.add_argument('--repeats', type=int, default=3, help='timed runs of each, alternating')
    p.add_argument('--warmup', type=int, default=500, help='untimed env steps before each timed run (>= bs)')
    p.add_argument('--block', type=int, default=1000, help='frames per turn when pipeline and loop alternate')
    p.add_argument('--seed', type=int, default=0)
    args = p.parse_args(argv)
    if min(args.frames, args.repeats, args.block) < 1 or args.warmup < CONFIG['bs']:
        p.error(f"need frames, repeats and block >= 1 and warmup >= {CONFIG['bs']}")
    torch.set_num_threads(1)
    print(f"command: `{shlex.join([sys.executable, *sys.argv])}`")
    print(f"torch {torch.__version__}, torch.set_num_threads(1) in both; {args.frames} timed frames per run after "
          f"{args.warmup} warm-up frames; {args.repeats} runs each, alternating pipeline and loop every {args.block} frames\n")
    n = check_same_work(args.seed)
    print(f"same work: the first {n} updates give identical loss/epsilon/beta rows and episode returns in both\n")

    timed_pair(args.seed, args.warmup, min(args.frames, 500), args.block)  # warm both code paths up once
    runs = {'pipeline': [], 'loop': []}
    for r in range(args.repeats):
        for name, t in timed_pair(args.seed, args.warmup, args.frames, args.block).items():
            runs[name].append(t)
            print(f"  run {r + 1} {name:8s}: {t[0]:6.2f} s wall / 10k frames ({t[1]:6.2f} s CPU)", flush=True)

    med = {k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v)) for k, v in runs.items()}
    ratio, cpu_ratio = med['pipeline'][0] / med['loop'][0], med['pipeline'][1] / med['loop'][1]
    print()
    print("| | median wall s / 10k frames | median CPU s / 10k frames | all runs, wall s / 10k |")
    print("|---|---:|---:|---|")
    for name, label in (('pipeline', '`Learner` pipeline'), ('loop', 'hand-written loop')):
        print(f"| {label} | {med[name][0]:.2f} | {med[name][1]:.2f} | {', '.join(f'{w:.2f}' for w, _ in runs[name])} |")
    verdict = 'meets' if ratio <= GOAL else 'MISSES'
    print(f"| **ratio pipeline / loop** | **{ratio:.3f}×** | {cpu_ratio:.3f}× | goal ≤ {GOAL}×: {verdict} it |")


if __name__ == '__main__':
    main()
