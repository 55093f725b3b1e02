"""A run's replay buffer saved in its directory (#43): checkpoint.pt names the save in replay/, a second checkpoint writes
what changed, `--replay-storage disk` keeps the buffer in files there, an old checkpoint with the buffer inside still
resumes, and a run killed at random moments (checkpoints included) resumes to the run never killed."""
import random, signal, subprocess, sys, time
from pathlib import Path
import pytest
import torch
import fastrl_per.replay.store as store
from fastrl_per.learners.learner import Learner
from fastrl_per.replay.store import SavedArrays, STATE_FILE, JOURNAL
from fastrl_per.run.rundir import load_checkpoint, save_checkpoint, replay_saves, REPLAY_DIR, PENDING
from fastrl_per.run.factories import restore_learner
from fastrl_per.run.train import train, evaluate
from conftest import wait_for_saved_steps
from test_resume import assert_same, run_state, COMMAND

pytestmark = pytest.mark.usefixtures('one_thread')   # every test trains on one torch thread (conftest.py)
LOOP = dict(checkpoint_every=100, eval_every=0, solved=0, progress=False)
LOOP_FLAGS = ['--checkpoint-every', '25', '--eval-every', '0', '--solved', '0', '--no-progress']


def written(action) -> int:
    "Bytes this process handed to write system calls (any file) while `action()` ran: /proc/self/io's wchar."
    def wchar(): return int(dict(l.split(': ') for l in Path('/proc/self/io').read_text().splitlines())['wchar'])
    before = wchar()
    action()
    return wchar() - before


def storage_aside(state:dict) -> dict:
    "`state` with its config's `replay_storage` left out: where the buffer lived, not what it holds."
    return dict(state, config={k: v for k, v in state['config'].items() if k != 'replay_storage'})


def replay_files(run_dir) -> list[str]:
    "The array files of the replay in `run_dir`."
    return sorted(p.name for p in (Path(run_dir) / REPLAY_DIR).glob('*.npy'))


@pytest.mark.parametrize('kwargs', [dict(), dict(replay_storage='disk'), dict(replay='uniform', nenvs=2)],
                         ids=['per-memory', 'per-disk', 'uniform-envs2'])
def test_resumed_from_the_pair_equals_the_learner_never_stopped(tmp_path, kwargs):
    "Two checkpoints (the second incremental), then a new learner from checkpoint.pt and replay/: the learner never stopped."
    first = Learner(seed=0, total_steps=600, bs=16, replay_dir=tmp_path / REPLAY_DIR, **kwargs)
    first.fit(300); save_checkpoint(tmp_path, first)
    first.fit(100); save_checkpoint(tmp_path, first)
    state = load_checkpoint(tmp_path)
    assert state['replay'] is None and replay_saves(tmp_path) == {state['replay_save']}
    del first   # on disk its buffer is the resumed learner's files
    resumed = restore_learner(state, tmp_path / REPLAY_DIR)
    whole = Learner(seed=0, total_steps=600, bs=16, **{**kwargs, 'replay_storage': 'memory'})   # no directory
    whole.fit(400)
    assert resumed.fit(200) == whole.fit(200)
    assert_same(storage_aside(resumed.state_dict()), storage_aside(whole.state_dict()))


def test_atari_frames_on_disk_resume_from_the_pair(tmp_path):
    """Pong's frames (a `FrameStorage` memory-mapped in replay/) through two checkpoints: the learner restored from the pair
    holds the buffer and networks saved (Pong-v5's sticky actions make its envs start fresh episodes: no exact rows)."""
    pytest.importorskip('ale_py')
    from fastrl_per.stages.atari import atari_defaults
    kwargs = dict(seed=0, **dict(atari_defaults(600), max_sz=400, warmup=100, bs=8))
    first = Learner('ALE/Pong-v5', replay_storage='disk', replay_dir=tmp_path / REPLAY_DIR, **kwargs)
    first.fit(200); save_checkpoint(tmp_path, first)
    first.fit(300); save_checkpoint(tmp_path, first)   # past the ring's 400 transitions: its frames wrap
    assert type(first.replay.buffer.storage).__name__ == 'FrameStorage' and len(replay_files(tmp_path)) > 1
    saved, files = first.state_dict(), replay_files(tmp_path)
    del first
    resumed = restore_learner(load_checkpoint(tmp_path), tmp_path / REPLAY_DIR)
    assert_same({k: v for k, v in resumed.state_dict().items() if k != 'envs'}, {k: v for k, v in saved.items() if k != 'envs'})
    assert len(resumed.fit(50)) > 0 and replay_files(tmp_path) == files   # it trains on in the same files


