"""Saved buffers as directories (`store`): round trips in memory and on disk, incremental saves against full ones, what
an incremental save writes, bad saves refused whole, old single-file saves, real processes killed mid-save, and a ring
on disk larger than this machine's memory."""
import copy, os, shutil, signal, subprocess, sys, time
from pathlib import Path
from unittest.mock import patch

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import fastrl_per.replay.store as store
from fastrl_per.replay.frames import FrameStorage
from fastrl_per.replay.memory import ReplayBuffer, RingStorage
from fastrl_per.replay.per import PrioritizedReplayBuffer
from fastrl_per.replay.store import JOURNAL, STATE_FILE, chunk_rows

KINDS = dict(uniform=ReplayBuffer, prioritized=PrioritizedReplayBuffer)


def transitions(start:int, n:int, width:int=4) -> dict:
    "Transitions `start`, ..., `start + n - 1`: every field follows from the number, kept as the extra field `w`."
    w = np.arange(start, start + n, dtype=np.int64)
    state = np.repeat((w % 251).astype(np.uint8)[:, None], width, 1)
    return dict(state=state, next_state=state + 1, action=w % 3, reward=w.astype(np.float32),
                terminated=w % 5 == 0, w=w)


def td_of(w:np.ndarray) -> np.ndarray:
    "The TD error a test feeds back for transition number `w`."
    return (w % 97 + 1).astype(np.float32)


def make(kind:str, max_sz:int, path=None, seed:int=0):
    "A `kind` buffer of `max_sz` rows with a ring in memory, or on disk in the directory `path`."
    return KINDS[kind](bs=8, seed=seed, storage=RingStorage(max_sz, path=path))


def fill(buf, start:int, n:int, width:int=4):
    "Write transitions `start`.. `start + n - 1` and, on a prioritized buffer, feed back their TD errors."
    data = transitions(start, n, width)
    slots = buf.extend(**data)
    if isinstance(buf, PrioritizedReplayBuffer): buf.update_priorities(slots, td_of(data['w'][-len(slots):]))


