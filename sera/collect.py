"""One rollout-collection step for every study: estimate p_hat, allocate the budget, draw and score rollouts.

A study supplies a `draw(counts)` callback: "draw counts[i] rollouts of prompt i of this step, return (payload,
rewards)", rewards (sum(counts),) grouped by prompt and scored once, in one batch; and, for the sequential
allocators, a prompt stream whose `take(k)` adds up to k prompts to the step (their step indices; `ids` holds every
taken prompt's dataset id). A collection function (`COLLECTORS`, keyed by the method's allocator) calls draw once or
more - pilots or probes first, then the rest of each group - and returns a `Collected`: the prompts trained on and
their counts, the rewards grouped by prompt with pilots first, p_hat and tau, the rollouts generated (dropped groups
included), and the rows of the concatenated payloads to train on, in the same grouped order. A new allocator is one
entry of `sera.allocators.SAMPLERS` (what it needs: p_hat, a prompt stream, DPS's predictor, SARA's prior; validation,
the loops and the tables read it there) and its collection function in `COLLECTORS`; what a sequential allocator
carries from step to step is one `SequentialState` (`sequential_state`), which the loops create, pass to `collect`
and checkpoint. Pure numpy; docs/design.md sections 2-4.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sera.advantages import ADVANTAGES, multiplicity_weights
from sera.allocation import active_waterline, dars_hw_extra, uniform, waterline
from sera.estimation import BetaHistory, pilot_p_hat
from sera.methods import MethodSettings
from sera.sequential import (
    DynamicsPredictor,
    SaraAction,
    SaraPrior,
    StepResult,
    dps_prompts,
    ds_step,
    sara_step,
    sera_counts_after_probe,
)

DrawFn = Callable[[np.ndarray], tuple[Any, np.ndarray]]  # counts (P,) -> (payload, rewards (sum counts,))


@dataclass
class Collected:
    """A step's rollouts, grouped by prompt (prompt 0's group first; within a group its pilots first)."""

    prompts: np.ndarray  # (C,) step indices of the prompts trained on, ascending (all B for the batch allocators)
    counts: np.ndarray  # (C,) rollouts of each, all trained on
    rewards: np.ndarray  # (N,) grouped
    payloads: list  # what each draw returned, in call order
    order: np.ndarray | None  # (N,) rows of the concatenated payloads to train on, grouped; None: the one payload
    p_hat: np.ndarray | None  # (C,) the estimate the allocation used, None for allocators without one
    tau: float | None  # SERA's continuous waterline level
    rollouts_generated: int  # everything drawn (pilots, probes and dropped groups included)
    metrics: dict = field(default_factory=dict)  # the sequential allocators' accounting (alloc/...)
    # the groups a sequential allocator dropped by its rule: (step indices (A,), successes (A,), failures (A,))
    abandoned: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    @property
    def rollouts_trained(self) -> int:
        return int(self.counts.sum())

    @property
    def rows(self) -> np.ndarray:
        """(N,) the group (0..C-1, an index into `prompts`) of each grouped rollout."""
        return np.repeat(np.arange(self.counts.size), self.counts)

    @property
    def successes(self) -> np.ndarray:
        """(C,) successes of each group."""
        return np.bincount(self.rows, weights=self.rewards, minlength=self.counts.size)


class _Draws:
    """Calls the study's draw callback and keeps every call's counts, payload and rewards."""

    def __init__(self, draw: DrawFn, batch: int = 0):
        self.draw, self.batch = draw, batch
        self.counts, self.payloads, self.rewards = [], [], []

    def __call__(self, counts: np.ndarray) -> np.ndarray:
        """Draw counts (P,) more rollouts of the step's first P prompts; returns this call's successes (P,)."""
        payload, rewards = self.draw(counts)
        rewards = np.asarray(rewards, dtype=np.float64)
        if rewards.shape != (int(counts.sum()),):
            raise ValueError(f"draw returned {rewards.shape[0]} rewards for {int(counts.sum())} rollouts")
        self.counts.append(np.asarray(counts, dtype=np.int64))
        self.payloads.append(payload)
        self.rewards.append(rewards)
        return np.bincount(np.repeat(np.arange(counts.size), counts), weights=rewards, minlength=counts.size)

    def by_ids(self, size: int):
        """The sequential steps' draw(prompt_ids, counts) -> rewards grouped in the order of prompt_ids, over a step
        of `size()` prompts so far."""

        def draw(prompt_ids, counts):
            full = np.zeros(size(), dtype=np.int64)
            full[prompt_ids] = counts
            self(full)
            rewards, offsets = self.rewards[-1], np.cumsum(full) - full  # this call's rewards, by ascending prompt
            counts = np.asarray(counts, dtype=np.int64)
            within = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
            return rewards[np.repeat(offsets[prompt_ids], counts) + within]  # regrouped in the order of prompt_ids

        return draw

    def collected(self, trained=None, p_hat=None, tau=None, metrics=None, result: StepResult | None = None):
        """The step's groups for prompts `trained` (default: every prompt drawn), grouped, each in draw order; the
        groups dropped by a sequential allocator from its `result`."""
        size = max(c.size for c in self.counts)
        totals = np.sum([np.pad(c, (0, size - c.size)) for c in self.counts], axis=0)
        trained = np.flatnonzero(totals) if trained is None else np.sort(np.asarray(trained, dtype=np.int64))
        rewards, order = np.concatenate(self.rewards), None
        if len(self.counts) > 1 or trained.size < np.count_nonzero(totals):
            # regroup: prompt by prompt, each call's rollouts in call order (pilots first); drop untrained groups
            rows = np.concatenate([np.repeat(np.arange(c.size), c) for c in self.counts])
            keep = np.flatnonzero(np.isin(rows, trained))
            order = keep[np.argsort(rows[keep], kind="stable")]
            rewards = rewards[order]
        counts = totals[trained]
        abandoned = None if result is None else (result.abandoned_ids, result.abandoned_successes,
                                                 result.abandoned_failures)  # fmt: skip
        return Collected(
            trained, counts, rewards, self.payloads, order, p_hat, tau, int(totals.sum()), metrics or {}, abandoned
        )


def collect_uniform(s: MethodSettings, batch: int, draw: DrawFn, **_) -> Collected:
    """n_i = n0 for every prompt, one draw."""
    draws = _Draws(draw, batch)
    draws(uniform(batch, s.n0))
    return draws.collected(np.arange(batch))


def collect_waterline(s: MethodSettings, batch: int, draw: DrawFn, p_hat_source=None, **_) -> Collected:
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
            return draws.collected(np.arange(batch))
        p_hat = np.asarray(p_hat, dtype=np.float64)
    # SERA: spend the same budget so the scale factors c(p_hat_i, n_i) come out (nearly) equal
    counts, tau = waterline(p_hat, s.budget(batch), s.n_min, s.n_max, s.delta, return_tau=True)
    draws(counts - drawn)
    return draws.collected(np.arange(batch), p_hat, tau)


def collect_active(s: MethodSettings, batch: int, draw: DrawFn, p_hat_source=None, left_out=None, **_) -> Collected:
    """SERA as its authors run it: p_hat_source() (the exact p), their active set and rounding (active_waterline).

    Prompts outside the active set get no rollouts and are not among the groups trained on; the loss still averages
    over the budget B * n0 (the active prompts' counts add up to it), so they stay in its denominator with weight 0.
    A p_hat with NaN (the Beta history before a prompt has an epoch behind it) allocates the batch uniformly.
    left_out: None (the authors' rule), or a callable giving (B,) prompts to leave out of the active set where the
    budget allows (alloc.never_solved=leave_out: the prompts never solved so far).
    """
    draws = _Draws(draw, batch)
    p_hat = np.asarray(p_hat_source(), dtype=np.float64)
    if BetaHistory.needs_uniform(p_hat):
        draws(uniform(batch, s.n0))
        return draws.collected(np.arange(batch))
    exclude = None if left_out is None else left_out()
    counts = active_waterline(p_hat, s.budget(batch), s.n_min, s.n_max, s.threshold, exclude)
    draws(counts)
    active = np.flatnonzero(counts)
    return draws.collected(active, p_hat[active], None, {"alloc/active": int(active.size)})


def collect_dars_hw(s: MethodSettings, batch: int, draw: DrawFn, **_) -> Collected:
    """DARS-HW: n0 rollouts each, then ceil(n0 / (2 a) - n0) more for prompts with accuracy a < 0.5 (extra budget)."""
    draws = _Draws(draw, batch)
    accuracy = draws(uniform(batch, s.n0)) / s.n0
    draws(dars_hw_extra(accuracy, s.n0, s.n_max))
    return draws.collected(np.arange(batch))


# ---------------------------------------------------------------------------------------------------------------
# Sequential allocators (docs/design.md section 4): they take prompts from the stream as they go and drop some groups.
# ---------------------------------------------------------------------------------------------------------------
@dataclass
class SequentialState:
    """What a sequential allocator carries across steps: DPS's predictor, SARA's prior (either may be None)."""

    predictor: DynamicsPredictor | None = None
    prior: SaraPrior | None = None

    def state_dict(self) -> dict:
        return {name: None if x is None else x.state_dict() for name, x in (("predictor", self.predictor),
                                                                            ("prior", self.prior))}  # fmt: skip

    def load_state_dict(self, state: dict) -> None:
        if state is None:  # a SARA or SARA+SERA checkpoint written before SARA had a prior: nothing was carried
            state = {"predictor": None, "prior": None}
        elif "alpha" in state:  # one written before SARA had a prior: the DPS predictor's state alone
            state = {"predictor": state, "prior": None}
        for name in ("predictor", "prior"):
            mine, saved = getattr(self, name), state.get(name)
            if name == "prior" and saved is None and mine is not None and mine.settings.prior == "flat":
                continue  # the flat prior carries nothing, so a checkpoint from before the prior existed resumes it
            if (mine is None) != (saved is None):
                raise ValueError(f"the checkpoint's sequential state {'lacks' if saved is None else 'has'} a {name}")
            if mine is not None:
                mine.load_state_dict(saved)


def sequential_state(s: MethodSettings, num_prompts: int | None) -> SequentialState | None:
    """The state the method's allocator carries across steps (None when it carries none). num_prompts: the size of
    the set of prompt ids (None when prompts never recur)."""
    sampler, q = s.sampler, s.sequential
    if not (sampler.predictor or sampler.prior):
        return None
    predictor = DynamicsPredictor(num_prompts, q.dps_decay) if sampler.predictor else None
    return SequentialState(predictor, SaraPrior(q, num_prompts) if sampler.prior else None)


def accounting(result: StepResult) -> dict:
    """The per-step accounting every sequential method logs; SARA's also its verdicts by probe size: how many groups
    were committed, continued and abandoned after j rollouts (lists indexed by j = 0..n)."""
    metrics = {
        "alloc/groups_committed": result.groups_committed,
        "alloc/groups_abandoned": result.groups_abandoned,
        "alloc/groups_discarded": result.groups_discarded,
        "alloc/prompts_drawn": result.prompts_drawn,
        "alloc/waves": result.waves,
        "alloc/hit_wave_cap": int(result.hit_wave_cap),
        "alloc/shortfall": result.shortfall,
    }
    if result.decisions is not None:
        for action, name in ((SaraAction.COMMIT, "committed"), (SaraAction.CONTINUE, "continued"),
                             (SaraAction.ABANDON, "abandoned")):  # fmt: skip
            metrics[f"alloc/{name}_at"] = result.decisions[action].tolist()
    return metrics


def collect_ds(s: MethodSettings, batch: int, draw: DrawFn, stream, **_) -> Collected:
    """DAPO dynamic sampling: rounds of gen_batch fresh prompts, n0 rollouts each, keep mixed groups, train on the
    first B."""
    draws = _Draws(draw)
    q = s.sequential
    result = ds_step(s.n0, batch, q.gen_batch or batch, q.max_rounds, draws.by_ids(stream.size), stream.take)
    return draws.collected(result.prompt_ids, metrics=accounting(result), result=result)


def dps_stream(stream, predictor, ratio: int):
    """stream.take(k) ranked by DPS (`dps_prompts`): the stream hands out step positions, the predictor knows
    dataset ids (stream.ids)."""
    return dps_prompts(predictor, stream.take, ratio, prompt_ids=lambda pool: stream.ids[pool])


def dps_observe(predictor: DynamicsPredictor, ids, successes, counts) -> dict:
    """Update DPS's predictor with the step's observed groups (dataset ids (G,)) and return its calibration: the mean
    predicted P(partial) of the prompts it selected, before this update, against the share of their groups observed
    partial (0 < K < n)."""
    predicted = predictor.partial_probability(ids)
    successes, counts = np.asarray(successes), np.asarray(counts)
    predictor.update(ids, successes, counts)
    if predicted.size == 0:
        return {}
    partial = (successes > 0) & (successes < counts)
    return {"alloc/dps_predicted_partial": float(predicted.mean()), "alloc/dps_observed_partial": float(partial.mean())}


def collect_dps(s: MethodSettings, batch: int, draw: DrawFn, stream, state, **_) -> Collected:
    """DPS: a candidate pool of r * B prompts, the top B by predicted P(partial), n0 rollouts each."""
    draws = _Draws(draw)
    chosen = dps_stream(stream, state.predictor, s.sequential.dps_ratio)(batch)
    counts = np.zeros(stream.size(), dtype=np.int64)
    counts[chosen] = s.n0
    draws(counts)
    out = draws.collected(chosen, metrics={"alloc/prompts_drawn": int(stream.size())})
    out.metrics |= dps_observe(state.predictor, stream.ids[out.prompts], out.successes, out.counts)
    return out


def _sara(s: MethodSettings, batch: int, draw: DrawFn, stream, state, complete: bool):
    """SARA's step (sara_step) on the stream, DPS-ranked when the state has a predictor (SARA+DPS). Returns the
    draws, the StepResult and the step's metrics; the caller records the step in the prior (`_sara_observe`)."""
    draws = _Draws(draw)
    predictor = state.predictor
    take = stream.take if predictor is None else dps_stream(stream, predictor, s.sequential.dps_ratio)
    a0, b0 = state.prior.a0, state.prior.b0
    result = sara_step(
        s.sequential, s.n0, batch, None, draws.by_ids(stream.size), take, complete_committed=complete,
        prior=state.prior,
    )  # fmt: skip
    metrics = {**accounting(result), "alloc/prior_a0": a0, "alloc/prior_b0": b0}
    if predictor is not None:  # every group drawn this step: committed, abandoned, or undecided at the wave cap
        n = result.drawn_successes + result.drawn_failures
        metrics |= dps_observe(predictor, stream.ids[result.drawn_ids], result.drawn_successes, n)
    return draws, result, metrics


def _sara_observe(state: SequentialState, stream, result: StepResult, out: Collected) -> None:
    """Record the step in SARA's prior: every group drawn, the committed ones with all the rollouts trained on."""
    successes, failures = result.drawn_successes.copy(), result.drawn_failures.copy()
    row = np.zeros(stream.size(), dtype=np.int64)  # step position -> its row in result.drawn_*
    row[result.drawn_ids] = np.arange(result.drawn_ids.size)
    successes[row[out.prompts]] = out.successes
    failures[row[out.prompts]] = out.counts - out.successes
    state.prior.observe(stream.ids[result.drawn_ids], successes, failures, result.probe_successes)


def collect_sara(s: MethodSettings, batch: int, draw: DrawFn, stream, state, **_) -> Collected:
    """SARA (and SARA+DPS with a predictor): probe, commit or abandon, refill from the stream, in waves."""
    draws, result, metrics = _sara(s, batch, draw, stream, state, complete=True)
    out = draws.collected(result.prompt_ids, metrics=metrics, result=result)
    _sara_observe(state, stream, result, out)
    return out


def collect_sara_sera(s: MethodSettings, batch: int, draw: DrawFn, stream, state, **_) -> Collected:
    """SARA+SERA: SARA's probe is SERA's pilot; the committed groups share C * n0 rollouts through the waterline."""
    draws, result, metrics = _sara(s, batch, draw, stream, state, complete=False)
    if result.counts.size == 0:
        out = draws.collected(result.prompt_ids, metrics=metrics, result=result)
        _sara_observe(state, stream, result, out)
        return out
    # SERA: the committed groups' probes give p_hat; the waterline spreads the rest of their budget
    extra = sera_counts_after_probe(result, result.counts.size * s.n0, s.n_max, s.p_lo, s.p_hi, s.delta)
    counts = np.zeros(stream.size(), dtype=np.int64)
    counts[result.prompt_ids] = extra
    draws(counts)
    order = np.argsort(result.prompt_ids)
    p_hat = np.clip(result.successes / result.counts, s.p_lo, s.p_hi)[order]
    out = draws.collected(result.prompt_ids, p_hat=p_hat, metrics=metrics, result=result)
    _sara_observe(state, stream, result, out)
    return out


# Each allocator's collection function (sera.allocators.SAMPLERS says what it needs; "none", Direct CE, has none)
COLLECTORS: dict[str, Callable[..., Collected]] = {
    "uniform": collect_uniform,
    "waterline": collect_waterline,
    "active": collect_active,
    "dars_hw": collect_dars_hw,
    "ds": collect_ds,
    "dps": collect_dps,
    "sara": collect_sara,
    "sara+dps": collect_sara,
    "sara+sera": collect_sara_sera,
}


def collect(
    s: MethodSettings,
    batch: int,
    draw: DrawFn,
    p_hat_source: Callable[[], np.ndarray] | None = None,
    stream=None,
    state: SequentialState | None = None,
    left_out: Callable[[], np.ndarray] | None = None,
) -> Collected:
    """The step's rollouts by the method's allocator. Batch allocators use the step's first B = batch prompts
    (taken already); p_hat_source gives the history or oracle p_hat (B,) when the estimator needs one. Sequential
    allocators take prompts from `stream` (take(k), size(), ids) and carry `state` across steps (DPS's predictor,
    SARA's prior: `sequential_state`). left_out: the authors' rule only (collect_active). Returns a Collected."""
    sampler, allocator = s.sampler, s.method.allocator
    if allocator not in COLLECTORS:
        raise ValueError(f"{s.method.name} collects no rollouts (allocator {allocator!r})")
    if s.estimator in ("history", "oracle", "beta") and p_hat_source is None:
        raise ValueError(f"method.estimator={s.estimator} needs a p_hat source")
    needs_state = sampler.predictor or sampler.prior
    if (sampler.stream and stream is None) or (needs_state and state is None):
        raise ValueError(f"{s.method.name} needs a prompt stream (and its state across steps: DPS's predictor, SARA's "
                         "prior; see sequential_state)")  # fmt: skip
    if needs_state and ((sampler.predictor and state.predictor is None) or (sampler.prior and state.prior is None)):
        raise ValueError(f"the sequential state passed lacks what {s.method.name} needs (use sequential_state)")
    if left_out is not None and allocator != "active":
        raise ValueError(f"left_out is the authors' active set's (method=sera); {s.method.name} has none")
    return COLLECTORS[allocator](s, batch, draw, p_hat_source=p_hat_source, stream=stream, state=state,
                                 left_out=left_out)  # fmt: skip


def advantages_and_weights(s: MethodSettings, out: Collected) -> tuple[np.ndarray, np.ndarray]:
    """(N,) advantages of the collected rollouts by the method's estimator, and (N,) rollout weights: SERA's
    multiplicity correction w_i = n0 / n_i, or ones. Grouped like out.rewards. docs/design.md sections 1, 2 and 4."""
    adv = ADVANTAGES[s.method.advantage](out.rewards, out.counts, **s.adv_kwargs)
    # SERA: multiplicity correction - every rollout of prompt i weighted by n0 / n_i
    weights = multiplicity_weights(out.counts, s.n0) if s.multiplicity_correction else np.ones(out.rewards.size)
    return adv, weights


def generation_metrics(out: Collected) -> dict:
    """Rollouts generated and a sequential allocator's accounting: logged by every step, trained on or not."""
    return {"alloc/generated": out.rollouts_generated, **out.metrics}


def collection_metrics(s: MethodSettings, out: Collected, batch: int) -> dict:
    """What every study logs of a step's collection (at least one group trained): mean reward, rollouts generated
    and trained against the budget B * n0, the counts' range, the groups with mixed rewards and their rollouts,
    SERA's waterline level, and a sequential allocator's accounting."""
    counts, successes = out.counts, out.successes
    mixed = (successes > 0) & (successes < counts)
    metrics = {
        **generation_metrics(out),
        "alloc/budget": s.budget(batch),
        "train/reward": float(out.rewards.mean()),
        "alloc/rollouts": out.rollouts_trained,
        "alloc/n_min": int(counts.min()),
        "alloc/n_max": int(counts.max()),
        "alloc/effective_groups": int(np.count_nonzero(mixed)),
        "alloc/effective_rollouts": int(counts[mixed].sum()),  # rollouts in groups with mixed rewards
    }
    if out.tau is not None:
        metrics["alloc/tau"] = out.tau
    return metrics
