#!/usr/bin/env python
"""SB3's `DQN`, `SAC` and `TD3` against `fastrl_per.integrations.sb3`'s prioritized classes at RL Zoo's settings.

Run from the repository root (the sb3 extra installed: `pip install 'fastrl_per[sb3]'`):

    python benchmarks/sb3_per.py             # DQN on CartPole-v1, Acrobot-v1, MountainCar-v0, LunarLander-v3; seeds 0-9
    python benchmarks/sb3_per.py --algo SAC TD3 --envs Pendulum-v1   # SAC and TD3 on Pendulum-v1
    python benchmarks/sb3_per.py --algo SAC TD3 --envs Hopper-v5 --seeds 0 1   # MuJoCo: pip install 'gymnasium[mujoco]'
    python benchmarks/sb3_per.py --quick     # 2,000 steps, one seed: a smoke run, not kept
    python benchmarks/sb3_per.py --table-only   # the table of the runs already in benchmarks/results/sb3_per.jsonl

The settings are RL Zoo's `hyperparams/dqn.yml`, `sac.yml` and `td3.yml` (rl_zoo3 2.9.2), the same for both sides of
a pair: nothing is tuned for either. The prioritized class adds the buffer's own defaults (alpha, beta, eps and the
weights' normalisation; `--buffer-kwargs` overrides them, e.g. `--buffer-kwargs "dict(eps=1e-2)"`) and anneals beta
to 1 over the run. Each run trains for the yaml's `n_timesteps` (or `--steps`) on one env, then plays 10
deterministic episodes on a separately seeded env. Hopper-v5 and HalfCheetah-v5 take the yaml's MuJoCo defaults (named
there for the v4 tasks) but a budget of 40,000 env steps, not RL Zoo's 1,000,000: 10,000 warm-up steps and 30,000
training steps at 16-19.5 CPU ms each (measured here, `MUJOCO_BUDGET`) are at most about 10 CPU minutes a run, where
1e6 steps would be about 5 hours; the table's `steps` column gives the steps run, and a note under it the budget. The
table gives, over seeds, the interquartile mean (IQM) and its 95 % percentile bootstrap interval (2,000 resamples of
the seeds; numpy, not rliable: one task a row, so rliable's stratified bootstrap is the plain one) of that final
return, of the mean return of all training episodes (the area under the learning curve, per episode), of the CPU
seconds per 1,000 env steps of `learn()` (process time, one torch thread) and, for PER, of the importance
weights' mean over training.
Runs go one after the other, uniform then prioritized for each env and seed, and each is appended to `--runs`
(default `benchmarks/results/sb3_per.jsonl`, committed, so that each session adds the seeds it finishes) as it ends,
so an interrupted benchmark keeps what it finished; run again, it skips the runs `--runs` holds. A model's
`seed` fixes its run (replay sampler included), so a run repeated gives the same numbers but the CPU times.
"""
from __future__ import annotations
import argparse, json, time
from pathlib import Path
import numpy as np
import torch

