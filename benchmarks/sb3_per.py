#!/usr/bin/env python
"""Stable-Baselines3's `DQN` against `fastrl_per.sb3.PrioritizedDQN` at RL Zoo's tuned hyperparameters.

Run from the repository root (stable-baselines3 installed: `pip install 'fastrl_per[sb3]'`):

    python benchmarks/sb3_per.py                          # CartPole-v1, Acrobot-v1, MountainCar-v0; seeds 0 1 2
    python benchmarks/sb3_per.py --quick                  # 2,000 steps, one seed: a smoke run
    python benchmarks/sb3_per.py --runs runs.jsonl --table-only   # the table of runs already written

The settings are RL Zoo's `hyperparams/dqn.yml` (DLR-RM/rl-baselines3-zoo at commit ce95481b), the same for both
algorithms: nothing is tuned for either. `PrioritizedDQN` adds the buffer's own defaults (alpha, beta, eps and the
weights' normalisation; `--buffer-kwargs` overrides them, e.g. `--buffer-kwargs "dict(eps=1e-2)"`) and anneals beta
to 1 over the run. Each run trains for the yaml's `n_timesteps` on one env, then plays 10 deterministic episodes on
a separately seeded env; the table gives the mean over seeds of that return, the CPU seconds per 1,000 env steps of
`learn()` (process time, one torch thread) and, for PER, the importance weights' mean over training. Runs go one
after the other, DQN then PrioritizedDQN for each env and seed, and each is appended to `--runs` as it ends, so an
interrupted benchmark keeps what it finished; run again, it skips the runs `--runs` holds.
"""
from __future__ import annotations
import argparse, json, time
from pathlib import Path
import numpy as np
import torch

# RL Zoo, hyperparams/dqn.yml (DLR-RM/rl-baselines3-zoo, commit ce95481b041fe5314c1b2f1a53940d169b9253fc)
ZOO = {
    'CartPole-v1': dict(n_timesteps=50_000, learning_rate=2.3e-3, batch_size=64, buffer_size=100_000,
                        learning_starts=1000, gamma=0.99, target_update_interval=10, train_freq=256,
                        gradient_steps=128, exploration_fraction=0.16, exploration_final_eps=0.04),
    'Acrobot-v1': dict(n_timesteps=100_000, learning_rate=6.3e-4, batch_size=128, buffer_size=50_000,
                       learning_starts=0, gamma=0.99, target_update_interval=250, train_freq=4, gradient_steps=-1,
                       exploration_fraction=0.12, exploration_final_eps=0.1),
    'MountainCar-v0': dict(n_timesteps=120_000, learning_rate=4e-3, batch_size=128, buffer_size=10_000,
                           learning_starts=1000, gamma=0.98, target_update_interval=600, train_freq=16,
                           gradient_steps=8, exploration_fraction=0.2, exploration_final_eps=0.07),
}
NET = dict(net_arch=[256, 256])   # every one of the three: policy_kwargs "dict(net_arch=[256, 256])"

def make_model(algo:str, env_id:str, seed:int, buffer_kwargs:dict):
    "The algorithm at RL Zoo's settings for `env_id`, minus `n_timesteps`."
    from stable_baselines3 import DQN
    from fastrl_per.sb3 import PrioritizedDQN
    hp = {k: v for k, v in ZOO[env_id].items() if k != 'n_timesteps'}
    if algo == 'DQN': return DQN('MlpPolicy', env_id, policy_kwargs=NET, seed=seed, **hp)

    class WeightsSeen(PrioritizedDQN):   # keeps the mean importance weight of every `train` call
        def train(self, gradient_steps:int, batch_size:int=100) -> None:
            super().train(gradient_steps, batch_size)
            self.weights_seen.append(self.logger.name_to_value['train/mean_weight'])
    model = WeightsSeen('MlpPolicy', env_id, policy_kwargs=NET, seed=seed, replay_buffer_kwargs=buffer_kwargs, **hp)
    model.weights_seen = []
    return model

def run(algo:str, env_id:str, seed:int, steps:int, episodes:int, buffer_kwargs:dict) -> dict:
    "Train one model, time it, evaluate it."
    import gymnasium as gym
    from stable_baselines3.common.evaluation import evaluate_policy
    model = make_model(algo, env_id, seed, buffer_kwargs)
    cpu, wall = time.process_time(), time.perf_counter()
    model.learn(steps)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    eval_env = gym.make(env_id)
    eval_env.reset(seed=10_000 + seed)
    mean, _ = evaluate_policy(model, eval_env, n_eval_episodes=episodes, deterministic=True)
    weights = getattr(model, 'weights_seen', None)
    return dict(algo=algo, env=env_id, seed=seed, steps=steps, ret=float(mean), cpu_per_1k=1000 * cpu / steps,
                wall_per_1k=1000 * wall / steps, mean_weight=float(np.mean(weights)) if weights else None,
                buffer_kwargs=repr(buffer_kwargs))

