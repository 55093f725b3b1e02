"""The checkpoints of a real `fastrl_per train --env ALE/Pong-v5 --buffer-size 1000000` run, timed as its replay
fills: each checkpoint's wall time, the bytes the process wrote for it (/proc/self/io), the replay directory's size
on disk and the process's peak resident memory so far. The run goes on until `--minutes` have passed, then stops as
SIGINT stops it (a checkpoint, then exit); the run directory is kept for `--resume`.

    python benchmarks/pong_checkpoints.py --out runs/pong_ckpt --minutes 15 [--replay-storage disk]

It calls `fastrl_per.run.train.train` in this process with `save_run` wrapped by a timer: the command's own code path,
flags and defaults (a 1,000,000-transition buffer needs `--steps` of at least that many: the run is planned for 10M
steps and cut short by the clock).
"""
import argparse, os, resource, signal, threading, time
from pathlib import Path
import fastrl_per.run.train as train_module

def written() -> int:
    "Bytes this process has handed to write calls so far."
    return int(next(l for l in open('/proc/self/io') if l.startswith('wchar')).split()[1])

def on_disk(path:Path) -> int:
    "Bytes the files under `path` occupy on disk (holes not counted)."
    return sum(f.stat().st_blocks * 512 for f in path.rglob('*') if f.is_file())

def timed(save_run, rows:list, run_dir:Path):
    "`save_run` that appends a row of measurements per call to `rows` and prints it."
    def save(*args, **kwargs):
        t, before = time.perf_counter(), written()
        save_run(*args, **kwargs)
        seconds, wrote = time.perf_counter() - t, written() - before
        learner = args[1]
        row = dict(step=learner.episodes.env_steps, stored=len(learner.replay), seconds=seconds, written=wrote,
                   replay_dir=on_disk(run_dir / 'replay') if (run_dir / 'replay').exists() else 0,
                   peak_rss=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6)
        rows.append(row)
        print(f"| {row['step']:,} | {row['stored']:,} | {seconds:.2f} | {wrote / 1e6:.1f} | "
              f"{row['replay_dir'] / 1e9:.2f} | {row['peak_rss']:.2f} |", flush=True)
    return save

def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--out', default='runs/pong_ckpt'); p.add_argument('--minutes', type=float, default=15)
    p.add_argument('--replay-storage', default='memory', choices=['memory', 'disk'])
    p.add_argument('--checkpoint-every', type=int, default=5_000)
    a = p.parse_args()
    rows, run_dir = [], Path(a.out)
    train_module.save_run = timed(train_module.save_run, rows, run_dir)
    threading.Timer(a.minutes * 60, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
    print(f"ALE/Pong-v5, --buffer-size 1000000, --replay-storage {a.replay_storage}, a checkpoint every "
          f"{a.checkpoint_every:,} env steps, stopped after {a.minutes} minutes\n")
    print("| env step | transitions stored | checkpoint s | MB written | replay/ on disk GB | peak RSS GB |\n"
          "|--:|--:|--:|--:|--:|--:|", flush=True)
    try:
        train_module.train(out=a.out, env_id='ALE/Pong-v5', max_sz=1_000_000, total_steps=10_000_000,
                           checkpoint_every=a.checkpoint_every, replay_storage=a.replay_storage, eval_every=0,
                           progress=False)
    except train_module.RunInterrupted as e: print(f"\n{str(e).splitlines()[0]}")

if __name__ == '__main__': main()
