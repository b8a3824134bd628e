"""Sequential rollout allocation and prompt selection: SARA, DS (DAPO dynamic sampling) and DPS (shared/DESIGN.md
section 4).

Pure numpy (no torch, no I/O). SARA probes each prompt with a few rollouts, keeps a Beta posterior over its pass rate,
and commits, abandons or probes further by the closed-form probability that the full group ends mixed
(`effective_probability`, `sara_decision`); `sara_step` runs one training step of it in batched waves. `ds_step` is
the dynamic-sampling baseline, `DynamicsPredictor` and `dps_select` are DPS's per-prompt three-state chain and its
top-B selection. Both step loops talk to the model only through two callbacks, `draw(prompt_ids, counts) -> rewards`
(flat, grouped by prompt in order) and `next_prompts(k) -> up to k prompt ids`, so they run the same against a
simulator in the tests and an LM rollout engine in training; both return a `StepResult` with the accounting every
method reports (rollouts generated and trained, groups kept and dropped).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable
from typing import Literal

import numpy as np
from scipy.special import gammaln

from sera.allocation import waterline
from sera.estimation import P_HI, P_LO, pilot_p_hat

Draw = Callable[[np.ndarray, np.ndarray], np.ndarray]  # (prompt_ids (G,), counts (G,)) -> rewards (sum counts,)
NextPrompts = Callable[[int], np.ndarray]  # k -> up to k fresh prompt ids; fewer once the stream is exhausted


# ----------------------------------------------------------------------------------------------------------------------
# SARA: the effectiveness predictor and the decision rule


def effective_probability(a0, b0, successes, failures, n):
    """Probability that a group of n rollouts ends mixed (0 < K < n), given a Beta(a0, b0) prior and the j = s + f
    rollouts drawn so far, which stay in the group.

    With a = a0 + s, b = b0 + f, m = n - j, R+ = prod_{i<m} (a+i)/(a+b+i) (the rest all succeed) and
    R- = prod_{i<m} (b+i)/(a+b+i) (the rest all fail): E = 1 if s > 0 and f > 0, else
    E = 1 - [f = 0] R+ - [s = 0] R-. The products are Beta-function ratios, evaluated with gammaln. All arguments
    broadcast; returns float64 of the broadcast shape. DESIGN section 4.
    """
    a0, b0 = np.asarray(a0, dtype=np.float64), np.asarray(b0, dtype=np.float64)
    s, f, n = (np.asarray(x, dtype=np.float64) for x in (successes, failures, n))
    if np.any(a0 <= 0) or np.any(b0 <= 0):
        raise ValueError("the Beta prior needs a0 > 0 and b0 > 0")
    if np.any(s < 0) or np.any(f < 0):
        raise ValueError("successes and failures must be non-negative")
    if np.any(n < 1):
        raise ValueError("the group size n must be at least 1")
    if np.any(s + f > n):
        raise ValueError("more rollouts drawn (successes + failures) than the group size n")
    a, b, m = a0 + s, b0 + f, n - s - f
    log_norm = gammaln(a + b) - gammaln(a + b + m)
    log_r_plus = gammaln(a + m) - gammaln(a) + log_norm
    log_r_minus = gammaln(b + m) - gammaln(b) + log_norm
    saturated = 1.0 - np.where(f == 0, np.exp(log_r_plus), 0.0) - np.where(s == 0, np.exp(log_r_minus), 0.0)
    return np.where((s > 0) & (f > 0), 1.0, saturated)


def mixed_probability(p, successes, failures, n):
    """Probability that a group of n rollouts ends mixed (0 < K < n) when the pass rate p is known exactly, given the
    j = s + f rollouts drawn so far (which stay in the group): 1 if already mixed, else
    1 - [f = 0] p^(n - j) - [s = 0] (1 - p)^(n - j). The limit of `effective_probability` as the prior's mass grows at
    mean p; on the classifier, where p is exact, it scores an abandoned group (the abandonment error). Broadcasts.
    """
    p = np.asarray(p, dtype=np.float64)
    s, f, n = (np.asarray(x, dtype=np.float64) for x in (successes, failures, n))
    if np.any((p < 0) | (p > 1)) or np.any(s < 0) or np.any(f < 0) or np.any(s + f > n):
        raise ValueError("need 0 <= p <= 1, non-negative outcomes and successes + failures <= n")
    m = n - s - f
    saturated = 1.0 - np.where(f == 0, p**m, 0.0) - np.where(s == 0, (1 - p) ** m, 0.0)
    return np.where((s > 0) & (f > 0), 1.0, np.clip(saturated, 0.0, 1.0))


class SaraAction(enum.IntEnum):
    """SARA's verdict on a group after a chunk of rollouts."""

    CONTINUE = 0  # draw a chunk more
    COMMIT = 1  # train on it: draw the rest of the group
    ABANDON = 2  # drop it and return its unspent rollouts to the step


