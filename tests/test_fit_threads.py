"""`fit` trains on one torch thread by default and gives torch's thread setting back as it found it (#44 item 5).

A library user's program keeps its own `torch.set_num_threads`: `fit(threads=n)` sets n only while it runs, restores
the setting when it returns or raises, and `threads=None` leaves it alone.
"""
from types import MappingProxyType
import pytest
import torch

from fastrl_per.learners.learner import Learner, torch_threads
from fastrl_per.learners.recurrent_learner import RecurrentLearner
from fastrl_per.run import factories
from fastrl_per.run.train import train


@pytest.fixture
def program_threads():
    "A program that set torch to 2 threads itself; its setting is restored after the test whatever happens."
    outside = torch.get_num_threads()
    torch.set_num_threads(2)
    yield 2
    torch.set_num_threads(outside)


class Watch:
    "`pipe` noting torch's thread count at each update it yields (in `seen`)."
    def __init__(self, pipe): self.pipe, self.seen = pipe, []
    def __iter__(self):
        for row in self.pipe:
            self.seen.append(torch.get_num_threads())
            yield row


def watched(learner):
    "`learner` with its pipe noting torch's thread count at every update; the list it notes them in."
    learner.pipe = watch = Watch(learner.pipe)
    return watch.seen


def small(model):
    if model is Learner: return Learner('CartPole-v1', seed=0, total_steps=400, bs=16, warmup=16)
    return RecurrentLearner('CartPoleNoVelocity-v1', seed=0, total_steps=400, bs=4, warmup=40, length=4, burn_in=2,
                            train_every=4)


@pytest.mark.parametrize('model', [Learner, RecurrentLearner])
@pytest.mark.parametrize('threads, inside', [(1, 1), (3, 3), (None, 2)])
def test_fit_trains_on_its_threads_and_restores_the_programs(model, threads, inside, program_threads):
    learner = small(model)
    seen = watched(learner)
    rows = learner.fit(120) if threads == 1 else learner.fit(120, threads=threads)   # 1: the default
    assert rows and set(seen) == {inside}
    assert torch.get_num_threads() == program_threads


def test_fit_restores_the_threads_when_it_raises(program_threads):
    learner = small(Learner)
    def failing():
        yield from ()
        raise RuntimeError('a stage failed')
    learner.pipe = failing()
    with pytest.raises(RuntimeError, match='a stage failed'): learner.fit(50)
    assert torch.get_num_threads() == program_threads


@pytest.mark.parametrize('threads', [0, -1, 1.5, True])
def test_a_bad_thread_count_is_refused_and_changes_nothing(threads, program_threads):
    learner = small(Learner)
    with pytest.raises(ValueError, match='threads'): learner.fit(50, threads=threads)
    assert torch.get_num_threads() == program_threads and learner.episodes.env_steps == 0


def test_torch_threads_nests(program_threads):
    with torch_threads(1):
        with torch_threads(3): assert torch.get_num_threads() == 3
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == program_threads


class Seeing(Learner):
    "A `Learner` noting torch's thread count at every update of its run (in `seen`)."
    seen = []
    def iterate(self, steps):
        for row in super().iterate(steps):
            self.seen.append(torch.get_num_threads())
            yield row


def test_train_runs_on_its_threads_and_restores_the_programs(program_threads, tmp_path, monkeypatch):
    "`train` (threads=1 by default) trains on one thread and gives the program's setting back, after a run or a refusal."
    seeing = factories.Registered(Seeing, 'mlp')
    monkeypatch.setattr(factories, 'LEARNERS', MappingProxyType({**factories.LEARNERS, 'mlp': seeing}))
    train(out=str(tmp_path / 'run'), total_steps=200, bs=16, warmup=16, eval_every=0, progress=False, solved=0)
    assert Seeing.seen and set(Seeing.seen) == {1} and torch.get_num_threads() == program_threads
    (tmp_path / 'file').write_text('not a run directory')
    with pytest.raises(Exception, match='file'): train(out=str(tmp_path / 'file'), total_steps=200, progress=False)
    assert torch.get_num_threads() == program_threads
