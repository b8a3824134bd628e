"""One rollout-collection step for every study: estimate p_hat, allocate the budget, draw and score rollouts.

A study supplies a `draw(counts)` callback: "draw counts[i] rollouts of prompt i of this step, return (payload,
rewards)", rewards (sum(counts),) grouped by prompt and scored once, in one batch. A sampler (`SAMPLERS`, keyed by
the method's allocator) calls it once or more - pilots first, then the rest of each group - and returns a
`Collected`: the counts, the rewards grouped by prompt with pilots first, p_hat and tau, the rollouts generated, and
the permutation that puts the concatenated payloads in the same grouped order. A new allocator is one entry of
`SAMPLERS`. Pure numpy; DESIGN.md sections 2-4.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from sera.allocation import dars_hw_extra, uniform, waterline
from sera.estimation import pilot_p_hat
from sera.methods import MethodSettings

DrawFn = Callable[[np.ndarray], tuple[Any, np.ndarray]]  # counts (B,) -> (payload, rewards (sum counts,))


@dataclass
class Collected:
    """A step's rollouts, grouped by prompt (prompt 0's group first; within a group its pilots first)."""

    counts: np.ndarray  # (B,) rollouts of each prompt, all trained on
    rewards: np.ndarray  # (N,) grouped
    payloads: list  # what each draw returned, in call order
    order: np.ndarray | None  # (N,) concatenated payload rows in grouped order; None: the one payload is grouped
    p_hat: np.ndarray | None  # (B,) the estimate the allocation used, None for allocators without one
    tau: float | None  # SERA's continuous waterline level
    rollouts_generated: int  # everything drawn (pilots included)

    @property
    def rollouts_trained(self) -> int:
        return int(self.counts.sum())

    @property
    def rows(self) -> np.ndarray:
        """(N,) the prompt of each grouped rollout."""
        return np.repeat(np.arange(self.counts.size), self.counts)

    @property
    def successes(self) -> np.ndarray:
        """(B,) successes of each prompt's group."""
        return np.bincount(self.rows, weights=self.rewards, minlength=self.counts.size)


class _Draws:
    """Calls the study's draw callback and keeps every call's counts, payload and rewards."""

    def __init__(self, draw: DrawFn, batch: int):
        self.draw, self.batch = draw, batch
        self.counts, self.payloads, self.rewards = [], [], []

    def __call__(self, counts: np.ndarray) -> np.ndarray:
        """Draw counts (B,) more rollouts; returns the successes of this call per prompt (B,)."""
        payload, rewards = self.draw(counts)
        rewards = np.asarray(rewards, dtype=np.float64)
        if rewards.shape != (int(counts.sum()),):
            raise ValueError(f"draw returned {rewards.shape[0]} rewards for {int(counts.sum())} rollouts")
        self.counts.append(counts)
        self.payloads.append(payload)
        self.rewards.append(rewards)
        return np.bincount(np.repeat(np.arange(self.batch), counts), weights=rewards, minlength=self.batch)

    def collected(self, p_hat=None, tau=None) -> Collected:
        counts = np.sum(self.counts, axis=0)
        rewards = np.concatenate(self.rewards)
        order = None
        if len(self.counts) > 1:  # regroup: prompt by prompt, each call's rollouts in call order (pilots first)
            rows = np.concatenate([np.repeat(np.arange(self.batch), c) for c in self.counts])
            order = np.argsort(rows, kind="stable")
            rewards = rewards[order]
        return Collected(counts, rewards, self.payloads, order, p_hat, tau, int(counts.sum()))


def collect_uniform(s: MethodSettings, batch: int, draw: DrawFn, p_hat_source=None) -> Collected:
    """n_i = n0 for every prompt, one draw."""
    draws = _Draws(draw, batch)
    draws(uniform(batch, s.n0))
    return draws.collected()


def collect_waterline(s: MethodSettings, batch: int, draw: DrawFn, p_hat_source=None) -> Collected:
    """SERA: p_hat (pilots, or p_hat_source() for history / oracle), then the waterline allocation of B * n0.

    Pilots are the first m rollouts of each group and count toward the budget: only n_i - m more are drawn. A
    p_hat_source that returns None has no estimate yet (the historical p_hat before any data): uniform allocation.
    """
    draws = _Draws(draw, batch)
    if s.estimator == "pilot":
        drawn = np.full(batch, s.pilot_m, dtype=np.int64)
        p_hat = pilot_p_hat(draws(drawn), s.pilot_m, s.p_lo, s.p_hi)
    else:
        drawn = np.zeros(batch, dtype=np.int64)
        p_hat = p_hat_source()
        if p_hat is None:
            draws(uniform(batch, s.n0))
            return draws.collected()
        p_hat = np.asarray(p_hat, dtype=np.float64)
    # SERA: spend the same budget so the scale factors c(p_hat_i, n_i) come out (nearly) equal
    counts, tau = waterline(p_hat, s.budget(batch), s.n_min, s.n_max, s.delta, return_tau=True)
    draws(counts - drawn)
    return draws.collected(p_hat, tau)


def collect_dars_hw(s: MethodSettings, batch: int, draw: DrawFn, p_hat_source=None) -> Collected:
    """DARS-HW: n0 rollouts each, then ceil(n0 / (2 a) - n0) more for prompts with accuracy a < 0.5 (extra budget)."""
    draws = _Draws(draw, batch)
    accuracy = draws(uniform(batch, s.n0)) / s.n0
    draws(dars_hw_extra(accuracy, s.n0, s.n_max))
    return draws.collected()


SAMPLERS = {"uniform": collect_uniform, "waterline": collect_waterline, "dars_hw": collect_dars_hw}


def collect(s: MethodSettings, batch: int, draw: DrawFn, p_hat_source: Callable[[], np.ndarray] | None = None):
    """The step's rollouts for B = batch prompts by the method's allocator. p_hat_source gives the history or
    oracle p_hat (B,) when the method's estimator needs one. Returns a Collected."""
    if s.estimator in ("history", "oracle") and p_hat_source is None:
        raise ValueError(f"method.estimator={s.estimator} needs a p_hat source")
    return SAMPLERS[s.method.allocator](s, batch, draw, p_hat_source)
