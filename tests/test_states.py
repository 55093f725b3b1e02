"""Every `load_state_dict` (and `load`) of the four buffers is all or nothing.

A table of corrupted states per buffer kind: each row must raise a `ValueError` naming what
is wrong, leave the buffer's state and tree exactly as they were, and leave it usable
(`sample` still works, and so does a load of the good state afterwards).
"""
import numpy as np
import pytest
import torch

from fastrl_per.core import SimpleStep
from fastrl_per.replay.memory import ReplayBuffer, ExperienceReplay
from fastrl_per.replay.per import PrioritizedReplayBuffer
from fastrl_per.replay.sequence import Episode, SequenceReplay, PrioritizedSequenceReplay
from conftest import assert_state_equal, assert_unchanged, snapshot


def make_step(i, episode_n=0, last=False):
    return SimpleStep(state=[float(i), 1.], action=i % 2, next_state=[i + 1., 1.], terminated=last,
                      reward=float(i), step_n=i, episode_n=episode_n)


def transitions(cls):
    "A buffer of 8 slots holding 11 steps (it wrapped), some priorities fed back."
    buf = cls(max_sz=8, bs=2, seed=0)
    buf.add(SimpleStep.from_steps([make_step(i) for i in range(11)]))
    if cls is PrioritizedReplayBuffer: buf.update_priorities(buf.sample(4).idxs, [0.5, -2., 3., 0.25])
    return buf


def episodes(cls):
    "A buffer of 20 transitions holding episodes of 6, 5 and 7 steps after an eviction, priorities fed back."
    buf = cls(20, seed=0)
    for e, n in enumerate([4, 6, 5, 7]): buf.add(Episode([make_step(i, e, i == n - 1) for i in range(n)]))
    if cls is PrioritizedSequenceReplay: buf.update_priorities(buf.sample_prioritized(3, 2).indices, [0.5, -2., 3.])
    return buf


def draw(buf):
    "One sample of whatever kind the buffer gives."
    if isinstance(buf, PrioritizedSequenceReplay): return buf.sample_prioritized(2, 3)
    return buf.sample(2, 3) if isinstance(buf, SequenceReplay) else buf.sample()


def cols(f):
    "A change to the state's columns made by `f(columns)` on a copy."
    def change(s): s['columns'] = {**s['columns']}; f(s['columns'])
    return change

def setitem(k, v): return lambda s: s.__setitem__(k, v)
def delitem(k): return lambda s: s.__delitem__(k)
def tensor_as(k, f): return lambda s: s.__setitem__(k, f(s[k]))


COMMON = [
    # id, change to a good state (in place), substrings of the ValueError
    ('kind', setitem('kind', 'Other'), ['Other']),
    ('version', setitem('version', 99), ['version 99']),
    ('missing rng', delitem('rng'), ['missing', 'rng']),
    ('rng garbage', setitem('rng', 'garbage'), ['sampler state']),
    ('rng not json of a bit generator', setitem('rng', '{"bit_generator": "Nope"}'), ['sampler state']),
    ('n_added negative', setitem('n_added', -3), ['n_added', '-3']),
    ('n_added float', setitem('n_added', 11.0), ['n_added', '11.0']),
    ('columns none', setitem('columns', None), ['columns']),
    ('columns not a dict', setitem('columns', [1, 2]), ['columns']),
    ('column missing', cols(lambda c: c.pop('reward')), ['SimpleStep fields']),
    ('column as list', cols(lambda c: c.__setitem__('state', c['state'].tolist())), ["'column state'", 'tensor', 'list']),
    ('column as numpy', cols(lambda c: c.__setitem__('reward', c['reward'].numpy())), ["'column reward'", 'tensor', 'ndarray']),
    ('column float64', cols(lambda c: c.__setitem__('state', c['state'].double())), ["'state'", 'float64']),
    ('column 2-d reward', cols(lambda c: c.__setitem__('reward', c['reward'][:, None])), ["'column reward'", '1-d']),
    ('column short', cols(lambda c: c.__setitem__('action', c['action'][:-1])), ["'column action'", 'rows']),
    ('column wrong dtype', cols(lambda c: c.__setitem__('env_id', c['env_id'].int())), ["'column env_id'", 'int32']),
    ('column needs grad', cols(lambda c: c.__setitem__('state', c['state'].clone().requires_grad_())), ["'column state'", 'plain']),
    ('next_state unlike state', cols(lambda c: c.__setitem__('next_state', c['next_state'][:, :1])), ['next_state']),
]

TRANSITION = [
    ('max_sz', setitem('max_sz', 9), ['max_sz 9']),
    ('bs 0', setitem('bs', 0), ['bs', '0']),
    ('bs float', setitem('bs', 2.0), ['bs', '2.0']),
    ('bs > max_sz', setitem('bs', 9), ['bs (9)', 'max_sz (8)']),
]

SEQUENCE = [
    ('capacity', setitem('capacity', 21), ['capacity 21']),
    ('first_id > next_id', setitem('first_id', 9), ['ids']),
    ('first_id negative', setitem('first_id', -1), ['first_id', '-1']),
    ('starts as numpy', tensor_as('starts', lambda t: t.numpy()), ["'starts'", 'tensor']),
    ('lengths float', tensor_as('lengths', lambda t: t.double()), ["'lengths'", 'float64']),
    ('lengths 2-d', tensor_as('lengths', lambda t: t[:, None]), ["'lengths'", '1-d']),
    ('lengths not back to back', tensor_as('lengths', lambda t: t + 1), ['back to back']),
    ('too many transitions', lambda s: s.update(n_added=s['n_added'] + 30, starts=s['starts'] + torch.tensor([0, 10, 30]),
                                                lengths=s['lengths'] + torch.tensor([10, 20, 0])), ['more than the capacity']),
]

