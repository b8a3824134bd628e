"""Confidence intervals for method differences (docs/design.md section 7): the question-paired bootstrap and the
seed-level t-interval. Pure numpy (scipy for the t quantile; no torch)."""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

import numpy as np


class BootstrapCI(NamedTuple):
    delta: np.ndarray | float  # observed mean(a - b)
    low: np.ndarray | float
    high: np.ndarray | float


def paired_bootstrap_ci(a, b, num_resamples: int = 10000, level: float = 0.95, seed: int = 0) -> BootstrapCI:
    """Percentile CI of mean(a - b), resampling question indices with replacement (the same for a and b).

    a, b: per-question scores, (Q,) or (Q, K) with one column per k. A resample of Q indices is drawn as
    multinomial counts over the questions, so all resample means are one (R, Q) @ (Q, K) product.
    Returns BootstrapCI(delta, low, high), scalars for 1-D input and (K,) arrays for 2-D.
    """
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape or a.ndim not in (1, 2) or a.shape[0] == 0:
        raise ValueError(f"a and b must have the same shape (Q,) or (Q, K) with Q > 0; got {a.shape}, {b.shape}")
    if not 0 < level < 1:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    diff = (a - b).reshape(a.shape[0], -1)  # (Q, K)
    q = diff.shape[0]
    means = resample_counts(q, num_resamples, seed) @ diff / q  # (R, K)
    alpha = (1 - level) / 2
    low, high = np.quantile(means, [alpha, 1 - alpha], axis=0)
    delta = diff.mean(axis=0)
    if a.ndim == 1:
        return BootstrapCI(float(delta[0]), float(low[0]), float(high[0]))
    return BootstrapCI(delta, low, high)


@lru_cache(maxsize=4)
def resample_counts(q: int, num_resamples: int, seed: int) -> np.ndarray:
    """The (R, Q) multinomial counts of `paired_bootstrap_ci`'s resamples, which depend only on (Q, R, seed): drawn
    once and reused by every comparison over the same questions (a table calls it once per row pair and K; drawing
    dominated the table build, 5 s each at Q = 5000). Stored in the smallest unsigned type that holds Q (the same
    integers, so the same means to the last bit) and read-only."""
    rng = np.random.default_rng(seed)
    counts = rng.multinomial(q, np.full(q, 1.0 / q), size=num_resamples).astype(np.min_scalar_type(q))
    counts.flags.writeable = False
    return counts


def seed_t_interval(diffs, level: float = 0.95) -> BootstrapCI:
    """Seed-level interval of a mean difference: mean +- t_{(1+level)/2, S-1} * sd / sqrt(S) over the S seeds.

    diffs: (S,) or (S, K) per-seed differences (e.g. each seed's SERA minus MaxRL Pass@k, averaged over questions);
    seeds, not questions, are the unit, so this covers training randomness, which the question-paired bootstrap does
    not. Returns BootstrapCI(mean, low, high); low and high are NaN with fewer than two seeds.
    """
    from scipy.stats import t

    d = np.asarray(diffs, dtype=np.float64)
    if d.ndim not in (1, 2) or d.shape[0] == 0:
        raise ValueError(f"diffs must be (S,) or (S, K) with S > 0; got {d.shape}")
    if not 0 < level < 1:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    s = d.shape[0]
    mean = d.mean(axis=0)
    if s < 2:
        half = np.full_like(mean, np.nan)
    else:
        half = t.ppf((1 + level) / 2, s - 1) * d.std(axis=0, ddof=1) / np.sqrt(s)
    if d.ndim == 1:
        return BootstrapCI(float(mean), float(mean - half), float(mean + half))
    return BootstrapCI(mean, mean - half, mean + half)


def paired_t_power(effect: float, sd: float, seeds: int, level: float = 0.95) -> float:
    """Power of the seed-level two-sided t-test (`seed_t_interval` excluding zero) at `seeds` seeds, when the per-seed
    differences have mean `effect` and standard deviation `sd`: P(|T| > t_{(1+level)/2, S-1}) under the noncentral
    t with S - 1 degrees of freedom and noncentrality effect * sqrt(S) / sd."""
    from scipy.stats import nct, t

    if seeds < 2 or not sd > 0 or not np.isfinite(effect):
        raise ValueError(f"power needs seeds >= 2, sd > 0 and a finite effect; got {seeds}, {sd}, {effect}")
    df, noncentrality = seeds - 1, effect * np.sqrt(seeds) / sd
    critical = t.ppf((1 + level) / 2, df)
    # the lower tail as the upper tail of the mirrored distribution: scipy's nct.cdf far in the tail returns NaN
    return float(nct.sf(critical, df, noncentrality) + nct.sf(critical, df, -noncentrality))


def seeds_for_power(effect: float, sd: float, power: float = 0.8, level: float = 0.95, cap: int = 1000) -> int | None:
    """The fewest seeds (>= 2) at which `paired_t_power` reaches `power`; None when not even `cap` seeds do."""
    if not 0 < power < 1:
        raise ValueError(f"power must lie in (0, 1), got {power}")
    for seeds in range(2, cap + 1):
        if paired_t_power(effect, sd, seeds, level) >= power:
            return seeds
    return None


def tost_power(
    difference: float, sd: float, seeds: int, margin: float, level: float = 0.90, draws: int = 200_000, seed: int = 0
) -> float:
    """Power of the two one-sided tests for equivalence within +/- `margin`: P(the seed-level `level` t-interval lies
    inside (-margin, margin)) when the per-seed differences are normal with mean `difference` and SD `sd`. By Monte
    Carlo over the sample mean and SD (independent for normal data), seeded, so the same call gives the same value."""
    from scipy.stats import t

    if seeds < 2 or not sd > 0 or not margin > 0:
        raise ValueError(f"power needs seeds >= 2, sd > 0 and margin > 0; got {seeds}, {sd}, {margin}")
    rng = np.random.default_rng(seed)
    mean = rng.normal(difference, sd / np.sqrt(seeds), draws)
    sample_sd = sd * np.sqrt(rng.chisquare(seeds - 1, draws) / (seeds - 1))
    half = t.ppf((1 + level) / 2, seeds - 1) * sample_sd / np.sqrt(seeds)
    return float(np.mean((mean - half > -margin) & (mean + half < margin)))


def seeds_for_equivalence(
    difference: float, sd: float, margin: float, power: float = 0.8, cap: int = 200
) -> int | None:
    """The fewest seeds (>= 2) at which `tost_power` reaches `power`; None when not even `cap` seeds do (a true
    difference at or beyond the margin never does)."""
    if not 0 < power < 1:
        raise ValueError(f"power must lie in (0, 1), got {power}")
    if abs(difference) >= margin:
        return None
    for seeds in range(2, cap + 1):
        if tost_power(difference, sd, seeds, margin) >= power:
            return seeds
    return None
