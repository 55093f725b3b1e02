"""`FrameStorage`: every sampleable slot rebuilds the stacks the envs produced (synthetic streams with
random episode ends over 1-3 interleaved sub-envs and ring wrap-around, and real ALE frames), the
sampleable-slot bookkeeping, state round trips and bad input."""
import importlib.util

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from fastrl_per.core import SimpleStep, STEP_FIELDS
from fastrl_per.replay.frames import FrameStorage
from fastrl_per.replay.sumtree import SumTree
from fastrl_per.stages.nstep import NStepTransitions


def env_stream(seed, nenvs, stack, n, p_end, alphabet, frame_shape=(1, 2)):
    """`n` transitions of `nenvs` sub-envs stepped in a random interleaving, each observation a
    `FrameStackObservation`-style stack (a new episode padded with its first frame)."""
    rng = np.random.default_rng(seed)
    queues, step_n, episode_n, total, out = [None] * nenvs, [0] * nenvs, [0] * nenvs, [0.] * nenvs, []
    new_frame = lambda: rng.integers(0, alphabet, frame_shape, dtype=np.uint8)
    for _ in range(n):
        e = int(rng.integers(nenvs))
        if queues[e] is None: queues[e] = [new_frame()] * stack
        state = np.stack(queues[e])
        queues[e] = queues[e][1:] + [new_frame()]
        terminated, truncated = bool(rng.random() < p_end), bool(rng.random() < p_end / 2)
        reward = np.float32(rng.normal())
        step_n[e] += 1; total[e] += reward
        out.append(dict(state=state, next_state=np.stack(queues[e]), action=np.int64(rng.integers(6)),
                        terminated=terminated, truncated=truncated, reward=reward, total_reward=np.float32(total[e]),
                        env_id=np.int64(e), step_n=np.int64(step_n[e]), episode_n=np.int64(episode_n[e]), n_steps=np.int32(1)))
        if terminated or truncated:
            queues[e], step_n[e], total[e] = None, 0, 0.
            episode_n[e] += 1
    return out


def columns(steps):
    return {n: np.stack([s[n] for s in steps]) for n in STEP_FIELDS}


def write(storage, steps, single):
    "Write `steps` as one batch, or (for one step, when `single`) through `write_step`."
    if len(steps) == 1 and single: return np.array([storage.write_step(SimpleStep(**steps[0]))])
    return storage.write(columns(steps))


