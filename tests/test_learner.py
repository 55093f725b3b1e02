"""DQN stages and `Learner`: TD targets, priority feedback, weighted loss gradients, target updates,
beta annealing, uniform replay, a short CartPole run, resuming runs, and a bad-input table.

Every expected number is recomputed here by hand (from copies of the networks taken *before* the
optimiser step where the library's values are taken before it), not read back from the library.
"""
import re
import shutil
from copy import deepcopy
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn
from torch.utils.data import IterDataPipe
from torch.utils.data.datapipes.iter import IterableWrapper

import fastrl_per.run.rundir as rundir_mod
from fastrl_per.replay.store import SavedArrays
from fastrl_per.core import SimpleStep
from fastrl_per.stages.envs import GymTransformBlock
from fastrl_per.learners.dqn import (AnnealBeta, OnlineQ, OptimizerStep, PriorityFeedback, QNetwork, TargetUpdate, TDTargets,
                            TrainStep, WeightedLoss, td_target)
from fastrl_per.learners.learner import Learner
from fastrl_per.replay.memory import ExperienceReplay
from fastrl_per.replay.per import PrioritizedExperienceReplay
from fastrl_per.stages.pipes import find_upstream
from fastrl_per.run.train import evaluate, greedy_returns, train
from fastrl_per.run.rundir import load_checkpoint, read_metrics


pytestmark = pytest.mark.usefixtures('one_thread')   # every test trains on one torch thread (conftest.py)
ONE_STEP = dict(n_step=1, bs=64)   # a transition stored per env step, the first update at step 64: counts the tests state by hand


def update_frames(run) -> np.ndarray:
    "The env steps of metrics.csv's update rows (not the rows of episodes that ended between updates)."
    m = read_metrics(run)
    return m['frame'][~np.isnan(m['update'])]


class Fixed(nn.Module):
    "Q(s) = s @ W: values we can compute by hand."
    def __init__(self, w):
        super().__init__()
        self.w = nn.Parameter(torch.tensor(w, dtype=torch.float32))
    def forward(self, s): return s @ self.w


def steps_batch(*steps): return SimpleStep.from_steps(list(steps))


# ---------------------------------------------------------------------------------------------
# TD targets
# ---------------------------------------------------------------------------------------------

TARGET_W = [[1., 2.], [3., 4.]]
# next_states below:  [1,1] @ W = [4, 6] ; [1,0] @ W = [1, 2] ; [0,1] @ W = [3, 4]
TD_BATCH = dict(
    terminal=SimpleStep(state=[0., 0.], action=0, next_state=[1., 1.], reward=1., terminated=True),
    nonterminal=SimpleStep(state=[0., 0.], action=1, next_state=[1., 0.], reward=0.5),
    truncated=SimpleStep(state=[0., 0.], action=1, next_state=[0., 1.], reward=-0.5, truncated=True),
    both=SimpleStep(state=[0., 0.], action=0, next_state=[1., 1.], reward=2., terminated=True, truncated=True))


def test_td_targets_by_hand():
    batch = steps_batch(*TD_BATCH.values())
    target = td_target(batch, Fixed(TARGET_W), gamma=0.9)
    # terminal: r only; non-terminal and truncated: r + γ max_a Q_target(s', a)
    expected = torch.tensor([1., 0.5 + 0.9 * 2, -0.5 + 0.9 * 4, 2.])
    torch.testing.assert_close(target, expected)
    # the pipe stage gives the same, for a plain batch and for a `(batch, idxs)` item
    for item in (batch, (batch, torch.arange(4))):
        ts = next(iter(TDTargets(OnlineQ(IterableWrapper([item]), Fixed(TARGET_W)), Fixed(TARGET_W), gamma=0.9)))
        assert isinstance(ts, TrainStep) and ts.batch == batch
        torch.testing.assert_close(ts.target, expected)


def test_truncated_bootstraps_like_nonterminal():
    t = td_target(steps_batch(TD_BATCH['truncated'], SimpleStep(state=[0., 0.], action=1, next_state=[0., 1.], reward=-0.5)),
                  Fixed(TARGET_W), gamma=0.9)
    assert t[0].item() == t[1].item() == pytest.approx(-0.5 + 0.9 * 4)


def test_double_dqn_target_by_hand():
    batch = steps_batch(*TD_BATCH.values())
    online = Fixed([[5., 0.], [0., 1.]])  # argmax at [1,1]: [5,1]→0 ; [1,0]: [5,0]→0 ; [0,1]: [0,1]→1
    target = td_target(batch, Fixed(TARGET_W), 0.9, next_q=online(batch.next_state))
    # the target network values the online network's choice: [1,0]@W = [1,2] → a*=0 → 1, not max 2
    expected = torch.tensor([1., 0.5 + 0.9 * 1, -0.5 + 0.9 * 4, 2.])
    torch.testing.assert_close(target, expected)
    assert not torch.allclose(target, td_target(batch, Fixed(TARGET_W), 0.9))  # differs from plain DQN here
    ts = next(iter(TDTargets(OnlineQ(IterableWrapper([batch]), online, double=True), Fixed(TARGET_W), 0.9)))
    torch.testing.assert_close(ts.target, expected)