# RL Zoo, hyperparams/dqn.yml (DLR-RM/rl-baselines3-zoo, commit ce95481b041fe5314c1b2f1a53940d169b9253fc; the same in
# rl_zoo3 2.9.2), each with policy_kwargs "dict(net_arch=[256, 256])"
DQN_ZOO = {
    'CartPole-v1': dict(n_timesteps=50_000, learning_rate=2.3e-3, batch_size=64, buffer_size=100_000,
                        learning_starts=1000, gamma=0.99, target_update_interval=10, train_freq=256,
                        gradient_steps=128, exploration_fraction=0.16, exploration_final_eps=0.04),
    'Acrobot-v1': dict(n_timesteps=100_000, learning_rate=6.3e-4, batch_size=128, buffer_size=50_000,
                       learning_starts=0, gamma=0.99, target_update_interval=250, train_freq=4, gradient_steps=-1,
                       exploration_fraction=0.12, exploration_final_eps=0.1),
    'MountainCar-v0': dict(n_timesteps=120_000, learning_rate=4e-3, batch_size=128, buffer_size=10_000,
                           learning_starts=1000, gamma=0.98, target_update_interval=600, train_freq=16,
                           gradient_steps=8, exploration_fraction=0.2, exploration_final_eps=0.07),
    'LunarLander-v3': dict(n_timesteps=100_000, learning_rate=6.3e-4, batch_size=128, buffer_size=50_000,
                           learning_starts=0, gamma=0.99, target_update_interval=250, train_freq=4, gradient_steps=-1,
                           exploration_fraction=0.12, exploration_final_eps=0.1),
}
DQN_ZOO = {env: dict(hp, policy_kwargs=dict(net_arch=[256, 256])) for env, hp in DQN_ZOO.items()}
# RL Zoo 2.9.2, hyperparams/sac.yml and td3.yml: Pendulum-v1, and the MuJoCo tasks' "HalfCheetah-v4: &mujoco-defaults"
# entry (the yaml names the v4 tasks; its Hopper-v4 is the same defaults), else SB3's defaults. TD3's normal action
# noise of std 0.1 is made below. RL Zoo's 1e6 MuJoCo steps are hours a run on this CPU, so those tasks carry a
# `budget`: the env steps a run takes unless --steps says otherwise. Measured here (one torch thread, 2 shared cores,
# seed 0, 3,000 steps past learning_starts): the 10,000 warm-up steps cost 0.33-0.52 ms each, the training steps
# 16.3-19.4 ms (SAC 18.3 / PER 19.4 and TD3 16.3 / 17.9 on Hopper-v5; 16.6 / 18.2 and 17.0 / 17.5 on HalfCheetah-v5),
# so 40,000 steps (30,000 of them training) are at most about 10 CPU minutes a run (80 runs for seeds 0-9).
MUJOCO_BUDGET = 40_000
BUDGET_NOTE = "at most about 10 CPU minutes a run here: 30,000 training steps at 16-19.5 ms"
SAC_MUJOCO = dict(n_timesteps=1_000_000, learning_starts=10_000, budget=MUJOCO_BUDGET)
TD3_MUJOCO = dict(n_timesteps=1_000_000, learning_starts=10_000, noise_std=0.1, train_freq=1, gradient_steps=1,
                  learning_rate=1e-3, batch_size=256, policy_kwargs=dict(net_arch=[400, 300]), budget=MUJOCO_BUDGET)
MUJOCO = ('Hopper-v5', 'HalfCheetah-v5')
ZOO = {'DQN': DQN_ZOO,
       'SAC': {'Pendulum-v1': dict(n_timesteps=20_000, learning_rate=1e-3), **{env: SAC_MUJOCO for env in MUJOCO}},
       'TD3': {'Pendulum-v1': dict(n_timesteps=20_000, gamma=0.98, buffer_size=200_000, learning_starts=10_000,
                                   gradient_steps=1, train_freq=1, learning_rate=1e-3, noise_std=0.1,
                                   policy_kwargs=dict(net_arch=[400, 300])),
               **{env: TD3_MUJOCO for env in MUJOCO}}}

def run_steps(algo:str, env_id:str, steps:int|None=None) -> int:
    "The env steps a run takes: `steps` if given, else the env's `budget`, else RL Zoo's `n_timesteps`."
    hp = ZOO[algo][env_id]
    return steps or hp.get('budget') or hp['n_timesteps']

def need_mujoco():
    "Exit with one line naming the install when the MuJoCo tasks' simulator is missing."
    try: import mujoco  # noqa: F401
    except ImportError:
        raise SystemExit("sb3_per.py: Hopper-v5 and HalfCheetah-v5 need MuJoCo: pip install 'gymnasium[mujoco]'")

def make_model(algo:str, prioritized:bool, env_id:str, seed:int, buffer_kwargs:dict, learning_starts:int|None=None):
    ("SB3's `algo`, or its prioritized class, at RL Zoo's settings for `env_id`, minus `n_timesteps` and `budget`; "
     "`learning_starts`, if given, replaces the yaml's (--quick's smoke runs only).")
    import gymnasium as gym, stable_baselines3, fastrl_per.integrations.sb3
    from stable_baselines3.common.noise import NormalActionNoise
    hp = {k: v for k, v in ZOO[algo][env_id].items() if k not in ('n_timesteps', 'budget')}
    if learning_starts is not None: hp['learning_starts'] = learning_starts
    if 'noise_std' in hp:
        n = gym.make(env_id).action_space.shape[0]
        hp['action_noise'] = NormalActionNoise(np.zeros(n), hp.pop('noise_std') * np.ones(n))
    if not prioritized: return getattr(stable_baselines3, algo)('MlpPolicy', env_id, seed=seed, **hp)
    base = getattr(fastrl_per.integrations.sb3, f'Prioritized{algo}')

    class WeightsSeen(base):   # keeps the mean importance weight of every `train` call
        def train(self, gradient_steps:int, batch_size:int=100) -> None:
            super().train(gradient_steps, batch_size)
            self.weights_seen.append(self.logger.name_to_value['train/mean_weight'])
    model = WeightsSeen('MlpPolicy', env_id, seed=seed, replay_buffer_kwargs=buffer_kwargs, **hp)
    model.weights_seen = []
    return model

