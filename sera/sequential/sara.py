"""SARA (docs/design.md section 4): the probability that a group ends mixed, the commit / continue / abandon rule,
its Beta prior (flat, fitted to the population, or that plus the prompt's history) and the step loop in batched
waves, vectorised over the step's groups; SARA+SERA's counts after the probe. Pure numpy.
"""

from __future__ import annotations

import dataclasses
import enum

import numpy as np
from scipy.special import gammaln

from sera.allocation import waterline
from sera.estimation import P_HI, P_LO, pilot_p_hat
from sera.sequential.common import PRIOR_CLIP, Draw, NextPrompts, SequentialSettings, StepResult, _draw, _next

# ----------------------------------------------------------------------------------------------------------------------
# SARA: the effectiveness predictor and the decision rule


def effective_probability(a0, b0, successes, failures, n):
    """Probability that a group of n rollouts ends mixed (0 < K < n), given a Beta(a0, b0) prior and the j = s + f
    rollouts drawn so far, which stay in the group.

    With a = a0 + s, b = b0 + f, m = n - j, R+ = prod_{i<m} (a+i)/(a+b+i) (the rest all succeed) and
    R- = prod_{i<m} (b+i)/(a+b+i) (the rest all fail): E = 1 if s > 0 and f > 0, else
    E = 1 - [f = 0] R+ - [s = 0] R-. The products are Beta-function ratios, evaluated with gammaln. All arguments
    broadcast; returns float64 of the broadcast shape. docs/design.md section 4.
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
    4. All arguments broadcast; returns int8 SaraAction codes of the broadcast shape. docs/design.md section 4.
    """
    e = effective_probability(a0, b0, successes, failures, n)
    j = np.asarray(successes) + np.asarray(failures)
    mixed = (np.asarray(successes) > 0) & (np.asarray(failures) > 0)
    commit = (e >= tau_hi) | mixed
    abandon = ~commit & (((j >= k_min) & (e <= tau_lo)) | (j >= np.asarray(n)))
    action = np.where(commit, SaraAction.COMMIT, np.where(abandon, SaraAction.ABANDON, SaraAction.CONTINUE))
    return action.astype(np.int8)


# ----------------------------------------------------------------------------------------------------------------------
# SARA's prior: flat, fitted to the population, or that plus the prompt's own history


def fit_beta_prior(probe_successes, k0: int, clip: tuple[float, float] = PRIOR_CLIP) -> tuple[float, float]:
    """Beta(a0, b0) fitted by the beta-binomial method of moments to G probes of k0 rollouts each.

    Each group's first k0 outcomes are an unbiased sample of its prompt, whatever happened to the group later, so with
    p_g = s_g / k0 (G,): mu = mean p_g, v = var p_g, the intra-prompt correlation
    rho = (k0 v / (mu (1 - mu)) - 1) / (k0 - 1) = 1 / (a0 + b0 + 1), a0 + b0 = 1 / rho - 1, a0 = mu (a0 + b0),
    b0 = (1 - mu)(a0 + b0), each clipped to `clip`. The prior keeps the window's mean: the mass is capped at what the
    upper clip allows with the mean kept, a0 + b0 = min(1 / rho - 1, hi / max(mu, 1 - mu)), and rho <= 0 (no spread
    beyond the binomial's, e.g. no probe in the window is k0/k0) takes the cap, so a population at 6.5% gives about
    (3.5, 50), never (50, 50), and abandons its 0/k0 probes. mu = 0 gives (lo, hi), mu = 1 (hi, lo). A saturated
    population (p near 0 or 1) gives rho near 1 and both parameters near the lower clip. Returns floats (a0, b0).
    docs/design.md section 4.
    """
    s = np.asarray(probe_successes, dtype=np.float64).reshape(-1)
    if k0 < 2:
        raise ValueError(f"the method of moments needs probes of k0 >= 2 rollouts, got k0={k0}")
    if s.size == 0:
        raise ValueError("no probes to fit the prior to")
    if np.any(s < 0) or np.any(s > k0):
        raise ValueError(f"probe successes must lie in [0, k0={k0}]")
    p = s / k0
    mu, v = float(p.mean()), float(p.var())
    lo, hi = clip
    if mu in (0.0, 1.0):  # every probe all-fail (or all-succeed): all the mass on that side
        return (lo, hi) if mu == 0 else (hi, lo)
    rho = (k0 * v / (mu * (1 - mu)) - 1) / (k0 - 1)
    cap = hi / max(mu, 1 - mu)  # SARA: the largest mass whose a0 and b0 both fit under the clip with the mean kept
    mass = cap if rho <= 0 else min(1 / rho - 1, cap)
    return float(np.clip(mu * mass, lo, hi)), float(np.clip((1 - mu) * mass, lo, hi))