def sara_decision(successes, failures, n, a0=1.0, b0=1.0, k_min=2, tau_lo=0.45, tau_hi=0.95) -> np.ndarray:
    """SARA's two-threshold rule on the effectiveness probability E_j (`effective_probability`), j = s + f.

    COMMIT if E_j >= tau_hi (always once mixed, where E_j = 1); else ABANDON if j >= k_min and E_j <= tau_lo; else
    CONTINUE. A complete group (j = n) is never continued: it is committed if mixed and abandoned otherwise. With the
    flat prior, after j >= 1 identical outcomes E_j = (n - j)/(n + 1), so n = 8, tau_lo = 0.45 abandons after exactly
    4. All arguments broadcast; returns int8 SaraAction codes of the broadcast shape. DESIGN section 4.
    """
    e = effective_probability(a0, b0, successes, failures, n)
    j = np.asarray(successes) + np.asarray(failures)
    mixed = (np.asarray(successes) > 0) & (np.asarray(failures) > 0)
    commit = (e >= tau_hi) | mixed
    abandon = ~commit & (((j >= k_min) & (e <= tau_lo)) | (j >= np.asarray(n)))
    action = np.where(commit, SaraAction.COMMIT, np.where(abandon, SaraAction.ABANDON, SaraAction.CONTINUE))
    return action.astype(np.int8)


@dataclasses.dataclass(frozen=True)
class SequentialSettings:
    """Settings of the sequential allocators, SARA, DS and DPS (DESIGN section 4; SARA's are derived from its
    abstract, every threshold a setting). `method.sequential` of a run config; configs/method/common.yaml holds the
    same defaults (a test checks that they agree)."""

    k0: int = 4  # SARA: rollouts in a fresh prompt's first probe
    k_min: int = 2  # SARA: never abandon a group with fewer rollouts than this
    chunk: int = 2  # SARA: rollouts per further probe of an undecided group
    tau_lo: float = 0.45  # SARA: abandon when E_j <= tau_lo
    tau_hi: float = 0.95  # SARA: commit when E_j >= tau_hi (always once mixed)
    a0: float = 1.0  # SARA: Beta prior over every prompt's pass rate
    b0: float = 1.0
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
        if self.max_waves < 1 or self.max_rounds < 1 or self.dps_ratio < 1:
            raise ValueError(f"need max_waves, max_rounds, dps_ratio >= 1, got {self.max_waves, self.max_rounds}, "
                             f"{self.dps_ratio}")  # fmt: skip
        if self.mode not in ("fill", "budget"):
            raise ValueError(f"mode must be 'fill' or 'budget', got {self.mode!r}")
        if not 0 <= self.dps_decay <= 1 or (self.gen_batch is not None and self.gen_batch < 1):
            raise ValueError(f"need dps_decay in [0, 1] and gen_batch >= 1 or None, got {self.dps_decay}, "
                             f"{self.gen_batch}")  # fmt: skip


