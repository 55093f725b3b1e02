"""A run directory through the real command, as a user's second terminal, a Ctrl-C or a kill would meet it: one
writer at a time (a second `train` on it is refused at once, exit 2, naming the holder; a SIGKILLed holder leaves no
stale lock), a signal at any moment leaves a directory that `--resume` continues or that the same `--out` takes
again, with a metrics.csv equal to a run never stopped, and every refusal says what to do next."""
import os, random, signal, subprocess, sys, threading, time
from pathlib import Path
import pytest
import torch
from conftest import wait_for_saved_steps

COMMAND = [str(Path(sys.executable).parent / 'fastrl_per'), 'train']
QUICK = ['--checkpoint-every', '100', '--eval-every', '0', '--solved', '0', '--no-progress']


def start(*args) -> subprocess.Popen:
    return subprocess.Popen([*COMMAND, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def refused(*args, seconds:float=30.) -> subprocess.CompletedProcess:
    "Run the command, which must be refused: exit 2 with one line on stderr, within `seconds` (at once, not waiting)."
    t = time.monotonic()
    done = subprocess.run([*COMMAND, *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert time.monotonic() - t < seconds
    return done


@pytest.mark.parametrize('storage', ['memory', 'disk'])
def test_a_second_writer_is_refused_and_a_killed_holder_leaves_no_stale_lock(tmp_path, storage):
    run = tmp_path / 'run'
    holder = start('--out', str(run), '--steps', '100000', '--replay-storage', storage, *QUICK)
    try:
        wait_for_saved_steps(holder, run, 200)
        assert holder.poll() is None, holder.communicate()
        for second in (['--resume', str(run)], ['--out', str(run)]):
            line = refused(*second, '--no-progress').stderr
            assert f"run directory {str(run)!r} is in use by another writer (held by pid {holder.pid})" in line, line
            assert 'wait for it to end, or use another directory' in line
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=60)
    finally:
        if holder.poll() is None: holder.kill(); holder.wait()
    saved = torch.load(run / 'checkpoint.pt', weights_only=True)['env_steps']
    resumed = subprocess.run([*COMMAND, '--resume', str(run), '--steps', str(saved + 100), '--no-progress'],
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr   # the kernel dropped the dead holder's lock
    assert f'resumed at step {saved}' in resumed.stdout


STEPS = ['--steps', '400', *QUICK]


@pytest.fixture(scope='module')
def whole(tmp_path_factory) -> str:
    "metrics.csv of the run never stopped."
    run = tmp_path_factory.mktemp('whole') / 'run'
    done = subprocess.run([*COMMAND, '--out', str(run), *STEPS], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return (run / 'metrics.csv').read_text()


def finish(run:Path) -> subprocess.CompletedProcess:
    ("Carry a stopped run on as a user would: `--resume` it, or, when it says nothing was committed, start it again "
     "with the same `--out`.")
    done = subprocess.run([*COMMAND, '--resume', str(run), *STEPS], capture_output=True, text=True, timeout=300)
    if 'already has 400 steps; ask for more with --steps' in done.stderr:   # the signal came after its last save
        return subprocess.CompletedProcess(done.args, 0)
    if done.returncode == 2:
        assert 'start it again with --out' in done.stderr or 'start one there with --out' in done.stderr, done.stderr
        done = subprocess.run([*COMMAND, '--out', str(run), *STEPS], capture_output=True, text=True, timeout=300)
    return done


MOMENTS = [('metrics.csv', 0.), ('checkpoint.next.pt', 0.), ('replay', 0.), ('checkpoint.pt', 0.)]
MOMENTS += [('metrics.csv', random.Random(0).uniform(0, 2))]   # and once a moment later, mid-run


@pytest.mark.parametrize('signum', [signal.SIGINT, signal.SIGKILL])
@pytest.mark.parametrize('name,delay', MOMENTS)
def test_a_signal_at_any_moment_leaves_a_run_that_goes_on(tmp_path, whole, signum, name, delay):
    run = tmp_path / 'run'
    proc = start('--out', str(run), *STEPS)
    def watch():   # signal the run as soon as `name` appears in its directory (or it ends), then after `delay`
        while not (run / name).exists() and proc.poll() is None: time.sleep(0.0005)
        time.sleep(delay)
        if proc.poll() is None: proc.send_signal(signum)
    watcher = threading.Thread(target=watch)
    watcher.start()
    _, stderr = proc.communicate(timeout=300)
    watcher.join()
    if proc.returncode != 0:
        done = finish(run)
        assert done.returncode == 0, (proc.returncode, stderr, done.stderr)
    assert (run / 'metrics.csv').read_text() == whole   # no row lost, none twice


def test_a_metrics_row_cut_mid_line_is_repaired_on_resume(tmp_path, whole):
    run = tmp_path / 'run'
    proc = start('--out', str(run), *STEPS)
    wait_for_saved_steps(proc, run, 100)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 130, stderr
    saved = torch.load(run / 'checkpoint.pt', weights_only=True)['env_steps']
    with open(run / 'metrics.csv', 'a', newline='') as f: f.write(f'{saved + 1},77,0.12')   # what a kill leaves
    done = finish(run)
    assert done.returncode == 0, done.stderr
    assert (run / 'metrics.csv').read_text() == whole


def test_refusals_say_what_to_do(tmp_path):
    mine = tmp_path / 'mine'
    mine.mkdir(); (mine / 'notes.txt').write_text('mine')
    assert 'choose a new or empty directory for --out' in refused('--out', str(mine)).stderr
    assert 'give a run\'s directory, or start a new run with --out' in refused('--resume', str(mine)).stderr
    assert 'choose a directory for --out' in refused('--out', str(mine / 'notes.txt')).stderr
    # a directory that is not there (a run refused, or stopped before it began, removes the one it made)
    assert f"start one there with --out {str(tmp_path / 'never')!r}" in refused('--resume', str(tmp_path / 'never')).stderr
    run = tmp_path / 'run'
    done = subprocess.run([*COMMAND, '--out', str(run), '--steps', '200', *QUICK], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"continue it with --resume {str(run)!r}" in refused('--out', str(run)).stderr
    assert 'a resumed run stays in its directory: give one of them' in refused(
        '--resume', str(run), '--out', str(mine)).stderr
    outside = tmp_path / 'outside.json'
    (run / 'run.json').rename(outside); (run / 'run.json').symlink_to(outside)
    line = refused('--resume', str(run), '--steps', '300').stderr
    assert "run.json' leads outside its run directory" in line and 'replace the link with the file itself' in line


def test_an_absurdly_long_env_id_is_shortened_in_the_message(tmp_path):
    done = subprocess.run([*COMMAND, '--env', 'x' * 5000, '--out', str(tmp_path / 'run'), '--no-progress'],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and len(done.stderr) < 400, done.stderr
    assert '5,000 characters' in done.stderr, done.stderr
    assert not (tmp_path / 'run').exists()