# ---------------------------------------------------------------------------------------------
# One prioritized update: the sampled slots get |δ| + eps, δ from the networks before the step
# ---------------------------------------------------------------------------------------------

def random_steps(n, obs_dim=3, n_actions=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [SimpleStep(state=torch.randn(obs_dim, generator=g), action=int(torch.randint(n_actions, (1,), generator=g)),
                       next_state=torch.randn(obs_dim, generator=g), reward=float(torch.randn(1, generator=g)) * 3,
                       terminated=i % 4 == 3, truncated=i % 5 == 4, step_n=i) for i in range(n)]


def hand_priorities(batch, online, target, gamma, eps):
    "|δ| + eps per sampled row, δ = r + γ·Q_target(s', argmax Q_online(s'))·(1 - terminated) − Q_online(s, a)."
    with torch.no_grad():
        a_star = online(batch.next_state).argmax(-1)
        boot = target(batch.next_state)[torch.arange(len(batch)), a_star]
        y = batch.reward + gamma * boot * (~batch.terminated).float()
        q = online(batch.state)[torch.arange(len(batch)), batch.action.long()]
    return ((y - q).abs() + eps).double().numpy()


def last_write(idxs, values):
    "slot → value with the last of repeated slots winning, as `update_priorities` promises."
    out = {}
    for i, v in zip(np.asarray(idxs).tolist(), np.asarray(values).tolist()): out[i] = v
    return out


def one_update_chain(n_stored, bs, seed=0, gamma=0.9, eps=1e-3, preset=None):
    "A PER chain whose buffer holds `n_stored` steps, iterated for exactly one update."
    torch.manual_seed(seed)
    model, target = QNetwork(3, 2, hidden=16), QNetwork(3, 2, hidden=16)  # different weights on purpose
    steps = random_steps(n_stored, seed=seed)
    per = PrioritizedExperienceReplay(IterableWrapper(steps[-1:]), bs=bs, max_sz=64, eps=eps, seed=seed)
    per.add(steps[:-1])
    if preset: per.update_priorities(list(preset), list(preset.values()))
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    pipe = TDTargets(OnlineQ(per, model, double=True), target, gamma)
    pipe = WeightedLoss(pipe)
    pipe = OptimizerStep(pipe, opt)
    pipe = TargetUpdate(pipe, model, target, every=1)  # the target moves too, before the feedback stage runs
    pipe = PriorityFeedback(pipe)
    online0, target0 = deepcopy(model), deepcopy(target)
    before = per.buffer.priorities.copy()
    out = list(pipe)
    assert len(out) == 1
    return per, out[0], model, target, online0, target0, before


def test_priorities_after_one_update_are_td_before_the_step():
    per, ts, model, target, online0, target0, before = one_update_chain(n_stored=40, bs=8)
    n = len(per)
    assert n == 40
    np.testing.assert_array_equal(before[:n - 1], 1.0)  # every new step entered at max_priority (1 at the start)
    before[n - 1] = 1.0  # the pipe added the last step, also at max_priority 1, just before sampling
    # the networks did change, so a δ from the post-step networks would be a different number
    assert not all(torch.equal(a, b) for a, b in zip(model.parameters(), online0.parameters()))
    assert all(torch.equal(a, b) for a, b in zip(target.parameters(), model.parameters()))  # hard copy every=1
    idxs = ts.batch.idxs.numpy()
    expected = last_write(idxs, hand_priorities(ts.batch, online0, target0, 0.9, 1e-3))
    stale = last_write(idxs, hand_priorities(ts.batch, model, target, 0.9, 1e-3))
    prios = per.buffer.priorities
    for slot, p in expected.items():
        assert prios[slot] == pytest.approx(p, rel=1e-5), slot
    assert any(abs(stale[s] - expected[s]) > 1e-3 for s in expected)  # the test can tell the two apart
    untouched = np.setdiff1d(np.arange(n), idxs)
    assert len(untouched) >= n - 8
    np.testing.assert_array_equal(prios[untouched], before[untouched])
    assert per.max_priority == pytest.approx(max(1.0, max(expected.values())))
    # the tree holds priority ** alpha of every slot
    np.testing.assert_allclose(per.buffer.kind[np.arange(n)], prios[:n] ** per.alpha, rtol=1e-9)
    # the feedback is what the loss stage computed before the optimiser step
    np.testing.assert_allclose(ts.td_errors.abs().numpy() + 1e-3, hand_priorities(ts.batch, online0, target0, 0.9, 1e-3), rtol=1e-5)


def test_priorities_with_repeated_slots():
    "Slot 0 holds most of the priority mass, so it fills several segments of the batch."
    per, ts, model, target, online0, target0, before = one_update_chain(n_stored=8, bs=8, seed=1, preset={0: 100.})
    idxs = ts.batch.idxs.numpy()
    assert len(np.unique(idxs)) < len(idxs)
    expected = last_write(idxs, hand_priorities(ts.batch, online0, target0, 0.9, 1e-3))
    for slot, p in expected.items():
        assert per.buffer.priorities[slot] == pytest.approx(p, rel=1e-5)


class Inject(IterDataPipe):
    "Yield fixed items, with a buffer upstream for the stages that look it up."
    def __init__(self, source_datapipe, items): self.source_datapipe, self.items = source_datapipe, items
    def __iter__(self): yield from self.items


def test_priority_feedback_last_write_wins():
    "Different TD errors for one repeated slot: the last one in the batch is stored."
    per = PrioritizedExperienceReplay(None, bs=3, max_sz=8, eps=1e-2, seed=0)
    per.add(random_steps(4))
    batch = per.sample(3)
    batch.idxs = torch.tensor([1, 2, 1])
    ts = TrainStep(batch, td_errors=torch.tensor([-5.0, 0.25, -0.5]))
    assert list(PriorityFeedback(Inject(per, [ts]))) == [ts]
    np.testing.assert_allclose(per.buffer.priorities[:4], [1.0, 0.5 + 1e-2, 0.25 + 1e-2, 1.0])
    np.testing.assert_allclose(per.buffer.kind[np.arange(4)], per.buffer.priorities[:4] ** per.alpha)


def test_max_priority_ignores_overwritten_repeats():
    per = PrioritizedExperienceReplay(None, bs=3, max_sz=8, eps=1e-2, seed=0)
    per.add(random_steps(4))
    per.update_priorities([1, 2, 1], [5.0, 0.25, 0.5])
    assert per.max_priority == pytest.approx(max(per.buffer.priorities[:4]))  # 1.0: nothing above it was stored


def test_learner_update_priorities_by_hand():
    "The same check through `Learner`'s own wiring (double DQN, gamma, eps), one update at a time."
    learner = Learner('CartPole-v1', seed=0, total_steps=1000, bs=16, max_sz=500, eps=1e-4, target_every=3, n_step=1)  # 1-step TD by hand
    learner.fit(60)  # 45 updates: priorities, the target network and max_priority have all moved
    for _ in range(3):  # one of these updates also copies the online network to the target network
        online0, target0 = deepcopy(learner.model), deepcopy(learner.dqn_update.target_model)
        before = learner.replay.buffer.priorities.copy()
        max_before = learner.replay.max_priority
        learner.budget.grant(1) # one env step → one sampled batch → one update (what `iterate` does)
        (ts,) = list(learner.dqn_update.anneal)  # the last stage before the metrics: the TrainStep itself
        n = len(learner.replay)
        before[n - 1] = max_before  # the new step entered at max_priority
        idxs = ts.batch.idxs.numpy()
        expected = last_write(idxs, hand_priorities(ts.batch, online0, target0, 0.99, 1e-4))
        prios = learner.replay.buffer.priorities
        for slot, p in expected.items(): assert prios[slot] == pytest.approx(p, rel=1e-5)
        untouched = np.setdiff1d(np.arange(n), idxs)
        np.testing.assert_array_equal(prios[untouched], before[untouched])
        assert not all(torch.equal(a, b) for a, b in zip(learner.model.parameters(), online0.parameters()))


# ---------------------------------------------------------------------------------------------
# The weighted loss and its gradient
# ---------------------------------------------------------------------------------------------

def test_weighted_loss_gradient_by_hand():
    w = [[0.5, -0.5], [0.25, 1.]]
    model, target_net = Fixed(w), Fixed(TARGET_W)
    batch = steps_batch(SimpleStep(state=[1., 2.], action=0, next_state=[0., 1.], reward=1.),     # δ small: quadratic part
                        SimpleStep(state=[2., 0.], action=1, next_state=[1., 0.], reward=0.),     # δ large: linear part
                        SimpleStep(state=[-1., 3.], action=1, next_state=[1., 1.], reward=-2., terminated=True))
    batch.weights = torch.tensor([1.0, 0.25, 0.6])
    ts = next(iter(WeightedLoss(TDTargets(OnlineQ(IterableWrapper([batch]), model), target_net, 0.9))))
    ts.loss.backward()

    # by hand: q_i = s_i·W[:, a_i]; y_i = r_i + 0.9·max(s'_i W)·(1 - term_i); huber'(x) = clamp(x, -1, 1)
    S, A = np.array([[1., 2.], [2., 0.], [-1., 3.]]), [0, 1, 1]
    Wn = np.array(w)
    q = np.array([S[i] @ Wn[:, A[i]] for i in range(3)])                 # [1.0, -1.0, 3.5]
    y = np.array([1. + 0.9 * 4., 0. + 0.9 * 2., -2.])                  # [0,1]@T=[3,4]; [1,0]@T=[1,2]; terminal
    d = q - y
    huber = np.where(np.abs(d) < 1, 0.5 * d ** 2, np.abs(d) - 0.5)
    wts = np.array([1.0, 0.25, 0.6])
    assert ts.loss.item() == pytest.approx((wts * huber).mean(), rel=1e-6)
    grad = np.zeros((2, 2))
    for i in range(3): grad[:, A[i]] += wts[i] * np.clip(d[i], -1, 1) * S[i] / 3
    np.testing.assert_allclose(model.w.grad.numpy(), grad, rtol=1e-6)
    # weighting after the mean, or not at all, gives another gradient: the test tells them apart
    unweighted = np.zeros((2, 2))
    for i in range(3): unweighted[:, A[i]] += wts.mean() * np.clip(d[i], -1, 1) * S[i] / 3
    assert not np.allclose(unweighted, grad)
    torch.testing.assert_close(ts.td_errors, torch.tensor(y - q, dtype=torch.float32))
    assert not ts.td_errors.requires_grad
    assert target_net.w.grad is None


def test_target_network_gets_no_gradient():
    torch.manual_seed(0)
    model, target = QNetwork(3, 2, hidden=8), QNetwork(3, 2, hidden=8)
    per = PrioritizedExperienceReplay(IterableWrapper(random_steps(12)), bs=4, max_sz=16, seed=0)
    pipe = OptimizerStep(WeightedLoss(TDTargets(OnlineQ(per, model, double=True), target, 0.9)),
                         torch.optim.SGD(model.parameters(), lr=0.1))
    pipe = TargetUpdate(pipe, model, target, every=5)
    assert all(not p.requires_grad for p in target.parameters())
    assert len(list(pipe)) == 9
    assert all(p.grad is None for p in target.parameters())
    assert all(p.grad is not None for p in model.parameters())
    assert all(not p.requires_grad for p in target.parameters())  # also after hard copies

    learner = Learner('CartPole-v1', seed=0, total_steps=500, bs=16, target_every=10)
    learner.fit(80)
    assert all(not p.requires_grad and p.grad is None for p in learner.dqn_update.target_model.parameters())
    assert all(p.requires_grad for p in learner.model.parameters())


# ---------------------------------------------------------------------------------------------
# Target updates
# ---------------------------------------------------------------------------------------------

def test_hard_target_update_every_k():
    model, target = Fixed([[0., 0.]]), Fixed([[-1., -1.]])
    stage = TargetUpdate(IterableWrapper(range(10)), model, target, every=3)
    seen = []
    for i, _ in enumerate(stage):  # update i + 1 has just happened
        seen.append(target.w[0, 0].item())
        with torch.no_grad(): model.w += 1.  # the online network moves after every update
    # model value at update u is u - 1; copies at updates 3, 6, 9
    assert seen == [-1., -1., 2., 2., 2., 5., 5., 5., 8., 8.]
    assert stage.steps == 10


def test_soft_target_update_tau():
    torch.manual_seed(0)
    model, target = QNetwork(3, 2, hidden=4), QNetwork(3, 2, hidden=4)
    stage = TargetUpdate(IterableWrapper(range(3)), model, target, tau=0.1)
    expect = [p.detach().clone() for p in target.parameters()]
    for _ in stage:
        expect = [e + 0.1 * (m.detach() - e) for e, m in zip(expect, model.parameters())]
        for e, t in zip(expect, target.parameters()): torch.testing.assert_close(t, e)
        with torch.no_grad():
            for p in model.parameters(): p.mul_(-1.5)  # move the online network
    # one step moves every parameter exactly a fraction tau of the way
    a, b = Fixed([[0., 10.]]), Fixed([[4., -10.]])
    next(iter(TargetUpdate(IterableWrapper([0]), a, b, tau=0.25)))
    torch.testing.assert_close(b.w, torch.tensor([[3., -5.]]))


@pytest.mark.parametrize('kwargs,match', [(dict(), 'exactly one'), (dict(every=3, tau=0.1), 'exactly one'),
                                          (dict(tau=0.), r'tau.*0\.0'), (dict(tau=1.5), '1.5'), (dict(every=0), 'every')])
def test_target_update_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match): TargetUpdate(IterableWrapper([]), Fixed([[0.]]), Fixed([[0.]]), **kwargs)