class SaraPrior:
    """SARA's Beta prior over each prompt's pass rate, carried from step to step (docs/design.md section 4).

    `beta(ids)` gives the prior (a0, b0) of each fresh prompt, `observe` records a finished step. settings.prior:
    - flat: Beta(settings.a0, settings.b0) for every prompt, always;
    - population: Beta(a0, b0) fitted (`fit_beta_prior`) to the probes of the last settings.window steps, refitted
      after every step; Beta(settings.a0, settings.b0) until the first step has probes;
    - history: the population prior plus the prompt's own past (successes, failures), each multiplied by
      lam = settings.history_decay at every later visit: at a visit the prior is (a0 + lam S, b0 + lam F), and the
      visit's outcomes then give S <- lam S + s, F <- lam F + f. Prompts are integer ids in [0, num_prompts).
    The state (the window's probes, the fitted prior, the per-prompt counts) is saved with `state_dict` for resume.
    """

    def __init__(self, settings: SequentialSettings, num_prompts: int | None = None):
        if settings.prior == "history" and not num_prompts:
            raise ValueError("SARA's history prior keeps counts per prompt: it needs a finite set of prompt ids")
        self.settings = settings
        self.a0, self.b0 = settings.a0, settings.b0  # the population part, refitted after each step
        self.window: list[np.ndarray] = []  # probe successes (G,) of the last `window` steps, oldest first
        self.counts = np.zeros((num_prompts, 2)) if settings.prior == "history" else None  # (P, 2) decayed S, F

    def beta(self, ids) -> tuple[np.ndarray, np.ndarray]:
        """The prior (a0 (G,), b0 (G,)) of prompts ids (G,) at this visit."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        a, b = np.full(ids.size, self.a0), np.full(ids.size, self.b0)
        if self.counts is not None:  # SARA: the prompt's own decayed history on top of the population
            past = self.settings.history_decay * self.counts[ids]
            a, b = a + past[:, 0], b + past[:, 1]
        return a, b

    def observe(self, ids, successes, failures, probe_successes) -> None:
        """Record a step: every group drawn, prompts ids (G,) unique, with its successes and failures (G,) over all
        its rollouts and the successes among its first k0 (G,). Refits the population prior for the next step."""
        q = self.settings
        if q.prior == "flat":
            return
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        s, f = np.asarray(successes, dtype=np.float64), np.asarray(failures, dtype=np.float64)
        if s.shape != ids.shape or f.shape != ids.shape or np.unique(ids).size != ids.size:
            raise ValueError("observe needs unique prompt ids and one success and failure count per id")
        self.window = [*self.window, np.asarray(probe_successes, dtype=np.int64).reshape(-1)][-q.window :]
        pooled = np.concatenate(self.window)
        if pooled.size:
            self.a0, self.b0 = fit_beta_prior(pooled, q.k0)
        if self.counts is not None:
            self.counts[ids] = q.history_decay * self.counts[ids] + np.stack([s, f], axis=1)

    def state_dict(self) -> dict:
        return {
            "prior": np.array([self.a0, self.b0]),
            "window": np.concatenate(self.window) if self.window else np.zeros(0, dtype=np.int64),
            "window_sizes": np.array([w.size for w in self.window], dtype=np.int64),
            "counts": None if self.counts is None else self.counts.copy(),
        }

    def load_state_dict(self, state: dict) -> None:
        counts = state["counts"]
        if (counts is None) != (self.counts is None) or (counts is not None and counts.shape != self.counts.shape):
            raise ValueError("the saved SARA prior was made with another prior setting or number of prompts")
        self.a0, self.b0 = (float(x) for x in state["prior"])
        sizes = np.asarray(state["window_sizes"], dtype=np.int64)
        self.window = np.split(np.asarray(state["window"], dtype=np.int64), np.cumsum(sizes)[:-1]) if sizes.size else []
        self.counts = None if counts is None else np.asarray(counts, dtype=np.float64).copy()


# ----------------------------------------------------------------------------------------------------------------------
# SARA's step loop, vectorised: the step's groups are rows of a (G, n) reward matrix


@dataclasses.dataclass
class _Groups:
    """Groups in flight: prompt ids (G,), rewards (G, n) filled left to right (probes first), rollouts drawn j (G,),
    the prior (a0, b0) each was admitted with (G,), and the order in which each was first drawn (G,)."""

    ids: np.ndarray
    rewards: np.ndarray
    j: np.ndarray
    a0: np.ndarray
    b0: np.ndarray
    order: np.ndarray

    @classmethod
    def empty(cls, n: int) -> _Groups:
        z = np.zeros(0, dtype=np.int64)
        return cls(z, np.zeros((0, n)), z, np.zeros(0), np.zeros(0), z)

    def __len__(self) -> int:
        return self.ids.size

    def arrays(self) -> tuple[np.ndarray, ...]:
        return self.ids, self.rewards, self.j, self.a0, self.b0, self.order

    def take(self, rows) -> _Groups:
        return _Groups(*(x[rows] for x in self.arrays()))

    @staticmethod
    def concat(parts: list[_Groups], n: int) -> _Groups:
        parts = [g for g in parts if len(g)]
        if not parts:
            return _Groups.empty(n)
        return _Groups(*(np.concatenate(column) for column in zip(*(g.arrays() for g in parts), strict=True)))

    def fill(self, rows: np.ndarray, counts: np.ndarray, rewards: np.ndarray) -> None:
        """Write a draw's flat rewards (sum counts,) into rows (R,) at each row's next counts (R,) positions."""
        start = np.cumsum(counts) - counts
        within = np.arange(rewards.size) - np.repeat(start, counts)
        self.rewards[np.repeat(rows, counts), np.repeat(self.j[rows], counts) + within] = rewards
        self.j[rows] += counts

    @property
    def successes(self) -> np.ndarray:
        return self.rewards.sum(axis=1).astype(np.int64)  # unfilled entries are 0


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


def _wave(settings: SequentialSettings, n: int, draw: Draw, g: _Groups, complete: bool):
    """One wave's draws and verdicts on the groups g (updated in place): one batched draw probes the fresh groups (k0)
    and extends the undecided ones (min(chunk, n - j)), `sara_decision` judges every group, and a second draw completes
    the newly committed ones to n when `complete`. Returns (actions (G,), j at the verdict (G,), rollouts drawn)."""
    chunk = np.where(g.j > 0, np.minimum(settings.chunk, n - g.j), settings.k0)
    g.fill(np.arange(len(g)), chunk, _draw(draw, g.ids, chunk))
    s = settings
    k, j = g.successes, g.j.copy()
    action = sara_decision(k, j - k, n, g.a0, g.b0, s.k_min, s.tau_lo, s.tau_hi)
    drawn = int(chunk.sum())
    todo = np.flatnonzero((action == SaraAction.COMMIT) & (j < n)) if complete else np.zeros(0, dtype=np.int64)
    if todo.size:  # SARA: a committed group keeps its probes and is completed to n
        rest = n - j[todo]
        g.fill(todo, rest, _draw(draw, g.ids[todo], rest))
        drawn += int(rest.sum())
    return action, j, drawn


def sara_step(
    settings: SequentialSettings,
    n: int,
    batch_size: int,
    budget: int | None,
    draw: Draw,
    next_prompts: NextPrompts,
    complete_committed: bool = True,
    prior: SaraPrior | None = None,
) -> StepResult:
    """One training step of SARA: probe fresh prompts, decide, commit or abandon, refill, in batched waves.

    Each wave makes one draw holding a k0-rollout probe for every fresh prompt and a min(chunk, n - j) chunk for every
    undecided group, applies `sara_decision` to every group (each fresh prompt's Beta prior from `prior.beta`, fixed
    for the step), then (complete_committed) draws the rest of each newly committed group up to n in a second call;
    probes stay in the group. Abandoned groups free their unspent rollouts, which the next wave spends on fresh prompts
    from `next_prompts`. Fill mode keeps batch_size groups open (committed or undecided) and stops once all batch_size
    are committed; budget mode (budget defaults to batch_size * n) probes fresh prompts while the unheld budget can pay
    for a whole group, and commits as many groups as it affords. A budget given in fill mode is a hard cap too. Each
    open group holds n rollouts of the budget until it is abandoned, so rollouts_generated <= budget always. Stops
    when no group is open and none can be opened (target reached, budget spent, stream exhausted), or after max_waves
    waves (groups still undecided are discarded; hit_wave_cap). `prior` is needed unless settings.prior is flat; the
    caller records the step in it afterwards (`SaraPrior.observe`). The groups are rows of one reward matrix, so a
    wave costs a few array operations whatever its number of groups. Shapes: see StepResult; all committed counts are
    n (their probe count with complete_committed=False). docs/design.md section 4.
    """
    if not 1 <= settings.k0 <= n:
        raise ValueError(f"the first probe k0={settings.k0} must lie in [1, n={n}]")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if settings.mode == "budget" and budget is None:
        budget = batch_size * n
    if budget is not None and budget < 0:
        raise ValueError(f"budget must be non-negative, got {budget}")
    if prior is None and settings.prior != "flat":
        raise ValueError(f"prior={settings.prior} carries state across steps: pass prior=SaraPrior(settings, ...)")
    prior = prior if prior is not None else SaraPrior(settings)
    live = _Groups.empty(n)  # undecided groups, in admission order
    done: dict[str, list] = {"committed": [], "abandoned": []}  # _Groups per wave, in verdict order
    decisions = np.zeros((3, n + 1), dtype=np.int64)
    spent = prompts_drawn = waves = held_by_caller = 0  # held_by_caller: unspent n - j of groups committed uncompleted
    committed = 0
    exhausted = hit_cap = False
    while True:
        held, open_groups = held_by_caller + int(n * len(live) - live.j.sum()), committed + len(live)
        fresh = 0 if exhausted else _fresh_count(settings, n, batch_size, budget, spent, open_groups, held)
        if not len(live) and fresh <= 0:
            break
        if waves == settings.max_waves:
            hit_cap = True
            break
        new_ids = _next(next_prompts, fresh) if fresh > 0 else np.zeros(0, dtype=np.int64)
        exhausted = exhausted or new_ids.size < fresh
        if not len(live) and new_ids.size == 0:
            break
        a0, b0 = prior.beta(new_ids)
        order = np.arange(prompts_drawn, prompts_drawn + new_ids.size)
        prompts_drawn += new_ids.size
        waves += 1
        fresh_groups = _Groups(new_ids, np.zeros((new_ids.size, n)), np.zeros(new_ids.size, dtype=np.int64), a0, b0,
                               order)  # fmt: skip
        g = _Groups.concat([live, fresh_groups], n)
        action, j, drawn = _wave(settings, n, draw, g, complete_committed)
        spent += drawn
        np.add.at(decisions, (action, j), 1)
        commit = np.flatnonzero(action == SaraAction.COMMIT)
        done["committed"].append(g.take(commit))
        done["abandoned"].append(g.take(np.flatnonzero(action == SaraAction.ABANDON)))  # SARA: unspent rollouts freed
        committed += commit.size
        held_by_caller += int(np.sum(n - g.j[commit]))
        live = g.take(np.flatnonzero(action == SaraAction.CONTINUE))
    return _sara_result(settings, n, batch_size, done, live, decisions, spent, prompts_drawn, waves, hit_cap)


def _sara_result(settings, n, batch_size, done, live, decisions, spent, prompts_drawn, waves, hit_cap) -> StepResult:
    """Assemble sara_step's StepResult from its committed and abandoned groups (in verdict order) and the groups
    still undecided at the end (discarded)."""
    kept, dropped = _Groups.concat(done["committed"], n), _Groups.concat(done["abandoned"], n)
    every = _Groups.concat([kept, dropped, live], n)
    first = np.argsort(every.order, kind="stable")  # every group drawn, in the order it was first drawn
    every = every.take(first)
    k = every.successes
    return StepResult(
        prompt_ids=kept.ids,
        counts=kept.j,
        rewards=kept.rewards[np.arange(n) < kept.j[:, None]],  # row by row: grouped, each in draw order
        rollouts_generated=spent,
        rollouts_trained=int(kept.j.sum()),
        groups_committed=len(kept),
        groups_abandoned=len(dropped),
        groups_discarded=len(live),
        prompts_drawn=prompts_drawn,
        waves=waves,
        hit_wave_cap=hit_cap,
        shortfall=max(batch_size - len(kept), 0) if settings.mode == "fill" else 0,
        abandoned_ids=dropped.ids,
        abandoned_successes=dropped.successes,
        abandoned_failures=dropped.j - dropped.successes,
        drawn_ids=every.ids,
        drawn_successes=k,
        drawn_failures=every.j - k,
        probe_successes=every.rewards[:, : settings.k0].sum(axis=1).astype(np.int64),
        decisions=decisions,
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
    docs/design.md sections 2-4.
    """
    j = result.counts
    if j.size == 0:
        return np.zeros(0, dtype=np.int64)
    k = result.successes
    p_hat = np.empty(j.size)
    for m in np.unique(j):
        p_hat[j == m] = pilot_p_hat(k[j == m], int(m), lo, hi)
    return waterline(p_hat, total, max(2, int(j.max())), n_max, delta) - j
