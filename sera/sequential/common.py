"""What the sequential allocators share: their settings (`SequentialSettings`), the two callbacks the step loops
talk to the model through (`Draw`, `NextPrompts`) and one step's outcome (`StepResult`). Pure numpy.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Literal

import numpy as np

Draw = Callable[[np.ndarray, np.ndarray], np.ndarray]  # (prompt_ids (G,), counts (G,)) -> rewards (sum counts,)
NextPrompts = Callable[[int], np.ndarray]  # k -> up to k fresh prompt ids; fewer once the stream is exhausted


PRIORS = ("flat", "population", "history")  # SARA's prior over a prompt's pass rate (docs/design.md section 4)
PRIOR_CLIP = (0.05, 50.0)  # the fitted a0, b0 are each clipped to this range


@dataclasses.dataclass(frozen=True)
class SequentialSettings:
    """Settings of the sequential allocators, SARA, DS and DPS (docs/design.md section 4; SARA's are derived from its
    abstract, every threshold a setting). `method.sequential` of a run config; configs/method/common.yaml holds the
    same defaults (a test checks that they agree)."""

    k0: int = 2  # SARA: rollouts in a fresh prompt's first probe
    k_min: int = 2  # SARA: never abandon a group with fewer rollouts than this
    chunk: int = 2  # SARA: rollouts per further probe of an undecided group (the design's delta)
    tau_lo: float = 0.45  # SARA: abandon when E_j <= tau_lo
    tau_hi: float = 0.95  # SARA: commit when E_j >= tau_hi (always once mixed)
    prior: Literal["flat", "population", "history"] = "population"  # SARA: Beta prior over each prompt's pass rate
    a0: float = 1.0  # SARA: the flat prior Beta(a0, b0); also the population prior until the first step's probes
    b0: float = 1.0
    window: int = 20  # SARA, population prior: fitted to the probes of the last `window` steps
    history_decay: float = 0.7  # SARA, history prior: lam, the weight of a prompt's past counts at each later visit
    max_waves: int = 16  # SARA: cap on waves per step (paper silent); an all-saturated stream stops here
    mode: Literal["fill", "budget"] = "fill"  # SARA: until B groups are committed, or until the budget is spent
    gen_batch: int | None = None  # DS: prompts a generation round (None = B)
    max_rounds: int = 10  # DS: cap on generation rounds a step (verl's default)
    dps_ratio: int = 8  # DPS: candidate pool of dps_ratio * B prompts
    dps_decay: float = 0.5  # DPS: lam (0.7 for MATH-like sets)

    def __post_init__(self):
        if self.k0 < 1 or self.chunk < 1 or self.k_min < 1:
            raise ValueError(f"need k0, chunk, k_min >= 1, got {self.k0}, {self.chunk}, {self.k_min}")
        if not 0 <= self.tau_lo < self.tau_hi <= 1:
            raise ValueError(f"need 0 <= tau_lo < tau_hi <= 1, got tau_lo={self.tau_lo}, tau_hi={self.tau_hi}")
        if self.a0 <= 0 or self.b0 <= 0:
            raise ValueError(f"the Beta prior needs a0, b0 > 0, got {self.a0}, {self.b0}")
        if self.prior not in PRIORS:
            raise ValueError(f"prior must be one of {PRIORS}, got {self.prior!r}")
        if self.prior != "flat" and self.k0 < 2:
            raise ValueError(f"prior={self.prior} fits the spread of the k0-rollout probes: it needs k0 >= 2, got 1")
        if self.window < 1 or not 0 <= self.history_decay <= 1:
            raise ValueError(f"need window >= 1 and history_decay in [0, 1], got {self.window}, {self.history_decay}")
        if self.max_waves < 1 or self.max_rounds < 1 or self.dps_ratio < 1:
            raise ValueError(f"need max_waves, max_rounds, dps_ratio >= 1, got {self.max_waves, self.max_rounds}, "
                             f"{self.dps_ratio}")  # fmt: skip
        if self.mode not in ("fill", "budget"):
            raise ValueError(f"mode must be 'fill' or 'budget', got {self.mode!r}")
        if not 0 <= self.dps_decay <= 1 or (self.gen_batch is not None and self.gen_batch < 1):
            raise ValueError(f"need dps_decay in [0, 1] and gen_batch >= 1 or None, got {self.dps_decay}, "
                             f"{self.gen_batch}")  # fmt: skip

    def changes(self, reads) -> dict:
        """{setting: value} of the settings in `reads` (those an allocator reads) that differ from the defaults, in
        field order: what names a run (MethodSettings.variant) and a table row (paper_figures.sara)."""
        default = SequentialSettings()
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.name in reads and getattr(self, f.name) != getattr(default, f.name)
        }


# ----------------------------------------------------------------------------------------------------------------------
# One step's outcome, shared by SARA and DS


@dataclasses.dataclass(frozen=True, eq=False)
class StepResult:
    """The groups to train on, as a ragged (rewards, counts) batch, and the step's accounting.

    Every drawn group ends in exactly one of: committed (trained), abandoned (dropped by the method's rule: SARA's
    E_j <= tau_lo, DS's all-equal filter; recorded per group so a caller with exact p can score the decision), or
    discarded (SARA: undecided at the wave cap; DS: a kept group beyond the first batch_size). rollouts_generated
    counts every rollout drawn, probes and dropped groups included. The drawn_* arrays hold every group drawn, in the
    order it was first drawn, whatever became of it (what SARA's prior and DPS's predictor observe).
    """

    prompt_ids: np.ndarray  # (C,) int64, committed prompts in commit order
    counts: np.ndarray  # (C,) int64 rollouts of each committed group
    rewards: np.ndarray  # (sum counts,) float64, grouped by prompt, each group in draw order (probes first)
    rollouts_generated: int
    rollouts_trained: int
    groups_committed: int
    groups_abandoned: int
    groups_discarded: int
    prompts_drawn: int
    waves: int  # SARA waves, DS generation rounds
    hit_wave_cap: bool  # the cap stopped the step while work remained (undecided groups or a shortfall)
    shortfall: int  # batch_size minus groups committed in fill mode and DS (0 in budget mode)
    abandoned_ids: np.ndarray  # (A,) int64
    abandoned_successes: np.ndarray  # (A,) int64 successes among the abandoned group's rollouts
    abandoned_failures: np.ndarray  # (A,) int64
    drawn_ids: np.ndarray  # (G,) int64, every group drawn
    drawn_successes: np.ndarray  # (G,) int64 over all its rollouts drawn in this step
    drawn_failures: np.ndarray  # (G,) int64
    probe_successes: np.ndarray | None = None  # (G,) int64 SARA: successes among the group's first k0 rollouts
    decisions: np.ndarray | None = None  # (3, n + 1) int64 SARA: verdicts (SaraAction rows) by rollouts drawn j

    @property
    def successes(self) -> np.ndarray:
        """(C,) successes K_i per committed group (with complete_committed=False: the SARA+SERA pilot outcome)."""
        return np.bincount(np.repeat(np.arange(self.counts.size), self.counts), self.rewards, self.counts.size)

    @property
    def effective_groups(self) -> int:
        """Committed groups with mixed outcomes, 0 < K < n_i."""
        k = self.successes
        return int(np.sum((k > 0) & (k < self.counts)))


def _draw(draw: Draw, prompt_ids: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Call the rollout callback once; its flat binary rewards (sum counts,), grouped by prompt in order, checked."""
    rewards = np.asarray(draw(prompt_ids, counts), dtype=np.float64)
    if rewards.shape != (int(counts.sum()),):
        raise ValueError(f"draw returned {rewards.shape} rewards for counts summing to {int(counts.sum())}")
    if np.any((rewards != 0) & (rewards != 1)):
        raise ValueError("draw must return binary rewards (0 or 1)")
    return rewards


def _next(next_prompts: NextPrompts, k: int) -> np.ndarray:
    ids = np.asarray(next_prompts(k), dtype=np.int64).reshape(-1)
    if ids.size > k:
        raise ValueError(f"next_prompts({k}) returned {ids.size} prompts")
    return ids


def _ints(parts) -> np.ndarray:
    return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, dtype=np.int64)
