"""pass@k against its definition, and the paired bootstrap's coverage on a known distribution."""

import itertools
import math
import subprocess
import sys
from fractions import Fraction

import numpy as np
import pytest

from sera.passk import pass_at_k
from sera.stats import paired_bootstrap_ci, resample_counts, seed_t_interval


def test_pass_at_k_matches_subset_enumeration():
    n = 7
    for c in range(n + 1):
        outcomes = [1] * c + [0] * (n - c)
        for k in range(1, n + 1):
            subsets = list(itertools.combinations(outcomes, k))
            exact = sum(max(s) for s in subsets) / len(subsets)
            assert pass_at_k(n, c, k) == pytest.approx(exact, abs=1e-12)


def test_pass_at_k_vectorised_shapes():
    out = pass_at_k(10, np.array([0, 1, 5, 10]), [1, 2, 5])
    assert out.shape == (4, 3)
    np.testing.assert_allclose(out[:, 0], [0, 0.1, 0.5, 1.0])
    assert pass_at_k(np.array([10, 20]), np.array([1, 2]), 1).shape == (2,)


def test_pass_at_k_stable_at_n4096():
    n = 4096
    for c in [1, 3, 100, 2000, 4090]:
        for k in [1, 64, 1024, 4000]:
            exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
            assert pass_at_k(n, c, k) == pytest.approx(float(exact), rel=1e-9, abs=1e-12)


def test_pass_at_k_bad_input():
    with pytest.raises(ValueError, match="k <= n"):
        pass_at_k(4, 1, 8)
    with pytest.raises(ValueError, match="c <= n"):
        pass_at_k(4, 5, 1)


def test_bootstrap_ci_shapes_and_determinism():
    rng = np.random.default_rng(0)
    a, b = rng.random((50, 3)), rng.random((50, 3))
    ci = paired_bootstrap_ci(a, b, num_resamples=2000, seed=3)
    assert ci.delta.shape == ci.low.shape == (3,)
    np.testing.assert_allclose(ci.delta, (a - b).mean(0))
    assert np.all(ci.low <= ci.delta) and np.all(ci.delta <= ci.high)
    again = paired_bootstrap_ci(a, b, num_resamples=2000, seed=3)
    np.testing.assert_array_equal(ci.low, again.low)
    assert isinstance(paired_bootstrap_ci(a[:, 0], b[:, 0]).delta, float)


def test_bootstrap_pairing_cancels_shared_question_difficulty():
    rng = np.random.default_rng(0)
    difficulty = rng.random(200)
    ci = paired_bootstrap_ci(difficulty + 0.01, difficulty, num_resamples=1000)
    assert ci.low == pytest.approx(0.01) and ci.high == pytest.approx(0.01)


def test_bootstrap_coverage_near_95_percent():
    """Per-question differences a - b with known mean 0.1: the 95% interval should cover it ~95% of the time."""
    rng = np.random.default_rng(1)
    trials, covered = 400, 0
    for t in range(trials):
        b = rng.random(150)
        a = b + 0.1 + rng.normal(0, 0.3, 150)
        ci = paired_bootstrap_ci(a, b, num_resamples=1000, seed=t)
        covered += ci.low <= 0.1 <= ci.high
    assert 0.91 <= covered / trials <= 0.98  # binomial sd at 400 trials is ~0.011