@pytest.mark.parametrize('replay', ['uniform', 'per'])
def test_a_second_checkpoint_writes_the_rows_written_since(tmp_path, monkeypatch, replay):
    "A checkpoint after 500 more steps writes about 500 rows (in 64 KB chunks here), not the whole ring again."
    monkeypatch.setattr(store, 'CHUNK_BYTES', 1 << 16)   # chunks of 64 KB: a 7 MB ring has a hundred of them
    learner = Learner(seed=0, total_steps=5_000, bs=16, replay=replay, max_sz=100_000, replay_dir=tmp_path / REPLAY_DIR)
    learner.fit(1_000)
    first = written(lambda: save_checkpoint(tmp_path, learner))
    ring, files = learner.replay.buffer.storage.nbytes(), replay_files(tmp_path)
    assert first > 1_000 * ring // 100_000   # the first writes the rows written so far (the rest: a hole)
    learner.fit(500)
    second = written(lambda: save_checkpoint(tmp_path, learner))
    assert replay_files(tmp_path) == files   # written in place: no second copy
    small = (tmp_path / 'checkpoint.pt').stat().st_size + (tmp_path / REPLAY_DIR / STATE_FILE).stat().st_size
    rows = 4 * (1 << 16)   # 500 rows of 72 bytes reach at most two chunks, each journaled before it is written
    assert second - small <= rows, (first, second, small, ring)
    if replay == 'uniform': assert second < 0.1 * ring, (first, second, ring)   # PER's priorities are in state.pt


def test_replay_storage_disk_runs_as_memory_and_checkpoints_by_flushing(tmp_path):
    "`replay_storage='disk'`: the run's metrics are those of the run in memory; its ring is one file, kept in place."
    disk, memory = tmp_path / 'disk', tmp_path / 'memory'
    train(out=str(disk), total_steps=600, replay_storage='disk', **LOOP)
    train(out=str(memory), total_steps=600, **LOOP)
    assert (disk / 'metrics.csv').read_text() == (memory / 'metrics.csv').read_text()
    assert_same(storage_aside(run_state(disk)), storage_aside(run_state(memory)))
    files = replay_files(disk)
    assert len(files) == 1 and files[0].startswith('rows.')
    assert load_checkpoint(disk)['config']['replay_storage'] == 'disk'
    assert 'checkpoint.pt (the latest, step 600)' in evaluate(str(disk), episodes=1, latest=True)
    train(resume=str(disk), total_steps=800, **LOOP)
    assert replay_files(disk) == files and load_checkpoint(disk)['env_steps'] == 800
    with pytest.raises(ValueError, match='replay_storage'):
        train(resume=str(disk), total_steps=900, replay_storage='memory', **LOOP)


def as_version_5(state:dict) -> dict:
    "`state` as version 5 wrote it: the replay buffer inside checkpoint.pt, no `replay_storage` in the config."
    old = {k: v for k, v in state.items() if k != 'replay_save'}
    return dict(old, version=5, config={k: v for k, v in state['config'].items() if k != 'replay_storage'})


