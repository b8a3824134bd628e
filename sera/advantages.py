"""Per-rollout advantages for ragged groups of binary rewards (docs/design.md sections 1 and 4).

Pure numpy (no torch). A step's rollouts come as `(rewards, counts)`: rewards (N,) flat, prompt i owning the next
counts[i] entries, N = sum(counts). Every function returns flat advantages (N,). The loss averages over rollouts,
so a prompt's gradient estimate is (1 / n_i) sum_j A_ij grad log pi(y_ij | x_i).
"""

from __future__ import annotations

import functools

import numpy as np
from scipy.special import gammaln

GRPO_EPS = 1e-6


def _groups(rewards, counts):
    """Validated (rewards (N,), counts (B,), group id of each rollout (N,), per-group sum (B,))."""
    rewards = np.asarray(rewards, dtype=np.float64)
    counts = np.asarray(counts, dtype=np.int64)
    if counts.ndim != 1 or np.any(counts < 1):
        raise ValueError("counts must be a 1-D array of positive rollout counts")
    if rewards.shape != (int(counts.sum()),):
        raise ValueError(f"rewards has shape {rewards.shape}, but counts sum to {int(counts.sum())}")
    gid = np.repeat(np.arange(counts.size), counts)
    return rewards, counts, gid, np.bincount(gid, weights=rewards, minlength=counts.size)


def grpo(rewards, counts) -> np.ndarray:
    """GRPO: A = (r - mean) / (std + 1e-6) per group, with the sample std (ddof = 1; 0 for a group of one)."""
    rewards, counts, gid, sums = _groups(rewards, counts)
    mean = (sums / counts)[gid]
    sq = np.bincount(gid, weights=(rewards - mean) ** 2, minlength=counts.size)
    std = np.sqrt(sq / np.maximum(counts - 1, 1))
    return (rewards - mean) / (std[gid] + GRPO_EPS)


def dr_grpo(rewards, counts) -> np.ndarray:
    """Dr. GRPO: A = r - mean (no std normalisation)."""
    rewards, counts, gid, sums = _groups(rewards, counts)
    return rewards - (sums / counts)[gid]


def rloo(rewards, counts) -> np.ndarray:
    """RLOO: A_j = r_j - mean of the other n - 1 rewards (0 for a group of one)."""
    rewards, counts, gid, sums = _groups(rewards, counts)
    others = np.maximum(counts - 1, 1)[gid]
    return np.where(counts[gid] > 1, rewards - (sums[gid] - rewards) / others, 0.0)


def maxrl(rewards, counts, keep_cv_on_zero: bool = False) -> np.ndarray:
    """MaxRL: A_j = (r_j - mean) / mean = n r_j / K - 1, so g = sum_j (r_j / K - 1/n) S_j (docs/design.md section 1).

    All-fail groups (K = 0) get A = 0 by default: the control variate is dropped with the success term, and
    E[g] = (1 - (1-p)^(n-1)) grad log p (delta = 1). With keep_cv_on_zero they get A = -1, giving
    E[g] = (1 - (1-p)^n) grad log p (delta = 0). All-success groups get A = 0.
    """
    rewards, counts, gid, sums = _groups(rewards, counts)
    mean = (sums / counts)[gid]
    safe = np.where(mean > 0, mean, 1.0)
    on_zero = -1.0 if keep_cv_on_zero else 0.0
    return np.where(mean > 0, (rewards - mean) / safe, on_zero)


def _log_binom(n, k):
    return gammaln(n + 1) - gammaln(k + 1) - gammaln(n - k + 1)


def pkpo(rewards, counts, k: int = 16) -> np.ndarray:
    """PKPO pass@k transform for binary rewards, then a leave-one-out baseline (docs/design.md section 4).

    Correct samples get g = (k / n) C(n - c, k - 1) / C(n - 1, k - 1), incorrect g = 0 (binomials in log space);
    the advantage is g_j minus the mean of the other n - 1 transformed rewards. Needs n_i >= k for every group.
    """
    rewards, counts, gid, sums = _groups(rewards, counts)
    if np.any(counts < k):
        raise ValueError(f"PKPO with k={k} needs at least k rollouts per prompt, got min {counts.min()}")
    n, c = counts[gid].astype(np.float64), sums[gid]
    valid = (rewards > 0) & (n - c >= k - 1)
    log_g = np.log(k / n) + _log_binom(n - c, np.minimum(k - 1, n - c)) - _log_binom(n - 1, k - 1)
    g = np.where(valid, np.exp(np.where(valid, log_g, 0.0)), 0.0)
    return rloo(g, counts)


ADVANTAGES = {"grpo": grpo, "dr_grpo": dr_grpo, "rloo": rloo, "maxrl": maxrl, "pkpo": pkpo}


def multiplicity_weights(counts, n0: int) -> np.ndarray:
    """SERA's multiplicity correction: per-rollout weights w = n0 / n_i (N,) (docs/design.md section 2).

    Averaging the loss over all R rollouts weights prompt i by n_i / n0; w undoes that, so every prompt keeps the
    weight it would have under uniform allocation and E[step gradient] = (1/B) sum_i c(p_i, n_i) grad log p_i.
    """
    counts = np.asarray(counts, dtype=np.int64)
    if np.any(counts < 1):
        raise ValueError("counts must be positive")
    return np.repeat(n0 / counts, counts)


@functools.lru_cache(maxsize=4096)
def _advantage_by_successes(name: str, n: int, kwargs: tuple) -> tuple[np.ndarray, np.ndarray]:
    """(f1, f0), each (n + 1,): the advantage of a success / failure in a group of n with K = 0..n successes."""
    rewards = (np.arange(n)[None, :] < np.arange(n + 1)[:, None]).astype(np.float64)  # (n + 1, n): K ones first
    adv = ADVANTAGES[name](rewards.ravel(), np.full(n + 1, n), **dict(kwargs)).reshape(n + 1, n)
    f1 = np.where(np.arange(n + 1) > 0, adv[:, 0], 0.0)
    f0 = np.where(np.arange(n + 1) < n, adv[:, -1], 0.0)
    return f1, f0


def expected_scale(name: str, p, n, **kwargs) -> np.ndarray:
    """kappa(p, n) with E[(1/n) sum_j A_j grad log pi(y_j)] = kappa grad log p, for any advantage in ADVANTAGES.

    With binary rewards the advantage of a rollout depends only on its reward and the group's success count K, and
    E[S | r = 1] = grad log p, E[S | r = 0] = -p / (1 - p) grad log p, so
    kappa = sum_K Binom(K; n, p) [ (K/n) f1(K) - ((n - K)/n) (p / (1 - p)) f0(K) ]. For MaxRL this is c(p, n);
    for GRPO and the others it is the noise-free scale the classifier study compares against. p (B,), n (B,).
    """
    from scipy.stats import binom

    p = np.clip(np.asarray(p, dtype=np.float64), 0.0, 1 - 1e-12)
    n = np.broadcast_to(np.asarray(n, dtype=np.int64), p.shape)
    kappa = np.empty_like(p)
    for size in np.unique(n):
        rows = n == size
        f1, f0 = _advantage_by_successes(name, int(size), tuple(sorted(kwargs.items())))
        k = np.arange(size + 1)
        pmf = binom.pmf(k[None, :], size, p[rows, None])  # (b, n + 1)
        odds = p[rows, None] / (1 - p[rows, None])
        kappa[rows] = (pmf * (k / size * f1 - (size - k) / size * odds * f0)).sum(axis=1)
    return kappa
