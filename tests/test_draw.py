"""The draw is a part a buffer holds: a user's `Draw` runs through `ReplayBuffer` (sample, feedback, state, files),
`PrioritizedReplayBuffer` is the buffer built with a `PriorityDraw`, and a state goes only where its draw's part fits."""
import functools
import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from fastrl_per.core import SimpleStep
from fastrl_per.replay.memory import Draw, UniformDraw, ReplayBuffer
from fastrl_per.replay.per import PriorityDraw, PrioritizedReplayBuffer
from fastrl_per.replay.frames import FrameStorage
from conftest import assert_state_equal, assert_refused_unchanged


class Newest(Draw):
    "A user's draw: the `bs` newest slots, weights one, and a count of the TD errors handed back (saved with the buffer)."
    def __init__(self, storage): self.storage, self.fed = storage, 0
    def written(self, start, n): "The storage's trackers say what is newest."
    def pick(self, rng, bs):
        newest = (self.storage.idx - 1 - np.arange(bs)) % self.storage.max_sz
        return newest, np.ones(bs, np.float32)
    def update(self, idxs, td_errors): self.fed += len(td_errors)
    def anneal_beta(self, fraction, final=1.0): "No weights to anneal."
    def state_dict(self): return dict(fed=self.fed)
    def check_state(self, state):
        if not isinstance(state.get('fed'), int): raise ValueError(f"state fed must be an int, got {state.get('fed')!r}")
        return state
    def assign(self, state): self.fed = state['fed']


def steps(n, start=0):
    return SimpleStep.from_steps([SimpleStep(state=[float(i)], action=i % 2, next_state=[i + 1.], reward=i / 4)
                                  for i in range(start, start + n)])


def test_a_users_draw_runs_through_the_buffer(tmp_path):
    buf = ReplayBuffer(max_sz=8, bs=3, seed=0, draw=Newest)
    buf.add(steps(10))
    batch = buf.sample()
    assert batch.idxs.tolist() == [1, 0, 7] and batch.state[:, 0].tolist() == [9., 8., 7.]
    buf.update_priorities(batch.idxs, torch.ones(3, 1))
    with pytest.raises(ValueError, match='do not pair'): buf.update_priorities(batch.idxs, [1.])   # checked first
    assert buf.draw.fed == 3 and buf.state_dict()['fed'] == 3
    buf.save(tmp_path / 'newest')
    back = ReplayBuffer(max_sz=8, bs=3, draw=Newest)
    back.load(tmp_path / 'newest')
    assert back.draw.fed == 3 and back.sample().idxs.tolist() == [1, 0, 7]
    assert_state_equal(back.state_dict(), buf.state_dict())


def test_a_state_loads_only_where_its_draws_part_fits():
    uniform, newest = ReplayBuffer(max_sz=8, seed=0), ReplayBuffer(max_sz=8, seed=0, draw=Newest)
    by_priority = ReplayBuffer(max_sz=8, seed=0, draw=PriorityDraw)
    for buf in (uniform, newest, by_priority): buf.add(steps(5))
    assert_refused_unchanged(lambda: ReplayBuffer(max_sz=8, draw=Newest), lambda b: b.load_state_dict(uniform.state_dict()),
                             ['state fed must be an int, got None'])
    assert_refused_unchanged(lambda: ReplayBuffer(max_sz=8), lambda b: b.load_state_dict(by_priority.state_dict()),
                             ['state holds priorities', 'PriorityDraw'])
    assert_refused_unchanged(lambda: ReplayBuffer(max_sz=8, draw=PriorityDraw),
                             lambda b: b.load_state_dict(uniform.state_dict()), ['prioritized state', 'priorities'])
    other = ReplayBuffer(max_sz=8, draw=PriorityDraw)
    other.load_state_dict(by_priority.state_dict())
    assert_state_equal(other.state_dict(), by_priority.state_dict())


def test_a_draw_must_be_whole_and_made_from_the_storage():
    class Half(Draw):
        def pick(self, rng, bs): return np.zeros(bs, np.int64), np.ones(bs, np.float32)
    with pytest.raises(TypeError, match="abstract methods.*written"): Half()
    with pytest.raises(TypeError, match="made None"): ReplayBuffer(draw=lambda storage: None)
    with pytest.raises(TypeError, match="made <class 'fastrl_per.replay.memory.UniformDraw'>"):
        ReplayBuffer(draw=lambda storage: UniformDraw)   # the class, not a draw made from the storage
    assert isinstance(ReplayBuffer().draw, UniformDraw) and isinstance(PrioritizedReplayBuffer().draw, PriorityDraw)


def columns(n, start, frames):
    "`n` transitions from `start` as keyword columns: one float state, or (`frames`) stacks of four 2x2 uint8 frames."
    t = np.arange(start, start + n)
    cols = dict(action=t % 2, reward=(t / 4).astype(np.float32), terminated=np.zeros(n, bool))
    if frames:
        f = ((start + np.arange(n + 4)) % 251).astype(np.uint8)[:, None, None] * np.ones((1, 2, 2), np.uint8)
        stack = lambda k: np.stack([f[i + k:i + k + 4] for i in range(n)])
        return dict(cols, state=stack(0), next_state=stack(1))
    return dict(cols, state=t[:, None].astype(np.float32), next_state=t[:, None] + np.float32(1))


ops = st.lists(st.one_of(st.tuples(st.just('add'), st.integers(1, 7)), st.tuples(st.just('sample'), st.integers(1, 6)),
                         st.tuples(st.just('anneal'), st.floats(0., 1.5))), min_size=1, max_size=20)


@pytest.mark.filterwarnings('ignore:sampling')   # batches larger than the buffer repeat steps, and say so
@settings(max_examples=60, deadline=None)
@given(st.sampled_from(['proportional', 'rank', 'lap']), st.sampled_from([0.4, 1.]), st.booleans(), ops)
def test_the_prioritized_buffer_is_the_buffer_built_with_a_priority_draw(kind, alpha, frames, history):
    """Draws, weights, knobs and states equal, for every kind, on a ring and on a `FrameStorage` that loses frames (13
    frame slots for 12 stacks of 4: slots leave the draw)."""
    storage = (lambda: FrameStorage(12, 13)) if frames else (lambda: None)
    cls = PrioritizedReplayBuffer(max_sz=12, seed=0, alpha=alpha, prioritization=kind, storage=storage())
    built = ReplayBuffer(max_sz=12, seed=0, storage=storage(),
                         draw=functools.partial(PriorityDraw, alpha=alpha, prioritization=kind))
    n = 0
    for op, k in history:
        if op == 'add':
            for buf in (cls, built): buf.extend(**columns(k, n, frames))
            n += k
        elif op == 'sample' and cls.storage.n_valid:
            a, b = cls.sample(k), built.sample(k)
            assert torch.equal(a.idxs, b.idxs) and torch.equal(a.weights, b.weights)
            td = a.reward.double() * 3 + a.idxs / 7
            cls.update_priorities(a.idxs, td); built.update_priorities(b.idxs, td)
        elif op == 'anneal':
            cls.anneal_beta(k); built.anneal_beta(k)
    assert (cls.beta, cls.max_priority) == (built.draw.core.beta, built.draw.core.max_priority)
    ours, theirs = cls.state_dict(columns=False), built.state_dict(columns=False)   # the storages' arrays: alike
    assert_state_equal(ours, dict(theirs, kind='PrioritizedReplayBuffer', version=2))