# ---------------------------------------------------------------------------------------------
# Beta annealing
# ---------------------------------------------------------------------------------------------

def test_anneal_beta_linear_to_one():
    per = PrioritizedExperienceReplay(IterableWrapper(random_steps(15)), bs=1, max_sz=20, beta=0.4, seed=0)
    betas = [per.beta for _ in AnnealBeta(per, total_steps=10)]
    np.testing.assert_allclose(betas, [0.4 + 0.6 * min(1, k / 10) for k in range(1, 16)], rtol=1e-12)
    assert betas[9] == betas[-1] == 1.0
    np.testing.assert_allclose(np.diff(betas[:10]), 0.06)  # linear: equal steps
    per2 = PrioritizedExperienceReplay(IterableWrapper(random_steps(4)), bs=1, max_sz=20, beta=0.5, seed=0)
    assert [per2.beta for _ in AnnealBeta(per2, total_steps=4, final=0.9)] == pytest.approx([0.6, 0.7, 0.8, 0.9])
    with pytest.raises(ValueError, match='total_steps'): AnnealBeta(per, total_steps=0)


def test_learner_beta_reaches_one_at_total_steps():
    learner = Learner('CartPole-v1', seed=0, total_steps=200, bs=64)
    learner.fit(200)
    assert learner.replay.beta == pytest.approx(1.0)


