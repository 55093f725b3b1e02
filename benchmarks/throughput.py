"""CPU per 1,000 env steps and per update: the `Learner` pipeline, a hand-written loop on the same fast
paths, and Stable-Baselines3's DQN set to the same work, measured side by side in one process.

All three: CartPole-v1 at `fastrl_per train`'s defaults, 3-step returns, one update of batch 128 per
stored transition, a 128×128 ReLU MLP (ours with LayerNorm in both hidden layers, SB3's without), Adam at 5e-4, γ 0.99, replay of 50,000, a soft target update
with τ 0.01 after every update, gradient-norm clipping at 10, smooth-L1 loss, epsilon from 1.0 to
0.01 (SB3: its `n_steps=3` replay). Differences that remain (and make SB3's
work *smaller*, not larger): SB3's DQN has no prioritized replay (ours samples from the sum tree,
weights the loss and writes priorities back) and no double-DQN target (ours runs one more forward
pass per update). SB3 runs its own defaults otherwise (torch's default Adam path, `DummyVecEnv`
+ `Monitor`, its logger).

Each repeat builds a fresh one of each, warms each up for `--warmup` env steps (untimed: epsilon
reaches its final 0.01, the buffers fill), then times `--frames` env steps of each in turns of
`--block` steps (pipeline, loop, SB3, then the order reversed, ...) so all three see the same load
from whatever else shares the machine. Then the update alone: `--updates` updates of the loop
(`HandLoop.update`: sample, TD target, loss, backward, Adam, soft update, priority write-back,
beta) against SB3's `train(gradient_steps=1)` + its `polyak_update`, alternating the same way.
CPU time is `time.process_time()`; torch runs on one thread. The table gives medians over
`--repeats` repeats. Last, what the rest of a step costs the update itself: `hand_update` on batches
sampled beforehand, alone and with one small numpy call or the buffer's own sample between
two updates (each of which costs a few µs alone).

    .venv/bin/python benchmarks/throughput.py [--repeats 3] [--warmup 5000] [--frames 3000] [--block 500] [--updates 2000]
    .venv/bin/python benchmarks/throughput.py --breakdown [--warmup 5000] [--frames 3000]

`--breakdown` times only the hand-written loop, part by part (`TimedLoop`): where each µs of an env step goes.
"""
import argparse
import collections
import shlex
import statistics
import sys
import time
from pathlib import Path

import gymnasium as gym
import torch

sys.path.insert(0, str(Path(__file__).parent))
from overhead import CONFIG, ENV, HandLoop, alternate, check_same_work, hand_update, pipeline  # noqa: E402

GOALS = dict(steps=1.0, sb3_update=0.6, loop=1.1)


def sb3_dqn(seed, warmup):
    "SB3's DQN configured to `CONFIG`'s work (uniform replay, plain DQN target)."
    from stable_baselines3 import DQN
    c = CONFIG
    return DQN('MlpPolicy', gym.make(ENV), learning_rate=c['lr'], buffer_size=c['max_sz'], learning_starts=c['bs'],
               batch_size=c['bs'], tau=c['tau'], gamma=c['gamma'], train_freq=1, gradient_steps=1, n_steps=c['n_step'],
               target_update_interval=1, exploration_initial_eps=c['explore_start'], exploration_final_eps=c['explore_end'],
               exploration_fraction=min(1., c['explore_steps'] / warmup), max_grad_norm=c['max_grad_norm'],
               policy_kwargs=dict(net_arch=[c['hidden'], c['hidden']]), seed=seed, device='cpu', verbose=0)


class SB3Steps:
    "SB3's DQN stepped in blocks: `learn` continued where it stopped."
    def __init__(self, seed, warmup): self.model, self.warmup = sb3_dqn(seed, warmup), warmup
    def fit(self, n):
        self.model.learn(total_timesteps=n, reset_num_timesteps=self.model.num_timesteps == 0)
    def update(self):
        from stable_baselines3.common.utils import polyak_update
        m = self.model
        m.train(gradient_steps=1, batch_size=m.batch_size)
        polyak_update(m.q_net.parameters(), m.q_net_target.parameters(), m.tau)


