#!/usr/bin/env python
"""Does the own-loop TD3 of `nbs/14_own_loop.ipynb` learn `Pendulum-v1`, with prioritized and with uniform replay?

Run from the repository root:

    python benchmarks/td3_own_loop.py                  # seeds 0 1 2, both buffers, 20,000 env steps
    python benchmarks/td3_own_loop.py --replays uniform proportional lap   # LAP beside them (its Huber critics)
    python benchmarks/td3_own_loop.py --env-steps 3000 --seeds 0   # a smoke run
    python benchmarks/td3_own_loop.py --peers          # the loop's buffer lines in cpprb and torchrl: run and counted
    python benchmarks/td3_own_loop.py --env HalfCheetah-v5 --env-steps 100000 --start-steps 25000 --lr 3e-4 \
        --eval-every 5000 --replays uniform proportional lap --runs cheetah.jsonl   # LAP's paper's settings (mujoco)
    python benchmarks/td3_own_loop.py --table-only cheetah.jsonl   # the table of the runs a file holds

Each run is `fastrl_per.learners.td3.td3` with its defaults, the same for both buffers (nothing is tuned
for either): every `--eval-every` env steps the greedy policy plays 10 episodes, and the table
gives the first env step at which their mean return reached the goal (-200), the best and the
last mean return. One torch thread per run; runs go one after the other.

`--peers` runs, on random Pendulum-shaped data, the lines of the loop that touch the buffer
(make it with an extra field, add one step, sample onto the training device with weights, feed
|TD| back, anneal beta) as written for fastrl_per, for cpprb and for torchrl, and counts them.
cpprb and torchrl are benchmark-only packages (`pip install --no-deps cpprb`, `pip install torchrl`),
not dependencies; a library that is not importable is reported as skipped.
"""
from __future__ import annotations
import argparse, inspect, json, time
import numpy as np
import torch
from fastrl_per.learners.td3 import td3
from fastrl_per.replay.priorities import KINDS

GOAL = -200.

# The buffer lines of the loop in `fastrl_per.learners.td3.td3`, for each library: `make` once, `add` each env step, then each
# update `sample` (the fields the loss reads, on `dev`, and the weights), `feedback` of the (B, 1) TD error, `anneal`.
def fastrl_per_lines(obs_dim, act_dim, n, bs, dev):
    from fastrl_per.replay.per import PrioritizedReplayBuffer
    rb = PrioritizedReplayBuffer(max_sz=n, bs=bs, alpha=0.6, beta=0.4, seed=0)
    def add(o, a, r, o2, term, noise): rb.add(state=o, action=a, reward=r, next_state=o2, terminated=term, noise=noise)
    def sample():
        b = rb.sample(device=dev)
        w = b.weights.to(dev)[:, None]
        return b.state, b.action, b.reward[:, None], b.next_state, b.terminated[:, None], w, b.idxs
    feedback = lambda idxs, td: rb.update_priorities(idxs, td.detach())
    anneal = lambda fraction: rb.anneal_beta(fraction)
    return add, sample, feedback, anneal

def cpprb_lines(obs_dim, act_dim, n, bs, dev):
    import cpprb
    fields = {'obs': {'shape': obs_dim}, 'act': {'shape': act_dim}, 'rew': {}, 'next_obs': {'shape': obs_dim},
              'done': {}, 'noise': {'shape': act_dim}}
    rb = cpprb.PrioritizedReplayBuffer(n, env_dict=fields, alpha=0.6, eps=1e-6)
    add = lambda o, a, r, o2, term, noise: rb.add(obs=o, act=a, rew=r, next_obs=o2, done=term, noise=noise)
    beta = [0.4]
    def sample():
        s = rb.sample(bs, beta=beta[0])
        t = {k: torch.as_tensor(v, dtype=torch.float32).to(dev, non_blocking=True)
             for k, v in s.items() if k != 'indexes'}
        return t['obs'], t['act'], t['rew'], t['next_obs'], t['done'].bool(), t['weights'][:, None], s['indexes']
    feedback = lambda idxs, td: rb.update_priorities(idxs, td.detach().abs().cpu().numpy().ravel() + 1e-6)
    def anneal(fraction): beta[0] = 0.4 + fraction * (1 - 0.4)
    return add, sample, feedback, anneal

def torchrl_lines(obs_dim, act_dim, n, bs, dev):
    from tensordict import TensorDict
    from torchrl.data import LazyTensorStorage, TensorDictPrioritizedReplayBuffer
    rb = TensorDictPrioritizedReplayBuffer(alpha=0.6, beta=0.4, eps=1e-6, storage=LazyTensorStorage(n), batch_size=bs,
                                           priority_key='td_error')
    f32 = lambda x: torch.as_tensor(x, dtype=torch.float32)
    add = lambda o, a, r, o2, term, noise: rb.add(TensorDict(obs=f32(o), act=f32(a), rew=f32(r), next_obs=f32(o2),
                                                             done=torch.as_tensor(term), noise=f32(noise)))
    def sample():
        b = rb.sample().to(dev, non_blocking=True)
        return b['obs'], b['act'], b['rew'][:, None], b['next_obs'], b['done'][:, None], b['_weight'][:, None], b
    def feedback(b, td):
        b['td_error'] = td.detach().abs().squeeze(-1)
        rb.update_tensordict_priority(b)
    def anneal(fraction): rb.sampler.beta = 0.4 + fraction * (1 - 0.4)
    return add, sample, feedback, anneal