# ---------------------------------------------------------------------------------------------
# Uniform replay
# ---------------------------------------------------------------------------------------------

def test_uniform_replay_learner():
    learner = Learner('CartPole-v1', replay='uniform', seed=0, total_steps=500, bs=16, n_step=1)  # a transition per env step
    rows = learner.fit(100)
    assert len(rows) == 100 - 16 + 1
    assert all(r['beta'] == 1.0 for r in rows)
    assert all(np.isfinite(r['loss']) for r in rows)
    assert [r['frame'] for r in rows] == list(range(16, 101))
    assert type(learner.replay) is ExperienceReplay and learner.dqn_update.anneal is None
    with pytest.raises(LookupError): find_upstream(learner.pipe, PrioritizedExperienceReplay)
    from torch.utils.data.graph import traverse_dps
    def stages(graph):
        for stage, children in graph.values():
            yield type(stage)
            yield from stages(children)
    assert PriorityFeedback not in set(stages(traverse_dps(learner.pipe)))
    assert AnnealBeta not in set(stages(traverse_dps(learner.pipe)))
    batch = learner.replay.sample()
    assert torch.equal(batch.weights, torch.ones(16))
    # the per learner, for contrast, reports its annealed beta: 500 - 16 + 1 updates are planned
    rows = Learner('CartPole-v1', replay='per', seed=0, total_steps=500, bs=16, n_step=1).fit(30)
    assert rows[0]['beta'] == pytest.approx(0.4 + 0.6 / 485) and rows[-1]['beta'] == pytest.approx(0.4 + 0.6 * 15 / 485)