def one_repeat(seed, warmup, frames, block, updates):
    learners = dict(pipeline=pipeline(seed, 30_000), loop=HandLoop(seed, 30_000), sb3=SB3Steps(seed, warmup))
    for l in learners.values(): l.fit(warmup)
    assert learners['pipeline'].agent.epsilon == learners['loop'].agent.epsilon == CONFIG['explore_end']
    assert abs(learners['sb3'].model.exploration_rate - CONFIG['explore_end']) < 1e-9
    steps = alternate({k: l.fit for k, l in learners.items()}, frames, block)
    loop, sb3 = learners['loop'], learners['sb3']
    upd = alternate(dict(loop=lambda n: [loop.update() for _ in range(n)],
                         sb3=lambda n: [sb3.update() for _ in range(n)]), updates, block)
    return {k: 1000 * cpu / frames for k, (_, cpu, _) in steps.items()}, {k: 1e3 * cpu / updates for k, (_, cpu, _) in upd.items()}


def update_beside(seed, warmup, updates):
    """CPU µs per `hand_update` (targets, loss, backward, clip, Adam: no replay calls) on batches sampled beforehand, then
    with one small numpy call, or the buffer's own sample, run between two updates: what the rest of a step costs the update."""
    import numpy as np
    loop = HandLoop(seed, 30_000)
    loop.fit(warmup)
    c, rng = loop.c, np.random.default_rng(seed)
    batches = [loop.buf.sample(c['bs']) for _ in range(updates)]
    def timed(between, with_update=True):
        start = time.process_time()
        for b in batches:
            x = between()
            if with_update: hand_update(loop.model, loop.target, loop.params, loop.opt, x if x is not None else b, c['gamma'], c['max_grad_norm'])
        return 1e6 * (time.process_time() - start) / updates
    rows = []
    for name, between in (('nothing', lambda: None), ('`rng.integers(0, 1000, 128)`', lambda: (rng.integers(0, 1000, 128), None)[1]),
                          ("the buffer's `sample` (its batch is the one trained on)", lambda: loop.buf.sample(c['bs']))):
        timed(between)   # warm
        rows.append((name, timed(between), timed(between, with_update=False)))
    return rows


class TimedLoop(HandLoop):
    """`HandLoop` with each part of a step timed (CPU µs): the env itself, acting (the Q-network and epsilon), the
    records (`EnvRun`'s `SimpleStep` and the n-step transition), the buffer write, the sample, the update (target,
    loss, backward, Adam, soft update, metrics row) and the priority write (`update_priorities`, `anneal_beta`)."""
    def __init__(self, seed, total_steps):
        super().__init__(seed, total_steps)
        self.spent = collections.Counter()
        self.env.actions = self.timed('acting', self.env.actions)
        for env in self.env.envs: env.step, env.reset = self.timed('env', env.step), self.timed('env', env.reset)
        self.env.step = self.timed('env step call', self.env.step)
        self.nstep_read = self.timed('record (n-step)', lambda: list(self.nstep))
        self.buf.add = self.timed('write', self.buf.add)
        self.buf.sample = self.timed('sample', self.buf.sample)
        self.buf.update_priorities = self.timed('priority write', self.buf.update_priorities)
        self.buf.anneal_beta = self.timed('priority write', self.buf.anneal_beta)

    def timed(self, name, f):
        def run(*args, **kwargs):
            start = time.process_time()
            try: return f(*args, **kwargs)
            finally: self.spent[name] += time.process_time() - start
        return run

    def fit(self, steps):   # HandLoop.fit, the n-step stage read as one call so that it can be timed
        end = self.frames + steps
        while self.frames < end:
            step = self.env.step(self.agent)
            if not len(step): continue
            self.frames += 1
            self.new_steps[:] = [step[0]]
            for transition in self.nstep_read():
                self.buf.add(transition)
                if len(self.buf) >= self.c['bs']: self.update()