def run(algo:str, prioritized:bool, env_id:str, seed:int, steps:int, episodes:int, buffer_kwargs:dict,
        learning_starts:int|None=None) -> dict:
    "Train one model, time it, evaluate it."
    import gymnasium as gym
    from stable_baselines3.common.evaluation import evaluate_policy
    model = make_model(algo, prioritized, env_id, seed, buffer_kwargs, learning_starts)
    cpu, wall = time.process_time(), time.perf_counter()
    model.learn(steps)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    training = model.get_env().env_method('get_episode_rewards')[0]   # SB3 wraps the env in a Monitor
    eval_env = gym.make(env_id)
    eval_env.reset(seed=10_000 + seed)
    mean, _ = evaluate_policy(model, eval_env, n_eval_episodes=episodes, deterministic=True)
    weights = getattr(model, 'weights_seen', None)
    name = f'Prioritized{algo}' if prioritized else algo
    return dict(algo=name, env=env_id, seed=seed, steps=steps, ret=float(mean), cpu_per_1k=1000 * cpu / steps,
                auc=float(np.mean(training)) if training else None,
                wall_per_1k=1000 * wall / steps, mean_weight=float(np.mean(weights)) if weights else None,
                buffer_kwargs=repr(buffer_kwargs))

def iqm(values) -> float:
    "The interquartile mean: the mean of the values left when a quarter is cut from each end (as scipy's trim_mean)."
    x = np.sort(np.asarray(values, float))
    cut = int(0.25 * len(x))
    return float(x[cut:len(x) - cut].mean())

def bootstrap_ci(values, reps:int=2000, seed:int=0) -> tuple[float, float]:
    ("The 95 % percentile bootstrap interval of the IQM over seeds: `reps` resamples of the seeds with replacement. "
     "Each table row is one task, so rliable's bootstrap stratified by task is this plain one.")
    x = np.asarray(values, float)
    draws = np.random.default_rng(seed).integers(0, len(x), (reps, len(x)))
    lo, hi = np.percentile([iqm(x[d]) for d in draws], [2.5, 97.5])
    return float(lo), float(hi)

def cell(values:list, fmt:str) -> str:
    "IQM [95 % bootstrap interval] (n) of `values`."
    if not values: return '-'
    lo, hi = bootstrap_ci(values)
    return f"{iqm(values):{fmt}} [{lo:{fmt}}, {hi:{fmt}}] ({len(values)})"

def table(runs:list[dict]) -> str:
    ("A markdown table: per algorithm and env, each side's final return, mean training-episode return (AUC), CPU per "
     "1,000 steps, and PER's mean weight, each as IQM [95 % bootstrap interval] (seeds).")
    head = ("| algo | env | steps | seeds | return | PER return | AUC | PER AUC | CPU s / 1k steps "
            "| PER CPU s / 1k steps | CPU ratio | PER mean weight |\n|---|---|---|---|---|---|---|---|---|---|---|---|")
    rows, notes = [], []
    for algo, envs in ZOO.items():
        for env_id in envs:
            by = {side: [r for r in runs if r['env'] == env_id and r['algo'] == name]
                  for side, name in (('uniform', algo), ('per', f'Prioritized{algo}'))}
            if not any(by.values()): continue
            col = lambda side, key, fmt: cell([r[key] for r in by[side] if r.get(key) is not None], fmt)
            cpu = {side: [r['cpu_per_1k'] for r in rs] for side, rs in by.items()}
            ratio = f"{np.mean(cpu['per']) / np.mean(cpu['uniform']):.2f}×" if all(cpu.values()) else '-'
            seeds = sorted({r['seed'] for rs in by.values() for r in rs})
            steps = sorted({r['steps'] for rs in by.values() for r in rs})
            rows.append(f"| {algo} | {env_id} | {'/'.join(map(str, steps))} | {' '.join(map(str, seeds))} "
                        f"| {col('uniform', 'ret', '.1f')} | {col('per', 'ret', '.1f')} "
                        f"| {col('uniform', 'auc', '.1f')} "
                        f"| {col('per', 'auc', '.1f')} | {col('uniform', 'cpu_per_1k', '.2f')} "
                        f"| {col('per', 'cpu_per_1k', '.2f')} | {ratio} | {col('per', 'mean_weight', '.3f')} |")
            if any(n < envs[env_id]['n_timesteps'] for n in steps):
                budget = envs[env_id].get('budget')
                why = (f"its budget of {budget:,} env steps ({BUDGET_NOTE})" if budget and set(steps) == {budget}
                       else "--steps or --quick" + (f" (its budget: {budget:,})" if budget else ''))
                notes.append(f"{algo} on {env_id}: {'/'.join(f'{n:,}' for n in steps)} steps of RL Zoo's "
                             f"{envs[env_id]['n_timesteps']:,}, by {why}")
    return '\n'.join([head] + rows + ([''] + notes if notes else []))