# ---------------------------------------------------------------------------------------------
# A short training run beats the random policy
# ---------------------------------------------------------------------------------------------

TRAIN_STEPS = 5000  # ~20 s on one core; the last 20 episodes averaged 128, 106 and 134 for seeds 0, 1, 2


def test_short_training_run_beats_random():
    random_steps_ = list(GymTransformBlock(None, n=TRAIN_STEPS, seed=0)(['CartPole-v1']).unbatch())
    random_returns = [s.total_reward.item() for s in random_steps_ if s.terminated or s.truncated]
    random_mean = float(np.mean(random_returns))
    assert 15 < random_mean < 35  # CartPole's random policy lasts about 22 steps
    learner = Learner('CartPole-v1', seed=0, total_steps=TRAIN_STEPS)
    rows = learner.fit(TRAIN_STEPS)
    assert learner.episodes.env_steps == TRAIN_STEPS and rows[-1]['frame'] == TRAIN_STEPS
    assert len(learner.episodes.returns) >= 20
    recent = learner.episodes.recent(20)
    assert recent > 2 * random_mean, (recent, random_mean)


# ---------------------------------------------------------------------------------------------
# Run directories: resume and evaluate
# ---------------------------------------------------------------------------------------------

@pytest.fixture(scope='module')
def base_run(tmp_path_factory):
    "A 300-step run of 1-step transitions and batches of 64 (so counts are easy to state), trained once; tests that change a run work on a copy."
    run = tmp_path_factory.mktemp('base') / 'run'
    torch.set_num_threads(1)
    summary = train(total_steps=300, out=str(run), progress=False, **ONE_STEP)
    assert '300 steps' in summary
    return run


def copy_run(base_run, tmp_path):
    dst = tmp_path / 'run'
    shutil.copytree(base_run, dst)
    return dst