def expected_writes(n_added:int, max_sz:int) -> np.ndarray:
    "The number of the transition each stored slot holds after `n_added` writes to a ring of `max_sz` rows."
    s = np.arange(min(n_added, max_sz))
    return s + max_sz * ((n_added - 1 - s) // max_sz)


def check_holds(buf, n_added:int, width:int=4, priorities:bool=True):
    ("`buf` holds exactly what `n_added` writes of `fill` left, and the priorities fed back (unless `priorities` is "
     "False: a draw before a slot's rewrite makes its update stale, dropped).")
    assert buf.storage.n_added == n_added
    if not n_added: return
    w = expected_writes(n_added, buf.max_sz)
    rows = buf.memory[:]
    assert np.array_equal(rows.w.numpy(), w)
    assert np.array_equal(rows.state.numpy(), np.repeat((w % 251).astype(np.uint8)[:, None], width, 1))
    assert np.array_equal(rows.reward.numpy(), w.astype(np.float32))
    if priorities and isinstance(buf, PrioritizedReplayBuffer):
        assert np.allclose(buf.priorities[:len(w)], td_of(w) + buf.eps)


def assert_same_state(a, b, where:str='state'):
    "Two states equal: dicts key by key, tensors and arrays bit for bit, the rest with ==."
    if isinstance(a, dict):
        assert set(a) == set(b), where
        for k in a: assert_same_state(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, torch.Tensor): assert torch.equal(a, b), where
    else: assert a == b, where


def assert_same(a, b, draws:int=3):
    "Two buffers with equal states that draw the same batches from here on (the sampler continues alike)."
    assert_same_state(a.state_dict(), b.state_dict())
    for _ in range(draws):
        x, y = a.sample(), b.sample()
        assert torch.equal(x.idxs, y.idxs) and torch.equal(x.weights, y.weights) and torch.equal(x.state, y.state)


def files(d:Path) -> list:
    return sorted(p.name for p in Path(d).glob('*.npy'))


# ---------------------------------------------------------------- round trips

@pytest.mark.parametrize('kind', KINDS)
@pytest.mark.parametrize('src, dst', [('memory', 'memory'), ('disk', 'disk'), ('memory', 'disk'), ('disk', 'memory')])
def test_round_trip(tmp_path, kind, src, dst):
    "Save, load into a fresh buffer (ring in memory or on disk): the same rows, priorities, trackers and next batches."
    saved_at = tmp_path / 'saved'
    buf = make(kind, 200, saved_at if src == 'disk' else None)
    fill(buf, 0, 150); fill(buf, 150, 120); buf.sample()   # wrapped: slots 0-69 hold transitions 200-269
    buf.save(saved_at)
    fresh = make(kind, 200, tmp_path / 'live' if dst == 'disk' else None, seed=1)   # `saved_at` is buf's own
    fresh.load(saved_at)
    check_holds(fresh, 270)
    assert (fresh.idx, fresh.cycle, len(fresh)) == (buf.idx, buf.cycle, len(buf))
    assert_same(buf, fresh)
    if dst == 'disk': assert isinstance(fresh.storage.rows, np.memmap)
    for b in (buf, fresh): fill(b, 270, 50)   # both go on alike
    assert_same(buf, fresh)


def test_disk_load_maps_its_own_files(tmp_path):
    "Loading a storage on disk from its own directory maps the saved file: nothing is copied, the file is the ring."
    buf = make('prioritized', 300, tmp_path)
    fill(buf, 0, 250); buf.save(tmp_path)
    ref, name = make('prioritized', 300), Path(buf.storage.rows.filename).name
    ref.load_state_dict(buf.state_dict())
    del buf   # the directory's one owner ends: a new process would find it so
    fresh = make('prioritized', 300, tmp_path, seed=1)
    fresh.load(tmp_path)
    assert files(tmp_path) == [Path(fresh.storage.rows.filename).name] == [name]
    assert_same(ref, fresh)


def test_disk_buffer_saved_elsewhere(tmp_path):
    "A buffer on disk saved to another directory writes its rows there: that save loads on its own (it did not)."
    buf = make('prioritized', 100, tmp_path / 'live'); fill(buf, 0, 130)
    buf.save(tmp_path / 'elsewhere')
    assert len(files(tmp_path / 'elsewhere')) == 1
    shutil.rmtree(tmp_path / 'live')
    fresh = make('prioritized', 100, seed=1); fresh.load(tmp_path / 'elsewhere')
    check_holds(fresh, 130)


def test_disk_storage_taking_over_other_rows_keeps_its_last_save(tmp_path):
    """A storage on disk saved, then given other rows (`load_state_dict`, or a save from elsewhere), then written and
    killed before saving again: its directory still loads as the save (its writes once journaled the new rows as the
    save's undo copies, and loading put them into it)."""
    for take_over in ('state_dict', 'directory'):
        d = tmp_path / take_over
        buf = make('uniform', 100, d); fill(buf, 0, 40); buf.save(d)
        other = make('uniform', 100); fill(other, 1000, 60)
        if take_over == 'state_dict': buf.load_state_dict(other.state_dict())
        else: other.save(tmp_path / 'other'); buf.load(tmp_path / 'other')
        fill(buf, 2000, 5)   # then a crash: no save
        fresh = make('uniform', 100); fresh.load(d)
        check_holds(fresh, 40)


def test_refused_load_from_its_own_directory_keeps_the_live_file(tmp_path):
    """A storage on disk whose directory holds another buffer's save (of another size) refuses to load it and keeps
    its rows: loading used to tidy its live file away first, and its next save then named a missing file."""
    other = make('uniform', 40); fill(other, 0, 30); other.save(tmp_path)
    buf = make('uniform', 50, tmp_path); fill(buf, 100, 20)
    with pytest.raises(ValueError, match='max_sz 40'): buf.load(tmp_path)
    assert Path(buf.storage.rows.filename).exists()
    check_holds_from(buf, 100, 20)
    buf.save(tmp_path)
    fresh = make('uniform', 50); fresh.load(tmp_path)
    check_holds_from(fresh, 100, 20)


def test_save_onto_a_file_is_refused(tmp_path):
    "Saving where a file lies (an earlier version's single-file save) is a `ValueError` naming it; the file stays."
    (tmp_path / 'replay.pt').write_bytes(b'old')
    buf = make('uniform', 50); fill(buf, 0, 10)
    with pytest.raises(ValueError, match='replay.pt.*is a file'): buf.save(tmp_path / 'replay.pt')
    assert (tmp_path / 'replay.pt').read_bytes() == b'old'


def test_journal_recovered_under_another_chunk_size(tmp_path):
    """A journal left by a kill is put back by row, not by chunk number: a version with another `CHUNK_BYTES`
    recovers it the same (a chunk index would have landed the undo copies elsewhere)."""
    with patch.object(store, 'CHUNK_BYTES', 7 * 64):
        buf = make('uniform', 100, tmp_path); fill(buf, 0, 100); buf.save(tmp_path)
        fill(buf, 100, 30)   # rows 0-29 rewritten, their chunks (7 rows each) journaled; then a kill
        assert len(list((tmp_path / JOURNAL).glob('*.npy'))) == 5
    del buf
    fresh = make('uniform', 100, tmp_path); fresh.load(tmp_path)   # the default CHUNK_BYTES here, the owner's recovery
    check_holds(fresh, 100)


def test_disk_storage_through_a_symlink(tmp_path):
    "A storage whose directory is reached through a symlink keeps its live file there and saves in place."
    (tmp_path / 'real').mkdir(); (tmp_path / 'link').symlink_to(tmp_path / 'real')
    buf = make('prioritized', 100, tmp_path / 'link'); fill(buf, 0, 60); buf.save(tmp_path / 'link')
    live = Path(buf.storage.rows.filename).name
    fill(buf, 60, 20); buf.save(tmp_path / 'link')
    assert files(tmp_path / 'real') == [live]   # saved in place, the live file not replaced by a copy
    with pytest.raises(ValueError, match='in use by another writer'): make('prioritized', 100, tmp_path / 'real')
    del buf   # one owner, whichever path reaches the directory
    fresh = make('prioritized', 100, tmp_path / 'real', seed=1); fresh.load(tmp_path / 'real')
    check_holds(fresh, 80)


def test_frame_storage_round_trip_and_not_into_a_ring(tmp_path):
    "A FrameStorage's save round-trips in memory and on disk; a ring, or another buffer kind, refuses it, unchanged."
    frames = np.arange(40, dtype=np.uint8)[:, None, None] * np.ones((1, 2, 2), np.uint8)
    stacks = lambda k: np.stack([frames[i + k:i + k + 3] for i in range(30)])
    fields = dict(state=stacks(0), next_state=stacks(1), action=np.arange(30), reward=np.ones(30, np.float32),
                  terminated=np.zeros(30, bool))
    for path in (None, tmp_path / 'live'):
        buf = PrioritizedReplayBuffer(bs=4, seed=0, storage=FrameStorage(max_sz=20, path=path))
        buf.extend(**fields)
        buf.save(tmp_path / 'saved')
        fresh = PrioritizedReplayBuffer(bs=4, seed=0, storage=FrameStorage(max_sz=20, path=path and tmp_path / 'f'))
        fresh.load(tmp_path / 'saved')
        assert_same(buf, fresh)
    for other in (make('prioritized', 20), ReplayBuffer(bs=4, storage=FrameStorage(max_sz=20))):
        if other.storage.rows is None and isinstance(other.storage, RingStorage): fill(other, 0, 5)
        before = other.state_dict()
        with pytest.raises(ValueError, match='FrameStorage|PrioritizedReplayBuffer'): other.load(tmp_path / 'saved')
        assert_same_state(before, other.state_dict())


# ---------------------------------------------------------------- incremental saves

ops = st.lists(st.one_of(st.tuples(st.just('add'), st.integers(1, 130)),
                         st.tuples(st.sampled_from(['save', 'sample', 'reload']), st.just(0))), min_size=1, max_size=14)


@settings(max_examples=100, deadline=None, database=None)
@given(ops=ops, kind=st.sampled_from(list(KINDS)), on_disk=st.booleans())
def test_incremental_saves_equal_full_saves(tmp_path_factory, ops, kind, on_disk):
    """After any sequence of adds, draws, saves to one directory (chunks of 7 rows, so saves write some chunks and
    not others) and reloads (a save, then a load of it into the same buffer: on disk it maps its own files again), the
    buffer is the one that only added and drew, and the directory holds what a full save of it holds."""
    d = tmp_path_factory.mktemp('inc')
    with patch.object(store, 'CHUNK_BYTES', 7 * 64):   # 7 rows of 64 bytes (the packed record here)
        buf, ref, n = make(kind, 100, d / 'live' if on_disk else None), make(kind, 100), 0
        for op, k in ops + [('save', 0)]:
            if op == 'add': fill(buf, n, k); fill(ref, n, k); n += k
            elif op == 'sample' and n >= buf.bs: buf.sample(); ref.sample()
            elif op in ('save', 'reload'): buf.save(d / 'live')
            if op == 'reload': buf.load(d / 'live')
        assert_same(buf, ref, draws=0)
        assert n == 0 or chunk_rows(buf.storage.rows) == 7
        full = copy.deepcopy(buf) if n and not on_disk else None
        if full is not None:
            full.save(d / 'full')   # another path: written whole
            a, b = [np.load(next((d / s).glob('rows.*.npy'))) for s in ('live', 'full')]
            for name in a.dtype.names: assert np.array_equal(a[name], b[name]), name   # padding bytes aside
        fresh = make(kind, 100, seed=1)
        fresh.load(d / 'live')
        check_holds(fresh, n, priorities=all(op != 'sample' for op, _ in ops))
        if on_disk and n: assert Path(buf.storage.rows.filename).name in files(d / 'live')
        assert_same(buf, fresh, draws=3 if n >= buf.bs else 0)
        assert not list((d / 'live' / JOURNAL).glob('*'))


def io_written() -> int:
    "Bytes this process has handed to write calls so far (`wchar` of /proc/self/io)."
    return int(next(l for l in open('/proc/self/io') if l.startswith('wchar')).split()[1])


@pytest.mark.parametrize('on_disk', [False, True])
def test_incremental_save_writes_only_the_chunks_passed(tmp_path, on_disk):
    """A 33 MB ring (8 chunks): after 100 more transitions, a save to the same directory writes one chunk (its undo copy
    first, for the ring in memory) and `state.pt`, not the ring; a ring on disk journals that chunk as the adds reach
    it and then only flushes. The file stays the same, and the journal is empty after."""
    buf = make('prioritized', 30_000, tmp_path if on_disk else None)
    fill(buf, 0, 30_000, width=512)
    t = time.perf_counter(); before = io_written()
    buf.save(tmp_path)
    full, full_s = io_written() - before, time.perf_counter() - t
    chunk = chunk_rows(buf.storage.rows) * buf.storage.rows.itemsize
    (name,) = files(tmp_path)
    mtime = (tmp_path / name).stat().st_mtime_ns
    t = time.perf_counter(); before = io_written()
    fill(buf, 30_000, 100, width=512)   # rows 0-99: chunk 0
    buf.save(tmp_path)
    inc, inc_s = io_written() - before, time.perf_counter() - t
    state_bytes = (tmp_path / STATE_FILE).stat().st_size
    assert files(tmp_path) == [name] and not list((tmp_path / JOURNAL).glob('*'))
    assert inc <= (1 if on_disk else 2) * chunk + state_bytes + 100_000, (inc, chunk, state_bytes)
    if not on_disk: assert full >= buf.storage.rows.nbytes and (tmp_path / name).stat().st_mtime_ns > mtime
    assert inc < 0.35 * max(full, buf.storage.rows.nbytes), (inc, full)
    fresh = make('prioritized', 30_000, seed=1); fresh.load(tmp_path)
    check_holds(fresh, 30_100, width=512)
    print(f"full save {full / 1e6:.1f} MB in {full_s:.2f} s, incremental {inc / 1e6:.1f} MB in {inc_s:.2f} s")


def test_first_save_writes_the_rows_written(tmp_path):
    """A first save of a ring that holds 1,000 of its 200,000 rows writes those rows, not the zeros after them: the
    file has the ring's full size, but as a hole the file system reads as zeros; loaded into memory, it reads the
    1,000 rows (a resumed Atari run would otherwise take the whole 7 GB ring into memory) and equals the buffer."""
    buf = make('prioritized', 200_000)
    fill(buf, 0, 1_000, width=512)
    before = io_written()
    buf.save(tmp_path)
    written = io_written() - before
    (name,) = files(tmp_path)
    row = buf.storage.rows.itemsize
    assert (tmp_path / name).stat().st_size >= 200_000 * row            # the ring's whole length
    assert written < 1_000 * row + (tmp_path / STATE_FILE).stat().st_size + 1_000_000, (written, 1_000 * row)
    assert (tmp_path / name).stat().st_blocks * 512 < 10 * 1_000 * row   # allocated: about the rows written
    fresh = make('prioritized', 200_000, seed=1)
    before = rss_mb()
    fresh.load(tmp_path)   # reads the 1,000 rows into memory; the zeros after them take none until written
    assert (rss_mb() - before) * 1e6 < 50 * 1_000 * row, (rss_mb() - before, 200_000 * row / 1e6)
    check_holds(fresh, 1_000, width=512)
    assert np.array_equal(fresh.storage.rows, buf.storage.rows)


# ---------------------------------------------------------------- bad saves refused whole

def corrupt_state(d): (d / STATE_FILE).write_bytes(b'not a torch file')
def missing_array(d): next(d.glob('rows.*.npy')).unlink()
def truncated_array(d):
    f = next(d.glob('rows.*.npy')); f.write_bytes(f.read_bytes()[:f.stat().st_size // 2])
def resave(f:Path, a:np.ndarray):
    "Write `a` over the .npy file `f`, keeping the mark of the save that wrote it (`store.MARK_BYTES` at its end)."
    mark = f.read_bytes()[-store.MARK_BYTES:]
    np.save(f, a)
    with open(f, 'ab') as out: out.write(mark)
def wrong_shape(d):
    f = next(d.glob('rows.*.npy')); resave(f, np.load(f)[:-1])
def wrong_dtype(d):
    f = next(d.glob('rows.*.npy')); resave(f, np.zeros(len(np.load(f, mmap_mode='r')), np.float64))
def wrong_fields(d):
    f = next(d.glob('rows.*.npy')); a = np.load(f)
    resave(f, a.astype(np.dtype([(n if n != 'reward' else 'rewards', a.dtype[n]) for n in a.dtype.names])))


@pytest.mark.parametrize('target_on_disk', [False, True])
@pytest.mark.parametrize('damage, message', [
    (corrupt_state, 'cannot read a saved buffer'), (missing_array, 'unreadable'), (truncated_array, 'unreadable'),
    (wrong_shape, 'a RingStorage of 50 rows'), (wrong_dtype, 'chunk 0 .* does not match its checksum'),
    (wrong_fields, 'not the SimpleStep fields|does not match its checksum'), (None, 'max_sz 40')])
def test_bad_saves_refused_whole(tmp_path, damage, message, target_on_disk):
    "A damaged save, or one of another size, is a `ValueError` naming the problem; the buffer loading it is unchanged."
    src = make('prioritized', 40 if damage is None else 50); fill(src, 0, 45); src.save(tmp_path / 'saved')
    if damage is not None: damage(tmp_path / 'saved')
    target = make('prioritized', 50, tmp_path / 'live' if target_on_disk else None, seed=3)
    fill(target, 1000, 30); target.sample()
    before = target.state_dict()
    with pytest.raises(ValueError, match=message): target.load(tmp_path / 'saved')
    assert_same_state(before, target.state_dict())
    check_holds_from(target, 1000, 30)


def check_holds_from(buf, start:int, n:int):
    "`buf` still holds the transitions `start`, ..., `start + n - 1` in its first slots."
    assert np.array_equal(buf.memory[:].w.numpy(), np.arange(start, start + n))


def test_other_kind_refused_whole(tmp_path):
    "A uniform buffer's save does not load into a prioritized one (nor the other way): a `ValueError`, nothing changed."
    for src_kind, dst_kind in (('uniform', 'prioritized'), ('prioritized', 'uniform')):
        src = make(src_kind, 50); fill(src, 0, 20); src.save(tmp_path / src_kind)
        target = make(dst_kind, 50); fill(target, 500, 10)
        before = target.state_dict()
        with pytest.raises(ValueError, match=f"state of a {type(src).__name__}"): target.load(tmp_path / src_kind)
        assert_same_state(before, target.state_dict())


@pytest.mark.parametrize('kind', KINDS)
@pytest.mark.parametrize('on_disk', [False, True])
def test_old_single_file_save_loads(tmp_path, kind, on_disk):
    "A save of the earlier format (`torch.save` of `state_dict()` to one file) still loads, into memory or onto disk."
    buf = make(kind, 60); fill(buf, 0, 75); buf.sample()
    torch.save(buf.state_dict(), tmp_path / 'replay.pt')
    fresh = make(kind, 60, tmp_path / 'live' if on_disk else None, seed=2)
    fresh.load(tmp_path / 'replay.pt')
    check_holds(fresh, 75)
    assert_same(buf, fresh)
    fresh.save(tmp_path / 'live')   # and saves as a directory from then on
    again = make(kind, 60, seed=5); again.load(tmp_path / 'live')
    assert_same(fresh, again)


# ---------------------------------------------------------------- killed mid-save: a real process, SIGKILL

WIDTH, RING, SIDE = 512, 12_000, 84   # rows of ~1.1 KB: 13 MB, 4 chunks; frames 84x84, a quarter as many: 5 chunks
STORAGES = ('memory', 'disk', 'frames')   # a ring in memory, a ring on disk, a FrameStorage on disk


def generation_sizes(gens:int, storage:str) -> np.ndarray:
    "How many transitions the child writes before each of its saves (a FrameStorage writes slower: a quarter)."
    return (1500 + (np.arange(gens) * 737) % 3000) // (4 if storage == 'frames' else 1)


def frame_transitions(start:int, n:int) -> dict:
    "Transitions `start`.. along one chain of frames: frame `i` is all `i % 251`, transition `w` stacks frames w..w+3."
    values = (np.arange(start, start + n + 4) % 251).astype(np.uint8)
    frames = np.broadcast_to(values[:, None, None], (n + 4, SIDE, SIDE))
    stacks = np.lib.stride_tricks.sliding_window_view(frames, 4, axis=0).transpose(0, 3, 1, 2)
    w = np.arange(start, start + n)
    return dict(state=stacks[:n], next_state=stacks[1:], action=w % 3, reward=w.astype(np.float32),
                terminated=np.zeros(n, bool), w=w)


def make_storage(storage:str, d:Path, seed:int=0):
    "A prioritized buffer of `RING` transitions in the `storage` of `STORAGES` (on disk: in `d`)."
    if storage == 'frames': return PrioritizedReplayBuffer(bs=8, seed=seed, storage=FrameStorage(RING // 4, path=d))
    return make('prioritized', RING, d if storage == 'disk' else None, seed)


def fill_storage(buf, start:int, n:int):
    "`fill` for a ring (rows `WIDTH` wide), or the same with `frame_transitions` for a FrameStorage."
    if not isinstance(buf.storage, FrameStorage): return fill(buf, start, n, WIDTH)
    data = frame_transitions(start, n)
    slots = buf.extend(**data)
    buf.update_priorities(slots, td_of(data['w']))


def check_storage(buf, n_added:int):
    "`check_holds` for a ring; for a FrameStorage the rows, each stack rebuilt from its frames, and the priorities."
    if not isinstance(buf.storage, FrameStorage): return check_holds(buf, n_added, WIDTH)
    assert buf.storage.n_added == n_added and buf.storage.n_valid == len(buf)
    w = expected_writes(n_added, buf.max_sz)
    rows = buf.memory[:]
    assert np.array_equal(rows.w.numpy(), w)
    stacks = (w[:, None] + np.arange(4)) % 251
    assert np.array_equal(rows.state.numpy()[:, :, 0, 0], stacks)
    assert np.array_equal(rows.next_state.numpy()[:, :, -1, -1], (stacks + 1) % 251)
    assert np.allclose(buf.priorities[:len(w)], td_of(w) + buf.eps)


def child(where:str, storage:str):
    "Fill a prioritized buffer, save, and keep adding and saving until killed; print each save's count when done."
    d = Path(where)
    buf = make_storage(storage, d)
    n = 0
    for k in generation_sizes(10_000, storage):
        for part in np.array_split(np.arange(n, n + k), 5):   # on disk, kills land between these writes too
            fill_storage(buf, int(part[0]), len(part))
        n += int(k)
        buf.save(d)
        print(n, flush=True)


def killed_trial(d:Path, storage:str, rng) -> tuple[int, int, bool]:
    "Run `child`, SIGKILL it at a random moment after its first save; return (last reported save, loaded, journaled)."
    proc = subprocess.Popen([sys.executable, __file__, str(d), storage], stdout=subprocess.PIPE,
                            text=True, env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    reported = [int(proc.stdout.readline())]   # a first save exists
    time.sleep(rng.uniform(0, 1.5))
    proc.send_signal(signal.SIGKILL)
    out, _ = proc.communicate()
    reported += [int(x) for x in out.split()]
    journaled, before = any((d / JOURNAL).glob('*.npy')), listing(d)
    fresh = make_storage(storage, d, seed=1)
    fresh.load(d)
    if storage == 'memory': assert listing(d) == before   # a reader writes nothing: the journal is put over in memory
    return reported[-1], fresh, journaled


def listing(d:Path) -> dict:
    "Every file under `d` with its size and modification time."
    return {p.relative_to(d).as_posix(): (p.stat().st_size, p.stat().st_mtime_ns) for p in d.rglob('*') if p.is_file()}


@pytest.mark.parametrize('storage', STORAGES)
def test_killed_mid_save_leaves_one_save(tmp_path, storage):
    """A process saving (and, on disk, writing) in a loop is killed at random moments: the directory then loads as
    exactly one of its saves, the last it reported or the one it was making, rows, counters and priorities alike."""
    rng, saves = np.random.default_rng(0), np.cumsum(generation_sizes(10_000, storage))
    trial = journaled = 0
    while trial < 3 or not journaled and trial < 8:   # more trials until one was killed with undo copies pending
        d = tmp_path / f'trial{trial}'
        last, fresh, journal = killed_trial(d, storage, rng)
        n = fresh.storage.n_added
        assert n in saves and n >= last and np.searchsorted(saves, n) <= np.searchsorted(saves, last) + 1, (n, last)
        check_storage(fresh, n)
        if storage != 'memory':   # the owner's load recovered and tidied
            assert not list(d.glob('*.tmp')) and not list((d / JOURNAL).glob('*')), sorted(os.listdir(d))
        fresh.sample()
        del fresh
        shutil.rmtree(d)
        trial, journaled = trial + 1, journaled + journal
    assert journaled, f"none of {trial} kills landed while the journal held undo copies"


# ---------------------------------------------------------------- larger than memory

def rss_mb() -> float:
    return int(next(l for l in open('/proc/self/status') if l.startswith('VmRSS:')).split()[1]) / 1e3


def test_ring_on_disk_larger_than_memory(tmp_path):
    """A ring on disk of 48 GB, or 1.25x this machine's memory if more (a sparse file, larger than the memory): write a
    few thousand rows, sample, save in place, load into a fresh buffer (it maps the file), sample again; resident
    memory grows by a few MB."""
    d = tmp_path / 'big'
    try:
        rss0 = rss_mb()
        ram = os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES')
        max_sz = int(max(48e9, 1.25 * ram)) // 2128   # rows of 2 KB of frames (state and next state) and small fields
        buf = ReplayBuffer(bs=256, seed=0, storage=RingStorage(max_sz, path=d, reserve=False))
        for start in range(0, 4000, 1000): buf.extend(**transitions(start, 1000, width=1024))
        (name,) = files(d)
        size = (d / name).stat().st_size
        assert size > ram and size > 40e9, (size, ram)
        assert (d / name).stat().st_blocks * 512 < 100e6   # sparse: only written pages use disk
        batch = buf.sample()
        assert np.array_equal(batch.state.numpy()[:, 0], (batch.w.numpy() % 251).astype(np.uint8))
        buf.save(d)
        drawn = buf.sample().idxs   # what a buffer loaded from this save draws first
        del buf, batch   # its one owner gone, the directory is free for the next
        fresh = ReplayBuffer(bs=256, seed=0, storage=RingStorage(max_sz, path=d, reserve=False))
        fresh.load(d)
        assert torch.equal(fresh.sample().idxs, drawn)
        assert files(d) == [name] and fresh.storage.n_added == 4000
        assert rss_mb() - rss0 < 200, (rss0, rss_mb())
    finally:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == '__main__': child(*sys.argv[1:])
