"""A prioritized replay buffer larger than this machine's memory, on disk: fill an on-disk ring of Atari-sized
transitions (two 84x84 uint8 frames each) to `--times` x the machine's RAM, then time what a training loop does with
it (sample 32 and 256 with priority updates, add, save in place, load in a fresh process's buffer) against the same
calls on an in-memory buffer of `--memory-rows` rows in the same run. The process's resident memory is printed with
each step: it stays far below the buffer's size. The files are deleted at the end.

    python benchmarks/disk_replay.py --times 2 --dir /work/disk_replay
"""
import argparse, os, shutil, time
from pathlib import Path
import numpy as np
from fastrl_per.replay.memory import RingStorage
from fastrl_per.replay.per import PrioritizedReplayBuffer

SHAPE, BATCH = (84, 84), 20_000   # an Atari frame as stored by a ring (no frame sharing); rows written per extend

def rss_gb(kind:str='RssAnon') -> float:
    ("This process's resident memory of `kind` in GB: RssAnon, its own; RssFile, pages of mapped files (the buffer's, "
     "which the OS drops when memory is short).")
    return int(next(l for l in open('/proc/self/status') if l.startswith(kind + ':')).split()[1]) / 1e6

def resident() -> str: return f"RSS own {rss_gb():.2f} GB, of mapped files {rss_gb('RssFile'):.2f} GB"

def ram_gb() -> float:
    return os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 1e9

def batch(n:int, start:int, rng, noise:np.ndarray|None=None) -> dict:
    "`n` transitions; their frames are `noise` (made once by the caller: filling is I/O) or made here."
    frames = rng.integers(0, 255, (n, *SHAPE), np.uint8) if noise is None else noise[:n]
    return dict(state=frames, next_state=frames, action=rng.integers(0, 6, n), reward=np.ones(n, np.float32),
                terminated=np.zeros(n, bool), step=np.arange(start, start + n))

def fill(buffer, rows:int, rng, report:bool=False):
    t0, done, noise = time.perf_counter(), 0, rng.integers(0, 255, (BATCH, *SHAPE), np.uint8)
    while done < rows:
        n = min(BATCH, rows - done)
        buffer.extend(**batch(n, done, rng, noise))
        done += n
        if report and done % (BATCH * 25) == 0:
            print(f"  filled {done:,} rows ({done * buffer.storage.rows.itemsize / 1e9:.1f} GB) "
                  f"in {time.perf_counter() - t0:.0f} s, {resident()}", flush=True)
    return time.perf_counter() - t0

def per_call(f, repeats:int) -> float:
    "Median µs of `f()` over `repeats` calls."
    times = []
    for _ in range(repeats):
        t = time.perf_counter(); f(); times.append(time.perf_counter() - t)
    return float(np.median(times)) * 1e6

def loop_costs(buffer, rng, repeats:int) -> dict:
    def learn(bs):
        b = buffer.sample(bs)
        buffer.update_priorities(b.idxs, rng.random(bs))
    one = batch(1, 0, rng)
    one = {k: v[0] for k, v in one.items()}
    return {'sample+update 32': per_call(lambda: learn(32), repeats),
            'sample+update 256': per_call(lambda: learn(256), repeats // 4),
            'add one': per_call(lambda: buffer.add(**one), repeats)}

def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--times', type=float, default=2.0, help="buffer size as a multiple of the machine's RAM")
    p.add_argument('--memory-rows', type=int, default=200_000, help='rows of the in-memory buffer compared')
    p.add_argument('--repeats', type=int, default=400)
    p.add_argument('--dir', default='disk_replay', help='where the on-disk buffer goes (deleted at the end)')
    a = p.parse_args()
    rng, where = np.random.default_rng(0), Path(a.dir)
    row = 2 * np.prod(SHAPE) + 32
    rows = int(a.times * ram_gb() * 1e9 / row)
    free = shutil.disk_usage(where.parent if where.parent.exists() else '.').free
    if rows * row > 0.9 * free: raise SystemExit(f"{rows * row / 1e9:.0f} GB do not fit in {free / 1e9:.0f} GB free")
    print(f"RAM {ram_gb():.1f} GB; on-disk buffer of {rows:,} rows ({rows * row / 1e9:.1f} GB, {a.times}x RAM) in {where}")
    try:
        disk = PrioritizedReplayBuffer(bs=32, seed=0, storage=RingStorage(rows, path=where))
        fill_s = fill(disk, rows, rng, report=True)
        print(f"filled in {fill_s:.0f} s ({rows * row / 1e9 / fill_s:.2f} GB/s), {resident()}")
        t = time.perf_counter(); disk.save(where); save_s = time.perf_counter() - t
        print(f"save in place (a flush and state.pt): {save_s:.1f} s")
        t = time.perf_counter()
        again = PrioritizedReplayBuffer(bs=32, seed=0, storage=RingStorage(rows, path=where))
        again.load(where); load_s = time.perf_counter() - t
        print(f"load (maps the file): {load_s:.2f} s, {resident()}")
        on_disk = loop_costs(again, rng, a.repeats)
        memory = PrioritizedReplayBuffer(a.memory_rows, bs=32, seed=0)
        fill(memory, a.memory_rows, rng)
        in_memory = loop_costs(memory, rng, a.repeats)
        print(f"\n| call (µs, median) | in memory, {a.memory_rows:,} rows | on disk, {rows:,} rows ({a.times}x RAM) "
              "| disk / memory |\n|---|--:|--:|--:|")
        for k in in_memory: print(f"| {k} | {in_memory[k]:.0f} | {on_disk[k]:.0f} | {on_disk[k] / in_memory[k]:.2f} |")
        print(f"\nat the end (the in-memory buffer included): {resident()}")
    finally:
        shutil.rmtree(where, ignore_errors=True)

if __name__ == '__main__': main()