def peers():
    "Run each library's buffer lines for 600 random steps and 20 updates; print their line counts."
    print('| library | buffer lines in the loop | ran |\n|---|--:|---|')
    rng, dev = np.random.default_rng(0), torch.device('cpu')
    for lines in (fastrl_per_lines, cpprb_lines, torchrl_lines):
        name, count = lines.__name__.removesuffix('_lines'), len(inspect.getsource(lines).splitlines()) - 1
        try: add, sample, feedback, anneal = lines(3, 1, 1_000, 64, dev)
        except (ImportError, RuntimeError) as e:   # torchrl: its C++ sum tree is built for one torch version
            print(f'| {name} | {count} | not run: {type(e).__name__}: {str(e)[:120]} |'); continue
        for i in range(600):
            obs = rng.standard_normal(3)
            add(obs, rng.uniform(-2, 2, 1), -rng.random(), obs + 0.1, False, np.zeros(1))
        for i in range(20):
            obs, act, rew, next_obs, done, w, key = sample()
            assert obs.shape == (64, 3) and act.shape == rew.shape == done.shape == w.shape == (64, 1)
            assert done.dtype == torch.bool
            feedback(key, torch.rand(64, 1))
            anneal(i / 19)
        print(f'| {name} | {count} | yes |')

def table(rows:list, env:str, goal:float|None):
    "The markdown table of `rows` (one dict per run, as `--runs` holds them), and how many seeds reached `goal`."
    steps = {r['env_steps'] for r in rows}
    print(f"\n## TD3 on {env}, {'/'.join(f'{s:,}' for s in sorted(steps))} env steps, greedy mean return over 10 "
          f"episodes" + ('' if goal is None else f" (goal >= {goal:.0f})") + '\n')
    print('| seed | replay | first env step at goal | best | last | CPU s |')
    print('|---|---|---|---|---|---|')
    for r in rows:
        curve = r['curve']
        reached = None if goal is None else next((s for s, v in curve if v >= goal), None)
        at = '—' if reached is None else f'{reached:,}'
        print(f"| {r['seed']} | {r['replay']} | {at} | {max(v for _, v in curve):.1f} | {curve[-1][1]:.1f} | "
              f"{r['cpu_s']:.0f} |")
    if goal is None: return
    for kind in dict.fromkeys(r['replay'] for r in rows):
        runs = [r for r in rows if r['replay'] == kind]
        ok = [r for r in runs if any(v >= goal for _, v in r['curve'])]
        print(f'\n{kind}: reached the goal on {len(ok)} of {len(runs)} seeds')

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--env', default='Pendulum-v1', help='a gymnasium env with a Box action space')
    ap.add_argument('--seeds', type=int, nargs='+', default=[0, 1, 2])
    ap.add_argument('--env-steps', type=int, default=20_000)
    ap.add_argument('--eval-every', type=int, default=1_000)
    ap.add_argument('--start-steps', type=int, help="random actions first (default: td3's)")
    ap.add_argument('--lr', type=float, help="Adam's learning rate for both networks (default: td3's)")
    ap.add_argument('--device', help="where the networks learn (default: td3's, the CPU)")
    ap.add_argument('--replays', nargs='+', default=['proportional', 'uniform'], choices=['uniform', *KINDS],
                    help="the buffers: 'uniform', or a prioritized one of each kind named")
    ap.add_argument('--runs', help='a file each finished run is appended to, one JSON line each')
    ap.add_argument('--table-only', nargs='*', metavar='RUNS', help="print the table of these --runs files; run nothing")
    ap.add_argument('--peers', action='store_true', help="only run and count the loop's buffer lines in each library")
    args = ap.parse_args(argv)
    if args.peers: return peers()
    if args.table_only is not None:
        rows = [json.loads(line) for f in args.table_only for line in open(f) if line.strip()]
        env = ' and '.join(dict.fromkeys(r['env'] for r in rows))   # the runs' own env, not --env
        return table(rows, env, GOAL if env == 'Pendulum-v1' else None)
    goal = GOAL if args.env == 'Pendulum-v1' else None
    torch.set_num_threads(1)
    given = {k: v for k, v in dict(start_steps=args.start_steps, lr=args.lr, device=args.device).items()
             if v is not None}
    rows = []
    for seed in args.seeds:
        for kind in args.replays:
            t0 = time.process_time()
            replay = dict(prioritized=False) if kind == 'uniform' else dict(prioritization=kind)
            progress = lambda step, score: print(f'# {args.env} seed {seed} {kind} step {step} return {score:.1f} '
                                                 f'cpu {time.process_time() - t0:.0f} s', flush=True)
            curve = td3(args.env, env_steps=args.env_steps, seed=seed, eval_every=args.eval_every, on_eval=progress,
                        **replay, **given)
            rows.append(dict(env=args.env, seed=seed, replay=kind, env_steps=args.env_steps, **given,
                             curve=curve, cpu_s=time.process_time() - t0))
            if args.runs:
                with open(args.runs, 'a') as f: f.write(json.dumps(rows[-1]) + '\n')
    table(rows, args.env, goal)

if __name__ == '__main__': main()
