"""Prioritized replay on the training device against the host tree with its copies: the time of a sample, an update
and a learner step (sample then update) at N = 2^20 and B = 256, 1,024 and 65,536, timed with CUDA events on a GPU
(wall clock on the CPU), and torchrl's PrioritizedSampler where torchrl imports. Then an Atari-shaped DQN step on the
device (84x84x4 uint8 frames in a device `ReplayBuffer`, the Nature network, Adam) with uniform and prioritized
replay at B = 32 and 256, run eagerly and captured in a CUDA graph (the capture needs CUDA).
Usage: python benchmarks/gpu_replay.py [--device cuda] [--quick] [--reps 50]; --device cpu --quick runs in seconds
(N = 2^12; the DQN step at B = 32 alone)."""
import argparse, time

import numpy as np
import torch
import torch.nn.functional as F

from fastrl_per.replay.devicetree import DevicePriorities
from fastrl_per.replay.priorities import Priorities
from fastrl_per.replay.memory import ReplayBuffer
from fastrl_per.learners.conv import NatureQNetwork


def timer(device):
    "A function that runs `f` `reps` times and gives the mean microseconds: CUDA events on a GPU, else the clock."
    def timed(f, reps):
        f()   # warm up (and compile, for the host tree)
        if device.type == 'cuda':
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(reps): f()
            end.record()
            torch.cuda.synchronize()
            return start.elapsed_time(end) * 1e3 / reps
        t = time.perf_counter()
        for _ in range(reps): f()
        return (time.perf_counter() - t) * 1e6 / reps
    return timed


def ours_on_device(n, bs, device):
    "Sample, update and step of a `DevicePriorities` holding `n` keys, uniforms and TD errors made on the device."
    core = DevicePriorities(n, device=device)
    core.add(0, n)
    td = torch.rand(bs, device=device)
    sample = lambda: core.draw_given(torch.rand(bs, dtype=torch.float64, device=device), check=False)
    keys = sample()[0]
    update = lambda: core.update_unchecked(keys, td)
    def step():
        k, _ = sample()
        core.update_unchecked(k, td)
    return sample, update, step


def ours_on_host(n, bs, device):
    "The host core with the copies a learner on `device` makes: drawn keys and weights there, TD errors back."
    core, rng = Priorities(n), np.random.default_rng(0)
    core.add(0, n)
    td = torch.rand(bs, device=device)
    def sample():
        keys, weights = core.draw(rng, bs)
        return torch.from_numpy(keys).to(device), torch.from_numpy(weights).to(device)
    keys = sample()[0]
    update = lambda: core.update(keys.cpu().numpy(), td.double().cpu().numpy())
    def step():
        k, _ = sample()
        core.update(k.cpu().numpy(), td.double().cpu().numpy())
    return sample, update, step


def torchrl_sampler(n, bs, device):
    "torchrl's PrioritizedSampler on `device` (sampler_device where it has one), or None where torchrl does not import."
    try:
        from torchrl.data import PrioritizedSampler, LazyTensorStorage
    except ImportError: return None
    storage = LazyTensorStorage(n, device=device)
    storage.set(torch.arange(n), torch.zeros(n, device=device))
    sampler = PrioritizedSampler(n, alpha=0.6, beta=0.4)
    sampler.extend(torch.arange(n))
    td = torch.rand(bs, device=device)
    keys = sampler.sample(storage, bs)[0]
    sample = lambda: sampler.sample(storage, bs)
    update = lambda: sampler.update_priority(keys, td)
    def step():
        k, _ = sampler.sample(storage, bs)
        sampler.update_priority(k, td)
    return sample, update, step


def atari_replay(n, device, chunk=8192):
    "A `ReplayBuffer` on `device` holding `n` Atari-shaped transitions (4 stacked 84x84 uint8 frames, 6 actions)."
    buffer = ReplayBuffer(max_sz=n, bs=32, seed=0, device=device)
    for start in range(0, n, chunk):   # in chunks: the random frames made for a write are a chunk, not the buffer
        k = min(chunk, n - start)
        frames = torch.randint(0, 256, (k + 1, 4, 84, 84), dtype=torch.uint8, device=device)
        buffer.extend(state=frames[:-1], action=torch.randint(0, 6, (k,), device=device),
                      reward=torch.rand(k, device=device), next_state=frames[1:],
                      terminated=torch.rand(k, device=device) < 0.01)
    return buffer


