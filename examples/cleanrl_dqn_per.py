"""DQN in one file, written in CleanRL's style, with prioritized replay from fastrl_per.

The loop is CleanRL's `dqn.py` (its published defaults: Adam 2.5e-4, a buffer of 10,000, gamma 0.99, a hard target
update every 500 steps, batch 128, epsilon 1 -> 0.05 over half the run, learning from step 10,000 every 10 steps,
500,000 steps, a 120-84 MLP, the mean squared TD error) on gymnasium 1.x, with three lines that prioritized replay
adds: the loss weighted by the batch's importance weights, the TD errors handed back as priorities, and beta annealed
over the run. `--replay` picks the buffer; the loop is the same for all three, since fastrl_per's uniform
`ReplayBuffer` answers `update_priorities` and `anneal_beta` too:

- `per`: fastrl_per's `PrioritizedReplayBuffer` (`--weight-norm`, `--eps`, `--alpha`, `--beta`);
- `uniform`: fastrl_per's `ReplayBuffer`;
- `sb3`: Stable-Baselines3's plain `ReplayBuffer` (imported only then: `pip install stable-baselines3`).

    python examples/cleanrl_dqn_per.py --seed 1 --replay per --out runs/cleanrl-per-1
    python examples/cleanrl_dqn_per.py --total-timesteps 30000 --learning-starts 600 --replay uniform

It logs as CleanRL does: a `global_step=..., episodic_return=...` line per episode, an `SPS:` line every 100 steps
once learning, and TensorBoard events under `runs/{env_id}__{exp_name}__{seed}__{time}` (`tensorboard --logdir runs`):
charts/episodic_return, charts/episodic_length, charts/epsilon, charts/SPS, losses/td_loss, losses/q_values and,
this script's own, losses/mean_weight and charts/beta. With `--out DIR` it also writes `DIR/episodes.csv` (env step,
episodic return), `DIR/train.csv` (one row per 1,000 env steps once learning: loss, mean importance weight, epsilon,
beta, SPS) and `DIR/summary.json`; its last line is the summary. Needs the `cleanrl` extra (tyro and TensorBoard:
`.venv/bin/pip install -e '.[cleanrl]'` in a clone).
"""
from __future__ import annotations
import csv, dataclasses, json, os, random, time
from pathlib import Path
from types import SimpleNamespace
from typing import Literal
import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim
import tyro
from torch.utils.tensorboard import SummaryWriter
from fastrl_per.replay.memory import ReplayBuffer
from fastrl_per.replay.per import PrioritizedReplayBuffer
from fastrl_per.replay.priorities import EPS, WEIGHT_NORM


@dataclasses.dataclass
class Args:
    exp_name: str = os.path.basename(__file__)[: -len(".py")]
    """the name of this experiment (in the TensorBoard run's name)"""
    seed: int = 1
    """seed of the run (Python, numpy, torch, the env and the replay's sampler)"""
    env_id: str = "CartPole-v1"
    """the id of the environment"""
    total_timesteps: int = 500_000
    """total env steps of the run"""
    learning_rate: float = 2.5e-4
    """Adam's learning rate"""
    buffer_size: int = 10_000
    """the replay memory's capacity"""
    gamma: float = 0.99
    """the discount factor"""
    tau: float = 1.0
    """the target network's update rate (1: a hard copy)"""
    target_network_frequency: int = 500
    """env steps between target network updates"""
    batch_size: int = 128
    """transitions sampled per update"""
    start_e: float = 1.0
    """epsilon at the start"""
    end_e: float = 0.05
    """epsilon at the end of its decay"""
    exploration_fraction: float = 0.5
    """the fraction of `total_timesteps` over which epsilon falls from start_e to end_e"""
    learning_starts: int = 10_000
    """env steps before learning starts"""
    train_frequency: int = 10
    """env steps between updates"""
    replay: Literal["per", "uniform", "sb3"] = "per"
    """the replay buffer: fastrl_per's prioritized or uniform one, or Stable-Baselines3's"""
    weight_norm: Literal["batch", "buffer"] = WEIGHT_NORM
    """per: the importance weights divided by the batch's largest weight or the buffer's largest possible one"""
    eps: float = EPS
    """per: added to every |TD error|"""
    alpha: float = 0.6
    """per: how much prioritization is used"""
    beta: float = 0.4
    """per: the importance-sampling exponent at the start, annealed to 1 over the run"""
    threads: int = 1
    """torch CPU threads"""
    cuda: bool = True
    """train on CUDA when it is available"""
    out: str | None = None
    """a directory for episodes.csv, train.csv and summary.json"""


