"""SERA's allocation against brute force, its invariants (hypothesis), and DARS-HW's schedule."""

import itertools
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sera.allocation import continuous_waterline, dars_hw_extra, scale_factor, uniform, waterline


def brute_force_maxmin(p_hat, budget, n_min, n_max, delta):
    best = -1.0
    for n in itertools.product(range(n_min, n_max + 1), repeat=len(p_hat)):
        if sum(n) == budget:
            best = max(best, scale_factor(np.array(p_hat), np.array(n), delta).min())
    return best


def test_scale_factor_at_p_one_is_one_without_a_warning():
    # a prompt solved with certainty (the classifier's exact p reaches 1.0 in float32) is not attenuated at all
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        c = scale_factor(np.array([1.0, 1.0, 0.5]), np.array([16, 2, 2]))
    assert c.tolist() == [1.0, 1.0, 0.5]


def test_scale_factor_closed_form():
    assert scale_factor(0.5, 3, delta=1) == pytest.approx(0.75)
    assert scale_factor(0.5, 3, delta=0) == pytest.approx(0.875)
    assert scale_factor(0.3, 1, delta=1) == 0.0  # n = 1: the default estimator is identically zero
    np.testing.assert_allclose(scale_factor([0.1, 0.9], [4, 2]), [1 - 0.9**3, 1 - 0.1])


def test_uniform():
    assert uniform(3, 16).tolist() == [16, 16, 16]


@pytest.mark.parametrize("delta", [0, 1])
def test_waterline_matches_brute_force(delta):
    rng = np.random.default_rng(0)
    for _ in range(300):
        num = int(rng.integers(1, 5))
        n_min, n_max = int(rng.integers(max(2, delta), 4)), int(rng.integers(4, 11))
        budget = int(rng.integers(num * n_min, num * n_max + 1))
        p_hat = rng.uniform(0.02, 0.98, num) if rng.random() < 0.5 else rng.uniform(0.5, 0.99, num)
        n = waterline(p_hat, budget, n_min, n_max, delta)
        assert n.sum() == budget
        got = scale_factor(p_hat, n, delta).min()
        assert got == pytest.approx(brute_force_maxmin(p_hat, budget, n_min, n_max, delta), abs=1e-12)


def test_waterline_reviewed_counterexamples_are_optimal():
    """Cases where flooring the continuous solution overshoots the optimum for one prompt (found in review)."""
    for p_hat, budget, n_min, n_max, delta in [
        ([0.971, 0.573, 0.974, 0.830], 16, 2, 9, 1),
        ([0.132, 0.614, 0.276, 0.387], 16, 2, 10, 0),
    ]:
        n = waterline(np.array(p_hat), budget, n_min, n_max, delta)
        best = brute_force_maxmin(p_hat, budget, n_min, n_max, delta)
        assert scale_factor(np.array(p_hat), n, delta).min() == pytest.approx(best, abs=1e-12)


def test_waterline_equalises_scale_on_the_line():
    p_hat = np.array([0.05, 0.1, 0.2, 0.4, 0.8])
    n_cont, lam = continuous_waterline(p_hat, 5 * 16, 2, 1000, delta=1)
    assert n_cont.sum() == pytest.approx(80)
    c = scale_factor(p_hat, n_cont, 1)
    on_line = (n_cont > 2) & (n_cont < 1000)
    np.testing.assert_allclose(c[on_line], 1 - np.exp(-lam))
    assert np.all(c[~on_line] >= 1 - np.exp(-lam) - 1e-12)  # easy prompts clipped at n_min sit above


def test_waterline_tau_and_shape():
    p_hat = np.array([0.02, 0.3, 0.9, 0.6])
    n, tau = waterline(p_hat, 64, 2, 128, return_tau=True)
    assert n.dtype == np.int64 and n.sum() == 64
    assert 0 < tau < 1
    assert n[0] > n[1] > n[3] >= n[2] == 2  # hardest prompt gets the most, easiest sits at n_min


@pytest.mark.parametrize(
    "p_hat, budget, n_min, n_max, match",
    [
        ([0.5, 0.0], 8, 2, 8, "strictly inside"),
        ([0.5, 1.0], 8, 2, 8, "strictly inside"),
        ([0.5, 0.5], 3, 2, 8, "infeasible"),
        ([0.5, 0.5], 17, 2, 8, "infeasible"),
        ([0.5, 0.5], 8, 5, 4, "n_min <= n_max"),
    ],
)
def test_waterline_rejects_bad_input(p_hat, budget, n_min, n_max, match):
    with pytest.raises(ValueError, match=match):
        waterline(np.array(p_hat), budget, n_min, n_max)


p_hats = st.lists(st.floats(0.001, 0.999), min_size=1, max_size=40).map(np.array)


@settings(max_examples=150, deadline=None)
@given(p_hat=p_hats, n0=st.integers(2, 64), spread=st.integers(1, 16), data=st.data())
def test_waterline_invariants(p_hat, n0, spread, data):
    n_min = data.draw(st.integers(2, n0))
    n_max = n0 * spread
    budget = data.draw(st.integers(len(p_hat) * n_min, len(p_hat) * n_max))
    n = waterline(p_hat, budget, n_min, n_max)
    assert n.sum() == budget
    assert n.min() >= n_min and n.max() <= n_max
    order = np.argsort(p_hat, kind="stable")
    for i, j in zip(order[:-1], order[1:], strict=True):  # lower p_hat never gets fewer rollouts
        if p_hat[i] < p_hat[j]:
            assert n[i] >= n[j]


@settings(max_examples=50, deadline=None)
@given(p=st.floats(0.001, 0.999), num=st.integers(1, 50), n0=st.integers(2, 64))
def test_waterline_equal_p_hat_is_uniform(p, num, n0):
    n = waterline(np.full(num, p), num * n0, 2, 8 * n0)
    assert n.max() - n.min() <= 1 and n.sum() == num * n0


def test_dars_hw_extra():
    n0 = 16
    acc = np.array([0.0, 1 / 16, 0.25, 0.5, 0.9])
    # a = 0 -> 1/32 -> ceil(256 - 16) = 240, capped at n_max - n0; 1/16 -> 128 - 16 = 112; 0.25 -> 16; >= 0.5 -> 0
    assert dars_hw_extra(acc, n0, n_max=128).tolist() == [112, 112, 16, 0, 0]
    assert dars_hw_extra(acc, n0, n_max=1000).tolist() == [240, 112, 16, 0, 0]