def test_resume_continues_counters(base_run, tmp_path):
    run = copy_run(base_run, tmp_path)
    first = load_checkpoint(run)
    assert first['env_steps'] == 300 and SavedArrays(run / 'replay').read()['n_added'] == 300   # the buffer: in replay/
    n_first = len(update_frames(run))
    assert first['updates'] == n_first == 300 - 64 + 1
    train(total_steps=500, resume=str(run), progress=False)
    state = load_checkpoint(run)
    frames = update_frames(run)
    assert state['env_steps'] == 500
    assert state['updates'] == first['updates'] + 200 == len(frames)
    assert SavedArrays(run / 'replay').read()['n_added'] == 500
    # the agent's counter continues too (it also counts the autoreset steps the stream drops: one per ended episode)
    assert first['agent']['steps'] >= 300 and state['agent']['steps'] >= first['agent']['steps'] + 200
    assert state['config'] == dict(first['config'], total_steps=500)  # a resume may plan more steps (beta re-planned)
    # one row per update, no frame twice, contiguous from the first update to the last frame
    assert len(set(frames.tolist())) == len(frames)
    np.testing.assert_array_equal(frames, np.arange(64, 501))
    assert sorted(p.name for p in run.iterdir() if p.name != '.lock') == ['best.pt', 'checkpoint.pt', 'metrics.csv', 'plot.png', 'replay', 'run.json', 'tb']
    # evaluate --latest: a sentence with the mean of greedy episodes of the checkpoint's network
    out = evaluate(str(run), episodes=2, latest=True)
    assert isinstance(out, str) and 'mean return over 2 greedy episodes' in out
    learner = Learner(**state['config'], replay_dir=run / 'replay')
    learner.load_state_dict(state)
    mean = np.mean(greedy_returns(learner.agent, 'CartPole-v1', 2, 10_000))
    assert re.search(r'episodes: ([0-9.]+)', out).group(1) == f"{mean:.1f}"


def snapshot(run):
    return {str(p.relative_to(run)): p.read_bytes() for p in sorted(Path(run).rglob('*')) if p.is_file()}


def corrupt(run):
    (Path(run) / 'checkpoint.pt').write_bytes(np.random.default_rng(0).bytes(4096))


def edit_checkpoint(run, edit):
    path = Path(run) / 'checkpoint.pt'
    state = torch.load(path, weights_only=True)
    edit(state)
    torch.save(state, path)


def set_hidden(run): edit_checkpoint(run, lambda s: s['config'].update(hidden=64))


# (name, prepare the copied run dir or None, the failing call given the run dir and a fresh dir, words the message names)
BAD = [
    ('unknown env', None, lambda run, new: train(env_id='NoSuchEnv-v0', total_steps=100, out=str(new), progress=False), ['NoSuchEnv-v0']),
    ('continuous actions', None, lambda run, new: train(env_id='Pendulum-v1', total_steps=100, out=str(new), progress=False),
     ['Pendulum-v1', 'discrete']),
    ('steps 0', None, lambda run, new: train(total_steps=0, out=str(new), progress=False), ['steps', '0']),
    ('steps -5', None, lambda run, new: train(total_steps=-5, out=str(new), progress=False), ['steps', '-5']),
    ('resume steps 0', None, lambda run, new: train(total_steps=0, resume=str(run), progress=False), ['steps', '0']),
    ('resume steps -5', None, lambda run, new: train(total_steps=-5, resume=str(run), progress=False), ['steps', '-5']),
    ('resume no further', None, lambda run, new: train(total_steps=300, resume=str(run), progress=False), ['300']),
    ('out holds a run', None, lambda run, new: train(total_steps=400, out=str(run), progress=False), ['already holds a run']),
    ('out holds a run, bad env', None, lambda run, new: train(env_id='Pendulum-v1', total_steps=400, out=str(run), progress=False),
     ['already holds a run']),
    ('resume without checkpoint', None, lambda run, new: train(total_steps=400, resume=str(new), progress=False),
     ['is not a fastrl_per run', 'checkpoint.pt']),
    ('corrupt checkpoint, resume', corrupt, lambda run, new: train(total_steps=400, resume=str(run), progress=False),
     ['cannot read checkpoint', 'checkpoint.pt']),
    ('corrupt checkpoint, evaluate', corrupt, lambda run, new: evaluate(str(run), episodes=1),
     ['cannot read checkpoint', 'checkpoint.pt']),
    ('edited config, resume', set_hidden, lambda run, new: train(total_steps=400, resume=str(run), progress=False),
     ['do not fit', 'size mismatch']),
    ('edited config, evaluate', set_hidden, lambda run, new: evaluate(str(run), episodes=1), ['do not fit']),
    ('wrong version', lambda run: edit_checkpoint(run, lambda s: s.__setitem__('version', 7)),
     lambda run, new: train(total_steps=400, resume=str(run), progress=False), ['version 7']),
    ('evaluate episodes 0', None, lambda run, new: evaluate(str(run), episodes=0), ['episodes', '0']),
]


@pytest.mark.parametrize('name,prepare,call,words', BAD, ids=[b[0] for b in BAD])
def test_bad_input(base_run, tmp_path, name, prepare, call, words):
    run = copy_run(base_run, tmp_path)
    if prepare is not None: prepare(run)
    before = snapshot(run)
    new = tmp_path / 'new'
    with pytest.raises(ValueError) as e: call(run, new)
    for w in words: assert w in str(e.value), (w, str(e.value))
    assert snapshot(run) == before  # nothing already written is lost or changed
    assert not new.exists()  # nothing half-made is left behind