class QNetwork(nn.Module):
    def __init__(self, env):
        super().__init__()
        self.network = nn.Sequential(nn.Linear(int(np.prod(env.observation_space.shape)), 120), nn.ReLU(),
                                     nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, env.action_space.n))

    def forward(self, x): return self.network(x)


def linear_schedule(start_e: float, end_e: float, duration: int, t: int) -> float:
    slope = (end_e - start_e) / duration
    return max(slope * t + start_e, end_e)


class SB3Replay:
    "Stable-Baselines3's plain `ReplayBuffer` behind the loop's buffer interface: no priorities, weights of one."
    def __init__(self, buffer_size: int, env, device):
        from stable_baselines3.common.buffers import ReplayBuffer as SB3ReplayBuffer
        self.rb = SB3ReplayBuffer(buffer_size, env.observation_space, env.action_space, device,
                                  handle_timeout_termination=False)

    def add(self, state, action, reward, next_state, terminated):
        self.rb.add(state[None], next_state[None], np.array([action]), np.array([reward]), np.array([terminated]),
                    [{}])

    def sample(self, bs: int, device=None):
        data = self.rb.sample(bs)
        return SimpleNamespace(state=data.observations, action=data.actions.flatten(),
                               next_state=data.next_observations, reward=data.rewards.flatten(),
                               terminated=data.dones.flatten(), idxs=None,
                               weights=torch.ones(bs, device=data.rewards.device))

    def update_priorities(self, idxs, td_errors): pass
    def anneal_beta(self, fraction: float, final: float = 1.0): pass


def make_replay(args: Args, env, device):
    "The buffer `--replay` names; the loop below uses it the same way whichever it is."
    if args.replay == "sb3": return SB3Replay(args.buffer_size, env, device)
    if args.replay == "uniform": return ReplayBuffer(max_sz=args.buffer_size, bs=args.batch_size, seed=args.seed)
    return PrioritizedReplayBuffer(max_sz=args.buffer_size, bs=args.batch_size, alpha=args.alpha, beta=args.beta,
                                   eps=args.eps, seed=args.seed, weight_norm=args.weight_norm)