def breakdown(seed, warmup, frames):
    "CPU µs per env step of each part of `TimedLoop`, after `warmup` untimed steps; the whole, and what is left."
    loop = TimedLoop(seed, warmup + frames)
    loop.fit(warmup)
    loop.spent.clear()
    start = time.process_time()
    loop.fit(frames)
    total = time.process_time() - start
    s = {k: 1e6 * v / frames for k, v in loop.spent.items()}
    parts = {'env (gymnasium step/reset)': s['env'], 'acting (Q-network, epsilon)': s['acting'],
             "record (EnvRun's SimpleStep, the n-step transition)": s['env step call'] - s['env'] - s['acting']
             + s['record (n-step)'], 'write (`add`)': s['write'], 'sample (128)': s['sample'],
             'priority write (`update_priorities`, `anneal_beta`)': s['priority write']}
    rest = 1e6 * total / frames - sum(parts.values())
    parts['update (target, loss, backward, Adam, soft update, metrics) and the loop'] = rest
    return parts, 1e6 * total / frames


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--repeats', type=int, default=3)
    p.add_argument('--warmup', type=int, default=5_000, help='untimed env steps first (>= the epsilon decay)')
    p.add_argument('--frames', type=int, default=3_000, help='timed env steps of each, per repeat')
    p.add_argument('--block', type=int, default=500, help='env steps (or updates) per turn')
    p.add_argument('--updates', type=int, default=2_000, help='timed updates alone, per repeat')
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--breakdown', action='store_true', help="only the loop's step, part by part")
    args = p.parse_args(argv)
    if args.warmup < CONFIG['explore_steps']: p.error(f"--warmup must be >= {CONFIG['explore_steps']} (epsilon's decay)")
    torch.set_num_threads(1)
    if args.breakdown:
        print(f"command: `{shlex.join([sys.executable, *sys.argv])}`\n")
        runs = [breakdown(args.seed + r, args.warmup, args.frames) for r in range(args.repeats)]
        total = statistics.median(t for _, t in runs)
        print("| part of an env step (hand-written loop, `train` defaults) "
              f"| CPU µs / env step (median of {args.repeats}) | share |")
        print("|---|--:|--:|")
        for name in runs[0][0]:
            v = statistics.median(p[name] for p, _ in runs)
            print(f"| {name} | {v:,.0f} | {100 * v / total:.0f}% |")
        print(f"| **the whole step** | **{total:,.0f}** | |")
        return
    import stable_baselines3
    print(f"command: `{shlex.join([sys.executable, *sys.argv])}`")
    print(f"torch {torch.__version__}, stable-baselines3 {stable_baselines3.__version__}, one torch thread; "
          f"{args.repeats} repeats of {args.warmup} warm-up steps, {args.frames} timed steps and {args.updates} timed updates\n")
    print(f"same work, pipeline and loop: the first {check_same_work(args.seed)} updates give identical rows\n")
    runs = [one_repeat(args.seed + r, args.warmup, args.frames, args.block, args.updates) for r in range(args.repeats)]
    med = lambda i, k: statistics.median(run[i][k] for run in runs)
    steps = {k: med(0, k) for k in ('pipeline', 'loop', 'sb3')}
    upd = {k: med(1, k) for k in ('loop', 'sb3')}
    every = lambda i, k: ', '.join(f"{run[i][k]:.2f}" for run in runs)
    print("| | CPU s / 1,000 env steps (median) | repeats | CPU ms / update alone (median) | repeats |")
    print("|---|--:|---|--:|---|")
    print(f"| `Learner` pipeline (`fastrl_per train` defaults) | {steps['pipeline']:.2f} | {every(0, 'pipeline')} | | |")
    print(f"| hand-written loop, same fast paths | {steps['loop']:.2f} | {every(0, 'loop')} | {upd['loop']:.3f} | {every(1, 'loop')} |")
    print(f"| Stable-Baselines3 DQN, same work | {steps['sb3']:.2f} | {every(0, 'sb3')} | {upd['sb3']:.3f} | {every(1, 'sb3')} |")
    ratios = [('pipeline CPU / 1,000 steps', steps['pipeline'], GOALS['steps'], 's'),
              ('pipeline / loop, per env step', steps['pipeline'] / steps['loop'], GOALS['loop'], '×'),
              ('ours / SB3, per update alone', upd['loop'] / upd['sb3'], GOALS['sb3_update'], '×'),
              ('pipeline / SB3, per env step', steps['pipeline'] / steps['sb3'], None, '×')]
    print("\n| measure | value | goal |")
    print("|---|--:|---|")
    for name, v, goal, unit in ratios:
        verdict = '' if goal is None else f"≤ {goal}{unit}: {'met' if v <= goal else 'MISSED'}"
        print(f"| {name} | {v:.2f}{unit} | {verdict} |")
    rows = update_beside(args.seed, args.warmup, args.updates)
    print("\n| between two updates | CPU µs per update + it | CPU µs of it alone | the update's extra |")
    print("|---|--:|--:|--:|")
    for i, (name, both, alone) in enumerate(rows): print(f"| {name} | {both:.0f} | {alone:.1f} | {f'{both - alone - rows[0][1]:+.0f}' if i else ''} |")


if __name__ == '__main__':
    main()
