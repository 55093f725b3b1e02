"""`RecurrentLearner` (R2D2-style): the carried and stored state, burn-in, masks at episode ends, sequence priorities,
exact resume through a saved checkpoint, and bad arguments."""
import io
import numpy as np
import pytest
import torch
from torch.utils.data.datapipes.iter import IterableWrapper

from fastrl_per.core import SimpleStep
from fastrl_per.stages.envs import GymStepper
from fastrl_per.stages.pipes import UnbatchSteps
from fastrl_per.learners.recurrent import RecurrentQNetwork
from fastrl_per.learners.recurrent_learner import RecurrentEpsilonGreedy, RecurrentLearner, WithRecurrentState, sequence_step
from fastrl_per.replay.sequence import PendingEpisodes, PrioritizedBatch, PrioritizedSequenceReplay

SMALL = dict(seed=0, total_steps=2_000, bs=8, length=4, burn_in=2, warmup=100)


def acted_buffer(seed=0, steps=120, epsilon=0.5):
    "Episodes of CartPoleNoVelocity-v1 acted by a carried-state agent on a fresh network, with the states it read."
    torch.manual_seed(seed)
    net = RecurrentQNetwork(2, 2)
    agent = RecurrentEpsilonGreedy(net, 2, start=epsilon, end=epsilon, seed=seed)
    stepper = GymStepper(IterableWrapper(['CartPoleNoVelocity-v1']), agent, seed=seed, n=steps)
    buf = PrioritizedSequenceReplay(1_000, seed=seed)
    for e in PendingEpisodes().add(SimpleStep.from_steps(list(WithRecurrentState(UnbatchSteps(stepper), agent)))): buf.add(e)
    return net, buf


@pytest.mark.parametrize('burn_in', [0, 1, 5])
def test_a_sequence_replayed_from_its_stored_state_scores_as_the_episode_run_from_its_start(one_thread, burn_in):
    net, buf = acted_buffer()
    assert buf.n_episodes >= 3
    with torch.no_grad():
        whole = {id: net.unroll(buf.episode(id).steps.state[None])[0][0] for id in buf.ids}
    batch = buf.sample_sequences(200, 6, burn_in)
    ts = sequence_step(batch, net, net, burn_in=burn_in, n_step=3, gamma=0.99)
    for i in range(200):
        id, first = int(batch.indices[i]), int(batch.chunks.step_n[i, burn_in]) - 1   # step_n counts from 1
        mask = batch.mask[i, burn_in:]
        episode = buf.episode(id).steps
        steps = np.arange(first, first + int(mask.sum()))
        ref = whole[id][steps].gather(-1, episode.action[steps, None]).squeeze(-1)
        assert torch.allclose(ts.q[i][mask], ref, atol=1e-4)


def test_the_zero_state_differs_from_the_stored_one_without_burn_in(one_thread):
    net, buf = acted_buffer()
    batch = buf.sample_sequences(64, 4, 0)
    later = batch.chunks.step_n[:, 0] > 3
    stored = sequence_step(batch, net, net, 0, 3, 0.99).q
    zero = sequence_step(batch, net, net, 0, 3, 0.99, stored=False).q
    assert later.any() and not torch.allclose(stored[later], zero[later], atol=1e-3)


def test_padded_steps_past_an_episodes_end_change_nothing(one_thread):
    "Whatever the rows past the end hold, the loss, the valid targets and the priorities stay the same."
    net, buf = acted_buffer()
    batch = buf.sample_sequences(64, 8, 2)
    pad = ~batch.mask
    assert pad[:, 2:].any()
    fields = batch.chunks.as_dict()
    noisy = dict(fields, reward=torch.where(pad, 99., fields['reward']), state=torch.where(pad[..., None], 7., fields['state']),
                 action=torch.where(pad, 1 - fields['action'], fields['action']))
    other = PrioritizedBatch(SimpleStep.from_fields(noisy), batch.indices, batch.weights, batch.mask)
    a, b = sequence_step(batch, net, net, 2, 3, 0.99), sequence_step(other, net, net, 2, 3, 0.99)
    train = batch.mask[:, 2:]
    assert torch.allclose(a.loss, b.loss) and torch.allclose(a.td_errors, b.td_errors)
    assert torch.allclose(a.target[train], b.target[train])