def test_config_mismatch_names_the_value(base_run):
    state = load_checkpoint(base_run)
    seed = state['config']['seed']
    learner = Learner('CartPole-v1', seed=seed, total_steps=300, hidden=64)
    with pytest.raises(ValueError, match=r"config differs.*'hidden': \(128, 64\)"): learner.load_state_dict(state)
    other = Learner('CartPole-v1', seed=seed + 1, total_steps=300)
    with pytest.raises(ValueError, match=rf"'seed': \({seed}, {seed + 1}\)"): other.load_state_dict(state)
    with pytest.raises(ValueError, match='version'): other.load_state_dict({'version': 0})
    with pytest.raises(ValueError, match='version'): other.load_state_dict([1, 2])


def test_checkpoint_with_unknown_config_key(base_run, tmp_path):
    run = copy_run(base_run, tmp_path)
    edit_checkpoint(run, lambda s: s['config'].update(foo=1))
    before = snapshot(run)
    with pytest.raises(ValueError, match='foo'): train(total_steps=400, resume=str(run), progress=False)
    with pytest.raises(ValueError, match='foo'): evaluate(str(run), episodes=1)
    assert snapshot(run) == before


def test_checkpoint_missing_a_part(base_run, tmp_path):
    run = copy_run(base_run, tmp_path)
    edit_checkpoint(run, lambda s: s.pop('replay'))
    with pytest.raises(ValueError, match='replay'): train(total_steps=400, resume=str(run), progress=False)


def test_failed_run_then_resume_has_no_duplicate_frames(base_run, tmp_path, monkeypatch):
    run = copy_run(base_run, tmp_path)
    def disk_full(*args): raise OSError('disk full')
    with monkeypatch.context() as m:
        m.setattr(rundir_mod, "save_checkpoint", disk_full)
        with pytest.raises(OSError): train(total_steps=400, resume=str(run), progress=False)
    train(total_steps=450, resume=str(run), progress=False)
    frames = update_frames(run)
    np.testing.assert_array_equal(frames, np.arange(64, 451))


# ---------------------------------------------------------------------------------------------
# The stream: bounded by a budget, continued on resume
# ---------------------------------------------------------------------------------------------

def test_iterate_bounds_the_stream_without_setting_stage_attributes():
    learner = Learner('CartPole-v1', seed=3, total_steps=500, bs=16)
    for steps in (10, 30, 1):
        before = learner.episodes.env_steps
        learner.fit(steps)
        assert learner.episodes.env_steps == before + steps
    assert learner.stepper.n is None  # the stepper itself stays endless


def test_resume_continues_envs_even_when_they_already_run():
    a = Learner('CartPole-v1', seed=3, total_steps=500, bs=16)
    a.fit(40)
    b = Learner('CartPole-v1', seed=3, total_steps=500, bs=16)
    b.fit(25)  # b's envs exist and are mid-stream
    b.load_state_dict(a.state_dict())
    run, saved = b.stepper.envs.get()[0], a.stepper.envs.get()[0]
    np.testing.assert_array_equal(run.obs, saved.obs)   # a's episode in progress, not b's nor a fresh one
    assert (run.step_n == saved.step_n).all() and (run.episode_n == saved.episode_n).all()
    assert b.fit(5) == a.fit(5)
    assert b.episodes.env_steps == 45


# ---- the learner's options: n-step returns, dueling head, several envs, update cadence, device

def test_n_step_transitions_reach_the_buffer_and_the_targets():
    learner = Learner('CartPole-v1', seed=0, total_steps=400, n_step=3, gamma=0.9)
    learner.fit(400)
    stored = learner.replay.memory[:]
    assert set(stored.n_steps.tolist()) <= {1, 2, 3} and (stored.n_steps == 3).sum() > len(stored) // 2
    live = stored[~stored.terminated]
    # a non-terminal 3-step transition bootstraps with 0.9 ** 3
    from fastrl_per.learners.dqn import td_target
    batch = live[:8]
    zero = torch.nn.Linear(4, 2)
    torch.nn.init.zeros_(zero.weight); torch.nn.init.ones_(zero.bias)   # Q(s', ·) = 1 everywhere
    torch.testing.assert_close(td_target(batch, zero, 0.9), batch.reward + 0.9 ** batch.n_steps.float())


def test_dueling_head_is_used_and_trains():
    from fastrl_per.learners.dqn import DuelingHead
    learner = Learner('CartPole-v1', seed=0, total_steps=300, dueling=True)
    assert isinstance(learner.model[-1], DuelingHead) and isinstance(learner.dqn_update.target_model[-1], DuelingHead)
    rows = learner.fit(300)
    assert all(np.isfinite(r['loss']) for r in rows)


