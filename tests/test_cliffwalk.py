"""The Blind Cliffwalk: the memory, the learned criterion, and the paper's claim on small n, that prioritized
replay needs fewer updates than uniform replay (statistical, fixed seeds, with a margin)."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from fastrl_per.replay.cliffwalk import METHODS, Cliffwalk, cliffwalk_memory, true_q, updates_to_learn

SEEDS = range(10)


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 12))
def test_memory_holds_every_sequence_once(n):
    m = cliffwalk_memory(n)
    assert len(m['state']) == 2 ** (n + 1) - 2 and m['terminated'].sum() == 2 ** n   # each sequence ends once
    counts = np.bincount(m['state'] * 2 + m['action'], minlength=2 * n).reshape(n, 2)
    np.testing.assert_array_equal(counts[:, 1], 2 ** (n - 1 - np.arange(n)))         # right at s_i: 2**(n-1-i) copies
    np.testing.assert_array_equal(counts[:, 0], 2 ** (n - 1 - np.arange(n)))         # wrong at s_i: as many
    assert m['reward'].sum() == 1 and m['reward'][(m['state'] == n - 1) & (m['action'] == 1)].sum() == 1


@pytest.mark.parametrize('method,linear', [(m, l) for m in METHODS for l in (False, True) if not (l and m == 'oracle')])
def test_learned_means_mse_below_tolerance(method, linear):
    walk = Cliffwalk(5, seed=3, linear=linear)
    METHODS[method](walk)
    assert ((walk.values - true_q(5)) ** 2).mean() < 1e-3 and walk.updates > 0


@pytest.mark.parametrize('n', [6, 8])
def test_prioritized_replay_needs_fewer_updates_than_uniform(n):
    "Medians over 10 seeds; measured at n = 8: uniform 7,446, proportional 1,132, rank 1,460 (factor 2 demanded)."
    med = {m: np.median([updates_to_learn(n, m, s) for s in SEEDS]) for m in ('uniform', 'proportional', 'rank')}
    assert med['proportional'] < med['uniform'] / 2 and med['rank'] < med['uniform'] / 2, med


def test_prioritized_replay_pays_with_the_linear_learner_too():
    "Measured at n = 8 (benchmarks/cliffwalk_linear.py): uniform 5,344, proportional 1,340, rank 1,299 (2x asked)."
    med = {m: np.median([updates_to_learn(8, m, s, linear=True) for s in SEEDS])
           for m in ('uniform', 'proportional', 'rank')}
    assert med['proportional'] < med['uniform'] / 2 and med['rank'] < med['uniform'] / 2, med


def test_references_order_and_determinism():
    med = {m: np.median([updates_to_learn(8, m, s) for s in SEEDS]) for m in ('oracle', 'greedy', 'uniform')}
    assert med['oracle'] < med['greedy'] < med['uniform'], med
    assert updates_to_learn(7, 'rank', 4) == updates_to_learn(7, 'rank', 4)


@pytest.mark.parametrize('call,contains', [
    (lambda: cliffwalk_memory(0), ['n', '0']),
    (lambda: cliffwalk_memory(2.5), ['n', '2.5']),
    (lambda: cliffwalk_memory(25), ['n=25']),
    (lambda: updates_to_learn(4, 'prioritised'), ["'prioritised'", 'uniform']),
    (lambda: updates_to_learn(4, 'oracle', linear=True), ['oracle', 'linear']),
])
def test_bad_input(call, contains):
    with pytest.raises(ValueError) as e: call()
    for s in contains: assert s in str(e.value), (s, str(e.value))
