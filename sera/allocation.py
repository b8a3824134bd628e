"""Rollout allocators: how a step's budget of R = B * n0 rollouts is split across its B prompts.

Pure numpy (no torch). `uniform` is the baseline, `waterline` is SERA's max-min allocation (docs/design.md
section 2), `dars_hw_extra` is the DARS-HW baseline's second stage (section 4). `scale_factor` is the finite-rollout
attenuation c(p, n) of the MaxRL estimator (section 1) that SERA equalises.
"""

from __future__ import annotations

import numpy as np

_FLOOR_EPS = 1e-9  # floors are taken just below the continuous value so rounding can never overshoot the budget


def scale_factor(p, n, delta: float = 1):
    """Finite-rollout scale factor of the MaxRL estimator: c(p, n) = 1 - (1 - p)^(n - delta).

    E[g] = c(p, n) grad log p (docs/design.md section 1); delta = 1 for the default estimator, 0 when the control
    variate is kept on all-fail groups. Broadcasts p and n; an exponent below zero is treated as zero (c = 0).
    """
    p = np.asarray(p, dtype=np.float64)
    exponent = np.maximum(np.asarray(n, dtype=np.float64) - delta, 0.0)
    with np.errstate(divide="ignore"):  # p = 1: log1p(-1) = -inf, and c = -expm1(-inf) = 1, the right limit
        return -np.expm1(exponent * np.log1p(-p))


def uniform(num_prompts: int, n0: int) -> np.ndarray:
    """Uniform allocation: n_i = n0 for every prompt. Returns an int64 array of shape (num_prompts,)."""
    if num_prompts < 0 or n0 < 1:
        raise ValueError(f"uniform allocation needs num_prompts >= 0 and n0 >= 1, got {num_prompts}, {n0}")
    return np.full(num_prompts, n0, dtype=np.int64)


def _check_waterline_inputs(p_hat: np.ndarray, budget: int, n_min: int, n_max: int, delta: float) -> None:
    if p_hat.ndim != 1 or p_hat.size == 0:
        raise ValueError(f"p_hat must be a non-empty 1-D array, got shape {p_hat.shape}")
    if not np.all((p_hat > 0) & (p_hat < 1)):
        bad = p_hat[~((p_hat > 0) & (p_hat < 1))][:5]
        raise ValueError(f"p_hat must lie strictly inside (0, 1) (clip pilot estimates first); got {bad}")
    if not (1 <= n_min <= n_max):
        raise ValueError(f"need 1 <= n_min <= n_max, got n_min={n_min}, n_max={n_max}")
    if n_min < delta:
        raise ValueError(f"n_min={n_min} is below delta={delta}: the scale factor would be negative")
    num = p_hat.size
    if num * n_min > budget or num * n_max < budget:
        raise ValueError(
            f"infeasible budget: {num} prompts with {n_min} <= n_i <= {n_max} need "
            f"{num * n_min} <= budget <= {num * n_max}, got budget={budget}"
        )


def continuous_waterline(p_hat, budget: int, n_min: int, n_max: int, delta: float = 1):
    """Continuous relaxation of SERA: n_i(lam) = clip(delta + lam / a_i, n_min, n_max), a_i = -log(1 - p_hat_i).

    lam is the root of sum_i n_i(lam) = budget, found exactly: the sum is piecewise linear and nondecreasing in
    lam with breakpoints (n_min - delta) a_i and (n_max - delta) a_i, so it is evaluated at all sorted breakpoints
    and the crossing segment is solved linearly. Where the sum is flat at the budget (every prompt clipped), the
    smallest root is taken. Returns (n_cont (B,), lam). O(B log B). docs/design.md section 2.
    """
    p_hat = np.asarray(p_hat, dtype=np.float64)
    _check_waterline_inputs(p_hat, budget, n_min, n_max, delta)
    a = -np.log1p(-p_hat)  # (B,)
    inv_a = 1.0 / a
    order = np.argsort(a)  # both breakpoint lists are a times a constant >= 0, so one order sorts both
    lo_sorted = (n_min - delta) * a[order]  # lam below which prompt i sits at n_min
    hi_sorted = (n_max - delta) * a[order]  # lam above which prompt i sits at n_max
    inv_cum = np.concatenate([[0.0], np.cumsum(inv_a[order])])
    num = p_hat.size

    def total(lam):  # sum_i n_i(lam) for an array of lam values
        n_started = np.searchsorted(lo_sorted, lam, side="left")  # lo_i < lam: above n_min
        n_capped = np.searchsorted(hi_sorted, lam, side="right")  # hi_i <= lam: at n_max
        slope = inv_cum[n_started] - inv_cum[n_capped]
        on_line = n_started - n_capped
        return n_min * (num - n_started) + n_max * n_capped + delta * on_line + lam * slope

    points = np.unique(np.concatenate([[0.0], lo_sorted, hi_sorted]))
    sums = total(points)
    # first breakpoint whose sum reaches the budget (the last one, B * n_max, always does up to rounding)
    j = min(int(np.searchsorted(sums, budget, side="left")), points.size - 1)
    if j == 0:
        lam = 0.0
    else:  # no breakpoint inside (points[j-1], points[j]]: the sum is linear there, so interpolate
        left, right = points[j - 1], points[j]
        rise = sums[j] - sums[j - 1]
        lam = float(left + (budget - sums[j - 1]) * (right - left) / rise) if rise > 0 else float(right)
    n_cont = np.clip(delta + lam * inv_a, n_min, n_max)
    return n_cont, lam


