"""Per-rollout advantages for ragged groups of binary rewards (shared/DESIGN.md sections 1 and 4).

Pure numpy (no torch). A step's rollouts come as `(rewards, counts)`: rewards (N,) flat, prompt i owning the next
counts[i] entries, N = sum(counts). Every function returns flat advantages (N,). The loss averages over rollouts,
so a prompt's gradient estimate is (1 / n_i) sum_j A_ij grad log pi(y_ij | x_i).
"""

from __future__ import annotations

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


def group_mean(rewards, counts) -> np.ndarray:
    """Per-prompt mean reward (B,)."""
    _, counts, _, sums = _groups(rewards, counts)
    return sums / counts


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
    """MaxRL: A_j = (r_j - mean) / mean = n r_j / K - 1, so g = sum_j (r_j / K - 1/n) S_j (DESIGN section 1).

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
    """PKPO pass@k transform for binary rewards, then a leave-one-out baseline (DESIGN section 4).

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
    """SERA's multiplicity correction: per-rollout weights w = n0 / n_i (N,) (DESIGN section 2).

    Averaging the loss over all R rollouts weights prompt i by n_i / n0; w undoes that, so every prompt keeps the
    weight it would have under uniform allocation and E[step gradient] = (1/B) sum_i c(p_i, n_i) grad log p_i.
    """
    counts = np.asarray(counts, dtype=np.int64)
    if np.any(counts < 1):
        raise ValueError("counts must be positive")
    return np.repeat(n0 / counts, counts)