@pytest.mark.parametrize('eta', [0., 0.9, 1.])
def test_sequence_priority_mixes_max_and_mean_of_the_trained_steps(one_thread, eta):
    net, buf = acted_buffer()
    batch = buf.sample_sequences(32, 6, 2)
    ts = sequence_step(batch, net, net, 2, 3, 0.99, eta=eta)
    train = batch.mask[:, 2:]
    for i in range(32):
        delta = (ts.target[i] - ts.q[i].detach())[train[i]].abs()
        assert ts.td_errors[i] == pytest.approx(float(eta * delta.max() + (1 - eta) * delta.mean()), rel=1e-5, abs=1e-6)


def test_priorities_reach_the_episodes_ids(one_thread):
    learner = RecurrentLearner(**SMALL)
    learner.fit(400)
    raw = learner.replay.priorities()
    assert len(np.unique(raw)) > 3 and raw.min() > 0   # fed back, not all at the initial maximum


def test_resume_from_a_saved_checkpoint_continues_step_for_step(one_thread):
    learner = RecurrentLearner(**SMALL)
    learner.fit(437)                                   # mid-episode: open sequences and a carried state to save
    assert learner.sequences.pending.steps and learner.agent.state is not None
    buffer = io.BytesIO()
    torch.save(learner.state_dict(), buffer)
    buffer.seek(0)
    resumed = RecurrentLearner(**SMALL)
    resumed.load_state_dict(torch.load(buffer, weights_only=True))   # plain data
    a, b = learner.fit(500), resumed.fit(500)
    assert len(a) == len(b) > 50
    assert [r['loss'] for r in a] == [r['loss'] for r in b]
    assert learner.episodes.returns == resumed.episodes.returns
    assert torch.equal(learner.agent.state, resumed.agent.state)


def test_a_checkpoint_that_does_not_fit_changes_nothing(one_thread):
    learner = RecurrentLearner(**SMALL)
    learner.fit(300)
    state, other = learner.state_dict(), RecurrentLearner(**SMALL)
    before = other.state_dict()
    bad = [dict(state, sequences=dict(state['sequences'], carried=torch.zeros(1, 3, 128))),
           dict(state, sequences={k: v for k, v in state['sequences'].items() if k != 'items'}),
           dict(state, sequences=dict(state['sequences'], pending={'0': {'state': torch.zeros(3, 2)}}))]
    for s in bad:
        with pytest.raises(ValueError): other.load_state_dict(s)
    after = other.state_dict()
    assert after['env_steps'] == before['env_steps'] and after['sequences']['items'] == before['sequences']['items']


@pytest.mark.parametrize('kwargs,contains', [(dict(recurrent_state='burned'), "'stored' or 'zero'"), (dict(eta=1.5), 'eta'),
                                             (dict(burn_in=-1), 'burn_in'), (dict(length=0), 'length'), (dict(n_step=0), 'n_step')])
def test_bad_arguments_are_refused_by_name(kwargs, contains):
    with pytest.raises(ValueError, match=contains): RecurrentLearner(**kwargs)


def test_the_config_declares_how_replay_starts_its_state():
    assert {k: RecurrentLearner(**SMALL).config.plain()[k] for k in ('recurrent_state', 'burn_in')} == dict(recurrent_state='stored', burn_in=2)
    zero = RecurrentLearner(**dict(SMALL, recurrent_state='zero'))
    zero.fit(300)
    assert 'recurrent_state' not in zero.replay.episode(0).steps.fields   # nothing stored when replay starts from zeros
