"""`benchmarks/gpu_replay.py --device cpu --quick`, the prepared GPU script, runs on the CPU: every row of its table,
the Atari-shaped DQN steps timed eagerly, and the captured ones saying they need CUDA."""
import re, subprocess, sys
from pathlib import Path

SCRIPT = Path(__file__).parent.parent / 'benchmarks' / 'gpu_replay.py'

def test_the_quick_run_prints_every_row():
    done = subprocess.run([sys.executable, str(SCRIPT), '--device', 'cpu', '--quick', '--reps', '3'],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    rows = done.stdout.splitlines()
    assert rows[0].startswith('device cpu (host), torch ')
    assert rows[1].split() == ['replay', 'B', 'sample', 'update', 'step']
    for replay in ('ours on the device', 'ours on the host + copy'):
        for bs in (64, 256):
            row = next(r for r in rows if re.fullmatch(rf'{re.escape(replay)} +{bs} .*', r))
            times = [float(t) for t in row.split()[-3:]]
            assert all(t > 0 for t in times), (replay, bs, times)
    for name in ('Atari DQN uniform', 'Atari DQN PER'):
        eager = next(r for r in rows if r.startswith(f'{name}, eager'))
        assert eager.split()[-2] == '32' and float(eager.split()[-1]) > 0, eager
        captured = next(r for r in rows if r.startswith(f'{name}, captured'))
        assert re.fullmatch(rf'{name}, captured +32 +needs CUDA', captured), captured