# ----------------------------------------------------------------------------------------------------------------------
# One step's outcome, shared by SARA and DS


@dataclasses.dataclass(frozen=True, eq=False)
class StepResult:
    """The groups to train on, as a ragged (rewards, counts) batch, and the step's accounting.

    Every drawn group ends in exactly one of: committed (trained), abandoned (dropped by the method's rule: SARA's
    E_j <= tau_lo, DS's all-equal filter; recorded per group so a caller with exact p can score the decision), or
    discarded (SARA: undecided at the wave cap; DS: a kept group beyond the first batch_size). rollouts_generated
    counts every rollout drawn, probes and dropped groups included.
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

    @property
    def successes(self) -> np.ndarray:
        """(C,) successes K_i per committed group (with complete_committed=False: the SARA+SERA pilot outcome)."""
        return np.bincount(np.repeat(np.arange(self.counts.size), self.counts), self.rewards, self.counts.size)

    @property
    def effective_groups(self) -> int:
        """Committed groups with mixed outcomes, 0 < K < n_i."""
        k = self.successes
        return int(np.sum((k > 0) & (k < self.counts)))


def _draw(draw: Draw, prompt_ids: np.ndarray, counts: np.ndarray) -> list[np.ndarray]:
    """Call the rollout callback once and split its flat binary rewards into one array per prompt."""
    rewards = np.asarray(draw(prompt_ids, counts), dtype=np.float64)
    if rewards.shape != (int(counts.sum()),):
        raise ValueError(f"draw returned {rewards.shape} rewards for counts summing to {int(counts.sum())}")
    if np.any((rewards != 0) & (rewards != 1)):
        raise ValueError("draw must return binary rewards (0 or 1)")
    return np.split(rewards, np.cumsum(counts)[:-1])


def _next(next_prompts: NextPrompts, k: int) -> np.ndarray:
    ids = np.asarray(next_prompts(k), dtype=np.int64).reshape(-1)
    if ids.size > k:
        raise ValueError(f"next_prompts({k}) returned {ids.size} prompts")
    return ids


def _result(committed, abandoned, **accounting) -> StepResult:
    """committed: [(prompt id, rewards (n_i,))]; abandoned: [(prompt id, successes, failures)]."""
    counts = np.array([r.size for _, r in committed], dtype=np.int64)
    dropped = np.array(abandoned, dtype=np.int64).reshape(-1, 3)
    return StepResult(
        prompt_ids=np.array([i for i, _ in committed], dtype=np.int64),
        counts=counts,
        rewards=np.concatenate([r for _, r in committed]) if committed else np.zeros(0),
        rollouts_trained=int(counts.sum()),
        groups_committed=len(committed),
        groups_abandoned=len(abandoned),
        abandoned_ids=dropped[:, 0],
        abandoned_successes=dropped[:, 1],
        abandoned_failures=dropped[:, 2],
        **accounting,
    )


# ----------------------------------------------------------------------------------------------------------------------
# SARA's step loop


def _fresh_count(
    settings: SequentialSettings, n: int, batch_size: int, budget, spent: int, open_groups: int, held: int
):
    """How many fresh prompts the next wave may probe. Every open group holds n rollouts of the budget (`held` of them
    still unspent), so a commit can always be completed and the budget is never exceeded."""
    unheld = None if budget is None else (budget - spent - held) // n
    if settings.mode == "budget":
        return unheld
    slots = batch_size - open_groups
    return slots if unheld is None else min(slots, unheld)


def _wave(settings: SequentialSettings, n: int, draw: Draw, ids: np.ndarray, so_far: list[np.ndarray], complete: bool):
    """One wave's draws and verdicts: one batched draw probes the fresh groups (k0) and extends the undecided ones
    (min(chunk, n - j)), `sara_decision` judges every group, and a second draw completes the newly committed ones to n
    when `complete`. Returns (groups, actions (G,), rollouts drawn)."""
    chunk = np.array([min(settings.chunk, n - r.size) if r.size else settings.k0 for r in so_far], dtype=np.int64)
    groups = [np.concatenate(pair) for pair in zip(so_far, _draw(draw, ids, chunk), strict=True)]
    drawn = int(chunk.sum())
    k = np.array([r.sum() for r in groups], dtype=np.int64)
    j = np.array([r.size for r in groups], dtype=np.int64)
    s = settings
    action = sara_decision(k, j - k, n, s.a0, s.b0, s.k_min, s.tau_lo, s.tau_hi)
    rest = np.where(action == SaraAction.COMMIT, n - j, 0)
    todo = np.flatnonzero(rest) if complete else np.zeros(0, dtype=np.int64)
    if todo.size:  # SARA: a committed group keeps its probes and is completed to n
        for i, more in zip(todo, _draw(draw, ids[todo], rest[todo]), strict=True):
            groups[i] = np.concatenate([groups[i], more])
        drawn += int(rest[todo].sum())
    return groups, action, drawn


def sara_step(
    settings: SequentialSettings,
    n: int,
    batch_size: int,
    budget: int | None,
    draw: Draw,
    next_prompts: NextPrompts,
    complete_committed: bool = True,
) -> StepResult:
    """One training step of SARA: probe fresh prompts, decide, commit or abandon, refill, in batched waves.

    Each wave makes one draw holding a k0-rollout probe for every fresh prompt and a min(chunk, n - j) chunk for every
    undecided group, applies `sara_decision` to every group, then (complete_committed) draws the rest of each newly
    committed group up to n in a second call; probes stay in the group. Abandoned groups free their unspent rollouts,
    which the next wave spends on fresh prompts from `next_prompts`. Fill mode keeps batch_size groups open (committed
    or undecided) and stops once all batch_size are committed; budget mode (budget defaults to batch_size * n) probes
    fresh prompts while the unheld budget can pay for a whole group, and commits as many groups as it affords. A
    budget given in fill mode is a hard cap too. Each open group holds n rollouts of the budget until it is abandoned,
    so rollouts_generated <= budget always. Stops when no group is open and none can be opened (target reached, budget
    spent, stream exhausted), or after max_waves waves (groups still undecided are discarded; hit_wave_cap).
    Shapes: see StepResult; all committed counts are n (their probe count with complete_committed=False).
    DESIGN section 4.
    """
    if not 1 <= settings.k0 <= n:
        raise ValueError(f"the first probe k0={settings.k0} must lie in [1, n={n}]")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if settings.mode == "budget" and budget is None:
        budget = batch_size * n
    if budget is not None and budget < 0:
        raise ValueError(f"budget must be non-negative, got {budget}")
    live_ids = np.zeros(0, dtype=np.int64)  # undecided groups, in admission order
    live: list[np.ndarray] = []  # their rewards so far
    committed: list[tuple[int, np.ndarray]] = []
    abandoned: list[tuple[int, int, int]] = []
    spent = prompts_drawn = waves = held_by_caller = 0  # held_by_caller: unspent n - j of groups committed uncompleted
    exhausted = hit_cap = False
    while True:
        held, open_groups = held_by_caller + sum(n - r.size for r in live), len(committed) + len(live)
        fresh = 0 if exhausted else _fresh_count(settings, n, batch_size, budget, spent, open_groups, held)
        if not live and fresh <= 0:
            break
        if waves == settings.max_waves:
            hit_cap = True
            break
        new_ids = _next(next_prompts, fresh) if fresh > 0 else np.zeros(0, dtype=np.int64)
        exhausted = exhausted or new_ids.size < fresh
        prompts_drawn += new_ids.size
        if not live and new_ids.size == 0:
            break
        waves += 1
        ids = np.concatenate([live_ids, new_ids])
        groups, action, drawn = _wave(settings, n, draw, ids, live + [np.zeros(0)] * new_ids.size, complete_committed)
        spent += drawn
        for i in np.flatnonzero(action == SaraAction.ABANDON):  # SARA: early verdict, unspent rollouts freed
            abandoned.append((int(ids[i]), int(groups[i].sum()), int(groups[i].size - groups[i].sum())))
        for i in np.flatnonzero(action == SaraAction.COMMIT):
            committed.append((int(ids[i]), groups[i]))
            held_by_caller += n - groups[i].size
        keep = np.flatnonzero(action == SaraAction.CONTINUE)
        live_ids, live = ids[keep], [groups[i] for i in keep]
    return _result(
        committed,
        abandoned,
        rollouts_generated=spent,
        groups_discarded=len(live),
        prompts_drawn=prompts_drawn,
        waves=waves,
        hit_wave_cap=hit_cap,
        shortfall=max(batch_size - len(committed), 0) if settings.mode == "fill" else 0,
    )


def sera_counts_after_probe(
    result: StepResult,
    total: int,
    n_max: int,
    lo: float = P_LO,
    hi: float = P_HI,
    delta: float = 1,
) -> np.ndarray:
    """SARA+SERA: SARA's probe is SERA's pilot. Extra rollouts per committed group from SERA's waterline.

    For a `sara_step` result run with complete_committed=False (committed groups hold only their j_i probe rollouts),
    p_hat_i = clip(K_i / j_i, lo, hi) (`pilot_p_hat`), and the waterline spreads `total` = sum_i n_i rollouts, probes
    included, over the committed groups with n_min = max(2, max_i j_i) (the waterline takes one n_min, so every group
    is lifted to the largest probe). The caller picks total: batch_size * n0 in fill mode (the training budget, as for
    SARA; abandoned probes are overhead on top), or result.rollouts_trained + budget - result.rollouts_generated in
    budget mode (everything left; each committed group's n - j_i stayed reserved, so this is at least C n). Returns
    extra_i = n_i - j_i, (C,) int64; the caller draws them, appends them to the groups, and applies the multiplicity
    correction w_i = n0 / n_i. Raises ValueError (from `waterline`) when total cannot give every group n_min.
    DESIGN sections 2-4.
    """
    j = result.counts
    if j.size == 0:
        return np.zeros(0, dtype=np.int64)
    k = result.successes
    p_hat = np.empty(j.size)
    for m in np.unique(j):
        p_hat[j == m] = pilot_p_hat(k[j == m], int(m), lo, hi)
    return waterline(p_hat, total, max(2, int(j.max())), n_max, delta) - j


# ----------------------------------------------------------------------------------------------------------------------
# DS: DAPO dynamic sampling


def ds_step(
    n: int, batch_size: int, gen_batch: int, max_rounds: int, draw: Draw, next_prompts: NextPrompts
) -> StepResult:
    """One training step of DAPO dynamic sampling (verl recipe/dapo).

    Repeat { draw the next gen_batch prompts, n rollouts each, keep the groups whose rewards are not all equal } until
    batch_size groups are kept or max_rounds rounds have run (or the stream is exhausted); train on the first
    batch_size kept groups and discard the surplus. Every group is drawn once, so none is duplicated; at the cap the
    step trains on what was kept (possibly none: the caller skips the step) and reports the shortfall. Shapes: see
    StepResult; every committed count is n. DESIGN section 4.
    """
    if n < 1 or batch_size < 1 or gen_batch < 1 or max_rounds < 1:
        raise ValueError(f"need n, batch_size, gen_batch, max_rounds >= 1, got {n, batch_size, gen_batch, max_rounds}")
    kept: list[tuple[int, np.ndarray]] = []
    saturated: list[tuple[int, int, int]] = []
    rounds = prompts_drawn = 0
    exhausted = False
    while len(kept) < batch_size and rounds < max_rounds and not exhausted:
        ids = _next(next_prompts, gen_batch)
        exhausted = ids.size < gen_batch
        if ids.size == 0:
            break
        rounds += 1
        prompts_drawn += ids.size
        for i, r in zip(ids, _draw(draw, ids, np.full(ids.size, n)), strict=True):
            k = int(r.sum())
            if 0 < k < n:
                kept.append((int(i), r))
            else:
                saturated.append((int(i), k, n - k))
    trained = kept[:batch_size]
    return _result(
        trained,
        saturated,
        rollouts_generated=prompts_drawn * n,
        groups_discarded=len(kept) - len(trained),
        prompts_drawn=prompts_drawn,
        waves=rounds,
        hit_wave_cap=len(kept) < batch_size and rounds == max_rounds and not exhausted,
        shortfall=batch_size - len(trained),
    )


# ----------------------------------------------------------------------------------------------------------------------
# DPS: dynamics-predictive sampling

UNSOLVED, PARTIAL, SOLVED = 0, 1, 2  # DPS's three states of a prompt's group: K = 0, 0 < K < n, K = n


def _transition(alpha: np.ndarray) -> np.ndarray:
    """Phi(alpha): Dirichlet means, column-stochastic, Phi[..., i, j] = P(next state i | previous state j)."""
    return alpha / alpha.sum(axis=-2, keepdims=True)


class DynamicsPredictor:
    """DPS's per-prompt three-state chain (unsolved, partial, solved) with Dirichlet transition counts.

    Each prompt has alpha (3, 3) (prior alpha0 everywhere), a belief mu over its state at its last step (uniform
    initially) and the prior over its next state. `update` observes some prompts' groups, with e the observed state
    (one-hot) and lam = decay:
        xi[i, j] = e[i] Phi(alpha)[i, j] mu[j] / sum(.)            (Phi before this update)
        alpha <- lam alpha + (1 - lam) alpha0 + xi,   mu <- e,   prior <- Phi(alpha) e;
    every other tracked prompt: alpha <- lam alpha + (1 - lam) alpha0, mu <- prior, prior <- Phi(alpha) mu.
    As in maoyixiu/DPS (recipe/dps/task_sampler.py), mu is the belief at the prompt's previous step: the observed
    state after an observation, the propagated prior after a step without one. A prompt never observed keeps alpha0
    and the uniform belief (a fixed point of the decay), so only observed prompts are tracked. Reference values: one
    partial observation gives P(partial) = 0.40, one unsolved or solved 0.30, unseen 1/3. Prompts are integer ids in
    [0, num_prompts). DESIGN section 4.
    """

    def __init__(self, num_prompts: int, decay: float, alpha0: float = 1.0):
        if not 0 <= decay <= 1:
            raise ValueError(f"decay must lie in [0, 1], got {decay}")
        if alpha0 <= 0:
            raise ValueError(f"alpha0 must be > 0, got {alpha0}")
        self.decay, self.alpha0 = decay, alpha0
        self.alpha = np.full((num_prompts, 3, 3), alpha0)  # (P, 3, 3)
        self.belief = np.full((num_prompts, 3), 1 / 3)  # (P, 3) mu
        self.prior = np.full((num_prompts, 3), 1 / 3)  # (P, 3) over the next group's state
        self.tracked = np.zeros(num_prompts, dtype=bool)

    def partial_probability(self, ids) -> np.ndarray:
        """Prior probability (B,) that each prompt's next group is partial (0 < K < n)."""
        return self.prior[np.asarray(ids, dtype=np.int64), PARTIAL]

    def _decayed(self, alpha: np.ndarray) -> np.ndarray:
        # alpha0 + lam (alpha - alpha0) = lam alpha + (1 - lam) alpha0, exact at alpha = alpha0
        return self.alpha0 + self.decay * (alpha - self.alpha0)

    def update(self, ids, successes, n) -> None:
        """Observe the groups of prompts ids (B,), unique: successes (B,) out of n (scalar or (B,)) rollouts each."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        k = np.asarray(successes).reshape(-1)
        n = np.broadcast_to(np.asarray(n), k.shape)
        if ids.shape != k.shape or np.unique(ids).size != ids.size:
            raise ValueError("update needs unique prompt ids and one success count per id")
        if np.any(k < 0) or np.any(k > n):
            raise ValueError("successes must lie in [0, n]")
        state = np.where(k == 0, UNSOLVED, np.where(k == n, SOLVED, PARTIAL))  # (B,)
        unobserved = self.tracked.copy()
        unobserved[ids] = False
        rest = np.flatnonzero(unobserved)
        self.alpha[rest] = self._decayed(self.alpha[rest])
        self.belief[rest] = self.prior[rest]
        self.prior[rest] = np.einsum("pij,pj->pi", _transition(self.alpha[rest]), self.belief[rest])
        rows = np.arange(ids.size)
        weight = _transition(self.alpha[ids])[rows, state, :] * self.belief[ids]  # (B, 3): xi's only nonzero row
        xi = np.zeros((ids.size, 3, 3))
        xi[rows, state, :] = weight / weight.sum(axis=1, keepdims=True)
        self.alpha[ids] = self._decayed(self.alpha[ids]) + xi
        self.belief[ids] = np.eye(3)[state]
        self.prior[ids] = _transition(self.alpha[ids])[rows, :, state]
        self.tracked[ids] = True

    def state_dict(self) -> dict:
        return {k: getattr(self, k).copy() for k in ("alpha", "belief", "prior", "tracked")}

    def load_state_dict(self, state: dict) -> None:
        for key in ("alpha", "belief", "prior", "tracked"):
            value = np.asarray(state[key])
            if value.shape != getattr(self, key).shape:
                raise ValueError(f"{key} has shape {value.shape}, expected {getattr(self, key).shape}")
            setattr(self, key, value.astype(getattr(self, key).dtype).copy())


def dps_order(predictor: DynamicsPredictor, candidate_ids, batch_size: int) -> np.ndarray:
    """DPS selection as positions: the batch_size candidates (C,) with the highest prior P(partial), best first,
    (B,) int64 indices into candidate_ids.

    Ties keep the candidates' order in the pool (a stable sort), so the pool's own order (normally a random draw)
    breaks them and the result is deterministic given the pool. DESIGN section 4.
    """
    candidate_ids = np.asarray(candidate_ids, dtype=np.int64).reshape(-1)
    if not 0 <= batch_size <= candidate_ids.size:
        raise ValueError(f"cannot select {batch_size} of {candidate_ids.size} candidates")
    return np.argsort(-predictor.partial_probability(candidate_ids), kind="stable")[:batch_size]


def dps_select(predictor: DynamicsPredictor, candidate_ids, batch_size: int) -> np.ndarray:
    """DPS selection: the batch_size candidate ids with the highest prior P(partial), best first (`dps_order`)."""
    candidate_ids = np.asarray(candidate_ids, dtype=np.int64).reshape(-1)
    return candidate_ids[dps_order(predictor, candidate_ids, batch_size)]


def dps_prompts(
    predictor: DynamicsPredictor,
    candidates: NextPrompts,
    ratio: int,
    prompt_ids: Callable[[np.ndarray], np.ndarray] | None = None,
) -> NextPrompts:
    """A DPS-ranked prompt stream (DPS and SARA+DPS): next_prompts(k) draws a pool of ratio * k candidates from
    `candidates` and returns its top k by P(partial) (`dps_order`); unselected candidates are dropped. `prompt_ids`
    maps the candidates to the predictor's prompt ids when they are not the same (a step's stream hands out step
    positions); by default they are. DESIGN section 4."""
    if ratio < 1:
        raise ValueError(f"ratio must be >= 1, got {ratio}")

    def next_prompts(k: int) -> np.ndarray:
        pool = np.asarray(candidates(ratio * k), dtype=np.int64).reshape(-1)
        ids = pool if prompt_ids is None else prompt_ids(pool)
        return pool[dps_order(predictor, ids, min(k, pool.size))]

    return next_prompts