def per_seed(runs:list[dict]) -> str:
    "One line per run: its return and CPU per 1,000 steps."
    return '\n'.join(f"{r['env']:15} seed {r['seed']} {r['algo']:15} return {r['ret']:8.1f}  "
                     + (f"AUC {r['auc']:8.1f}  " if r.get('auc') is not None else '')
                     + f"CPU s/1k {r['cpu_per_1k']:6.2f}" + (f"  mean weight {r['mean_weight']:.3f}"
                                                         if r['mean_weight'] is not None else '') for r in runs)

RUNS = Path(__file__).parent / 'results' / 'sb3_per.jsonl'   # committed: each session adds the runs it finishes

def read_runs(path:Path) -> list[dict]:
    ("The runs in `path`, one JSON line each. A last line without its newline (a benchmark killed while writing) is "
     "cut off the file, so that the run is made again and the next one appended on a line of its own.")
    text = path.read_text() if path.exists() else ''
    if text and not text.endswith('\n'):
        text = text[:text.rfind('\n') + 1]
        path.write_text(text)
    return [json.loads(line) for line in text.splitlines() if line.strip()]

def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--algo', nargs='+', default=['DQN'], choices=list(ZOO))
    p.add_argument('--envs', nargs='+', help="of the algorithms' envs in ZOO, those to run (default: all)")
    p.add_argument('--steps', type=int,
                   help="env steps per run (default: the env's budget, else the yaml's n_timesteps)")
    p.add_argument('--seeds', nargs='+', type=int, default=list(range(10)))
    p.add_argument('--episodes', type=int, default=10, help="deterministic evaluation episodes per run")
    p.add_argument('--buffer-kwargs', default='dict()', help="PrioritizedDQN's replay_buffer_kwargs, as RL Zoo's yaml")
    p.add_argument('--runs', default=str(RUNS), help="file the runs are appended to, one JSON line each")
    p.add_argument('--table-only', action='store_true', help="print the table of the runs in --runs; run nothing")
    p.add_argument('--quick', action='store_true',
                   help="2,000 steps (learning_starts at most 1,000, so that training runs), seed 0, 2 evaluation "
                        "episodes; the runs are printed, not kept")
    a = p.parse_args()
    path, runs = Path(a.runs), []
    kept = [] if a.quick or not path.exists() else read_runs(path)
    done = {(r['algo'], r['env'], r['seed']) for r in kept}
    if not a.table_only:
        torch.set_num_threads(1)
        seeds, episodes = ([0], 2) if a.quick else (a.seeds, a.episodes)
        kwargs = eval(a.buffer_kwargs, {'dict': dict})
        todo = [(algo, env_id) for algo in a.algo for env_id in ZOO[algo] if not a.envs or env_id in a.envs]
        if any(env_id in MUJOCO for _, env_id in todo): need_mujoco()
        for algo, env_id in todo:
            for seed in seeds:
                for prioritized in (False, True):
                    name = f'Prioritized{algo}' if prioritized else algo
                    if (name, env_id, seed) in done: continue   # in --runs already: an interrupted benchmark goes on
                    steps = 2000 if a.quick else run_steps(algo, env_id, a.steps)
                    starts = min(1000, ZOO[algo][env_id].get('learning_starts', 100)) if a.quick else None
                    runs.append(run(algo, prioritized, env_id, seed, steps, episodes, kwargs, starts))
                    if a.quick: continue   # a smoke run: printed, not kept
                    path.parent.mkdir(parents=True, exist_ok=True)
                    with path.open('a') as f: f.write(json.dumps(runs[-1]) + '\n')
    if not a.quick: runs = read_runs(path)
    print(per_seed(runs))
    print(table(runs))

if __name__ == '__main__':
    main()