def waterline(p_hat, budget: int, n_min: int, n_max: int, delta: float = 1, return_tau: bool = False):
    """SERA's integer allocation: maximise min_i c(p_hat_i, n_i) s.t. sum n_i = budget, n_min <= n_i <= n_max.

    Continuous waterline (`continuous_waterline`), floors, and a greedy that gives one rollout at a time to the
    prompt with the lowest c(p_hat_i, n_i) below n_max until the sum is the budget. Flooring can leave a prompt
    above every optimum, so a second greedy restarts from the smallest allocation reaching the first pass's max-min
    level (a lower bound of every optimum); the greedy from a lower bound is optimal for max-min of separable
    increasing functions (tests compare with brute force). Shapes: p_hat (B,) in (0, 1) -> int64 (B,). With
    return_tau, also returns the continuous waterline level tau = 1 - exp(-lam). docs/design.md section 2.
    Raises ValueError when p_hat is outside (0, 1) or the budget is infeasible.
    """
    p_hat = np.asarray(p_hat, dtype=np.float64)
    n_cont, lam = continuous_waterline(p_hat, budget, n_min, n_max, delta)
    a = -np.log1p(-p_hat)  # c(p, n) = 1 - exp(-a (n - delta)): rank by a (n - delta), which does not saturate at 1
    # A feasible start: floors of the continuous solution (prompts clipped at n_max stay there), then the greedy.
    floors = np.where(n_cont >= n_max, n_max, np.maximum(np.floor(n_cont - _FLOOR_EPS), n_min)).astype(np.int64)
    first = _greedy_fill(a, floors, budget, n_max, delta)
    # Floors can sit above the optimum for some prompts, so restart the greedy from the smallest allocation that
    # reaches the first pass's max-min level L0: every optimal allocation is at least that large, and the greedy
    # from any such lower bound is optimal (it continues the greedy from n_min).
    level = float(np.min(a * np.maximum(first - delta, 0)))
    start = np.clip(np.ceil(delta + level / a - 1e-7), n_min, n_max).astype(np.int64)
    n = _greedy_fill(a, start, budget, n_max, delta)
    if return_tau:
        return n, float(-np.expm1(-lam))
    return n


def dars_hw_extra(accuracy, n0: int, n_max: int) -> np.ndarray:
    """DARS-HW stage 2: extra rollouts ceil(n0 / (2 a) - n0) per prompt, 0 when a >= 0.5, capped at n_max - n0.

    accuracy (B,) is the stage-1 success rate from n0 rollouts; a = 0 is replaced by 1 / (2 n0). DARS adds rollouts
    rather than redistributing them, so its budget exceeds B * n0 (report it). docs/design.md section 4.
    """
    a = np.asarray(accuracy, dtype=np.float64)
    if np.any((a < 0) | (a > 1)):
        raise ValueError("accuracy must lie in [0, 1]")
    if n_max < n0:
        raise ValueError(f"n_max={n_max} must be at least n0={n0}")
    a = np.where(a == 0, 1.0 / (2 * n0), a)
    extra = np.ceil(n0 / (2 * a) - n0 - _FLOOR_EPS)
    return np.clip(extra, 0, n_max - n0).astype(np.int64)


def _greedy_fill(a: np.ndarray, start: np.ndarray, budget: int, n_max: int, delta: float) -> np.ndarray:
    """From `start` (sum <= budget), give one rollout at a time to the prompt with the lowest a (n - delta) (the
    lowest scale factor) among those below n_max, until the sum is the budget.

    Batched: the k lowest values v_1 <= ... <= v_k (k = rollouts left) are handed out in one round up to the first L
    with v_L > min(u_1..u_L), u_j = the value after the +1: exactly the one-at-a-time greedy's first L picks.
    """
    n = start.copy()
    deficit = int(budget - n.sum())
    while deficit > 0:
        cand = np.flatnonzero(n < n_max)
        v = a[cand] * np.maximum(n[cand] - delta, 0)
        k = min(deficit, cand.size)
        low = np.argpartition(v, k - 1)[:k] if k < cand.size else np.arange(cand.size)
        order = low[np.argsort(v[low], kind="stable")]
        after = np.minimum.accumulate(v[order] + a[cand[order]])
        ok = v[order] <= after
        take = k if ok.all() else max(1, int(np.argmin(ok)))
        n[cand[order[:take]]] += 1
        deficit -= take
    return n
