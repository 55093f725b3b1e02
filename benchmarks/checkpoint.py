"""What a checkpoint of a prioritized replay buffer costs: the directory save (`buffer.save(dir)`: a first, full save;
a save after 5,000 more transitions, incremental) against the old single file (`torch.save(buffer.state_dict())`), for
a ring in memory and a ring on disk (`RingStorage(path=dir)`, `FrameStorage(path=dir)`), at several sizes of three
transition kinds: CartPole (float32 (4,) observations), 110 floats (the issue's measurement) and Atari frames
(`FrameStorage`, stacks of four 84x84 uint8 frames). Run from the repository root:

    nice -n 10 python benchmarks/checkpoint.py                    # the default table (about 10 minutes on 2 cores)
    nice -n 10 python benchmarks/checkpoint.py --quick            # a smoke run: sizes 10^4
    nice -n 10 python benchmarks/checkpoint.py --kinds atari --atari-sizes 1000000 --storages disk --no-old
    nice -n 10 python benchmarks/checkpoint.py --checksum-cost --kinds floats   # with and without checksums

Each buffer is filled, measured and saved in a fresh child process, and loaded in another: **save** the time of
the first save (a full one; on disk a flush of what the OS has not written yet); **save peak** the largest rise of
the process's resident memory (VmRSS, sampled every millisecond in a thread) during it, over the buffer's data
(`storage.nbytes()`); **+5k** the time and the bytes written to disk (`write_bytes` of /proc/self/io over the 5,000
adds and the save: for a ring on disk the adds' own pages count, as they reach the disk then) of the next save, and
**+5k / old** its time over the old format's full save; **load** a fresh buffer's `load` and its peak rise; **sample**
the median `sample(256)`, **add** the median single-transition `add`, with the data in the page cache (where a buffer
is measured both in memory and on disk, the two are timed in turns by one more process holding both). The old
format is the reference in the same process. The files go under `--dir` and are deleted as each buffer is done.
Goals (#43): a save raises peak memory by at most 0.1x the data; a save after 5,000 more transitions takes at most
0.1x a full save; a buffer on disk samples at most 1.2x as slowly as in memory.

`--checksum-cost` measures what the save's checksums (XXH3-64) cost, in one child process per buffer, with and
without them taking turns in each of `--repeats` rounds (ABAB..., the order swapped every round, so that a busy
moment of a shared machine falls on both): without them, `store.checksum` is a function returning 0 (a save records
zeros and a load checks them for nothing; no user knob). Per round and mode: a full save, a save after 5,000 more,
a fresh buffer's load (in memory a reader: it reads and checks every chunk; on disk the owner mapping its own
files: it reads no rows) and `verify()`, which reads the whole save and checks it; the table gives the median over
the rounds of the per-round ratio (checked / unchecked) and both medians. Goal (#50): at most 10 % on save and load.
"""
from __future__ import annotations
import argparse, json, os, platform, shlex, shutil, subprocess, sys, threading, time
from pathlib import Path
import numpy as np
import torch

MORE, SAMPLE, POOL = 5_000, 256, 512   # transitions between the saves; the batch drawn; distinct Atari frames
LABELS = dict(cartpole='CartPole', floats='110 floats', atari='Atari frames')


def status(key:str) -> int:
    "A field of /proc/self/status in bytes."
    return int(next(l for l in open('/proc/self/status') if l.startswith(key + ':')).split()[1]) * 1024


def written() -> int:
    "Bytes this process has caused to be written to storage (`write_bytes` of /proc/self/io)."
    return int(next(l for l in open('/proc/self/io') if l.startswith('write_bytes')).split()[1])


class Peak:
    "Within `with Peak() as p:`, the largest rise of VmRSS over its value at the start (`p.rise`, bytes) and the time."
    def __enter__(self):
        self.start = self.top = status('VmRSS')
        self.stop, self.t = threading.Event(), time.perf_counter()
        self.thread = threading.Thread(target=self.watch, daemon=True); self.thread.start()
        return self
    def watch(self):
        while not self.stop.wait(0.001): self.top = max(self.top, status('VmRSS'))
    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self.t
        self.stop.set(); self.thread.join()
        self.rise = max(self.top, status('VmRSS')) - self.start