def test_several_envs_step_together_and_count_each_transition():
    learner = Learner('CartPole-v1', seed=0, total_steps=600, nenvs=3)
    learner.fit(300)
    assert 270 <= learner.episodes.env_steps <= 300        # 100 vector steps of 3 copies, less the autoreset rows
    assert set(learner.replay.memory[:].env_id.tolist()) == {0, 1, 2}


@pytest.mark.parametrize('kw, updates', [(dict(), 300 - 64 + 1), (dict(warmup=200), 101),
                                         (dict(train_every=4), 60), (dict(train_every=4, gradient_steps=3, warmup=100), 3 * 51)])
def test_update_cadence(kw, updates):
    learner = Learner('CartPole-v1', seed=0, total_steps=300, **ONE_STEP, **kw)
    assert len(learner.fit(300)) == updates


def test_device_is_checked_and_cpu_works():
    learner = Learner('CartPole-v1', seed=0, total_steps=200, device='cpu')
    assert learner.dqn_update.device == torch.device('cpu') and len(learner.fit(200)) > 0
    with pytest.raises(ValueError, match="'gpu0'"): Learner('CartPole-v1', device='gpu0')


def test_beta_reaches_one_with_n_step_returns():
    "The plan of updates counts the n-step windows still open at the end: beta reaches 1 at the last step."
    rows = Learner('CartPole-v1', seed=0, total_steps=300, n_step=3).fit(300)
    assert rows[-1]['beta'] == pytest.approx(1.0) and rows[-2]['beta'] < 1.0


def test_layer_norm_is_the_default_and_can_be_turned_off(tmp_path):
    "Default: LayerNorm before each hidden ReLU, in the online and the target network; layer_norm=False is the seed notebook's MLP, through the command too."
    learner = Learner('CartPole-v1', seed=0, total_steps=300)
    for net in (learner.model, learner.dqn_update.target_model):
        assert [type(m) for m in net] == [nn.Linear, nn.LayerNorm, nn.ReLU, nn.Linear, nn.LayerNorm, nn.ReLU, nn.Linear]
    plain = Learner('CartPole-v1', seed=0, total_steps=300, layer_norm=False)
    assert [type(m) for m in plain.model] == [nn.Linear, nn.ReLU, nn.Linear, nn.ReLU, nn.Linear]
    rows = learner.fit(300)
    assert rows and all(np.isfinite(r['loss']) for r in rows)
    assert not torch.equal(learner.model[1].weight, torch.ones(128))   # the LayerNorm's scale trains with the rest
    train(out=str(tmp_path / 'run'), total_steps=200, layer_norm=False, progress=False)
    state = load_checkpoint(tmp_path / 'run')
    assert state['config']['layer_norm'] is False and not any('LayerNorm' in type(m).__name__ for m in Learner(**state['config']).model)


def test_a_version_2_checkpoint_resumes_with_the_network_it_was_written_by(base_run, tmp_path):
    "A run written before layer_norm existed (checkpoint version 2, no layer_norm in its config) resumes and evaluates through the command's functions."
    run = copy_run(base_run, tmp_path)
    state = torch.load(run / 'checkpoint.pt', weights_only=True)
    assert state['config']['layer_norm'] is True   # base_run: today's default
    # what version 2 wrote for a network without LayerNorm: rebuild the base run's learner without it, drop the key
    learner = Learner(**dict(state['config'], layer_norm=False, total_steps=300))
    learner.fit(300)
    old = learner.state_dict()
    config = {('envs' if k == 'nenvs' else k): v for k, v in old['config'].items() if k != 'layer_norm'}   # its names then
    torch.save(dict(old, version=2, config=config), run / 'checkpoint.pt')
    (run / 'best.pt').unlink()
    train(total_steps=400, resume=str(run), progress=False)
    resumed = load_checkpoint(run)
    assert (resumed['version'], resumed['config']['layer_norm'], resumed['env_steps']) == (6, False, 400)
    assert 'mean return over 2 greedy episodes' in evaluate(str(run), episodes=2, latest=True)


@pytest.mark.parametrize('cls', ['Learner', 'RecurrentLearner', 'ApexRun'])
def test_arguments_after_env_id_are_keywords_and_unknown_ones_refused(cls):
    "A position past env_id would land on another argument than the caller meant (the shared ones are delegated)."
    from fastrl_per.learners.recurrent_learner import RecurrentLearner
    from fastrl_per.learners.apex import ApexRun
    learner = dict(Learner=Learner, RecurrentLearner=RecurrentLearner, ApexRun=ApexRun)[cls]
    with pytest.raises(TypeError, match='positional'): learner('CartPole-v1', 'per', 5)
    with pytest.raises(TypeError, match="unexpected keyword argument 'sede'"): learner('CartPole-v1', sede=1)