def main(args: Args) -> dict:
    random.seed(args.seed); np.random.seed(args.seed); torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = True
    torch.set_num_threads(args.threads)
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    run_name = f"{args.env_id}__{args.exp_name}__{args.seed}__{int(time.time())}"
    writer = SummaryWriter(f"runs/{run_name}")
    writer.add_text("hyperparameters", "|param|value|\n|-|-|\n" +
                    "\n".join(f"|{key}|{value}|" for key, value in vars(args).items()))

    env = gym.wrappers.RecordEpisodeStatistics(gym.make(args.env_id))
    assert isinstance(env.action_space, gym.spaces.Discrete), "only discrete action spaces are supported"
    env.action_space.seed(args.seed)
    q_network = QNetwork(env).to(device)
    optimizer = optim.Adam(q_network.parameters(), lr=args.learning_rate)
    target_network = QNetwork(env).to(device)
    target_network.load_state_dict(q_network.state_dict())
    rb = make_replay(args, env, device)

    episodes, rows, interval = [], [], dict(loss=[], weight=[])
    weights_sum, updates, start_time = 0.0, 0, time.time()
    obs, _ = env.reset(seed=args.seed)
    for global_step in range(args.total_timesteps):
        epsilon = linear_schedule(args.start_e, args.end_e, args.exploration_fraction * args.total_timesteps,
                                  global_step)
        if random.random() < epsilon: action = env.action_space.sample()
        else:
            with torch.no_grad(): action = int(q_network(torch.as_tensor(obs, device=device)).argmax())
        next_obs, reward, terminated, truncated, info = env.step(action)
        # only termination stops bootstrapping: a truncated step keeps its true next observation
        rb.add(state=obs, action=action, reward=reward, next_state=next_obs, terminated=terminated)
        if terminated or truncated:
            print(f"global_step={global_step}, episodic_return={info['episode']['r']}")
            writer.add_scalar("charts/episodic_return", info["episode"]["r"], global_step)
            writer.add_scalar("charts/episodic_length", info["episode"]["l"], global_step)
            episodes.append((global_step, float(info["episode"]["r"])))
            obs, _ = env.reset()
        else: obs = next_obs

        if global_step > args.learning_starts:
            if global_step % args.train_frequency == 0:
                data = rb.sample(args.batch_size, device=device)
                with torch.no_grad():
                    target_max = target_network(data.next_state).max(dim=1).values
                    td_target = data.reward.flatten() + args.gamma * target_max * (1 - data.terminated.float())
                old_val = q_network(data.state).gather(1, data.action.long().view(-1, 1)).squeeze(1)
                td_error = td_target - old_val
                loss = (data.weights * td_error.pow(2)).mean()   # CleanRL's MSE, each sample's term weighted
                if global_step % 100 == 0:
                    sps = int(global_step / (time.time() - start_time))
                    print("SPS:", sps)
                    for tag, value in [("losses/td_loss", loss.item()), ("losses/q_values", old_val.mean().item()),
                                       ("losses/mean_weight", data.weights.mean().item()), ("charts/SPS", sps),
                                       ("charts/epsilon", epsilon), ("charts/beta", getattr(rb, "beta", 1.0))]:
                        writer.add_scalar(tag, value, global_step)
                rb.update_priorities(data.idxs, td_error.detach())
                rb.anneal_beta(global_step / args.total_timesteps)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                weight = float(data.weights.mean())
                weights_sum, updates = weights_sum + weight, updates + 1
                interval["loss"].append(loss.item()); interval["weight"].append(weight)
            if global_step % args.target_network_frequency == 0:
                for target_param, q_param in zip(target_network.parameters(), q_network.parameters()):
                    target_param.data.copy_(args.tau * q_param.data + (1.0 - args.tau) * target_param.data)
            if global_step % 1000 == 0 and interval["loss"]:
                rows.append(dict(step=global_step, loss=np.mean(interval["loss"]), weight=np.mean(interval["weight"]),
                                 epsilon=epsilon, beta=getattr(rb, "beta", 1.0),
                                 sps=int(global_step / (time.time() - start_time))))
                interval = dict(loss=[], weight=[])
    env.close()
    writer.close()
    seconds = time.time() - start_time
    returns = [r for _, r in episodes]
    summary = dict(args=dataclasses.asdict(args), episodes=len(episodes), updates=updates,
                   last20_return=float(np.mean(returns[-20:])) if returns else None,
                   sps=round(args.total_timesteps / seconds, 1), seconds=round(seconds, 1),
                   mean_weight=weights_sum / updates if updates else None)
    if args.out: write_run(Path(args.out), episodes, rows, summary)
    return summary


def write_run(out: Path, episodes: list, rows: list, summary: dict):
    "episodes.csv, train.csv and summary.json in `out`."
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "episodes.csv", "w", newline="") as f: csv.writer(f).writerows([("step", "return"), *episodes])
    with open(out / "train.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["step", "loss", "weight", "epsilon", "beta", "sps"])
        writer.writeheader(); writer.writerows(rows)
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    summary = main(tyro.cli(Args))
    print(json.dumps({k: v for k, v in summary.items() if k != "args"}))