def transitions(kind:str, start:int, n:int, pool:np.ndarray|None) -> dict:
    "`n` transitions of `kind` from number `start`; Atari ones slide along one chain of frames (each stored once)."
    w = np.arange(start, start + n)
    if kind == 'atari':
        window = pool[(start + np.arange(n + 4)) % len(pool)]
        stacks = np.lib.stride_tricks.sliding_window_view(window, 4, axis=0).transpose(0, 3, 1, 2)
        state, nxt = stacks[:n], stacks[1:n + 1]
    else:
        width = dict(cartpole=4, floats=110)[kind]
        state = np.broadcast_to((w % 1000).astype(np.float32)[:, None], (n, width))
        nxt = state + 1
    return dict(state=state, next_state=nxt, action=w % 6, reward=np.ones(n, np.float32), terminated=w % 500 == 499)


def make(kind:str, size:int, where:Path|None):
    from fastrl_per.replay.frames import FrameStorage
    from fastrl_per.replay.memory import RingStorage
    from fastrl_per.replay.per import PrioritizedReplayBuffer
    storage = (FrameStorage if kind == 'atari' else RingStorage)(size, path=where)
    return PrioritizedReplayBuffer(bs=SAMPLE, seed=0, storage=storage)


def fill(buf, kind:str, start:int, n:int, pool):
    batch = 1_000 if kind == 'atari' else 50_000
    for s in range(start, start + n, batch): buf.extend(**transitions(kind, s, min(batch, start + n - s), pool))