def cell(values:list, fmt:str) -> str:
    "mean ± sd (n) of `values`."
    if not values: return '-'
    return f"{np.mean(values):{fmt}} ± {np.std(values):{fmt}} ({len(values)})"

def table(runs:list[dict]) -> str:
    "A markdown table: per env, each algorithm's return, CPU per 1,000 steps, and PER's mean weight."
    head = ("| env | seeds | DQN return | PrioritizedDQN return | DQN CPU s / 1k steps "
            "| PrioritizedDQN CPU s / 1k steps | CPU ratio | PER mean weight |\n|---|---|---|---|---|---|---|---|")
    rows = []
    for env_id in ZOO:
        by = {a: [r for r in runs if r['env'] == env_id and r['algo'] == a] for a in ('DQN', 'PrioritizedDQN')}
        if not any(by.values()): continue
        cpu = {a: [r['cpu_per_1k'] for r in rs] for a, rs in by.items()}
        ratio = f"{np.mean(cpu['PrioritizedDQN']) / np.mean(cpu['DQN']):.2f}×" if all(cpu.values()) else '-'
        seeds = sorted({r['seed'] for rs in by.values() for r in rs})
        rows.append(f"| {env_id} | {' '.join(map(str, seeds))} | {cell([r['ret'] for r in by['DQN']], '.1f')} "
                    f"| {cell([r['ret'] for r in by['PrioritizedDQN']], '.1f')} | {cell(cpu['DQN'], '.2f')} "
                    f"| {cell(cpu['PrioritizedDQN'], '.2f')} | {ratio} "
                    f"| {cell([r['mean_weight'] for r in by['PrioritizedDQN']], '.3f')} |")
    return '\n'.join([head] + rows)

def per_seed(runs:list[dict]) -> str:
    "One line per run: its return and CPU per 1,000 steps."
    return '\n'.join(f"{r['env']:15} seed {r['seed']} {r['algo']:15} return {r['ret']:8.1f}  "
                     f"CPU s/1k {r['cpu_per_1k']:6.2f}" + (f"  mean weight {r['mean_weight']:.3f}"
                                                         if r['mean_weight'] is not None else '') for r in runs)

def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--envs', nargs='+', default=list(ZOO), choices=list(ZOO))
    p.add_argument('--seeds', nargs='+', type=int, default=[0, 1, 2])
    p.add_argument('--episodes', type=int, default=10, help="deterministic evaluation episodes per run")
    p.add_argument('--buffer-kwargs', default='dict()', help="PrioritizedDQN's replay_buffer_kwargs, as RL Zoo's yaml")
    p.add_argument('--runs', default='sb3_per_runs.jsonl', help="file the runs are appended to, one JSON line each")
    p.add_argument('--table-only', action='store_true', help="print the table of the runs in --runs; run nothing")
    p.add_argument('--quick', action='store_true',
                   help="2,000 steps, seed 0, 2 evaluation episodes; the runs are printed, not kept")
    a = p.parse_args()
    path, runs = Path(a.runs), []
    kept = [] if a.quick or not path.exists() else [json.loads(line) for line in path.read_text().splitlines() if line]
    done = {(r['algo'], r['env'], r['seed']) for r in kept}
    if not a.table_only:
        torch.set_num_threads(1)
        seeds, episodes = ([0], 2) if a.quick else (a.seeds, a.episodes)
        kwargs = eval(a.buffer_kwargs, {'dict': dict})
        for env_id in a.envs:
            for seed in seeds:
                for algo in ('DQN', 'PrioritizedDQN'):
                    if (algo, env_id, seed) in done: continue   # in --runs already: an interrupted benchmark goes on
                    steps = 2000 if a.quick else ZOO[env_id]['n_timesteps']
                    runs.append(run(algo, env_id, seed, steps, episodes, kwargs))
                    if a.quick: continue   # a smoke run: printed, not kept
                    with path.open('a') as f: f.write(json.dumps(runs[-1]) + '\n')
    if not a.quick: runs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    print(per_seed(runs))
    print(table(runs))

if __name__ == '__main__':
    main()
