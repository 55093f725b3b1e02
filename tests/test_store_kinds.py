"""The save directory's rules for what else saves there: `FrameStorage` rings (in memory and living on disk) and an
Ape-X replay shard's directory (`ReplayServer.save`, the buffer a shard's Ray actor holds, here in a plain process).
For each: a second writer is refused naming the holder's pid, a process killed mid-save leaves the last save (or the
one in flight) loadable, a crafted `state.pt` naming `../x` is refused before anything is read, and a flipped byte
of a saved array is caught by `SavedArrays(d).verify()`."""
import hashlib, json, random, signal, subprocess, sys
from pathlib import Path

import numpy as np
import pytest
import torch

from fastrl_per.learners.apex import ReplayServer
from fastrl_per.replay.frames import FrameStorage
from fastrl_per.replay.memory import RingStorage
from fastrl_per.replay.per import PrioritizedReplayBuffer
from fastrl_per.replay.store import STATE_FILE, SavedArrays, npy_offset

KINDS = ('frames memory', 'frames disk', 'apex shard')
MAX_SZ = 2000


def make(kind:str, path=None):
    "A buffer of `kind` (an Ape-X shard: its `ReplayServer`); `path`: where a frame ring on disk lives."
    if kind == 'apex shard': return ReplayServer(max_sz=MAX_SZ, bs=8, seed=0)
    return PrioritizedReplayBuffer(bs=8, seed=0, storage=FrameStorage(MAX_SZ, path=path if kind == 'frames disk'
                                                                      else None))


def fill(buf, start:int, n:int):
    "Transitions `start`.. `start + n - 1` of one long episode of 16x16 frames (frame `i` filled with `i % 251`)."
    frames = ((start + np.arange(n + 4)) % 251).astype(np.uint8)[:, None, None] * np.ones((1, 16, 16), np.uint8)
    stacks = lambda k: np.stack([frames[i + k:i + k + 4] for i in range(n)])
    fields = dict(state=stacks(0), next_state=stacks(1), action=np.arange(start, start + n) % 4,
                  reward=np.ones(n, np.float32), terminated=np.zeros(n, bool))
    if isinstance(buf, ReplayServer):
        from fastrl_per.core import SimpleStep
        buf.add(SimpleStep(**{k: torch.as_tensor(v) for k, v in fields.items()}), torch.ones(n))
    else: buf.extend(**fields)


def digest(buf) -> str:
    "A hash of every stored transition's state and action."
    rows = (buf.buffer if isinstance(buf, ReplayServer) else buf).memory[:]
    return hashlib.sha1(rows.state.numpy().tobytes() + rows.action.numpy().tobytes()).hexdigest()


def saved_dir(tmp_path:Path, kind:str) -> tuple:
    buf, d = make(kind, tmp_path / 'saved'), tmp_path / 'saved'
    fill(buf, 0, 1500); buf.save(d, 's0')
    return buf, d


HOLDER = """
import sys, time
sys.path[:0] = {path!r}
from test_store_kinds import make
{hold}
print('holding', flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize('kind', KINDS)
def test_a_second_writer_is_refused_naming_the_holder(tmp_path, kind):
    "Another process owns the directory (a frame ring living there): a save, or a second ring there, is refused."
    d = tmp_path / 'held'
    hold = f"s = make('frames disk', {str(d)!r}); from test_store_kinds import fill; fill(s, 0, 10)"
    code = HOLDER.format(path=[str(Path(__file__).parent), *sys.path], hold=hold)
    holder = subprocess.Popen([sys.executable, '-c', code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == 'holding'
        buf = make(kind); fill(buf, 0, 100)
        with pytest.raises(ValueError, match=f'in use by another writer \\(held by pid {holder.pid}\\)'):
            buf.save(d, 's1')
        if kind == 'frames disk':
            with pytest.raises(ValueError, match=f'held by pid {holder.pid}'): make(kind, d)
    finally:
        holder.send_signal(signal.SIGKILL); holder.wait()


SAVER = """
import sys
sys.path[:0] = {path!r}
from test_store_kinds import digest, fill, make
buf = make({kind!r}, {d!r})
for k in range(1000):
    fill(buf, k * 700, 700)   # the ring wraps every few saves
    print('saving', digest(buf), flush=True)
    buf.save({d!r}, f's{{k}}')
    print('saved', flush=True)
"""


@pytest.mark.parametrize('kind', KINDS)
def test_killed_mid_save_loads_the_last_save(tmp_path, kind):
    """A process saving in a loop, killed (SIGKILL) at a random moment after its second save: the directory loads
    exactly the last save it completed or the one it was writing, into a fresh buffer."""
    d = tmp_path / 'saves'
    code = SAVER.format(path=[str(Path(__file__).parent), *sys.path], kind=kind, d=str(d))
    saver = subprocess.Popen([sys.executable, '-c', code], stdout=subprocess.PIPE, text=True)
    lines = []
    while sum(line == 'saved' for line in lines) < 2: lines.append(saver.stdout.readline().strip())
    for _ in range(random.Random(kind).randrange(1, 8)): lines.append(saver.stdout.readline().strip())
    saver.send_signal(signal.SIGKILL); saver.wait()
    lines += saver.stdout.read().split('\n')
    hashes, done = [], []   # what each save was to write; those it completed
    for line in lines:
        if line.startswith('saving'): hashes.append(line.split()[1])
        elif line == 'saved': done.append(hashes[-1])
    fresh = make(kind, tmp_path / 'fresh'); fresh.load(d)
    assert digest(fresh) in {done[-1], hashes[-1]}, (len(done), len(hashes))


def test_crafted_state_naming_a_file_outside_is_refused(tmp_path):
    "A `state.pt` (of a frame ring's save, or a shard's) naming `../x.npy` is refused naming it; `x.npy` untouched."
    for kind in KINDS:
        buf, d = saved_dir(tmp_path / kind.replace(' ', '_'), kind)
        victim = d.parent / 'x.npy'; np.save(victim, np.arange(10))
        state = SavedArrays(d).read()
        state['arrays'][next(iter(state['arrays']))]['file'] = '../x.npy'
        torch.save(state, d / STATE_FILE)
        with pytest.raises(ValueError, match="names '../x.npy', not a plain file in the directory"):
            make(kind).load(d)
        assert np.array_equal(np.load(victim), np.arange(10))


def test_a_flipped_byte_is_caught_by_verify(tmp_path):
    "A byte flipped in a saved frame ring's frames (or a shard's rows): `verify()` names the file and chunk."
    for kind in KINDS:
        buf, d = saved_dir(tmp_path / kind.replace(' ', '_'), kind)
        SavedArrays(d).verify()
        f = next(d.glob('frames.*.npy')) if kind != 'apex shard' else next(d.glob('rows.*.npy'))
        data = bytearray(f.read_bytes()); data[npy_offset(f) + 100] ^= 0xFF; f.write_bytes(bytes(data))
        with pytest.raises(ValueError, match=f"\\({f.name}\\) chunk 0 .* does not match its checksum"):
            SavedArrays(d).verify()
