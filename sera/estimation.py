"""Estimating each prompt's success probability p_hat before allocating rollouts (docs/design.md section 3).

Pure numpy (no torch). Pilot estimates come from the first m rollouts of the step (which are reused inside the
budget); the historical estimate is the prompt's success rate the last time it was trained on.
"""

from __future__ import annotations

import numpy as np

P_LO, P_HI = 1 / 16, 15 / 16  # the paper's clipping range for m = 8 pilots


def pilot_p_hat(successes, m: int, lo: float = P_LO, hi: float = P_HI) -> np.ndarray:
    """Pilot estimate p_hat = clip(K_pilot / m, lo, hi). successes (B,) counts in [0, m]. docs/design.md section 3."""
    successes = np.asarray(successes, dtype=np.float64)
    if m < 1:
        raise ValueError(f"pilot size m must be >= 1, got {m} (m = 0 means the historical estimator)")
    if np.any((successes < 0) | (successes > m)):
        raise ValueError(f"pilot successes must lie in [0, m={m}]")
    if not 0 < lo <= hi < 1:
        raise ValueError(f"need 0 < lo <= hi < 1, got lo={lo}, hi={hi}")
    return np.clip(successes / m, lo, hi)


class HistoricalEstimator:
    """Historical estimate (m = 0): p_hat = the prompt's success rate the last time it was trained on, clipped.

    Prompts never seen fall back to the clipped running mean success rate of all rollouts seen so far. Before any
    rollout there is no estimate at all (`has_data` is False): callers allocate that first step uniformly, which is
    what the waterline gives for equal p_hat anyway, rather than pretend to know a prior. Prompts are integer ids in
    [0, num_prompts). The only stateful piece of the math modules: its state is two arrays and two counters, saved
    with `state_dict` for resume. docs/design.md section 3.
    """

    def __init__(self, num_prompts: int, lo: float = P_LO, hi: float = P_HI, prior: float = 0.5):
        if not 0 < lo <= hi < 1:
            raise ValueError(f"need 0 < lo <= hi < 1, got lo={lo}, hi={hi}")
        self.lo, self.hi, self.prior = lo, hi, prior
        self.last_rate = np.full(num_prompts, np.nan)  # NaN = never trained on
        self.total_successes = 0.0
        self.total_rollouts = 0

    @property
    def has_data(self) -> bool:
        """Whether any rollout has been recorded (before that, `estimate` only returns the prior)."""
        return self.total_rollouts > 0

    def fallback(self) -> float:
        """The clipped running mean success rate (prior before any data)."""
        mean = self.total_successes / self.total_rollouts if self.total_rollouts else self.prior
        return float(np.clip(mean, self.lo, self.hi))

    def estimate(self, ids) -> np.ndarray:
        """p_hat (B,) for prompt ids (B,)."""
        rate = self.last_rate[np.asarray(ids)]
        return np.clip(np.where(np.isnan(rate), self.fallback(), rate), self.lo, self.hi)

    def update(self, ids, successes, counts) -> None:
        """Record the step's outcome: successes (B,) out of counts (B,) rollouts for prompt ids (B,)."""
        successes = np.asarray(successes, dtype=np.float64)
        counts = np.asarray(counts)
        self.last_rate[np.asarray(ids)] = successes / counts
        self.total_successes += float(successes.sum())
        self.total_rollouts += int(counts.sum())

    def state_dict(self) -> dict:
        return {"last_rate": self.last_rate.copy(), "total": (self.total_successes, self.total_rollouts)}

    def load_state_dict(self, state: dict) -> None:
        self.last_rate = np.asarray(state["last_rate"], dtype=np.float64).copy()
        self.total_successes, self.total_rollouts = state["total"]
