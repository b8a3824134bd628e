"""The unbiased pass@k estimator (docs/design.md section 7). Pure numpy (no torch)."""

from __future__ import annotations

import numpy as np


def pass_at_k(n, c, k):
    """Unbiased pass@k from n samples with c correct: 1 - C(n - c, k) / C(n, k).

    The ratio is the product over i = n - c + 1 .. n of (1 - k / i), summed in log space from a per-k cumulative
    table, so it stays stable for n in the thousands. n and c broadcast to shape (Q,) (or are scalars); k is a
    scalar or (K,). Returns (Q,) for scalar k, (Q, K) otherwise. Needs 0 <= c <= n and 1 <= k <= n.
    """
    n_arr, c_arr = np.broadcast_arrays(np.asarray(n, dtype=np.int64), np.asarray(c, dtype=np.int64))
    k_arr = np.atleast_1d(np.asarray(k, dtype=np.int64))
    if np.any((c_arr < 0) | (c_arr > n_arr)):
        raise ValueError("pass_at_k needs 0 <= c <= n")
    if np.any(k_arr < 1) or (n_arr.size and np.any(k_arr > n_arr.min())):
        raise ValueError(f"pass_at_k needs 1 <= k <= n; got k up to {k_arr.max()} with n down to {n_arr.min()}")
    i = np.arange(1, int(n_arr.max(initial=1)) + 1, dtype=np.float64)  # (n_max,)
    ratio = np.minimum(k_arr[:, None] / i[None, :], 1.0)  # terms with i <= k are never used: zero them
    terms = np.where(i[None, :] > k_arr[:, None], np.log1p(-np.where(ratio < 1, ratio, 0.0)), 0.0)  # (K, n_max)
    cum = np.concatenate([np.zeros((k_arr.size, 1)), np.cumsum(terms, axis=1)], axis=1)  # (K, n_max + 1)
    lower = (n_arr - c_arr)[..., None]  # (Q, 1)
    log_ratio = cum[np.arange(k_arr.size), n_arr[..., None]] - cum[np.arange(k_arr.size), lower]  # (Q, K)
    out = np.where(lower >= k_arr, 0.0 - np.expm1(log_ratio), 1.0)
    return out[..., 0] if np.ndim(k) == 0 else out