PRIORITIES = [
    ('missing priorities', delitem('priorities'), ['missing', 'priorities']),
    ('max_priority 0', setitem('max_priority', 0.), ['max_priority', '0.0']),
    ('max_priority nan', setitem('max_priority', float('nan')), ['max_priority', 'nan']),
    ('max_priority below a priority', setitem('max_priority', 1.0), ['max_priority=1.0']),
    ('max_priority overflows under alpha', lambda s: s.update(max_priority=1e200, alpha=2.0), ['max_priority', 'overflows']),
    ('alpha negative', setitem('alpha', -0.5), ['alpha', '-0.5']),
    ('alpha overflows the leaves', setitem('alpha', 2000.), ['alpha=2000.0', 'overflows']),
    ('alpha underflows every leaf', lambda s: s.update(alpha=1e6, priorities=s['priorities'] * 0 + 0.5, max_priority=0.5),
     ['sum to 0']),
    ('beta inf', setitem('beta', float('inf')), ['beta', 'inf']),
    ('beta0 string', setitem('beta0', '0.4'), ['beta0']),
    ('eps 0', setitem('eps', 0.), ['eps', '0.0']),
    ('priorities float32', tensor_as('priorities', lambda t: t.float()), ["'priorities'", 'float32']),
    ('priorities as list', tensor_as('priorities', lambda t: t.tolist()), ["'priorities'", 'tensor']),
    ('priorities short', tensor_as('priorities', lambda t: t[:-1]), ["'priorities'", 'rows']),
    ('priority 0', tensor_as('priorities', lambda t: torch.cat([t[:-1], torch.zeros(1, dtype=t.dtype)])), ['priorities', '0.0']),
    ('priority negative', tensor_as('priorities', lambda t: -t), ['priorities']),
    ('priority nan', tensor_as('priorities', lambda t: t * float('nan')), ['priorities']),
    ('priority inf', tensor_as('priorities', lambda t: t * float('inf')), ['priorities']),
    ('writes int64', tensor_as('writes', lambda t: t.long()), ["'writes'", 'int64']),
    ('writes 0', tensor_as('writes', lambda t: t * 0), ['write counts']),
    ('sampled_at above writes', tensor_as('sampled_at', lambda t: t + 5), ['write counts']),
]

KINDS = {
    ReplayBuffer: (transitions, COMMON + TRANSITION),
    PrioritizedReplayBuffer: (transitions, COMMON + TRANSITION + PRIORITIES),
    SequenceReplay: (episodes, COMMON + SEQUENCE),
    PrioritizedSequenceReplay: (episodes, COMMON + SEQUENCE + PRIORITIES
                                + [('tree_length 0', setitem('tree_length', 0), ['tree_length', '0']),
                                   ('missing tree_length', delitem('tree_length'), ['tree_length'])]),
}

ROWS = [pytest.param(cls, change, contains, id=f'{cls.__name__}-{row_id}')
        for cls, (_, table) in KINDS.items() for row_id, change, contains in table]


def bad_state(good, change):
    "A shallow copy of `good` with `change` applied (the good state's tensors are never written in place)."
    state = dict(good)
    change(state)
    return state


@pytest.mark.filterwarnings('ignore::RuntimeWarning')
@pytest.mark.parametrize('cls,change,contains', ROWS)
def test_bad_state_changes_nothing(cls, change, contains):
    build = KINDS[cls][0]
    good = build(cls).state_dict()
    buf = build(cls)
    draw(buf)                                     # the target has moved on from the good state: its sampler differs
    before = snapshot(buf)
    with pytest.raises(ValueError) as e: buf.load_state_dict(bad_state(good, change))
    for c in contains: assert c in str(e.value), f"{c!r} not in {str(e.value)!r}"
    assert_unchanged(before, buf)
    twin = build(cls)
    draw(twin)
    assert_unchanged(before, twin)                # what `buf` would be had the load never been tried ...
    a, b = draw(buf), draw(twin)                  # ... and both go on alike
    assert_state_equal(buf.state_dict(), twin.state_dict())
    buf.load_state_dict(good)                     # a good state still loads
    assert_state_equal(buf.state_dict(), good)


@pytest.mark.parametrize('cls', list(KINDS))
def test_not_a_dict(cls):
    buf = KINDS[cls][0](cls)
    before = snapshot(buf)
    with pytest.raises(ValueError, match='dict, got list'): buf.load_state_dict([1, 2])
    assert_unchanged(before, buf)


@pytest.mark.parametrize('cls', [ReplayBuffer, PrioritizedReplayBuffer])
def test_bad_file_changes_nothing(cls, tmp_path):
    "`load` of a saved bad state (and through the pipe) is all or nothing too."
    buf = transitions(cls)
    state = buf.state_dict()
    state['bs'] = 0
    torch.save(state, tmp_path / 'bad.pt')
    pipe = ExperienceReplay(None, max_sz=8, buffer=buf)
    before = snapshot(pipe)
    with pytest.raises(ValueError, match='bs'): pipe.load(tmp_path / 'bad.pt')
    assert_unchanged(before, pipe)
    assert len(pipe.sample()) == 2


def test_empty_states_load_into_full_buffers():
    "A good state of an empty buffer is not a bad one: it empties the target."
    for cls, (build, _) in KINDS.items():
        empty = cls(max_sz=8, bs=2) if cls in (ReplayBuffer, PrioritizedReplayBuffer) else cls(20)
        buf = build(cls)
        buf.load_state_dict(empty.state_dict())
        assert len(buf) == 0
        assert_state_equal(buf.state_dict(), empty.state_dict())
