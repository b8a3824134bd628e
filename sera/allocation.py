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

    The allocation the one-rollout-at-a-time greedy gives from n_min: each rollout goes to the prompt with the lowest
    c(p_hat_i, n_i) below n_max. That greedy is optimal for max-min of separable increasing functions (tests compare
    with brute force); it is computed without handing rollouts out one by one (`_maxmin_counts`, O(B log B) whatever
    the distribution of p_hat). Where the budget runs out on a tie (the last rollout handed out and the first one
    left have equal values, as the pilots' discrete p_hat often give), which prompts get the tied rollouts is decided
    as the suite's batched greedy always decided it (`_legacy_greedy`), so every earlier run reruns identically.
    Shapes: p_hat (B,) in (0, 1) -> int64 (B,). With return_tau, also returns the continuous waterline level
    tau = 1 - exp(-lam) (`continuous_waterline`). docs/design.md section 2. Raises ValueError when p_hat is outside
    (0, 1) or the budget is infeasible.
    """
    p_hat = np.asarray(p_hat, dtype=np.float64)
    _check_waterline_inputs(p_hat, budget, n_min, n_max, delta)
    a = -np.log1p(-p_hat)  # c(p, n) = 1 - exp(-a (n - delta)): rank by a (n - delta), which does not saturate at 1
    n = _maxmin_counts(a, int(budget), int(n_min), int(n_max), delta)
    continuous = None  # the continuous solution, computed once when the tie path or tau needs it
    if not _boundary_is_clear(a, n, n_min, n_max, delta):
        continuous = continuous_waterline(p_hat, budget, n_min, n_max, delta)
        n = _legacy_greedy(a, continuous[0], budget, n_min, n_max, delta)
    if return_tau:
        lam = (continuous or continuous_waterline(p_hat, budget, n_min, n_max, delta))[1]
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


def _counts_below(a: np.ndarray, t: float, n_min: int, n_max: int, delta: float) -> np.ndarray:
    """Per prompt, the count once every rollout of value below t is handed out: the smallest k in [n_min, n_max]
    with a_i (k - delta) >= t (n_max when there is none). Rollout k of prompt i (taking it from k to k + 1 rollouts)
    has value a_i (k - delta), its scale factor's exponent; the division only guesses k, and the products decide, so
    the count is exact in the values the greedy compares."""
    with np.errstate(over="ignore", divide="ignore"):
        k = np.clip(np.ceil(delta + t / a), n_min, n_max)
    k -= (k > n_min) & (a * (k - 1 - delta) >= t)
    k += (k < n_max) & (a * (k - delta) < t)
    return k.astype(np.int64)


def _maxmin_counts(a: np.ndarray, budget: int, n_min: int, n_max: int, delta: float) -> np.ndarray:
    """The greedy's allocation from n_min (each rollout to the lowest value a_i (n_i - delta) below n_max, ties to
    the lower index), without the greedy: it hands out the R = budget - B n_min smallest rollout values, ordered by
    (value, index). A bisection on the threshold t (over the bit patterns of nonnegative doubles, so at most 64
    halvings) keeps `_counts_below(t)` summing to at most the budget at lo and at least at hi; prompts whose counts
    agree at lo and hi are settled and leave the search. When the undecided rollouts between lo and hi are few
    (about two a prompt), they are sorted by (value, index) and the first ones the budget still needs are handed out.
    O(B log B): each halving costs the prompts still undecided, and the final sort at most ~2B values."""
    num = a.size
    counts = np.empty(num, dtype=np.int64)
    index = np.arange(num)
    # no rollout's value a_i (k - delta), n_min <= k < n_max, lies below lo or reaches hi
    lo, hi = float(np.min(a) * (n_min - delta)), float(np.max(a) * (n_max - delta))
    k_lo = np.full(num, n_min, dtype=np.int64)
    k_hi = np.full(num, n_max, dtype=np.int64)
    settled = 0  # rollouts of the prompts that left the search
    while True:
        open_ = k_lo < k_hi
        counts[index[~open_]] = k_lo[~open_]
        settled += int(k_lo[~open_].sum())
        a, index, k_lo, k_hi = a[open_], index[open_], k_lo[open_], k_hi[open_]
        lo_bits, hi_bits = np.float64(lo).view(np.int64), np.float64(hi).view(np.int64)
        if int((k_hi - k_lo).sum()) <= 2 * a.size + 64 or hi_bits - lo_bits <= 1:
            break
        mid = float(np.int64((int(lo_bits) + int(hi_bits)) // 2).view(np.float64))
        k_mid = _counts_below(a, mid, n_min, n_max, delta)
        if settled + int(k_mid.sum()) <= budget:
            lo, k_lo = mid, k_mid
        else:
            hi, k_hi = mid, k_mid
    # the rollouts between lo and hi, as (prompt, k) pairs, in (value, index) order
    spans = k_hi - k_lo
    prompt = np.repeat(np.arange(a.size), spans)
    k = k_lo[prompt] + np.arange(prompt.size) - np.repeat(np.cumsum(spans) - spans, spans)
    order = np.lexsort((index[prompt], a[prompt] * (k - delta)))
    need = budget - settled - int(k_lo.sum())
    counts[index] = k_lo + np.bincount(prompt[order[:need]], minlength=a.size)
    return counts


def _boundary_is_clear(a: np.ndarray, n: np.ndarray, n_min: int, n_max: int, delta: float) -> bool:
    """Whether the allocation n's last rollouts are unambiguous: the largest value handed out, a_i (n_i - 1 - delta),
    lies clearly below the smallest value left, a_i (n_i - delta), so every greedy gives this n whatever its order
    among equal values (a relative margin of 1e-12 leaves room for the products' rounding)."""
    given = n > n_min
    left = n < n_max
    if not given.any() or not left.any():
        return True
    return float(np.max(a[given] * (n[given] - 1 - delta))) < float(np.min(a[left] * (n[left] - delta))) * (1 - 1e-12)


def _legacy_greedy(a, n_cont, budget, n_min, n_max, delta) -> np.ndarray:
    """The suite's original integer completion, kept for ties: floors of the continuous waterline, a batched greedy,
    and a second greedy from the smallest allocation reaching the first pass's max-min level. Its order among equal
    values comes from np.argpartition, so only this code reproduces it; it is slow (O(B^2)) only when a wide spread of
    p_hat meets a tie at the end of the budget. n_cont: the continuous waterline's solution."""
    floors = np.where(n_cont >= n_max, n_max, np.maximum(np.floor(n_cont - _FLOOR_EPS), n_min)).astype(np.int64)
    first = _greedy_fill(a, floors, budget, n_max, delta)
    level = float(np.min(a * np.maximum(first - delta, 0)))
    start = np.clip(np.ceil(delta + level / a - 1e-7), n_min, n_max).astype(np.int64)
    return _greedy_fill(a, start, budget, n_max, delta)


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


# The authors' rule (ChenZihao0121/SERA, `allocate_rollouts_from_probabilities` in its default mode): an active set,
# the same continuous waterline on it, and a rounding by squared error. Said again here in the suite's own code;
# tests/test_authors_rule.py checks it against outputs of their published code. docs/design.md section 2b.


def mixed_probability(p, n) -> np.ndarray:
    """P(0 < K < n) for K ~ Binomial(n, p): the chance that a group of n rollouts holds a success and a failure, so
    that its MaxRL advantages are not all zero. Computed as the definition 1 - (1 - p)^n - p^n, clipped to [0, 1] (the
    authors' form: the active set's ranking and threshold then see the same floats as theirs); 0 where n = 0.
    sera.sequential.mixed_probability is the same quantity for a group already partly drawn, subtracting in another
    order, which can differ in the last bit: the authors' rule keeps this one."""
    p = np.asarray(p, dtype=np.float64)
    n = np.broadcast_to(np.asarray(n, dtype=np.int64), p.shape)
    out = np.zeros(p.shape)
    some = n > 0
    out[some] = 1.0 - np.power(1.0 - p[some], n[some]) - np.power(p[some], n[some])
    return np.clip(out, 0.0, 1.0)


def _ordered(x: float) -> int:
    """A double as an integer in the doubles' order (negative ones included): neighbours differ by one."""
    bits = int(np.float64(x).view(np.int64))
    return bits if bits >= 0 else -(bits + 2**63)


def _from_ordered(i: int) -> float:
    return float(np.int64(i if i >= 0 else -i - 2**63).view(np.float64))


def _equalized_level(rate: np.ndarray, budget: int, n_min: int, n_max: int, lam: float) -> float:
    """The continuous level tau of the authors' waterline, n_i = clip(1 + tau / rate_i, n_min, n_max), as their
    bisection in log(tau) finds it: the largest double x in [log((n_min - 1) min rate), log((n_max - 1) max rate)]
    whose sum at tau = exp(x) stays within the budget (the lower end when none does). The exact root lam of the sum
    (`continuous_waterline`) lands within a few doubles of it, so a search outward from log(lam) by doubling steps,
    then halving, finds that double in O(log) sums instead of 100 bisection steps."""
    x_lo = float(np.log((n_min - 1) * np.min(rate))) if n_min > 1 else float(np.log(np.nextafter(0.0, 1.0)))
    x_hi = float(np.log((n_max - 1) * np.max(rate)))
    lo_end, hi_end = _ordered(x_lo), _ordered(x_hi)

    def fits(i: int) -> bool:  # the sum at tau = exp(x) is within the budget, x the double of order i
        return float(np.sum(np.clip(1.0 + float(np.exp(_from_ordered(i))) / rate, n_min, n_max))) <= budget

    start = min(max(_ordered(float(np.log(lam))) if lam > 0 else lo_end, lo_end), hi_end)
    if fits(start):  # find a double above that does not fit (or the upper end), then halve between
        good, step = start, 1
        bad = min(start + step, hi_end)
        while bad < hi_end and fits(bad):
            good, step = bad, step * 2
            bad = min(good + step, hi_end)
        if bad == hi_end and fits(bad):
            return float(np.exp(_from_ordered(bad)))
    else:  # find a double below that fits (or the lower end, which stands even when it does not)
        bad, step = start, 1
        good = max(start - step, lo_end)
        while good > lo_end and not fits(good):
            bad, step = good, step * 2
            good = max(bad - step, lo_end)
        if good == lo_end and not fits(good):
            return float(np.exp(x_lo))
    while bad - good > 1:
        mid = (good + bad) // 2
        good, bad = (mid, bad) if fits(mid) else (good, mid)
    return float(np.exp(_from_ordered(good)))


def _equalized_counts(p: np.ndarray, budget: int, n_min: int, n_max: int) -> np.ndarray:
    """The authors' allocation over the prompts given (all active): the continuous waterline (equal scale factor
    1 - (1 - p)^(n - 1) on the line), floors, and one more rollout each for the prompts below n_max whose squared
    distance from the waterline's factor T = 1 - exp(-tau) shrinks most (or grows least), ties to the lower index,
    until the budget is spent."""
    if budget == p.size * n_min:
        return np.full(p.size, n_min, dtype=np.int64)
    rate = -np.log1p(-p)
    log_fail = np.log1p(-p)
    _, lam = continuous_waterline(p, budget, n_min, n_max, delta=1)
    tau = _equalized_level(rate, budget, n_min, n_max, lam)
    n = np.clip(np.floor(np.clip(1.0 + tau / rate, n_min, n_max)).astype(np.int64), n_min, n_max)
    left = int(budget - n.sum())
    if left:
        cand = np.flatnonzero(n < n_max)
        target = float(-np.expm1(-tau))
        now = (-np.expm1(log_fail[cand] * (n[cand] - 1)) - target) ** 2
        then = (-np.expm1(log_fail[cand] * n[cand]) - target) ** 2
        n[cand[np.lexsort((cand, then - now))[:left]]] += 1
    return n


def active_waterline(p_hat, budget: int, n_min: int, n_max: int, threshold: float = 0.05, exclude=None) -> np.ndarray:
    """SERA as its authors run it: counts (B,) summing to the budget, 0 for a prompt left out of the active set.

    A prompt's score is P(0 < K < n_max), the most learning signal a group can carry under the cap. Prompts are
    ranked by score (ties to the lower index); the active set is the top k, with k the largest that a binary search
    over [ceil(budget / n_max), #(score >= threshold)] finds whose allocation (`_equalized_counts` over the k) keeps
    every active prompt's P(0 < K < n_i) at or above the threshold. When none qualifies, or fewer prompts reach the
    threshold than the budget needs under n_max, the top ceil(budget / n_max) are made active anyway, so the budget is
    spent exactly. threshold = 0 makes every prompt active (the authors' all-active mode). `exclude` (B,) bool, not
    the authors': prompts ranked last and never eligible, made active only where the budget needs them under n_max
    (the sink intervention alloc.never_solved=leave_out, results/cpu/PLAN_SINK.md). Weights: `active_weights`.
    Raises ValueError, naming the value, for p_hat outside (0, 1) or NaN, bad bounds, a threshold outside [0, 1], or
    a budget outside [B n_min, B n_max]. docs/design.md section 2b.
    """
    p = np.asarray(p_hat, dtype=np.float64)
    if not (isinstance(threshold, (int, float)) and 0.0 <= float(threshold) <= 1.0):
        raise ValueError(f"threshold must lie in [0, 1], got {threshold!r}")
    if n_min < 1:
        raise ValueError(f"n_min must be at least 1, got n_min={n_min}")
    if p.ndim == 1 and p.size and np.isnan(p).any():
        raise ValueError(f"p_hat holds NaN at positions {np.flatnonzero(np.isnan(p))[:5].tolist()}")
    _check_waterline_inputs(p, budget, n_min, n_max, 1)
    budget, n_min, n_max = int(budget), int(n_min), int(n_max)
    score = mixed_probability(p, n_max)
    if exclude is not None:
        score = np.where(np.asarray(exclude, dtype=bool), -1.0, score)
    ranked = np.argsort(-score, kind="stable")
    eligible = int(np.sum(score >= threshold))
    required = -(-budget // n_max)

    def allocate(k: int) -> np.ndarray:
        active = np.zeros(p.size, dtype=bool)
        active[ranked[:k]] = True
        counts = np.zeros(p.size, dtype=np.int64)
        counts[active] = _equalized_counts(p[active], budget, n_min, n_max)
        return counts

    if threshold == 0:  # every prompt qualifies, so the search below would end at all B (less those excluded)
        return allocate(p.size if exclude is None else max(required, int(np.sum(score >= 0))))
    best = None
    low, high = required, eligible
    while low <= high:
        k = (low + high) // 2
        counts = allocate(k)
        active = counts > 0
        if np.all(mixed_probability(p[active], counts[active]) >= threshold - 1e-12):
            best, low = counts, k + 1
        else:
            high = k - 1
    return best if best is not None else allocate(required)


def active_weights(counts, n0: int) -> np.ndarray:
    """The authors' per-prompt weights: n0 / n_i for a prompt with rollouts, 0 for one left out (which still counts
    in the loss's B n0 denominator)."""
    counts = np.asarray(counts)
    weights = np.zeros(counts.shape)
    weights[counts > 0] = float(n0) / counts[counts > 0].astype(np.float64)
    return weights