def test_math_modules_do_not_import_torch():
    code = (
        "import sys; import sera, sera.allocation, sera.allocators, sera.estimation, sera.advantages, sera.methods, "
        "sera.collect, sera.sequential, sera.passk, sera.stats; assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_seed_t_interval_hand_values_and_shapes():
    # diffs 1, 2, 3: mean 2, sd 1, t_{0.975, 2} = 4.3027 (tables), half width 4.3027 / sqrt(3) = 2.4842
    ci = seed_t_interval([1.0, 2.0, 3.0])
    assert (
        ci.delta == 2.0 and ci.low == pytest.approx(2 - 2.4842, abs=1e-4) and ci.high == pytest.approx(4.4842, abs=1e-4)
    )
    two = seed_t_interval(np.array([[1.0, 0.0], [3.0, 0.0]]))  # (S, K): one interval per column
    assert two.delta.tolist() == [2.0, 0.0] and two.low[1] == two.high[1] == 0.0
    one = seed_t_interval([0.5])
    assert one.delta == 0.5 and np.isnan(one.low) and np.isnan(one.high)
    with pytest.raises(ValueError):
        seed_t_interval([])


def test_seed_t_interval_covers_the_mean_95_percent_of_the_time():
    rng = np.random.default_rng(0)
    draws = rng.normal(1.0, 2.0, size=(4000, 5))  # 4000 experiments of 5 seeds each
    hits = [(lambda c: c.low <= 1.0 <= c.high)(seed_t_interval(d)) for d in draws]
    assert 0.935 <= np.mean(hits) <= 0.965


@pytest.mark.parametrize(("d", "seeds"), [(0.2, 199), (0.5, 34), (0.8, 15)])
def test_seeds_for_power_match_the_published_one_sample_t_sample_sizes(d, seeds):
    """Cohen's tables (and G*Power's one-sample t-test, two-sided, alpha 0.05, power 0.8) give 199, 34 and 15."""
    from sera.stats import paired_t_power, seeds_for_power

    assert seeds_for_power(d * 3.0, 3.0) == seeds  # only effect / sd matters
    assert paired_t_power(d, 1.0, seeds) >= 0.8 > paired_t_power(d, 1.0, seeds - 1)
    assert paired_t_power(-d, 1.0, seeds) == pytest.approx(paired_t_power(d, 1.0, seeds))  # two-sided


def test_power_refuses_what_it_cannot_compute():
    from sera.stats import paired_t_power, seeds_for_power

    with pytest.raises(ValueError, match="seeds >= 2"):
        paired_t_power(1.0, 0.0, 10)
    assert seeds_for_power(0.01, 10.0, cap=40) is None


def test_tost_power_is_how_often_the_90_percent_interval_falls_inside_the_margin():
    """Against the procedure itself on simulated seeds: draw per-seed differences, take seed_t_interval at 90%, count
    the experiments whose interval lies inside the margin."""
    from sera.stats import tost_power

    rng = np.random.default_rng(1)
    for difference, sd, seeds, margin in [(0.0, 1.9, 8, 2.0), (0.8, 1.5, 5, 2.0), (0.3, 3.0, 15, 2.0)]:
        draws = rng.normal(difference, sd, size=(4000, seeds))
        inside = [(lambda c: -margin < c.low and c.high < margin)(seed_t_interval(d, level=0.90)) for d in draws]
        assert tost_power(difference, sd, seeds, margin) == pytest.approx(np.mean(inside), abs=0.025)


def test_tost_power_at_the_margin_is_the_test_size_and_grows_with_seeds():
    from sera.stats import seeds_for_equivalence, tost_power

    assert tost_power(2.0, 1.0, 20, 2.0) <= 0.055  # a true difference at the margin: equivalence found <= 5%
    assert tost_power(0.0, 1.0, 4, 2.0) < tost_power(0.0, 1.0, 8, 2.0) < tost_power(0.0, 1.0, 16, 2.0)
    assert tost_power(0.5, 1.0, 6, 2.0) == tost_power(0.5, 1.0, 6, 2.0)  # seeded: repeatable
    needed = seeds_for_equivalence(0.5, 1.9, 2.0)
    assert tost_power(0.5, 1.9, needed, 2.0) >= 0.8 > tost_power(0.5, 1.9, needed - 1, 2.0)
    assert seeds_for_equivalence(2.5, 1.0, 2.0) is None  # outside the margin: never equivalent
    with pytest.raises(ValueError, match="margin > 0"):
        tost_power(0.0, 1.0, 5, 0.0)


def test_power_is_finite_far_in_the_tail():
    """scipy's noncentral t cdf returns NaN far in its tail (df 7, noncentrality 20); the power must not."""
    from sera.stats import paired_t_power

    assert paired_t_power(7.36, 1.04, 8) == pytest.approx(1.0)
    assert paired_t_power(-7.36, 1.04, 8) == pytest.approx(1.0)


def test_bootstrap_resamples_are_drawn_once_read_only_and_the_same_counts():
    counts = resample_counts(50, 200, 3)
    assert resample_counts(50, 200, 3) is counts and not counts.flags.writeable
    assert np.array_equal(counts, np.random.default_rng(3).multinomial(50, np.full(50, 1 / 50), size=200))
