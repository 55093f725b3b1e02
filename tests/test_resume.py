"Exact resume: a run interrupted and resumed gives the rows, networks and buffer of the uninterrupted run."
import io, math
import pytest
import torch
from fastrl_per.learners.learner import Learner
from fastrl_per.learners.recurrent_learner import RecurrentLearner
from fastrl_per.learners.apex import ApexRun
from fastrl_per.run.rundir import load_checkpoint
from fastrl_per.run.factories import restore_learner

pytestmark = pytest.mark.usefixtures('one_thread')   # every test trains on one torch thread (conftest.py)

def roundtrip(state):
    "`state` through a file, read back as a checkpoint is: `weights_only=True`."
    file = io.BytesIO()
    torch.save(state, file)
    file.seek(0)
    return torch.load(file, weights_only=True)

def assert_same(a, b, where='state'):
    "Exact equality of two nested states (tensors bit for bit, floats by value, nan equal to nan)."
    assert type(a) is type(b), f"{where}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, torch.Tensor): assert a.dtype == b.dtype and torch.equal(a, b) or (a.is_floating_point() and torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num())), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), f"{where}: keys {sorted(a)} != {sorted(b)}"
        for k in a: assert_same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), f"{where}: length {len(a)} != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)): assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and math.isnan(a): assert math.isnan(b), where
    else: assert a == b, f"{where}: {a!r} != {b!r}"

