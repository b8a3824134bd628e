"""Advantage estimators against hand-checked vectors, and MaxRL's expected value by exhaustive enumeration."""

import itertools

import numpy as np
import pytest

from sera.advantages import (
    ADVANTAGES,
    dr_grpo,
    grpo,
    maxrl,
    multiplicity_weights,
    pkpo,
    rloo,
)
from sera.allocation import scale_factor

R8 = np.array([1, 1, 0, 0, 0, 0, 0, 0], dtype=float)


def test_hand_checked_n8():
    np.testing.assert_allclose(grpo(R8, [8])[[0, 2]], [1.620, -0.540], atol=5e-4)
    np.testing.assert_allclose(maxrl(R8, [8]), [3, 3, -1, -1, -1, -1, -1, -1])
    np.testing.assert_allclose(dr_grpo(R8, [8])[[0, 2]], [0.75, -0.25])
    np.testing.assert_allclose(rloo(R8, [8])[[0, 2]], [1 - 1 / 7, -2 / 7])


def test_pkpo_hand_checked():
    # n = 4, k = 2, c = 2: correct g = (2/4) C(2,1)/C(3,1) = 1/3, incorrect 0; then leave-one-out mean
    np.testing.assert_allclose(pkpo([1, 1, 0, 0], [4], k=2), [2 / 9, 2 / 9, -2 / 9, -2 / 9])
    # n = k: only a lone correct sample is rewarded
    a = pkpo(np.eye(16)[0], [16], k=16)
    np.testing.assert_allclose(a, np.r_[1.0, np.full(15, -1 / 15)])
    assert np.all(pkpo(np.r_[1.0, 1.0, np.zeros(14)], [16], k=16) == 0)
    with pytest.raises(ValueError, match="at least k"):
        pkpo([1, 0], [2], k=4)


@pytest.mark.parametrize("name", sorted(ADVANTAGES))
def test_ragged_groups_are_independent(name):
    rng = np.random.default_rng(1)
    counts = np.array([16, 20, 17, 32])
    rewards = (rng.random(counts.sum()) < 0.3).astype(float)
    whole = ADVANTAGES[name](rewards, counts)
    parts = np.split(rewards, np.cumsum(counts)[:-1])
    np.testing.assert_allclose(whole, np.concatenate([ADVANTAGES[name](r, [r.size]) for r in parts]))


@pytest.mark.parametrize("name", sorted(ADVANTAGES))
def test_all_zero_and_all_one_groups_are_finite(name):
    rewards = np.r_[np.zeros(16), np.ones(16)]
    a = ADVANTAGES[name](rewards, [16, 16])
    assert np.all(np.isfinite(a))
    np.testing.assert_allclose(a, 0)  # nothing to learn from a group that all agrees


def test_maxrl_keep_cv_on_zero():
    assert maxrl(np.zeros(4), [4], keep_cv_on_zero=True).tolist() == [-1, -1, -1, -1]
    assert maxrl(np.zeros(4), [4]).tolist() == [0, 0, 0, 0]


def test_bad_groups_rejected():
    with pytest.raises(ValueError, match="counts sum"):
        grpo([1, 0, 1], [2])
    with pytest.raises(ValueError, match="positive"):
        maxrl([1, 0], [2, 0])


@pytest.mark.parametrize("keep_cv, delta", [(False, 1), (True, 0)])
@pytest.mark.parametrize("n", [2, 3, 5, 8])
def test_maxrl_expected_gradient_is_scaled_likelihood_gradient(keep_cv, delta, n):
    """E[g] = c(p, n) grad log p, enumerating all 2^n reward patterns of a softmax policy over 5 classes.

    Given the rewards, rollouts are independent, so E[S_j | r_j] is exact: with S = grad_z log softmax(z)[y] =
    e_y - pi, E[S | r = 1] = e_y* - pi and E[S | r = 0] = pi_wrong / (1 - p) - pi.
    """
    logits = np.array([0.3, -1.0, 0.8, 0.1, -0.4])
    pi = np.exp(logits) / np.exp(logits).sum()
    y_star = 1
    p = pi[y_star]
    e_star = np.eye(5)[y_star]
    s_success = e_star - pi
    s_fail = np.where(np.arange(5) == y_star, 0, pi) / (1 - p) - pi
    expected = np.zeros(5)
    for pattern in itertools.product([0.0, 1.0], repeat=n):
        r = np.array(pattern)
        prob = p ** r.sum() * (1 - p) ** (n - r.sum())
        adv = maxrl(r, [n], keep_cv_on_zero=keep_cv)
        expected += prob * np.mean(adv[:, None] * np.where(r[:, None] == 1, s_success, s_fail), axis=0)
    np.testing.assert_allclose(expected, scale_factor(p, n, delta) * (e_star - pi), atol=1e-12)


def test_multiplicity_weights():
    np.testing.assert_allclose(multiplicity_weights([2, 4], n0=4), [2, 2, 1, 1, 1, 1])
    # each prompt's total weight equals n0, as under uniform allocation
    w = multiplicity_weights([3, 10, 19], n0=8)
    np.testing.assert_allclose(np.add.reduceat(w, [0, 3, 13]), 8)
