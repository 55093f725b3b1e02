"""Prioritized replay on the training device against the host tree with its copies: the time of a sample, an update
and a learner step (sample then update) at N = 2^20 and B = 256, 1,024 and 65,536, timed with CUDA events on a GPU
(wall clock on the CPU), and torchrl's PrioritizedSampler where torchrl imports.
Usage: python benchmarks/gpu_replay.py [--device cuda] [--quick] [--reps 50]; --device cpu --quick runs in seconds."""
import argparse, time

import numpy as np
import torch

from fastrl_per.replay.devicetree import DevicePriorities
from fastrl_per.replay.priorities import Priorities


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
    print(f"{'replay':<26}{'B':>8}{'sample':>12}{'update':>12}{'step':>12}")
    for bs in batches:
        for name, make in (('ours on the device', ours_on_device), ('ours on the host + copy', ours_on_host),
                           ('torchrl PrioritizedSampler', torchrl_sampler)):
            ops = make(n, bs, device)
            if ops is None:
                print(f"{name:<26}{bs:>8}   torchrl does not import here")
                continue
            print(f"{name:<26}{bs:>8}" + ''.join(f"{timed(f, a.reps):>12.1f}" for f in ops))


if __name__ == '__main__': main()
