"""Speed of the sera math modules (issue: core library). Run: `make bench` (or python -m bench.bench_core).

Prints, from one run: the max-min waterline against the authors' rule (all prompts active, and with the active set) on
the p that training produces (an ImageNet cold start, a saturated classifier batch, a language-model mixture; B = 256,
4,096 and 65,536; n0 = 16 and 128; n_min = 2, n_max = 4 n0), each time with its ratio to the all-active mode; SERA's
waterline on 1,000,000 prompts against a plain bisection reference for the continuous level; pass@k for 500 questions
x 2048 samples x 12 k; and a 10,000-resample paired bootstrap over 500 x 12.
"""

from __future__ import annotations

import functools
import time

import numpy as np

from sera.allocation import active_waterline, continuous_waterline, waterline
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


def training_p(kind: str, num: int, rng) -> np.ndarray:
    """p as training produces it: 'cold' (95% near 1/1000, the rest spread), 'saturated' (a trained classifier: 70%
    within 1e-2 of 1), 'lm' (40% Beta(0.3, 30), 25% one minus that, 35% uniform on (0.05, 0.95))."""
    u = rng.random(num)
    if kind == "cold":
        p = np.where(u < 0.95, 1e-3 * np.exp(0.3 * rng.standard_normal(num)), rng.uniform(0.01, 0.9, num))
    elif kind == "saturated":
        p = np.where(u < 0.7, 1 - 10 ** rng.uniform(-6, -2, num), np.where(u < 0.9, rng.uniform(0.5, 0.99, num),
                                                                           10 ** rng.uniform(-6, -2, num)))  # fmt: skip
    else:
        p = np.where(u < 0.4, rng.beta(0.3, 30, num), np.where(u < 0.65, 1 - rng.beta(0.3, 30, num),
                                                               rng.uniform(0.05, 0.95, num)))  # fmt: skip
    return np.clip(p, 1e-9, 1 - 1e-9)


def allocation_rules(rng) -> None:
    print("allocation on training's p (one thread; ms; ratio to the authors' rule with every prompt active):")
    print(f"  {'p':<10}{'B':>7}{'n0':>5}{'max-min':>10}{'all active':>12}{'active set':>12}{'  ratios':>16}")
    for kind in ("cold", "saturated", "lm"):
        for num in (256, 4096, 65536):
            for n0 in (16, 128):
                p, budget, n_max = training_p(kind, num, rng), num * n0, 4 * n0
                repeats = 5 if num <= 4096 else 1
                args = (p, budget, 2, n_max)
                t_maxmin = best_of(functools.partial(waterline, *args), repeats)
                t_all = best_of(functools.partial(active_waterline, *args, threshold=0.0), repeats)
                t_active = best_of(functools.partial(active_waterline, *args), repeats)
                print(f"  {kind:<10}{num:>7}{n0:>5}{t_maxmin * 1e3:>10.2f}{t_all * 1e3:>12.2f}{t_active * 1e3:>12.2f}"
                      f"  {t_maxmin / t_all:>6.2f} {t_active / t_all:>6.2f}")  # fmt: skip
    print("  goals: max-min under 1 ms at B = 256 and 50 ms at B = 65,536, within 2x of all-active at every size")


def main() -> None:
    rng = np.random.default_rng(0)
    allocation_rules(rng)
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
