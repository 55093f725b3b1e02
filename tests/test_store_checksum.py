"""The save's checksum by name: a save records XXH3-64 and says so; a save made before the name was recorded (CRC-32,
no name) still loads, verifies and refuses damage; continuing one rewrites every checksum in XXH3-64; a name this
version does not know is refused naming `state.pt`, the buffer unchanged."""
import io, shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from fastrl_per.replay.store import STATE_FILE, SavedArrays, checksum, chunk_rows, npy_offset
from test_store import assert_same_state, check_holds, fill, make
from test_store_owner import flip

OLD_SAVE = Path(__file__).parent / 'data' / 'crc32_save'   # 45 transitions of `fill` in a prioritized ring of 50


def wrapper(d:Path) -> dict: return torch.load(d / STATE_FILE, weights_only=True)


def inner(d:Path) -> dict: return torch.load(io.BytesIO(wrapper(d)['state'].numpy().tobytes()), weights_only=True)


def rewrap(d:Path, state:dict, **names):
    "Write `state` as `d`'s state.pt with a CRC-32 of its bytes, the wrapper's keys `names` added (none: the old one)."
    payload = io.BytesIO(); torch.save(state, payload)
    payload = payload.getvalue()
    torch.save(dict(format='fastrl_per.save', crc=checksum(payload, 'crc32'), **names,
                    state=torch.frombuffer(bytearray(payload), dtype=torch.uint8)), d / STATE_FILE)


def as_crc32_save(d:Path):
    "Turn the save at `d` into what a save wrote before the checksum was named: CRC-32s everywhere, no name."
    state = inner(d)
    for info in state['arrays'].values():
        a, rows = np.load(d / info['file'], mmap_mode='r'), info.pop('checksum')
        assert rows == 'xxh3_64'
        info['crcs'] = [checksum(a[c * info['chunk']:min((c + 1) * info['chunk'], info['kept'])], 'crc32')
                        for c in range(len(info['crcs']))]
    rewrap(d, state)


def old_save(tmp_path:Path) -> Path:
    d = tmp_path / 'old'
    shutil.copytree(OLD_SAVE, d)
    return d


def test_a_new_save_names_xxh3_and_its_checksums_are_xxh3_of_the_rows(tmp_path):
    buf = make('prioritized', 50); fill(buf, 0, 45); buf.save(tmp_path)
    assert wrapper(tmp_path)['checksum'] == 'xxh3_64'
    info = inner(tmp_path)['arrays']['rows']
    rows = np.load(tmp_path / info['file'], mmap_mode='r')[:45]
    assert info['checksum'] == 'xxh3_64' and info['crcs'] == [checksum(rows, 'xxh3_64')]
    assert info['crcs'] != [checksum(rows, 'crc32')]


def test_a_save_of_the_previous_version_loads_verifies_and_refuses_damage(tmp_path):
    "The fixture was written by the code before the checksum was named: CRC-32s, and no name in state.pt."
    d = old_save(tmp_path)
    assert 'checksum' not in wrapper(d) and 'checksum' not in inner(d)['arrays']['rows']
    buf = make('prioritized', 50); buf.load(d)
    check_holds(buf, 45)
    SavedArrays(d).verify()
    disk = make('prioritized', 50, d); disk.load(d, verify=True)   # the owner, mapping its files, checking each chunk
    check_holds(disk, 45)
    del disk
    f = d / inner(d)['arrays']['rows']['file']
    flip(f, npy_offset(f) + 3)
    with pytest.raises(ValueError, match=f"{f.name}\\) chunk 0 .* does not match its checksum"):
        make('prioritized', 50).load(d)


def test_continuing_a_crc32_save_rewrites_every_chunk_checksum_in_xxh3(tmp_path):
    """A ring of two chunks saved, made a CRC-32 save, loaded, five rows more (chunk 0 only) and saved in place: the
    untouched chunk 1's checksum is not carried over under the new name; the save verifies, names XXH3 throughout."""
    probe = make('uniform', 10); fill(probe, 0, 1)
    n = chunk_rows(probe.storage.rows) + 100   # into the second chunk
    buf = make('prioritized', n); fill(buf, 0, n); buf.save(tmp_path)
    as_crc32_save(tmp_path)
    SavedArrays(tmp_path).verify()
    again = make('prioritized', n); again.load(tmp_path)
    fill(again, n, 5); again.save(tmp_path)   # the ring wraps over chunk 0
    info = inner(tmp_path)['arrays']['rows']
    assert info['checksum'] == 'xxh3_64' and len(info['crcs']) == 2
    SavedArrays(tmp_path).verify()
    fresh = make('prioritized', n); fresh.load(tmp_path)
    check_holds(fresh, n + 5)


@pytest.mark.parametrize('where', ['state', 'array'])
def test_an_unknown_checksum_name_is_refused_naming_state_pt(tmp_path, where):
    buf = make('prioritized', 50); fill(buf, 0, 45); buf.save(tmp_path)
    state = inner(tmp_path)
    if where == 'array': state['arrays']['rows']['checksum'] = 'sha7'
    rewrap(tmp_path, state, **({'checksum': 'sha7'} if where == 'state' else {}))
    target = make('prioritized', 50); fill(target, 100, 7)
    before = target.state_dict()
    with pytest.raises(ValueError, match=f"{STATE_FILE}.*sha7"): target.load(tmp_path)
    assert_same_state(before, target.state_dict())
    with pytest.raises(ValueError, match=f"{STATE_FILE}.*sha7"): SavedArrays(tmp_path).verify()
