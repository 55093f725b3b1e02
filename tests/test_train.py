"""Run directories in-process: the manifest, the guards on `--out`, orphan clean-up, file
modes, metrics truncation, signal handling and re-planned resumes."""
import csv
import os
import signal
import subprocess
from pathlib import Path

import numpy as np
import pytest

from fastrl_per.run.rundir import (check_new_run_dir, git_revision, keep_metrics_until, load_checkpoint, manifest_differences,
                               read_manifest, read_metrics, remove_orphans, share_mode)
from fastrl_per.run.factories import resume_learner
from fastrl_per.run.train import StopSignals, train

ROOT = Path(__file__).resolve().parents[1]


def test_git_revision_of_this_checkout_and_of_none(tmp_path):
    head = subprocess.run(['git', '-C', str(ROOT), 'rev-parse', 'HEAD'], capture_output=True, text=True).stdout.strip()
    got = git_revision(ROOT / 'fastrl_per')
    assert got['revision'] == head and isinstance(got['dirty'], bool)
    (tmp_path / 'pkg').mkdir()
    assert git_revision(tmp_path / 'pkg') is None


@pytest.mark.parametrize('make, message', [
    (lambda d: (d / 'f.txt').write_text('mine'), 'not a fastrl_per run'),
    (lambda d: (d / 'checkpoint.pt').write_bytes(b''), 'already holds a run; continue it with resume='),
    (lambda d: (d / 'run.json').write_text('{}'), 'already holds a run'),
])
def test_new_run_dir_refused(tmp_path, make, message):
    make(tmp_path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with pytest.raises(ValueError, match=message): check_new_run_dir(tmp_path)
    with pytest.raises(ValueError, match=message): train(out=str(tmp_path), total_steps=100, progress=False)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_orphans_and_modes(tmp_path):
    (tmp_path / 'metrics.csv').write_text('frame\n')
    os.chmod(tmp_path / 'metrics.csv', 0o640)
    (tmp_path / 'checkpoint.pt').write_bytes(b'x')
    os.chmod(tmp_path / 'checkpoint.pt', 0o600)
    for name in ('checkpoint.ptk2j3.tmp', 'run.jsonab.tmp', 'notes.tmp'): (tmp_path / name).write_text('')
    assert sorted(p.name for p in remove_orphans(tmp_path)) == ['checkpoint.ptk2j3.tmp', 'run.jsonab.tmp']
    assert (tmp_path / 'notes.tmp').exists()  # not ours
    share_mode(tmp_path)
    assert (tmp_path / 'checkpoint.pt').stat().st_mode & 0o777 == 0o640


def test_keep_metrics_until(tmp_path):
    rows = [['frame', 'update'], ['64', '1'], ['65', '2'], ['66', '3']]
    with open(tmp_path / 'metrics.csv', 'w', newline='') as f: csv.writer(f).writerows(rows)
    keep_metrics_until(tmp_path, 65)
    with open(tmp_path / 'metrics.csv', newline='') as f: assert list(csv.reader(f)) == rows[:3]
    with open(tmp_path / 'metrics.csv', 'a', newline='') as f: f.write('6')   # a row a SIGKILL cut short: frame 6 of 66?
    keep_metrics_until(tmp_path, 65)
    with open(tmp_path / 'metrics.csv', newline='') as f: assert list(csv.reader(f)) == rows[:3]


def test_stop_signals_first_sets_second_raises():
    previous = signal.getsignal(signal.SIGINT)
    with StopSignals() as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.signum == signal.SIGTERM
        with pytest.raises(KeyboardInterrupt): os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is previous


def test_run_resumed_to_more_steps_replans_beta(tmp_path):
    run = tmp_path / 'run'
    train(out=str(run), total_steps=200, progress=False)
    assert read_metrics(run)['beta'][-1] == pytest.approx(1.0)
    learner, state, notes = resume_learner(run, None, dict(total_steps=400))
    assert learner.config.total_steps == 400 and state['env_steps'] == 200 and "re-planned over 400" in notes[0]
    summary = train(resume=str(run), total_steps=400, progress=False)
    assert summary.startswith('planned steps changed from 200 to 400')
    m = read_metrics(run)
    assert m['frame'][-1] == 400 and m['beta'][-1] == pytest.approx(1.0)
    assert m['beta'][m['frame'] == 200][0] == pytest.approx(1.0)  # the first leg's plan ended there
    assert 0.4 < m['beta'][m['frame'] == 201][0] < 0.8  # the new plan: half way, at 400 steps
    manifest = read_manifest(run)
    assert [leg['from_step'] for leg in manifest['legs']] == [0, 200] and manifest['env_steps'] == 400
    assert manifest_differences(manifest) == []
    assert load_checkpoint(run)['config']['total_steps'] == 400


def test_episodes_that_ended_in_the_warm_up_keep_their_rows_after_a_resume(tmp_path):
    "A checkpoint in the warm-up (no update yet, so no episode row yet): the resumed run writes those episodes' rows."
    stopped, whole = tmp_path / 'stopped', tmp_path / 'whole'
    args = dict(replay='uniform', eval_every=0, solved=0, progress=False)   # uniform: beta's new plan changes nothing
    train(out=str(stopped), total_steps=100, **args)   # 128 transitions are stored before the first update
    assert len(read_metrics(stopped)['frame']) == 0 and len(load_checkpoint(stopped)['returns']) > 0
    train(resume=str(stopped), total_steps=300, **args)
    train(out=str(whole), total_steps=300, **args)
    a, b = read_metrics(stopped), read_metrics(whole)
    for c in ('frame', 'update', 'loss', 'episode_return'): np.testing.assert_array_equal(a[c], b[c])
