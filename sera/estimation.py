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


def outcomes(ids, successes, counts) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A step's outcomes for a history: one prompt id, success count and rollout count per group trained on. Raises
    ValueError when their lengths differ (numpy would broadcast a single group's outcome over every id)."""
    ids, successes, counts = np.asarray(ids), np.asarray(successes), np.asarray(counts)
    if not ids.ndim == successes.ndim == counts.ndim == 1 or not ids.size == successes.size == counts.size:
        raise ValueError(f"one prompt id per group: got ids {ids.shape}, successes {successes.shape}, counts "
                         f"{counts.shape}")  # fmt: skip
    return ids, successes, counts


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
        ids, successes, counts = outcomes(ids, successes, counts)
        successes = successes.astype(np.float64)
        self.last_rate[ids] = successes / counts
        self.total_successes += float(successes.sum())
        self.total_rollouts += int(counts.sum())

    def state_dict(self) -> dict:
        return {"last_rate": self.last_rate.copy(), "total": (self.total_successes, self.total_rollouts)}

    def load_state_dict(self, state: dict) -> None:
        self.last_rate = np.asarray(state["last_rate"], dtype=np.float64).copy()
        self.total_successes, self.total_rollouts = state["total"]


def epoch_of_step(step: int, batch_size: int, num_prompts: int) -> int:
    """The epoch a step belongs to in a training set read in epochs, B prompts a step: its first prompt's
    (position step * B), so where N is not a multiple of B the one step that runs into the next epoch still belongs to
    the ending one (docs/design.md section 3)."""
    return step * batch_size // num_prompts


def epoch_stream_ids(step: int, batch_size: int, start: int, count: int, num_prompts: int, permutation) -> np.ndarray:
    """Prompts start .. start + count - 1 of step `step` (fewer past N) in a training set read in epochs: the stream
    is the concatenation of per-epoch permutations (`permutation(epoch)`, an array of the N ids), and step t's prompts
    start at position t * B, so successive steps tile it and every prompt is seen once an epoch."""
    position = step * batch_size + np.arange(start, min(start + count, num_prompts))
    epoch, index = np.divmod(position, num_prompts)
    return np.array([permutation(int(e))[i] for e, i in zip(epoch, index, strict=True)])


class BetaHistory:
    """The authors' historical estimate (ChenZihao0121/SERA, HistoricalSuccessEstimator; the paper's Appendix C.1):
    each prompt's posterior mean under a Beta(prior_alpha, prior_beta) prior, over the outcomes of its past epochs.

    At each epoch boundary (`start_epoch`) a prompt's evidence is discounted and the epoch just ended is added once,
    successes <- discount * successes + K and failures <- discount * failures + (N - K), and the posterior mean
    (prior_alpha + successes) / (prior_alpha + prior_beta + successes + failures) is frozen for the whole epoch that
    starts: outcomes recorded during an epoch (`update`) wait for the next boundary, so no step sees its own epoch.
    A prompt never trained on has no estimate (NaN), and the rule that reads it allocates a batch holding such a
    prompt uniformly (`needs_uniform`), so the whole first epoch is plain MaxRL. Prompts absent from an epoch keep
    their evidence, discounted. Prompts are integer ids in [0, num_prompts); the state is arrays, saved with
    `state_dict` for resume. Checked against the authors' code in tests/test_authors_rule.py. docs/design.md 3b.
    """

    def __init__(self, num_prompts: int, prior_alpha: float = 0.5, prior_beta: float = 0.5, discount: float = 0.75):
        if not (prior_alpha > 0 and prior_beta > 0 and np.isfinite(prior_alpha) and np.isfinite(prior_beta)):
            raise ValueError(f"the Beta prior needs positive finite parameters, got {prior_alpha}, {prior_beta}")
        if not 0.0 <= discount <= 1.0:
            raise ValueError(f"discount must lie in [0, 1], got {discount}")
        if num_prompts < 1:
            raise ValueError(f"num_prompts must be >= 1, got {num_prompts}")
        self.prior_alpha, self.prior_beta, self.discount = float(prior_alpha), float(prior_beta), float(discount)
        self.epoch = -1  # the epoch under way; -1 before the first start_epoch
        self.successes = np.zeros(num_prompts)  # discounted evidence of the epochs before the current one
        self.failures = np.zeros(num_prompts)
        self.pending_successes = np.zeros(num_prompts, dtype=np.int64)  # the current epoch's outcomes
        self.pending_failures = np.zeros(num_prompts, dtype=np.int64)
        self.frozen = np.full(num_prompts, np.nan)  # the posterior means this epoch reads; NaN = no estimate
        self.frozen_count = np.zeros(num_prompts)  # the effective number of outcomes behind each

    def start_epoch(self) -> int:
        """Fold the epoch just ended into the evidence and freeze the next epoch's estimates; returns its index."""
        if self.epoch >= 0:
            seen = ~np.isnan(self.frozen) | (self.pending_successes + self.pending_failures > 0)
            self.successes = np.where(seen, self.discount * self.successes + self.pending_successes, 0.0)
            self.failures = np.where(seen, self.discount * self.failures + self.pending_failures, 0.0)
            count = self.successes + self.failures
            mean = (self.prior_alpha + self.successes) / (self.prior_alpha + self.prior_beta + count)
            self.frozen = np.where(seen, mean, np.nan)
            self.frozen_count = np.where(seen, count, 0.0)
            self.pending_successes[:] = 0
            self.pending_failures[:] = 0
        self.epoch += 1
        return self.epoch

    def advance_to(self, epoch: int) -> None:
        """Start epochs until `epoch` is under way (none when it already is): the loops call it before each batch."""
        while self.epoch < epoch:
            self.start_epoch()

    def estimate(self, ids) -> np.ndarray:
        """The frozen posterior means (B,) for prompt ids (B,); NaN for a prompt with no estimate yet."""
        return self.frozen[np.asarray(ids)].copy()

    def never_solved(self, ids) -> np.ndarray:
        """(B,) True for the prompt ids (B,) that have an estimate and no success in their history: the prompts the
        rule reads from failures and the prior alone (a Beta mean near 0, never 0). What exploratory analysis E2
        counts (results/cpu/PREREGISTRATION_AUTHORS.md); the current epoch's outcomes wait for the next boundary, as
        the estimates do."""
        ids = np.asarray(ids)
        return ~np.isnan(self.frozen[ids]) & (self.successes[ids] == 0)

    @staticmethod
    def needs_uniform(p_hat) -> bool:
        """The authors' cold-start rule: a batch with any prompt lacking an estimate is allocated uniformly."""
        return bool(np.isnan(np.asarray(p_hat, dtype=np.float64)).any())

    def update(self, ids, successes, counts) -> None:
        """Record outcomes for the next boundary: successes (B,) out of counts (B,) rollouts of prompt ids (B,)."""
        if self.epoch < 0:
            raise RuntimeError("BetaHistory.start_epoch must be called before the first update")
        ids, successes, counts = outcomes(ids, successes, counts)
        if np.any(successes < 0) or np.any(successes > counts):
            raise ValueError("successes must lie in [0, counts]")
        np.add.at(self.pending_successes, ids, successes.astype(np.int64))
        np.add.at(self.pending_failures, ids, (counts - successes).astype(np.int64))

    def state_dict(self) -> dict:
        keys = ("successes", "failures", "pending_successes", "pending_failures", "frozen", "frozen_count")
        return {"epoch": self.epoch, "prior": (self.prior_alpha, self.prior_beta, self.discount),
                **{key: getattr(self, key).copy() for key in keys}}  # fmt: skip

    def load_state_dict(self, state: dict) -> None:
        if tuple(state["prior"]) != (self.prior_alpha, self.prior_beta, self.discount):
            raise ValueError(f"the checkpoint's Beta history has prior and discount {tuple(state['prior'])}, "
                             f"this run {(self.prior_alpha, self.prior_beta, self.discount)}")  # fmt: skip
        if np.asarray(state["frozen"]).shape != self.frozen.shape:
            raise ValueError(f"the checkpoint's Beta history covers {np.asarray(state['frozen']).size} prompts, "
                             f"this run {self.frozen.size}")  # fmt: skip
        self.epoch = int(state["epoch"])
        for key in ("successes", "failures", "frozen", "frozen_count"):
            setattr(self, key, np.asarray(state[key], dtype=np.float64).copy())
        for key in ("pending_successes", "pending_failures"):
            setattr(self, key, np.asarray(state[key], dtype=np.int64).copy())