def dqn_step(replay, prioritized, bs, device, capturable=False):
    ("One DQN update on `replay`'s device, host-free: draw `bs` slots (uniform, or from a `DevicePriorities` over "
     "them), gather the batch, the weighted Huber loss of the Nature network against its target, Adam, and the "
     "priority update.")
    n = len(replay)
    net, target = NatureQNetwork(4, 6).to(device), NatureQNetwork(4, 6).to(device).requires_grad_(False)
    opt = torch.optim.Adam(net.parameters(), lr=1e-4, capturable=capturable)
    core = None
    if prioritized:
        core = DevicePriorities(n, device=device)
        core.add(0, n)
    def step():
        if core is None: keys, weights = torch.randint(n, (bs,), device=device), torch.ones(bs, device=device)
        else: keys, weights = core.draw_given(torch.rand(bs, dtype=torch.float64, device=device), check=False)
        b = replay.storage.gather(keys)
        q = net(b.state).gather(1, b.action.long().unsqueeze(1)).squeeze(1)
        with torch.no_grad(): goal = b.reward + 0.99 * target(b.next_state).max(1).values * ~b.terminated
        (F.smooth_l1_loss(q, goal, reduction='none') * weights).mean().backward()
        opt.step()
        if core is not None: core.update_unchecked(keys, goal - q.detach())
    return step, opt


def captured(replay, prioritized, bs, device):
    "`dqn_step` captured in a CUDA graph (after warm-up steps on a side stream): one replay per step."
    step, opt = dqn_step(replay, prioritized, bs, device, capturable=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            step()
    torch.cuda.current_stream().wait_stream(side)
    opt.zero_grad(set_to_none=True)   # the captured backward then writes the gradients, it does not add to them
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph): step()
    return graph.replay


def atari_rows(n, batches, reps, device, timed):
    "The table's rows of the Atari-shaped DQN step: uniform and prioritized, eager and captured, at each B."
    replay = atari_replay(n, device)
    for bs in batches:
        for prioritized in (False, True):
            name = f"Atari DQN {'PER' if prioritized else 'uniform'}"
            step, opt = dqn_step(replay, prioritized, bs, device)
            def eager():
                opt.zero_grad(set_to_none=True)
                step()
            print(f"{name + ', eager':<28}{bs:>8}{'':>24}{timed(eager, reps):>12.1f}")
            if device.type != 'cuda':
                print(f"{name + ', captured':<28}{bs:>8}{'':>24}{'needs CUDA':>12}")
                continue
            replay_graph = captured(replay, prioritized, bs, device)
            print(f"{name + ', captured':<28}{bs:>8}{'':>24}{timed(replay_graph, reps):>12.1f}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    p.add_argument('--quick', action='store_true', help='N = 2^12, B = 64 and 256: a check that the script runs')
    p.add_argument('--reps', type=int, default=50)
    a = p.parse_args()
    device = torch.device(a.device)
    n, batches = (2 ** 12, (64, 256)) if a.quick else (2 ** 20, (256, 1024, 65536))
    timed = timer(device)
    unit = 'GPU us (CUDA events)' if device.type == 'cuda' else 'wall us'
    print(f"device {device} ({torch.cuda.get_device_name(device) if device.type == 'cuda' else 'host'}), "
          f"torch {torch.__version__}, N = {n:,}, {a.reps} reps; times in {unit}")
    print(f"{'replay':<28}{'B':>8}{'sample':>12}{'update':>12}{'step':>12}")
    for bs in batches:
        for name, make in (('ours on the device', ours_on_device), ('ours on the host + copy', ours_on_host),
                           ('torchrl PrioritizedSampler', torchrl_sampler)):
            ops = make(n, bs, device)
            if ops is None:
                print(f"{name:<28}{bs:>8}   torchrl does not import here")
                continue
            print(f"{name:<28}{bs:>8}" + ''.join(f"{timed(f, a.reps):>12.1f}" for f in ops))
    # quick: B = 32 alone, one timed step; else 100,000 transitions (5.6 GB of frames) and B = 32 and 256
    atari_rows(*((512, (32,), 1) if a.quick else (100_000, (32, 256), a.reps)), device, timed)


if __name__ == '__main__': main()