def interrupted_and_whole(steps=1_000, **kwargs):
    "The rows and final state of `fit(steps/2)`, checkpoint, a new learner, `fit(steps/2)`; and those of one `fit(steps)`."
    first = Learner(total_steps=steps, **kwargs)
    rows = first.fit(steps // 2)
    resumed = Learner(total_steps=steps, **kwargs)
    resumed.load_state_dict(roundtrip(first.state_dict()))
    rows_after = resumed.fit(steps // 2)
    whole = Learner(total_steps=steps, **kwargs)
    whole_rows = whole.fit(steps)
    return rows, rows_after, resumed, whole_rows, whole

@pytest.mark.parametrize('steps, kwargs', [(1_000, dict()), (400, dict(n_step=3, nenvs=2)), (400, dict(replay='uniform', train_every=2, gradient_steps=2))],
                         ids=['per-500+500', 'nstep3-envs2-200+200', 'uniform-every2-200+200'])
def test_fit_resumed_halfway_equals_one_fit(steps, kwargs):
    rows, rows_after, resumed, whole_rows, whole = interrupted_and_whole(steps, seed=0, **kwargs)
    assert len(rows) > 50 and len(rows_after) > 50
    assert_same(rows + rows_after, whole_rows, 'rows')
    assert_same(resumed.state_dict(), whole.state_dict())   # networks, optimiser, buffer, RNGs, envs, counters
    assert resumed.state_dict()['fresh_episodes'] is None

def test_resume_crosses_an_episode_in_progress():
    "The checkpoint falls inside an episode, which the resumed learner finishes with the same return."
    first = Learner(total_steps=400, seed=0)
    first.fit(200)
    run, ended = first.stepper.envs.get()[0], len(first.episodes.returns)
    assert run.step_n[0] > 0 and not run.resetting[0], "the checkpoint should fall inside an episode"
    resumed = Learner(total_steps=400, seed=0)
    resumed.load_state_dict(roundtrip(first.state_dict()))
    first.fit(200); resumed.fit(200)
    assert len(first.episodes.returns) > ended and resumed.episodes.returns == first.episodes.returns

def test_a_rejected_checkpoint_leaves_the_learner_unchanged():
    learner = Learner(total_steps=1_000, seed=0, n_step=3)
    learner.fit(100)
    before = learner.state_dict()
    good = roundtrip(before)
    env0 = good['envs']['runs'][0]['envs'][0]
    bad_env = [(name, dict(attrs)) for name, attrs in env0]
    bad_env[-1][1]['state'] = ('ndarray', 'not a tensor')
    cases = {
        'env state': dict(good, envs=dict(good['envs'], runs=[dict(good['envs']['runs'][0], envs=[bad_env])])),
        'n-step window': dict(good, nstep=dict(good['nstep'], n=2)),
        'replay items': dict(good, replay_items=-1),
        'torch rng': dict(good, torch_rng=torch.zeros(3, dtype=torch.uint8)),
        'agent rng': dict(good, agent=dict(good['agent'], rng={'bit_generator': 'nope'})),
        'network': dict(good, model={}),
        'envs without a reason': dict(good, envs=None),
        'version 1': dict(good, version=1),
    }
    fresh = Learner(total_steps=1_000, seed=0, n_step=3)
    fresh_before = fresh.state_dict()
    for name, state in cases.items():
        for target, expect in ((learner, before), (fresh, fresh_before)):
            with pytest.raises(ValueError): target.load_state_dict(state)
            assert_same(target.state_dict(), expect, name)
    learner.load_state_dict(good)       # and the good state still loads


def as_version_4(state:dict) -> dict:
    "`state` as version 4 wrote it: the count of sub-envs was `envs`, Ape-X's base exploration rate `epsilon`."
    old_names = dict(nenvs='envs', explore_base='epsilon')
    return dict(state, version=4, config={old_names.get(k, k): v for k, v in state['config'].items()})

@pytest.mark.parametrize('make', [lambda: Learner('CartPole-v1', seed=0, total_steps=600, nenvs=2),
                                  lambda: RecurrentLearner(seed=0, total_steps=600, bs=8, length=4, burn_in=2, warmup=100),
                                  lambda: ApexRun('CartPole-v1', actors=2, seed=0, total_steps=600, explore_base=0.3)],
                         ids=['Learner', 'RecurrentLearner', 'ApexRun'])
def test_a_version_4_checkpoint_resumes(make, tmp_path):
    "`load_checkpoint` upgrades a checkpoint written before `nenvs` and `explore_base`: the learner it names is rebuilt whole."
    learner = make()
    if not isinstance(learner, ApexRun): learner.fit(200)   # an Ape-X run steps its envs only on Ray
    torch.save(as_version_4(learner.state_dict()), tmp_path / 'checkpoint.pt')
    restored = restore_learner(load_checkpoint(tmp_path))
    assert type(restored) is type(learner) and restored.config == learner.config
    assert_same(restored.state_dict(), learner.state_dict())


FORMER = dict(explore_start='eps_start', explore_end='eps_end', explore_steps='eps_decay_steps', explore_base='eps_base')

def with_former_names(state:dict) -> dict:
    "`state` as this version wrote it while the exploration settings were `eps_start`, `eps_end`, ... (`FORMER`)."
    return dict(state, config={FORMER.get(k, k): v for k, v in state['config'].items()})

@pytest.mark.parametrize('make', [lambda: Learner('CartPole-v1', seed=0, total_steps=600, explore_end=0.2),
                                  lambda: RecurrentLearner(seed=0, total_steps=600, bs=8, length=4, burn_in=2, warmup=100,
                                                           explore_steps=300),
                                  lambda: ApexRun('CartPole-v1', actors=2, seed=0, total_steps=600, explore_base=0.3)],
                         ids=['Learner', 'RecurrentLearner', 'ApexRun'])
def test_a_checkpoint_with_the_former_exploration_names_resumes(make, tmp_path):
    "A checkpoint of this version that names exploration `eps_*` is rebuilt whole, its settings under today's names."
    learner = make()
    if not isinstance(learner, ApexRun): learner.fit(200)
    state = with_former_names(learner.state_dict())
    assert {'eps_start', 'eps_end', 'eps_decay_steps'} <= set(state['config']) and 'explore_end' not in state['config']
    torch.save(state, tmp_path / 'checkpoint.pt')
    restored = restore_learner(load_checkpoint(tmp_path))
    assert type(restored) is type(learner) and restored.config == learner.config
    assert_same(restored.state_dict(), learner.state_dict())
    if not isinstance(learner, ApexRun): assert_same(restored.fit(50), learner.fit(50), 'rows')


# the command: a real `fastrl_per train` stopped by SIGINT and resumed, against one never stopped

import signal, subprocess, sys
from pathlib import Path
import gymnasium as gym
from fastrl_per.run.train import train
from conftest import scalars, wait_for_saved_steps

COMMAND = [str(Path(sys.executable).parent / 'fastrl_per')]
LOOP_FLAGS = ['--checkpoint-every', '50', '--eval-every', '200', '--eval-episodes', '2', '--solved', '0', '--no-progress']   # not in the checkpoint: a resumed run is given them again
RUN_FLAGS = ['--steps', '600', *LOOP_FLAGS]

def test_command_interrupted_and_resumed_equals_the_run_never_stopped(tmp_path):
    stopped, whole = tmp_path / 'stopped', tmp_path / 'whole'
    proc = subprocess.Popen([*COMMAND, 'train', '--out', str(stopped), *RUN_FLAGS], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_saved_steps(proc, stopped, 100)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 130, stderr
    frames = torch.load(stopped / 'checkpoint.pt', weights_only=True)['env_steps']
    assert 100 <= frames < 600, frames
    resumed = subprocess.run([*COMMAND, 'train', '--resume', str(stopped), *LOOP_FLAGS], capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    assert f'resumed at step {frames}: the envs continued their episodes exactly' in resumed.stdout
    done = subprocess.run([*COMMAND, 'train', '--out', str(whole), *RUN_FLAGS], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert (stopped / 'metrics.csv').read_text() == (whole / 'metrics.csv').read_text()
    assert_same(run_state(stopped), run_state(whole))
    assert_same(torch.load(stopped / 'best.pt', weights_only=True), torch.load(whole / 'best.pt', weights_only=True))
    assert_same(scalars(stopped), scalars(whole), 'TensorBoard')

def run_state(run_dir) -> dict:
    "The whole state of the run in `run_dir`, its replay (saved in replay/, named by checkpoint.pt) inside, as a resume reads it."
    return restore_learner(load_checkpoint(run_dir), Path(run_dir) / 'replay').state_dict()


def make_transformed_cartpole(**kwargs):
    "CartPole behind gymnasium's `TransformObservation`, whose function `env_state` cannot save."
    env = gym.make('CartPole-v1', **kwargs)
    return gym.wrappers.TransformObservation(env, lambda obs: obs * 2, env.observation_space)

if 'CartPoleTransformed-v0' not in gym.registry: gym.register('CartPoleTransformed-v0', entry_point=make_transformed_cartpole)

def test_envs_that_cannot_be_saved_resume_with_fresh_episodes(tmp_path):
    learner = Learner('CartPoleTransformed-v0', total_steps=300, seed=0)
    learner.fit(100)
    state = roundtrip(learner.state_dict())
    assert state['envs'] is None and "TransformObservation._saved_kwargs['func'] is a function" in state['fresh_episodes']
    out = tmp_path / 'run'
    train(out=str(out), env_id='CartPoleTransformed-v0', total_steps=150, eval_every=0, progress=False)
    summary = train(resume=str(out), total_steps=300, progress=False)
    assert 'resumed at step 150: the envs started fresh episodes' in summary and "TransformObservation._saved_kwargs['func'] is a function" in summary
    resumed = Learner('CartPoleTransformed-v0', total_steps=300, seed=0)
    resumed.load_state_dict(state)
    fresh = gym.make('CartPoleTransformed-v0').reset(seed=0 + 100)[0]
    assert resumed.stepper.envs.get()[0].obs[0].tolist() == fresh.tolist()   # fresh episodes, seeded from seed + frames


def test_fresh_episodes_drop_the_open_n_step_windows(tmp_path):
    "The n-step windows open at the checkpoint belong to episodes a fresh start abandons: the resumed run drops them and goes on."
    out = tmp_path / 'run'
    train(out=str(out), env_id='CartPoleTransformed-v0', total_steps=150, n_step=3, eval_every=0, progress=False)
    assert torch.load(out / 'checkpoint.pt', weights_only=True)['nstep']['windows']   # some were open
    summary = train(resume=str(out), total_steps=300, progress=False)
    assert 'resumed at step 150: the envs started fresh episodes' in summary and '300 steps' in summary


def test_atari_envs_continue_exactly_through_the_emulator_state():
    "ale-py's `cloneState(include_rng=True)`, serialised, restores an Atari episode in progress behind the DQN preprocessing; with sticky actions (the v5 default) the action a sticky step repeats is not in that state, so those envs start fresh episodes."
    ale_py = pytest.importorskip('ale_py')
    gym.register_envs(ale_py)
    from fastrl_per.stages.envs import EnvRun, env_state, check_env_state, set_env_state
    from fastrl_per.stages.atari import make_atari_env
    run = EnvRun('ALE/Pong-v5', 1, seed=0)
    for _ in range(10): run.step()
    assert 'sticky actions' in run.state_dict()['unsaved']
    for steps in (3, 10, 41):   # with sticky actions on, the chain from seed 0 already parted after 40 steps
        env, copy = (make_atari_env('ALE/Pong-v5', repeat_action_probability=0.) for _ in range(2))
        env.reset(seed=0); copy.reset(seed=3)
        for a in range(steps): env.step(a % 6)
        set_env_state(copy, check_env_state(copy, roundtrip(env_state(env))))
        for a in range(50): assert (env.step(a % 6)[0] == copy.step(a % 6)[0]).all()


def test_a_version_3_run_evaluates_and_resumes(tmp_path):
    "A run directory whose checkpoint.pt is version 3's (env steps were `frames`, sub-envs `envs`, no collector, no"
    " `replay_storage`): `evaluate` and `train --resume` upgrade it through the class it names, and go on."
    from fastrl_per.run.train import train, evaluate
    run = tmp_path / 'run'
    train(out=str(run), total_steps=200, bs=16, warmup=16, eval_every=0, progress=False, solved=0)
    state = restore_learner(load_checkpoint(run), run / 'replay').state_dict()   # the buffer inside, as then
    config = {('envs' if k == 'nenvs' else k): v for k, v in state['config'].items()
              if k not in ('collector', 'publish_every', 'replay_storage')}
    old = {('frames' if k == 'env_steps' else k): v for k, v in state.items() if k not in ('collector', 'replay_save')}
    torch.save(dict(old, version=3, config=config), run / 'checkpoint.pt')
    assert 'step 200' in evaluate(str(run), episodes=1, latest=True)
    train(resume=str(run), total_steps=300, eval_every=0, progress=False, solved=0)
    resumed = load_checkpoint(run)
    assert (resumed['version'], resumed['env_steps'], resumed['config']['replay_storage']) == (6, 300, 'memory')


def test_a_run_with_the_former_exploration_names_evaluates_and_resumes(tmp_path):
    ("A run directory whose checkpoint.pt names exploration `eps_*`: `evaluate` plays it, and `train --resume` with "
     "the same setting given (under either name) goes on and writes today's names.")
    from fastrl_per.run.train import evaluate
    run = tmp_path / 'run'
    train(out=str(run), total_steps=200, bs=16, warmup=16, eval_every=0, progress=False, solved=0, explore_end=0.2)
    torch.save(with_former_names(load_checkpoint(run)), run / 'checkpoint.pt')
    assert load_checkpoint(run)['config']['eps_end'] == 0.2
    assert 'step 200' in evaluate(str(run), episodes=1, latest=True)
    train(resume=str(run), total_steps=300, eval_every=0, progress=False, solved=0, explore_end=0.2)
    resumed = load_checkpoint(run)
    assert (resumed['env_steps'], resumed['config']['explore_end'], 'eps_end' in resumed['config']) == (300, 0.2, False)