def median_us(f, repeats:int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter(); f(); times.append(time.perf_counter() - t)
    return float(np.median(times)) * 1e6


def save_child(kind:str, size:int, storage:str, d:Path, old:bool) -> dict:
    "Fill a buffer, then: sampling, a full save, 5,000 more and a save, single adds, the old single-file save (`old`)."
    pool = np.random.default_rng(0).integers(0, 256, (POOL, 84, 84), np.uint8) if kind == 'atari' else None
    buf = make(kind, size, d / 'buffer' if storage == 'disk' else None)
    t = time.perf_counter(); fill(buf, kind, 0, size, pool); out = dict(fill_s=time.perf_counter() - t)
    out['data'] = buf.storage.nbytes()
    buf.sample(); out['sample_us'] = median_us(buf.sample, 200)
    with Peak() as p: buf.save(d / 'buffer')
    out.update(save_s=p.seconds, save_peak=p.rise)
    w0 = written()
    with Peak() as p:
        fill(buf, kind, size, MORE, pool)
        with Peak() as q: buf.save(d / 'buffer')
    out.update(inc_s=q.seconds, inc_peak=q.rise, inc_bytes=written() - w0)
    one = {k: v[0] for k, v in transitions(kind, size + MORE, 1, pool).items()}
    out['add_us'] = median_us(lambda: buf.add(**one), 1000)
    if old:
        w0 = written()
        with Peak() as p: torch.save(buf.state_dict(), d / 'old.pt')
        out.update(old_s=p.seconds, old_peak=p.rise, old_bytes=written() - w0)
    del buf
    warm = make(kind, 1_000, d / 'warm' if storage == 'disk' else None)   # for the loads' first calls
    fill(warm, kind, 0, 1_000, pool); warm.save(d / 'warm'); torch.save(warm.state_dict(), d / 'warm.pt')
    return out


def load_child(kind:str, size:int, storage:str, d:Path, old:bool) -> dict:
    ("A fresh buffer's load of the directory (a ring on disk: its own files) and of the old single file, each after "
     "the same load of a small buffer (the first call's imports and caches are not the load's cost).")
    make(kind, 1_000, d / 'warm' if storage == 'disk' else None).load(d / 'warm')
    make(kind, 1_000, None).load(d / 'warm.pt')
    buf = make(kind, size, d / 'buffer' if storage == 'disk' else None)
    with Peak() as p: buf.load(d / 'buffer')
    out = dict(load_s=p.seconds, load_peak=p.rise)
    del buf
    if old and storage == 'memory':
        buf = make(kind, size, None)
        with Peak() as p: buf.load(d / 'old.pt')
        out.update(old_load_s=p.seconds, old_load_peak=p.rise)
    return out


def speed_child(kind:str, size:int, d:Path) -> dict:
    ("The same buffer in memory and on disk, both filled, in one process: `sample(256)` and a single `add` timed in "
     "turns, three rounds (runs at different moments of a shared machine differ more than the two storages do).")
    pool = np.random.default_rng(0).integers(0, 256, (POOL, 84, 84), np.uint8) if kind == 'atari' else None
    bufs = dict(memory=make(kind, size, None), disk=make(kind, size, d / 'speed'))
    for buf in bufs.values(): fill(buf, kind, 0, size, pool); buf.sample()
    one = {k: v[0] for k, v in transitions(kind, size, 1, pool).items()}
    times = {}
    for _ in range(3):
        for where, buf in bufs.items():
            times.setdefault(f'{where}_sample_us', []).append(median_us(buf.sample, 100))
            times.setdefault(f'{where}_add_us', []).append(median_us(lambda: buf.add(**one), 300))
    return {k: float(np.median(v)) for k, v in times.items()}


def checksum_child(kind:str, size:int, storage:str, d:Path, rounds:int) -> dict:
    ("A buffer saved, saved after 5,000 more, loaded and verified with and without checksums, in turns (ABAB..., "
     "the order swapped each round): each step's times by mode, in seconds. Each round's saves go to a new "
     "directory of the mode's own (on disk: a new ring, filled, the buffer living there).")
    import fastrl_per.replay.store as store
    from fastrl_per.replay.store import SavedArrays
    modes = dict(checked=store.checksum, unchecked=lambda data, algo=None: 0)
    pool = np.random.default_rng(0).integers(0, 256, (POOL, 84, 84), np.uint8) if kind == 'atari' else None
    source = None if storage == 'disk' else make(kind, size, None)
    if source is not None: fill(source, kind, 0, size, pool)
    times = {m: {k: [] for k in ('save', 'inc', 'load', 'verify')} for m in modes}
    warm = make(kind, 1_000, None); fill(warm, kind, 0, 1_000, pool)   # the first calls' imports and caches
    warm.save(d / 'warm'); make(kind, 1_000, None).load(d / 'warm'); SavedArrays(d / 'warm').verify()
    for r in range(rounds):
        for mode in (list(modes) if r % 2 == 0 else list(modes)[::-1]):
            store.checksum, where, t = modes[mode], d / f'{mode}-{r}', times[mode]
            buf = source if source is not None else make(kind, size, where)
            if source is None: fill(buf, kind, 0, size, pool)   # a ring on disk lives in its directory
            t0 = time.perf_counter(); buf.save(where); t['save'].append(time.perf_counter() - t0)
            fill(buf, kind, size + r * MORE, MORE, pool)
            t0 = time.perf_counter(); buf.save(where); t['inc'].append(time.perf_counter() - t0)
            if source is None: del buf   # its directory's lock goes with it: the load below owns it
            fresh = make(kind, size, where if storage == 'disk' else None)
            t0 = time.perf_counter(); fresh.load(where); t['load'].append(time.perf_counter() - t0)
            del fresh
            t0 = time.perf_counter(); SavedArrays(where).verify(); t['verify'].append(time.perf_counter() - t0)
            shutil.rmtree(where)
    store.checksum = modes['checked']
    return times


def run_child(step:str, kind:str, size:int, storage:str, d:Path, more:str) -> dict:
    cmd = [sys.executable, __file__, '--child', step, kind, str(size), storage, str(d), more]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode: raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(kind:str, size:int, storage:str, root:Path, old:bool) -> dict:
    d = root / f'{kind}-{size}-{storage}'
    shutil.rmtree(d, ignore_errors=True); d.mkdir(parents=True)
    try:
        more = 'old' if old else 'no-old'
        saved = run_child('save', kind, size, storage, d, more)
        return dict(saved, **run_child('load', kind, size, storage, d, more))
    finally: shutil.rmtree(d, ignore_errors=True)


STEPS = dict(save='save', inc='+5k save', load='load', verify='verify')


def checksum_table(rows:list) -> str:
    "Per buffer and step: the median over rounds of the round's ratio (checked / unchecked), and both medians in ms."
    out = ['| buffer | ring | step | checked / unchecked (median of rounds) | checked | unchecked |',
           '|---|---|---|--:|--:|--:|']
    ms = lambda xs: f"{float(np.median(xs)) * 1e3:,.1f} ms"
    for r in rows:
        for step, label in STEPS.items():
            a, b = r['checked'][step], r['unchecked'][step]
            ratio = float(np.median([x / y for x, y in zip(a, b)]))
            out.append(f"| {LABELS[r['kind']]} {r['size']:,} | {r['storage']} | {label} | {ratio:.2f} | {ms(a)} | "
                       f"{ms(b)} |")
    return '\n'.join(out)


def checksum_cost(plan:list, root:Path, rounds:int) -> list:
    "Each buffer of `plan` in a child process of its own, measured in `rounds` rounds of both modes in turns."
    rows = []
    for kind, size, storage in plan:
        d = root / f'{kind}-{size}-{storage}'
        shutil.rmtree(d, ignore_errors=True); d.mkdir(parents=True)
        t = time.perf_counter()
        try: rows.append(dict(kind=kind, size=size, storage=storage,
                              **run_child('checksums', kind, size, storage, d, str(rounds))))
        finally: shutil.rmtree(d, ignore_errors=True)
        print(f"{kind} {size:,} {storage}: {time.perf_counter() - t:.0f} s", file=sys.stderr, flush=True)
    return rows


def measure_speed(kind:str, size:int, root:Path) -> dict:
    d = root / f'{kind}-{size}-speed'
    shutil.rmtree(d, ignore_errors=True); d.mkdir(parents=True)
    try: return run_child('speed', kind, size, 'both', d, 'no-old')
    finally: shutil.rmtree(d, ignore_errors=True)


def mb(b:float) -> str: return f"{b / 1e6:,.0f} MB" if b >= 1e6 else f"{b / 1e6:.2f} MB"


def table(rows:list) -> str:
    "The measurements as two markdown tables (saves; loads and calls), with the goals' ratios."
    memory = {(r['kind'], r['size']): r for r in rows if r['storage'] == 'memory'}
    saves = ["| buffer | ring | data | save | peak / data | +5k save | +5k bytes | old save | +5k / old | old peak |",
             '|---|---|' + '--:|' * 8]
    loads = ["| buffer | ring | load | peak / data | old load | sample 256 | add | sample disk / memory |",
             '|---|---|' + '--:|' * 6]
    for r in rows:
        name, ref = f"{LABELS[r['kind']]} {r['size']:,} | {r['storage']}", memory.get((r['kind'], r['size']))
        old = (f"{r['old_s']:.2f} s | {r['inc_s'] / r['old_s']:.3f} | {r['old_peak'] / r['data']:.2f}" if 'old_s' in r
               else 'not run | | ')
        saves.append(f"| {name} | {mb(r['data'])} | {r['save_s']:.2f} s | {r['save_peak'] / r['data']:.3f} | "
                     f"{r['inc_s']:.2f} s | {mb(r['inc_bytes'])} | {old} |")
        ratio = f"{r['sample_us'] / ref['sample_us']:.2f}" if r['storage'] == 'disk' and ref else ''
        old_load = f"{r['old_load_s']:.2f} s" if 'old_load_s' in r else ''
        loads.append(f"| {name} | {r['load_s']:.3f} s | {r['load_peak'] / r['data']:.3f} | {old_load} | "
                     f"{r['sample_us']:.0f} µs | {r['add_us']:.1f} µs | {ratio} |")
    return '\n'.join(saves) + '\n\n' + '\n'.join(loads)


def goals(rows:list) -> str:
    "Each goal of #43 against the worst row."
    memory = {(r['kind'], r['size']): r for r in rows if r['storage'] == 'memory'}
    peak = max(r['save_peak'] / r['data'] for r in rows)
    incs = [r['inc_s'] / r['old_s'] for r in rows if 'old_s' in r]
    disk = [r['sample_us'] / memory[r['kind'], r['size']]['sample_us'] for r in rows
            if r['storage'] == 'disk' and (r['kind'], r['size']) in memory]
    lines = [f"- save peak <= 0.1x data: worst {peak:.3f}x ({'met' if peak <= 0.1 else 'NOT met'})"]
    if incs: lines.append(f"- save after 5,000 more <= 0.1x a full save (the old single file): worst {max(incs):.3f}x "
                          f"({'met' if max(incs) <= 0.1 else 'NOT met'})")
    if disk: lines.append(f"- on-disk sample <= 1.2x in memory: worst {max(disk):.2f}x "
                          f"({'met' if max(disk) <= 1.2 else 'NOT met'})")
    return '\n'.join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--sizes', type=int, nargs='+', default=[100_000, 1_000_000], help='CartPole and 110-float sizes')
    p.add_argument('--disk-sizes', type=int, nargs='*', default=[10_000_000], help='CartPole sizes on disk only')
    p.add_argument('--atari-sizes', type=int, nargs='*', default=[100_000], help='Atari FrameStorage sizes')
    p.add_argument('--kinds', nargs='+', default=['cartpole', 'floats', 'atari'])
    p.add_argument('--dir', default='checkpoint_bench', help='where the buffers are saved (deleted after each)')
    p.add_argument('--quick', action='store_true', help='sizes 10^4 only (a smoke run)')
    p.add_argument('--json', help='also write the measurements to this file')
    p.add_argument('--table', help='print the tables of measurements a --json run wrote, and run nothing')
    p.add_argument('--storages', nargs='+', default=['memory', 'disk'], help='rings in memory, on disk or both')
    p.add_argument('--no-old', action='store_true', help='leave out the old single-file save (it copies the buffer)')
    p.add_argument('--checksum-cost', action='store_true', help='each buffer with and without checksums (no old save)')
    p.add_argument('--repeats', type=int, default=7, help='--checksum-cost: rounds of both, in turns')
    p.add_argument('--child', nargs=6, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        step, kind, size, storage, d, more = a.child
        torch.set_num_threads(1)
        if step == 'checksums': out = checksum_child(kind, int(size), storage, Path(d), int(more))
        elif step == 'speed': out = speed_child(kind, int(size), Path(d))
        else: out = (save_child if step == 'save' else load_child)(kind, int(size), storage, Path(d), more == 'old')
        print(json.dumps(out)); return
    if a.table:
        rows = json.loads(Path(a.table).read_text())
        print(table(rows)); print(); print(goals(rows)); return
    if a.quick: a.sizes, a.disk_sizes, a.atari_sizes = [10_000], [], [10_000]
    plan = [(k, n, s) for k in a.kinds for n in (a.atari_sizes if k == 'atari' else a.sizes)
            for s in a.storages]
    plan += [('cartpole', n, 'disk') for n in a.disk_sizes if 'cartpole' in a.kinds and 'disk' in a.storages]
    if a.checksum_cost:
        print(f"command: `{shlex.join(['python', *sys.argv])}`; python {platform.python_version()}, numpy "
              f"{np.__version__}, torch {torch.__version__}, {os.cpu_count()} CPUs, load average at start "
              f"{os.getloadavg()[0]:.2f}; {a.repeats} rounds\n")
        print(checksum_table(checksum_cost(plan, Path(a.dir), a.repeats)))
        print(f"\nload average at end {os.getloadavg()[0]:.2f}"); return
    rows = []
    for kind, size, storage in plan:
        t = time.perf_counter()
        measured = measure(kind, size, storage, Path(a.dir), not a.no_old)
        rows.append(dict(kind=kind, size=size, storage=storage, **measured))
        print(f"{kind} {size:,} {storage}: {time.perf_counter() - t:.0f} s", file=sys.stderr, flush=True)
    for kind, size in {(k, n) for k, n, s in plan if s == 'memory' and (k, n, 'disk') in plan}:
        speed = measure_speed(kind, size, Path(a.dir))
        for r in rows:
            if (r['kind'], r['size']) == (kind, size):
                r.update(sample_us=speed[f"{r['storage']}_sample_us"], add_us=speed[f"{r['storage']}_add_us"])
    if a.json: Path(a.json).write_text(json.dumps(rows, indent=1))
    print(table(rows)); print(); print(goals(rows))


if __name__ == '__main__': main()
