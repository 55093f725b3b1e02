"""A save directory against a second process and a crafted directory: one owner, readers that write nothing, file
names confined to the directory, refused journals and damaged files named in a `ValueError`, the buffer unchanged."""
import json, os, signal, subprocess, sys
from pathlib import Path

import numpy as np
import pytest
import torch

from fastrl_per.replay.memory import RingStorage
from fastrl_per.replay.store import JOURNAL, STATE_FILE, npy_offset
from test_store import assert_same_state, check_holds, check_holds_from, fill, listing, make

OWNER = """
import sys, time
sys.path[:0] = {path!r}
from test_store import fill, make
buf = make('prioritized', 20_000, {d!r})
fill(buf, 0, 15_000); buf.save({d!r})
fill(buf, 15_000, 8_000)   # the ring wraps over saved rows: their chunks go to the journal
print('ready', flush=True)
time.sleep(600)
"""


def start_owner(d:Path) -> subprocess.Popen:
    "A process owning `d`: a live on-disk buffer saved at 15,000 rows, then 8,000 more written; it waits, unsaved."
    code = OWNER.format(path=[str(Path(__file__).parent), *sys.path], d=str(d))
    proc = subprocess.Popen([sys.executable, '-c', code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == 'ready'
    return proc


def test_a_reader_beside_a_live_owner_writes_nothing_and_a_second_writer_is_refused(tmp_path):
    """While another process owns the directory: a load reads its last save exactly and changes no file (the owner's
    slot 0 keeps row 20,000); a second live storage and a save there are refused naming the owner's pid; once the
    owner is killed, the directory still loads that save, and a new owner may take it."""
    d = tmp_path / 'live'
    owner = start_owner(d)
    try:
        before = listing(d)
        reader = make('prioritized', 20_000); reader.load(d)
        check_holds(reader, 15_000)
        assert listing(d) == before and any((d / JOURNAL).glob('*.npy'))
        (rows,) = [np.load(f, mmap_mode='r') for f in d.glob('rows.*.npy')]
        assert rows['w'][0] == 20_000   # the owner's memory, untouched by the reader
        for second in (lambda: RingStorage(20_000, path=d), lambda: reader.save(d)):
            with pytest.raises(ValueError, match=f'in use by another writer \\(held by pid {owner.pid}\\)'): second()
        assert listing(d) == before
    finally:
        owner.send_signal(signal.SIGKILL); owner.wait()
    again = make('prioritized', 20_000); again.load(d)
    check_holds(again, 15_000)
    new_owner = make('prioritized', 20_000, d); new_owner.load(d)   # the kernel dropped the dead owner's lock
    check_holds(new_owner, 15_000)


def saved_dir(tmp_path:Path) -> Path:
    "A save of 45 transitions in a ring of 50, then 10 more rewritten in place with their undo copies journaled."
    d = tmp_path / 'saved'
    buf = make('prioritized', 50, d); fill(buf, 0, 45); buf.save(d); fill(buf, 45, 10)
    return d


def state_naming(d:Path, name:str):
    "Rewrite `d`'s state.pt (the old format, no checksum) so that its rows array names the file `name`."
    from fastrl_per.replay.store import SavedArrays
    state = SavedArrays(d).read()
    state['arrays']['rows']['file'] = name
    torch.save(state, d / STATE_FILE)


def journal_entry(d:Path, rename=None, truncate:bool=False):
    "Rename the journal's first entry with `rename(name)`, or cut it in half."
    entry = sorted((d / JOURNAL).glob('*.npy'))[0]
    if truncate: entry.write_bytes(entry.read_bytes()[:entry.stat().st_size // 2])
    else: entry.rename(entry.with_name(rename(entry.name)))


def flip(path:Path, at:int):
    data = bytearray(path.read_bytes()); data[at] ^= 0xFF; path.write_bytes(bytes(data))


DAMAGES = {
    'dotdot': (lambda d: state_naming(d, '../victim.npy'), 'not a plain file in the directory'),
    'absolute': (lambda d: state_naming(d, str(d.parent / 'victim.npy')), 'not a plain file in the directory'),
    'symlink out': (lambda d: ((d / 'out.npy').symlink_to(d.parent / 'victim.npy'), state_naming(d, 'out.npy')),
                    'not a plain file in the directory'),
    'unknown array': (lambda d: journal_entry(d, lambda n: n.replace('.rows.', '.ghost.')), "unknown array 'ghost'"),
    'negative row': (lambda d: journal_entry(d, lambda n: n.replace('.rows.', '.rows.-')), "bad first row '-"),
    'truncated entry': (lambda d: journal_entry(d, truncate=True), 'unreadable \\(truncated\\?\\)'),
    'npy header byte': (lambda d: flip(next(d.glob('rows.*.npy')), 20), "array 'rows' .* unreadable"),
    'journal byte': (lambda d: flip(f := sorted((d / JOURNAL).glob('*.npy'))[0], npy_offset(f) + 10),
                     "chunk 0 .* checksum"),
    'state byte': (lambda d: flip(d / STATE_FILE, (d / STATE_FILE).stat().st_size // 2), 'cannot read a saved buffer'),
}


@pytest.mark.parametrize('damage', DAMAGES)
def test_a_crafted_or_damaged_save_is_refused_naming_it(tmp_path, damage):
    """Each damage is a `ValueError` naming the file and what is wrong, before anything is read or written: a file
    outside the directory is never touched, the loading buffer keeps what it held."""
    d = saved_dir(tmp_path)
    victim = np.arange(100, dtype=np.int64); np.save(tmp_path / 'victim.npy', victim)
    do, message = DAMAGES[damage]
    do(d)
    target = make('prioritized', 50, seed=3); fill(target, 1000, 30)
    before = target.state_dict()
    with pytest.raises(ValueError, match=message): target.load(d)
    assert_same_state(before, target.state_dict())
    check_holds_from(target, 1000, 30)
    assert np.array_equal(np.load(tmp_path / 'victim.npy'), victim)


def test_a_flipped_byte_of_the_rows_is_refused_naming_file_and_chunk(tmp_path):
    "A saved row changed behind the save's back (no undo copy covers it) is refused by a reader, and by `verify()`."
    from fastrl_per.replay.store import SavedArrays
    buf = make('uniform', 50); fill(buf, 0, 45); buf.save(tmp_path)
    f = next(tmp_path.glob('rows.*.npy'))
    flip(f, npy_offset(f) + 20 * buf.storage.rows.itemsize)
    with pytest.raises(ValueError, match=f"{f.name}\\) chunk 0 \\(rows 0..44\\) does not match its checksum"):
        make('uniform', 50).load(tmp_path)
    with pytest.raises(ValueError, match='does not match its checksum'): SavedArrays(tmp_path).verify()


def refused(load, message:str):
    "`load()` raises a `ValueError` matching `message` (in a frame of its own: the loading buffer is freed after)."
    with pytest.raises(ValueError, match=message): load()


@pytest.mark.parametrize('storage', ['memory', 'disk'])
def test_a_file_or_state_of_another_save_is_refused_naming_it(tmp_path, storage):
    """Saved at 45 rows of a ring of 50, then 30 more (the ring wraps) saved in place: the first save's `state.pt`
    put back, or its rows file put back under the second save, is a `ValueError` naming the file, for an owner that
    maps the files and reads no rows (no checksum to catch it) and for a reader. Each file carries the mark of the
    save that last wrote it."""
    d = tmp_path / 'saved'
    buf = make('prioritized', 50, d if storage == 'disk' else None); fill(buf, 0, 45); buf.save(d)
    (rows,) = d.glob('rows.*.npy')
    first = {f: f.read_bytes() for f in (d / STATE_FILE, rows)}
    fill(buf, 45, 30); buf.save(d)
    del buf
    assert [p.name for p in d.glob('rows.*.npy')] == [rows.name]   # written in place
    second = {f: f.read_bytes() for f in first}
    for put_back in first:
        for f, data in second.items(): f.write_bytes(data)
        put_back.write_bytes(first[put_back])
        message = f"array 'rows' \\({rows.name}\\) was written by another save than state.pt's"
        refused(lambda: make('prioritized', 50, d).load(d), message)   # the owner's load (a storage on disk there)
        refused(lambda: make('prioritized', 50).load(d), message)      # a reader's
    for f, data in second.items(): f.write_bytes(data)
    again = make('prioritized', 50, d); again.load(d)
    check_holds(again, 75)


def test_a_save_stopped_between_marking_and_commit_loads_the_last_save(tmp_path):
    """A save that has marked its files anew but dies before `state.pt` is replaced (the commit made to fail: the
    moment is too short for a kill to land on reliably) leaves the last save loadable by a reader and by the owner,
    whose recovery puts the marks back; the buffer then saves again."""
    from unittest.mock import patch
    from fastrl_per.replay.store import SavedArrays
    d = tmp_path / 'saved'
    buf = make('prioritized', 50); fill(buf, 0, 45); buf.save(d); fill(buf, 45, 30)
    with patch.object(SavedArrays, 'commit', side_effect=OSError('stopped')):
        with pytest.raises(OSError, match='stopped'): buf.save(d)
    assert list((d / JOURNAL).glob('*.mark'))   # the note that a mark is changing
    reader = make('prioritized', 50); reader.load(d)
    check_holds(reader, 45)
    owner = make('prioritized', 50, d); owner.load(d)
    check_holds(owner, 45)
    assert not list((d / JOURNAL).glob('*'))
    del owner
    buf.save(d)
    reader = make('prioritized', 50); reader.load(d)
    check_holds(reader, 75)


LOOP_WRITER = """
import hashlib, json, os, sys, time
sys.path[:0] = {path!r}
from test_store import fill, make
buf, hashes = make('prioritized', {ring}, {d!r}), []
for k in range({saves}):
    fill(buf, k * {step}, {step}, {width})   # the ring wraps over saved rows every few saves
    buf.save({d!r})
    hashes.append(hashlib.sha1(buf.storage.rows[:buf.storage.sz].tobytes()).hexdigest())
    if k == 0: print('saved', flush=True)
    while k == 0 and not os.path.exists({reading!r}): time.sleep(0.01)   # the reader is loading: go on
print(json.dumps(hashes), flush=True)
"""

LOOP_READER = """
import hashlib, json, os, sys
sys.path[:0] = {path!r}
from test_store import make
seen, errors = [], []
while not os.path.exists({done!r}) or len(seen) < 3:
    try:
        buf = make('prioritized', {ring}); buf.load({d!r})
        seen.append(hashlib.sha1(buf.storage.rows[:buf.storage.sz].tobytes()).hexdigest())
        open({reading!r}, 'a').close()
    except Exception as e: errors.append(repr(e))
print(json.dumps(dict(seen=seen, errors=errors)), flush=True)
"""


def test_a_reader_loading_in_a_loop_beside_a_writer_saving_in_a_loop_sees_whole_saves(tmp_path):
    """Two processes: an owner on disk adding 1,500 rows of 2 KB to a ring of 4,000 (three chunks) and saving, 24
    times; a reader loading the directory over and over meanwhile. Every load equals exactly one of the writer's
    completed saves (by a hash of its rows), neither raises, and the reader saw several saves."""
    d, done = tmp_path / 'live', tmp_path / 'done'
    args = dict(path=[str(Path(__file__).parent), *sys.path], d=str(d), ring=4000, done=str(done),
                reading=str(tmp_path / 'reading'))
    writer = subprocess.Popen([sys.executable, '-c', LOOP_WRITER.format(saves=24, step=1500, width=1024, **args)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert writer.stdout.readline().strip() == 'saved'
    reader = subprocess.Popen([sys.executable, '-c', LOOP_READER.format(**args)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    out, err = writer.communicate(timeout=600)
    assert writer.returncode == 0, err[-3000:]
    done.touch()
    got, rerr = reader.communicate(timeout=600)
    assert reader.returncode == 0, rerr[-3000:]
    saves, read = json.loads(out.strip().splitlines()[-1]), json.loads(got.strip().splitlines()[-1])
    assert read['errors'] == [], read['errors'][:3]
    assert set(read['seen']) <= set(saves), f"{len(set(read['seen']) - set(saves))} loads matched no save"
    assert len(set(read['seen'])) >= 2, (len(read['seen']), len(set(read['seen'])))


def test_a_crashed_save_on_read_only_media_loads_the_last_save(tmp_path):
    """An owner killed (SIGKILL) with its journal holding undo copies, on a tmpfs then remounted read-only: a reader
    loads its last committed save exactly, the journal put over it in memory, and nothing on the medium changes."""
    mnt = tmp_path / 'ro'
    mnt.mkdir()
    done = subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=64m', 'tmpfs', str(mnt)], capture_output=True,
                          text=True)
    if done.returncode: pytest.skip(f"cannot mount a tmpfs here (root in CI can): {done.stderr.strip()}")
    try:
        d = mnt / 'live'
        owner = start_owner(d)
        owner.send_signal(signal.SIGKILL); owner.wait()
        assert any((d / JOURNAL).glob('*.npy'))
        subprocess.run(['mount', '-o', 'remount,ro', str(mnt)], check=True)
        before = listing(d)
        with pytest.raises(OSError, match='Read-only file system'): (d / 'probe').touch()
        reader = make('prioritized', 20_000); reader.load(d)
        check_holds(reader, 15_000)
        assert listing(d) == before
    finally:
        subprocess.run(['umount', '-l', str(mnt)], check=True)
