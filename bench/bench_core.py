"""Speed of the sera math modules (issue: core library). Run: `make bench` (or python -m bench.bench_core).

Prints, from one run: SERA's waterline on 1,000,000 prompts against a plain bisection reference for the continuous
level, pass@k for 500 questions x 2048 samples x 12 k, and a 10,000-resample paired bootstrap over 500 x 12.
"""

from __future__ import annotations

import time

import numpy as np

from sera.allocation import continuous_waterline, waterline
from sera.passk import pass_at_k
from sera.stats import paired_bootstrap_ci


def best_of(fn, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def bisection_lambda(p_hat, budget, n_min, n_max, delta=1, iters=100):
    """Reference: bisect lam until sum clip(delta + lam / a, n_min, n_max) = budget (100 halvings)."""
    inv_a = 1.0 / -np.log1p(-p_hat)
    lo, hi = 0.0, (n_max - delta) / inv_a.min()
    for _ in range(iters):
        mid = (lo + hi) / 2
        if np.clip(delta + mid * inv_a, n_min, n_max).sum() < budget:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def main() -> None:
    rng = np.random.default_rng(0)
    num, n0 = 1_000_000, 16
    p_hat = np.clip(rng.beta(0.5, 2.0, num), 1 / 16, 15 / 16)
    budget, n_min, n_max = num * n0, 2, 8 * n0
    t_exact = best_of(lambda: continuous_waterline(p_hat, budget, n_min, n_max))
    t_bisect = best_of(lambda: bisection_lambda(p_hat, budget, n_min, n_max))
    t_full = best_of(lambda: waterline(p_hat, budget, n_min, n_max))
    lam_exact = continuous_waterline(p_hat, budget, n_min, n_max)[1]
    lam_bisect = bisection_lambda(p_hat, budget, n_min, n_max)
    print(f"waterline, {num:,} prompts, n0={n0}:")
    print(
        f"  continuous level (sorted breakpoints): {t_exact:.3f} s; bisection reference: {t_bisect:.3f} s; "
        f"ratio {t_exact / t_bisect:.2f}; |lam difference| {abs(lam_exact - lam_bisect):.1e}"
    )
    print(f"  full integer allocation (level + greedy rounding): {t_full:.3f} s (target < 1 s)")

    questions, samples, ks = 500, 2048, 2 ** np.arange(12)
    correct = rng.binomial(samples, rng.beta(0.5, 2.0, questions))
    t_passk = best_of(lambda: pass_at_k(samples, correct, ks))
    print(f"pass@k, {questions} questions x {samples} samples x {ks.size} k: {t_passk * 1e3:.2f} ms (target < 2 s)")

    a, b = rng.random((questions, ks.size)), rng.random((questions, ks.size))
    t_boot = best_of(lambda: paired_bootstrap_ci(a, b, num_resamples=10_000))
    print(f"paired bootstrap, 10,000 resamples x {questions} questions x {ks.size} k: {t_boot:.3f} s (target < 2 s)")


if __name__ == "__main__":
    main()
