"""A save directory on a full disk: a small tmpfs mounted for the test, filled to many free-space levels (chunk
boundaries included) before an incremental save. Every save completes or raises `OSError`, the previous save always
loads exactly, the buffer is unchanged, and a retry with room succeeds. An on-disk storage reserves its file when it
is made: a full disk is an `OSError` naming the directory then, never a SIGBUS on a later write."""
import errno, os, signal, subprocess, sys
from pathlib import Path

import numpy as np
import pytest

from fastrl_per.replay.memory import ReplayBuffer, RingStorage
from fastrl_per.replay.store import CHUNK_BYTES, chunk_rows
from test_store import assert_same_state, check_holds, fill, make

WIDTH, RING, FIRST, MORE = 1024, 4000, 3000, 2000   # rows of about 2 KB: 3 chunks of 4 MB in the ring
PAGE = 4096


@pytest.fixture
def small_disk(tmp_path):
    "A 20 MB tmpfs mounted at a fresh directory (skipped, saying why, where this process may not mount)."
    mnt = tmp_path / 'disk'
    mnt.mkdir()
    done = subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=20m', 'tmpfs', str(mnt)], capture_output=True,
                          text=True)
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here (root in CI can): {done.stderr.strip() or done.returncode}")
    try: yield mnt
    finally: subprocess.run(['umount', '-l', str(mnt)], check=True)


def free(mnt:Path) -> int:
    st = os.statvfs(mnt)
    return st.f_bavail * st.f_frsize


def fill_disk(mnt:Path, level:int) -> Path:
    "Leave exactly `level` bytes free on `mnt` (a multiple of the page size), taken by a filler file."
    filler = mnt / 'filler'
    with open(filler, 'wb') as f:
        if free(mnt) > level: os.posix_fallocate(f.fileno(), 0, free(mnt) - level)
    assert free(mnt) == level, (free(mnt), level)
    return filler


def levels() -> list:
    "Free-space levels: every 0.5 MB to 12 MB, and each multiple of a journal entry (a chunk and its header) +- a page."
    entry = -(-(CHUNK_BYTES + 128) // PAGE) * PAGE
    at = {k * (1 << 19) for k in range(25)} | {CHUNK_BYTES, 2 * CHUNK_BYTES}
    at |= {k * entry + d for k in (1, 2, 3) for d in (-PAGE, 0, PAGE)}
    return sorted(at)


def saved_once(mnt:Path, storage:str):
    "A prioritized buffer saved at `FIRST` rows in `mnt/saved`, its ring in memory or living on disk there."
    d = mnt / 'saved'
    buf = make('prioritized', RING, d if storage == 'disk' else None)
    fill(buf, 0, FIRST, WIDTH); buf.save(d)
    return buf, d


def loads_exactly(d:Path, n_added:int):
    "A reader's load of `d` holds exactly what `n_added` writes left."
    reader = make('prioritized', RING); reader.load(d)
    check_holds(reader, n_added, WIDTH)


@pytest.mark.parametrize('storage', ['memory', 'disk'])
def test_an_incremental_save_on_a_full_disk_keeps_the_previous_save(small_disk, storage):
    """At each free-space level: `MORE` rows written (the ring wraps over saved rows: on disk their chunks are
    journaled as they are written) and saved. Each add or save completes or raises `OSError`; after an `OSError` the
    buffer holds what it held, the directory loads the previous save exactly, and with the filler gone a retry saves
    all of it. Some levels refuse and some succeed."""
    outcomes = []
    for level in levels():
        buf, d = saved_once(small_disk, storage)
        assert chunk_rows(buf.storage.rows) < FIRST   # the saved rows span two chunks
        if level > free(small_disk): break   # the levels above what the first save left
        filler = fill_disk(small_disk, level)
        before = buf.state_dict()
        try:
            fill(buf, FIRST, MORE, WIDTH)
            buf.save(d)
        except OSError as e:
            assert e.errno in (errno.ENOSPC, errno.EIO), (level, e)
            outcomes.append('refused')
            if buf.storage.n_added == FIRST: assert_same_state(before, buf.state_dict(), f'level {level}')
            else: check_holds(buf, FIRST + MORE, WIDTH)   # the add went in; its save was refused
            loads_exactly(d, FIRST)
            filler.unlink()
            if buf.storage.n_added == FIRST: fill(buf, FIRST, MORE, WIDTH)
            buf.save(d)
        else: outcomes.append('saved')
        if filler.exists(): filler.unlink()
        loads_exactly(d, FIRST + MORE)
        del buf
        subprocess.run(['rm', '-rf', str(d)], check=True)
    assert len(outcomes) > 20 and 'refused' in outcomes and 'saved' in outcomes, outcomes


WRITER = """
import os, sys
sys.path[:0] = {path!r}
from fastrl_per.replay.memory import ReplayBuffer, RingStorage
from test_store import check_holds, fill
buf = ReplayBuffer(bs=8, seed=0, storage=RingStorage({ring}, path={d!r}, reserve={reserve}))
fill(buf, 0, 1, {width})   # the ring's file is made
with open({filler!r}, 'wb') as f:   # and then the disk fills up
    st = os.statvfs({d!r}); os.posix_fallocate(f.fileno(), 0, st.f_bavail * st.f_frsize)
fill(buf, 1, {ring} + 500, {width})   # every row written, the ring wrapped
check_holds(buf, {ring} + 501, {width})
print('wrote', flush=True)
"""


def write_after_the_disk_fills(mnt:Path, reserve:bool) -> subprocess.CompletedProcess:
    "A process making a ring on `mnt` (`reserve` or not), filling the disk, then writing every row of the ring."
    d = mnt / f'live_{reserve}'
    code = WRITER.format(path=[str(Path(__file__).parent), *sys.path], d=str(d), ring=RING,
                         reserve=reserve, width=WIDTH, filler=str(mnt / 'filler'))
    done = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=120)
    subprocess.run(['rm', '-rf', str(d), str(mnt / 'filler')], check=True)
    return done


def test_a_disk_storage_reserves_its_file_when_it_is_made(small_disk):
    """No room for the ring: the first write (which makes its file) is an `OSError` naming the directory and the
    array, leaving no file and the buffer empty; with room, it succeeds then. Made with room, a ring reserved keeps
    writing after the disk fills, where a sparse one (`reserve=False`) dies of SIGBUS."""
    live = small_disk / 'live'
    filler = fill_disk(small_disk, 1 << 20)   # 1 MB free, the ring takes 8.4 MB
    buf = ReplayBuffer(bs=8, seed=0, storage=RingStorage(RING, path=live))
    with pytest.raises(OSError, match=f"no room in '{live}' for array 'rows' \\(8,416,000 bytes\\)") as e:
        fill(buf, 0, 10, WIDTH)
    assert e.value.errno == errno.ENOSPC and e.value.filename == str(live)
    assert not list(live.glob('*.npy')) and buf.storage.n_added == 0 and buf.storage.rows is None
    filler.unlink()
    fill(buf, 0, 10, WIDTH)
    check_holds(buf, 10, WIDTH)
    del buf, e
    subprocess.run(['rm', '-rf', str(live)], check=True)
    reserved = write_after_the_disk_fills(small_disk, reserve=True)
    assert reserved.returncode == 0 and reserved.stdout == 'wrote\n', reserved.stderr[-2000:]
    sparse = write_after_the_disk_fills(small_disk, reserve=False)
    assert sparse.returncode == -signal.SIGBUS, (sparse.returncode, sparse.stderr[-2000:])