def assert_rebuilds(storage, written):
    "Every valid slot gathers the transition last written there; the bookkeeping agrees with `valid`."
    n, max_sz = len(written), storage.max_sz
    assert (storage.sz, storage.n_added) == (min(n, max_sz), n)
    slots = np.arange(storage.sz)
    ok = storage.valid(slots)
    assert ok[(n - 1) % max_sz]  # the newest transition can always be sampled
    np.testing.assert_array_equal(storage.invalid_slots(), np.flatnonzero(~ok))
    assert storage.n_valid == ok.sum()
    np.testing.assert_array_equal(storage.valid_slots(np.arange(storage.n_valid)), np.flatnonzero(ok))
    good = np.flatnonzero(ok)
    batch = storage.gather(good)
    expected = columns([written[s + max_sz * ((n - 1 - s) // max_sz)] for s in good])
    for name in STEP_FIELDS: np.testing.assert_array_equal(getattr(batch, name).numpy(), expected[name], err_msg=name)
    if not ok.all():
        with pytest.raises(ValueError, match='cannot be gathered'): storage.gather(np.flatnonzero(~ok)[:1])


streams = dict(seed=st.integers(0, 2**32 - 1), nenvs=st.integers(1, 3), stack=st.integers(1, 4), n=st.integers(1, 70),
               p_end=st.sampled_from([0., .05, .2, .5]), alphabet=st.sampled_from([2, 3, 256]))


@settings(max_examples=150, deadline=None, database=None)
@given(max_sz=st.integers(1, 30), extra=st.none() | st.integers(0, 30), chunk_seed=st.integers(0, 2**32 - 1), **streams)
def test_every_sampleable_slot_rebuilds_the_stacks_the_envs_produced(max_sz, extra, chunk_seed, seed, nenvs, stack, n, p_end, alphabet):
    steps = env_stream(seed, nenvs, stack, n, p_end, alphabet)
    storage = FrameStorage(max_sz, frame_slots=None if extra is None else stack + 1 + extra)
    rng, i = np.random.default_rng(chunk_seed), 0
    while i < n:
        size = int(rng.integers(1, 6))
        slots = write(storage, steps[i:i + size], single=rng.random() < .5)
        i += len(steps[i:i + size])
        np.testing.assert_array_equal(slots, np.arange(i - min(size, max_sz, len(slots)), i) % max_sz)
        assert_rebuilds(storage, steps[:i])


def nstep_stream(steps, n_step):
    "The n-step transitions `NStepTransitions` makes of one-step `steps` (dicts of arrays), as dicts of arrays."
    out = NStepTransitions([SimpleStep(**s) for s in steps], n_step, gamma=0.9)
    return [{n: getattr(t, n).numpy() for n in STEP_FIELDS} for t in out]


@settings(max_examples=150, deadline=None, database=None)
@given(max_sz=st.integers(1, 30), extra=st.integers(0, 30), n_step=st.integers(2, 6), chunk_seed=st.integers(0, 2**32 - 1), **streams)
def test_n_step_transitions_rebuild_the_stacks_the_envs_produced(max_sz, extra, n_step, chunk_seed, seed, nenvs, stack, n, p_end, alphabet):
    "As above for n-step transitions: a state lies n_steps frames before its next state, several rows share an episode's last next state."
    steps = nstep_stream(env_stream(seed, nenvs, stack, n, p_end, alphabet), n_step)
    storage = FrameStorage(max_sz, frame_slots=2 * stack + extra)  # a row stored afresh may need two stacks
    rng, i = np.random.default_rng(chunk_seed), 0
    while i < len(steps):
        size = int(rng.integers(1, 6))
        write(storage, steps[i:i + size], single=rng.random() < .5)
        i += len(steps[i:i + size])
        assert_rebuilds(storage, steps[:i])


def test_an_n_step_transition_costs_one_frame_plus_one_per_episode_start():
    steps = nstep_stream(env_stream(seed=0, nenvs=3, stack=4, n=600, p_end=.02, alphabet=256, frame_shape=(8, 8)), n_step=3)
    storage = FrameStorage(max_sz=1000)
    for i in range(0, len(steps), 7): storage.write(columns(steps[i:i + 7]))
    starts = sum(s['step_n'] == 1 for s in steps)
    assert len(steps) == 600 and storage.n_frames == 600 + starts  # as for one-step transitions: an episode's end rows share its last frame


@settings(max_examples=60, deadline=None, database=None)
@given(**streams)
def test_a_frame_ring_holding_every_frame_keeps_every_transition_sampleable(seed, nenvs, stack, n, p_end, alphabet):
    storage = FrameStorage(max_sz=n, frame_slots=(stack + 1) * n)
    storage.write(columns(env_stream(seed, nenvs, stack, n, p_end, alphabet)))
    assert storage.valid(np.arange(n)).all() and len(storage.invalid_slots()) == 0


def test_a_transition_costs_one_frame_plus_one_per_episode_start():
    steps = env_stream(seed=0, nenvs=3, stack=4, n=500, p_end=.02, alphabet=256, frame_shape=(8, 8))
    storage = FrameStorage(max_sz=1000)
    for i in range(0, 500, 7): storage.write(columns(steps[i:i + 7]))
    starts = sum(s['step_n'] == 1 for s in steps)
    assert storage.n_frames == 500 + starts


@settings(max_examples=40, deadline=None, database=None)
@given(max_sz=st.integers(2, 30), **streams)
def test_prioritized_draws_with_invalid_leaves_at_zero_only_reach_sampleable_slots(max_sz, seed, nenvs, stack, n, p_end, alphabet):
    "The contract for a prioritized buffer: after each write, new slots get a priority and invalid slots 0."
    storage, tree = FrameStorage(max_sz, frame_slots=stack + 1 + max_sz // 2), SumTree(max_sz)  # a tight frame ring: many invalid slots
    for i, step in enumerate(env_stream(seed, nenvs, stack, n, p_end, alphabet)):
        tree.update(storage.write(columns([step])), np.ones(1))
        bad = storage.invalid_slots()
        tree.update(bad, np.zeros(len(bad)))
        u = (np.arange(64) + .5) / 64 * tree.total
        drawn = tree.find(u)
        assert storage.valid(drawn).all()
        storage.gather(drawn)


@settings(max_examples=40, deadline=None, database=None)
@given(max_sz=st.integers(1, 20), split=st.floats(0, 1), **streams)
def test_state_round_trips_through_a_file_and_both_copies_continue_alike(tmp_path_factory, max_sz, split, seed, nenvs, stack, n, p_end, alphabet):
    steps = env_stream(seed, nenvs, stack, n, p_end, alphabet)
    cut = int(split * n)
    storage = FrameStorage(max_sz)
    if cut: storage.write(columns(steps[:cut]))
    path = tmp_path_factory.mktemp('frames') / 'storage.pt'
    torch.save(dict(n_added=storage.n_added, columns=storage.state()), path)
    saved = torch.load(path, weights_only=True)
    restored = FrameStorage(max_sz)
    restored.check_saved(saved['n_added'], saved['columns'])
    restored.load(saved['n_added'], saved['columns'])
    assert restored.nbytes() == storage.nbytes()
    for s in (storage, restored):
        if cut < n: s.write(columns(steps[cut:]))
        assert_rebuilds(s, steps)


def saved_state():
    storage = FrameStorage(8)  # 8 + 0 + 4 frame slots
    storage.write(columns(env_stream(0, 2, 4, 12, .2, 256)))
    return storage.n_added, storage.state()


@pytest.mark.parametrize('change, message', [
    (lambda s: s.pop('prev'), 'a FrameStorage state holds'),
    (lambda s: s['rows'].pop('reward'), 'are not the fields'),
    (lambda s: s.update(frames=s['frames'][:-1]), "'frames' has 11 rows, this storage keeps 12"),
    (lambda s: s.update(newest=s['newest'][:3]), "'newest' has 3 rows"),
    (lambda s: s.update(frames=s['frames'].float()), 'not uint8'),
    (lambda s: s.update(stack=12), 'more than frame_slots 12'),
    (lambda s: s.update(ends=s['ends'][:, :2]), 'not \\(envs, 3\\)'),
])
def test_check_saved_names_what_does_not_fit(change, message):
    n_added, state = saved_state()
    change(state)
    with pytest.raises(ValueError, match=message): FrameStorage(8, frame_slots=12).check_saved(n_added, state)


def test_check_saved_refuses_a_state_for_another_size():
    with pytest.raises(ValueError, match='has 8 rows, this storage keeps 9'): FrameStorage(9).check_saved(*saved_state())


def bad(steps, **changes):
    cols = columns(steps)
    for name, f in changes.items(): cols[name] = f(cols[name])
    return cols


good_steps = env_stream(1, 2, 4, 6, 0., 256, frame_shape=(6, 6))

@pytest.mark.parametrize('cols, message', [
    (bad(good_steps, state=lambda a: a.astype(np.float32), next_state=lambda a: a.astype(np.float32)), 'uint8'),
    (bad(good_steps, state=lambda a: a.astype(np.int16)), 'state must hold uint8 frames, got dtype int16'),
    (bad(good_steps, state=lambda a: a[:, :, :5], next_state=lambda a: a[:, :, :5]), 'holds stacks of \\(4, 6, 6\\)'),
    (bad(good_steps, state=lambda a: a[:, :3], next_state=lambda a: a[:, :3]), 'holds stacks of \\(4, 6, 6\\)'),
    (bad(good_steps, state=lambda a: a[:, 0], next_state=lambda a: a[:, 0]), 'state has shape \\(6, 6\\) per step'),
    (bad(good_steps, next_state=lambda a: a[::-1].copy()), 'next_state must be state shifted by its n_steps \\(1\\) frames'),
    (bad(good_steps, next_state=lambda a: a[:, :, :5]), 'next_state has shape \\(4, 5, 6\\)'),
    (bad(good_steps, reward=lambda a: a[:3]), 'different batch sizes'),
    (bad(good_steps, reward=lambda a: a.astype(np.float64)), "field 'reward'"),
])
def test_bad_input_is_refused_before_anything_is_written(cols, message):
    storage = FrameStorage(10)
    storage.write(columns(env_stream(2, 2, 4, 6, 0., 256, frame_shape=(6, 6))))
    before = storage.state()
    with pytest.raises(ValueError, match=message): storage.write(cols)
    after = storage.state()
    assert storage.n_added == 6 and storage.n_frames == before['n_frames']
    for n in ('frames', 'prev', 'newest', 'oldest', 'ends'): assert torch.equal(before[n], after[n]), n


@pytest.mark.parametrize('cols, message', [
    (bad(good_steps, state=lambda a: a[:, :, 0, 0], next_state=lambda a: a[:, :, 0, 0]), 'must be a stack of frames per step'),
    (bad(good_steps, next_state=lambda a: a[:, :, :5]), 'state \\(4, 6, 6\\) and next_state \\(4, 5, 6\\) differ in shape'),
    (columns(good_steps), 'frame_slots \\(4\\) must exceed the stack of 4 frames'),
])
def test_bad_first_write_leaves_the_storage_empty(cols, message):
    storage = FrameStorage(10, frame_slots=4)
    with pytest.raises(ValueError, match=message): storage.write(cols)
    assert storage.state() is None and storage.n_frames == 0 and storage.n_valid == 0


@pytest.mark.parametrize('kwargs, message', [(dict(max_sz=0), 'max_sz'), (dict(max_sz=4, frame_slots=0), 'frame_slots'),
                                             (dict(max_sz=2.5), 'max_sz')])
def test_bad_sizes(kwargs, message):
    with pytest.raises(ValueError, match=message): FrameStorage(**kwargs)


@pytest.mark.skipif(importlib.util.find_spec('ale_py') is None, reason="ale-py is not installed: pip install 'fastrl_per[atari]'")
def test_real_pong_frames_from_two_interleaved_sub_envs():
    from fastrl_per.stages.atari import make_atari_vector_env
    envs = make_atari_vector_env('ALE/Pong-v5', nenvs=2, max_episode_steps=12)
    obs, _ = envs.reset(seed=3)
    rng, resetting, steps = np.random.default_rng(0), np.zeros(2, bool), []
    storage = FrameStorage(max_sz=40)  # 40 frame slots: the oldest transitions lose frames
    for _ in range(45):
        actions = rng.integers(envs.action_space[0].n, size=2)
        nxt, reward, terminated, truncated, _ = envs.step(actions)
        part = [dict(state=obs[i], next_state=nxt[i], action=np.int64(actions[i]), terminated=terminated[i], truncated=truncated[i],
                     reward=np.float32(reward[i]), total_reward=np.float32(0), env_id=np.int64(i), step_n=np.int64(0),
                     episode_n=np.int64(0), n_steps=np.int32(1)) for i in range(2) if not resetting[i]]  # next-step autoreset rows are not transitions
        if part: storage.write(columns(part))
        steps += part
        obs, resetting = nxt, terminated | truncated
    envs.close()
    assert sum(s['truncated'] for s in steps) >= 4  # several episodes per sub-env
    assert_rebuilds(storage, steps)
    assert 0 < storage.n_valid < storage.sz
    ended = {}  # env id -> whether its last transition ended an episode
    starts = 0
    for s in steps: starts += ended.get(int(s['env_id']), True); ended[int(s['env_id'])] = s['terminated'] or s['truncated']
    assert storage.n_frames == len(steps) + starts  # one frame per transition, one more per episode start
