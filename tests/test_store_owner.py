"""A save directory against a second process and a crafted directory: one owner, readers that write nothing, file
names confined to the directory, refused journals and damaged files named in a `ValueError`, the buffer unchanged."""
import os, signal, subprocess, sys
from pathlib import Path

import numpy as np
import pytest
import torch

from fastrl_per.memory import RingStorage
from fastrl_per.store import JOURNAL, STATE_FILE, npy_offset
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
    from fastrl_per.store import SavedArrays
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
    from fastrl_per.store import SavedArrays
    buf = make('uniform', 50); fill(buf, 0, 45); buf.save(tmp_path)
    f = next(tmp_path.glob('rows.*.npy'))
    flip(f, npy_offset(f) + 20 * buf.storage.rows.itemsize)
    with pytest.raises(ValueError, match=f"{f.name}\\) chunk 0 \\(rows 0..44\\) does not match its checksum"):
        make('uniform', 50).load(tmp_path)
    with pytest.raises(ValueError, match='does not match its checksum'): SavedArrays(tmp_path).verify()