def test_an_old_checkpoint_with_the_buffer_inside_resumes(tmp_path):
    "A version-5 run (its buffer inside checkpoint.pt, no replay/) resumes, ends as the run never stopped, then has replay/."
    stopped, whole = tmp_path / 'stopped', tmp_path / 'whole'
    proc = subprocess.Popen([*COMMAND, 'train', '--out', str(stopped), '--steps', '600', *LOOP_FLAGS],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_saved_steps(proc, stopped, 200)
    proc.send_signal(signal.SIGINT)
    assert proc.communicate(timeout=300) and proc.returncode == 130
    old = as_version_5(run_state(stopped))   # the state at the checkpoint, its buffer read back from replay/
    assert old['replay']['columns'] is not None
    torch.save(old, stopped / 'checkpoint.pt')
    for f in sorted((stopped / REPLAY_DIR).rglob('*'), reverse=True): f.rmdir() if f.is_dir() else f.unlink()
    (stopped / REPLAY_DIR).rmdir()
    assert f"resumed at step {old['env_steps']}" in train(resume=str(stopped), **dict(LOOP, checkpoint_every=25))
    train(out=str(whole), total_steps=600, **dict(LOOP, checkpoint_every=25))
    assert (stopped / 'metrics.csv').read_text() == (whole / 'metrics.csv').read_text()
    assert_same(run_state(stopped), run_state(whole))
    assert load_checkpoint(stopped)['replay_save'] in replay_saves(stopped)


def kill_in_a_checkpoint(proc, run_dir, seconds:float=20.) -> bool:
    "SIGKILL `proc` as soon as a checkpoint of it waits in checkpoint.next.pt (its replay being saved); whether it did."
    pending, deadline = Path(run_dir) / PENDING, time.monotonic() + seconds
    while not pending.exists() and proc.poll() is None and time.monotonic() < deadline: time.sleep(0.0005)
    proc.kill()
    return pending.exists()


@pytest.mark.parametrize('storage', ['memory', 'disk'])
def test_a_run_killed_at_random_moments_resumes_to_the_run_never_killed(tmp_path, storage):
    """`fastrl_per train` SIGKILLed four times, twice at a random moment and twice in a checkpoint (while its replay is
    saved), resumed each time: its metrics and final state are the uninterrupted run's; no half-written file is left."""
    run, whole, rng = tmp_path / 'run', tmp_path / 'whole', random.Random(storage)
    flags = ['--steps', '1500', '--replay-storage', storage, *LOOP_FLAGS]
    done = subprocess.run([*COMMAND, 'train', '--out', str(whole), *flags], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    saved, kills = 0, []
    for leg in range(4):
        start = ['--out', str(run), *flags] if leg == 0 else ['--resume', str(run), *LOOP_FLAGS]
        proc = subprocess.Popen([*COMMAND, 'train', *start], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wait_for_saved_steps(proc, run, saved + 50)
        if leg % 2: kills.append(('in a checkpoint', kill_in_a_checkpoint(proc, run)))
        else:
            try: proc.wait(timeout=rng.uniform(0, 1.))
            except subprocess.TimeoutExpired: proc.kill()
            kills.append(('at random', (run / PENDING).exists()))
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == -signal.SIGKILL, (out, err)
        saved = load_checkpoint(run)['env_steps']
    resumed = subprocess.run([*COMMAND, 'train', '--resume', str(run), *LOOP_FLAGS], capture_output=True, text=True,
                             timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    assert (run / 'metrics.csv').read_text() == (whole / 'metrics.csv').read_text(), kills
    assert_same(run_state(run), run_state(whole))
    replay = run / REPLAY_DIR
    assert not (run / PENDING).exists() and not list(replay.glob(f'{JOURNAL}/*')) and not list(run.rglob('*.tmp'))
    assert replay_files(run) == sorted(info['file'] for info in SavedArrays(replay).read()['arrays'].values())
    assert sum(hit for how, hit in kills if how == 'in a checkpoint') >= 1, kills   # at least one landed in one


KILL_AT_RENAME = """
import os, signal, sys
from fastrl_per.run.train import train
real, seen = os.replace, []
def replace(src, dst):   # SIGKILL the process at its third checkpoint: its replay is saved, checkpoint.pt not yet
    if str(src).endswith('checkpoint.next.pt'):
        seen.append(src)
        if len(seen) == 3: os.kill(os.getpid(), signal.SIGKILL)
    real(src, dst)
os.replace = replace
train(out=sys.argv[1], total_steps=600, replay_storage=sys.argv[2], checkpoint_every=100, eval_every=0, solved=0,
      progress=False)
"""


@pytest.mark.parametrize('storage', ['memory', 'disk'])
def test_a_run_killed_between_its_replay_and_its_checkpoint_resumes_from_both(tmp_path, storage):
    "Killed after the replay's save, before checkpoint.next.pt replaces checkpoint.pt: the resume finishes the pair."
    run, whole = tmp_path / 'run', tmp_path / 'whole'
    killed = subprocess.run([sys.executable, '-c', KILL_AT_RENAME, str(run), storage], capture_output=True, text=True,
                            timeout=600)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    pending = torch.load(run / PENDING, weights_only=True)
    assert pending['env_steps'] == 200 and load_checkpoint(run)['env_steps'] == 100   # steps 0, 100, then 200
    assert replay_saves(run) == {pending['replay_save']}   # the replay is the pending checkpoint's
    summary = train(resume=str(run), **dict(LOOP, replay_storage=storage))
    assert summary.startswith('the last checkpoint was interrupted after its replay was saved') and 'step 200' in summary
    train(out=str(whole), total_steps=600, **dict(LOOP, replay_storage=storage))
    assert (run / 'metrics.csv').read_text() == (whole / 'metrics.csv').read_text()
    assert_same(run_state(run), run_state(whole))
