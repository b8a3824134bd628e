"""SARA's effectiveness predictor against enumeration and Monte Carlo, its priors (the method-of-moments fit, the
population and history priors by hand and on constructed populations), its step loop's budget and accounting
invariants (hypothesis), DS's dynamic sampling, and DPS's chain against hand-computed values."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import betabinom, binom

from sera.sequential import (
    PRIOR_CLIP,
    PRIORS,
    DynamicsPredictor,
    SaraAction,
    SaraPrior,
    SequentialSettings,
    dps_order,
    dps_prompts,
    ds_step,
    effective_probability,
    fit_beta_prior,
    mixed_probability,
    sara_decision,
    sara_step,
    sera_counts_after_probe,
)

FLAT = {"prior": "flat", "k0": 4}  # the rule as first specified: every all-equal probe of 4 is abandoned at once

# ----------------------------------------------------------------------------------------------------------------------
# A simulated policy: prompt i succeeds with probability p[i]; every reward handed out is recorded.


class Simulator:
    def __init__(self, p, seed=0):
        self.p = np.asarray(p, dtype=np.float64)
        self.rng = np.random.default_rng(seed)
        self.returned = 0  # rewards handed out
        self.calls = 0
        self.history: dict[int, list[float]] = {}  # prompt id -> rewards in the order drawn

    def draw(self, ids, counts):
        assert np.all(np.asarray(counts) >= 1)
        self.calls += 1
        rewards = (self.rng.random(int(np.sum(counts))) < np.repeat(self.p[ids], counts)).astype(np.float64)
        for i, r in zip(ids, np.split(rewards, np.cumsum(counts)[:-1]), strict=True):
            self.history.setdefault(int(i), []).extend(r.tolist())
        self.returned += rewards.size
        return rewards


class Stream:
    """Prompt ids 0, 1, 2, ... up to `size` (unbounded when None), each handed out once."""

    def __init__(self, size=None):
        self.ids = itertools.count() if size is None else iter(range(size))
        self.issued = 0

    def __call__(self, k):
        out = np.array(list(itertools.islice(self.ids, k)), dtype=np.int64)
        self.issued += out.size
        return out


# ----------------------------------------------------------------------------------------------------------------------
# effective_probability


CASES = [  # (a0, b0, successes, failures, n)
    (1.0, 1.0, 0, 0, 8),  # before any rollout
    (1.0, 1.0, 3, 0, 8),  # probes kept in the group
    (1.0, 1.0, 0, 5, 8),
    (2.0, 5.0, 2, 0, 16),  # a non-flat prior
    (0.5, 0.5, 0, 4, 8),
    (3.0, 1.0, 0, 2, 6),
    (1.0, 1.0, 1, 1, 8),  # already mixed
    (1.0, 1.0, 8, 0, 8),  # complete and saturated
]


@pytest.mark.parametrize("a0, b0, s, f, n", CASES)
def test_effective_probability_matches_enumeration_of_the_final_count(a0, b0, s, f, n):
    """Enumerate the remaining m rollouts' success count k (beta-binomial): the group is mixed iff 0 < s + k < n."""
    m = n - s - f
    k = np.arange(m + 1)
    exact = np.sum(betabinom.pmf(k, m, a0 + s, b0 + f) * ((s + k > 0) & (s + k < n)))
    assert effective_probability(a0, b0, s, f, n) == pytest.approx(exact, abs=1e-12)


@pytest.mark.parametrize("a0, b0, s, f, n", CASES)
def test_effective_probability_matches_monte_carlo(a0, b0, s, f, n):
    """p from the Beta posterior, then the remaining rollouts; the mixed fraction of N = 400,000 groups has standard
    error sqrt(E (1 - E) / N) <= 0.0008, and the tolerance is 5 standard errors (plus 1e-4 where E is 0 or 1)."""
    rng = np.random.default_rng(1)
    num = 400_000
    p = rng.beta(a0 + s, b0 + f, num)
    k = s + rng.binomial(n - s - f, p)
    mixed = np.mean((k > 0) & (k < n))
    e = float(effective_probability(a0, b0, s, f, n))
    assert mixed == pytest.approx(e, abs=5 * np.sqrt(e * (1 - e) / num) + 1e-4)


def test_effective_probability_flat_prior_identity():
    """After j >= 1 identical outcomes under Beta(1, 1), E_j = (n - j)/(n + 1); before any rollout E_0 = (n-1)/(n+1)."""
    for n in (2, 8, 16, 128):
        j = np.arange(1, n + 1)
        np.testing.assert_allclose(effective_probability(1, 1, j, 0, n), (n - j) / (n + 1), atol=1e-12)
        np.testing.assert_allclose(effective_probability(1, 1, 0, j, n), (n - j) / (n + 1), atol=1e-12)
        assert effective_probability(1, 1, 0, 0, n) == pytest.approx((n - 1) / (n + 1))


MIXED_CASES = [(0.3, 0, 0, 8), (0.02, 0, 4, 8), (0.9, 3, 0, 16), (0.5, 1, 2, 8), (0.7, 0, 6, 6)]


@pytest.mark.parametrize("p, s, f, n", MIXED_CASES)
def test_mixed_probability_with_known_p(p, s, f, n):
    """The abandonment error's P(mixed | p, rollouts so far): against Monte Carlo of the remaining rollouts, and as the
    limit of effective_probability under a Beta prior concentrated at p (mass 1e8)."""
    rng = np.random.default_rng(2)
    k = s + rng.binomial(n - s - f, p, 400_000)
    mixed = np.mean((k > 0) & (k < n))
    e = float(mixed_probability(p, s, f, n))
    assert mixed == pytest.approx(e, abs=5 * np.sqrt(e * (1 - e) / 400_000) + 1e-4)
    assert e == pytest.approx(float(effective_probability(p * 1e8, (1 - p) * 1e8, s, f, n)), abs=1e-6)
    with pytest.raises(ValueError):
        mixed_probability(1.5, 0, 0, 8)


def test_effective_probability_broadcasts_and_validates():
    e = effective_probability(np.array([[1.0], [2.0]]), 1.0, np.array([0, 1, 2]), 0, 8)
    assert e.shape == (2, 3)
    for args, match in [
        ((0.0, 1.0, 0, 0, 8), "a0 > 0"),
        ((1.0, -1.0, 0, 0, 8), "a0 > 0"),
        ((1.0, 1.0, -1, 0, 8), "non-negative"),
        ((1.0, 1.0, 5, 4, 8), "group size"),
        ((1.0, 1.0, 0, 0, 0), "at least 1"),
    ]:
        with pytest.raises(ValueError, match=match):
            effective_probability(*args)


# ----------------------------------------------------------------------------------------------------------------------
# The decision rule


def test_flat_prior_n8_abandons_after_exactly_four_identical_outcomes():
    j = np.arange(1, 9)
    for s, f in [(0 * j, j), (j, 0 * j)]:
        action = sara_decision(s, f, 8, tau_lo=0.45)
        assert action[:3].tolist() == [SaraAction.CONTINUE] * 3  # j = 1 is also below k_min = 2
        assert action[3] == SaraAction.ABANDON


def test_decision_rule_commits_mixed_respects_k_min_and_tau_hi():
    assert sara_decision(1, 1, 8) == SaraAction.COMMIT  # mixed: E = 1
    assert sara_decision(0, 1, 8, tau_lo=0.9, k_min=2) == SaraAction.CONTINUE  # below k_min, whatever E
    assert sara_decision(0, 2, 8, tau_lo=0.9, k_min=2) == SaraAction.ABANDON
    # a strong prior near 1/2 makes an unmixed group likely to mix: E = 0.98 >= tau_hi commits before it is mixed
    assert sara_decision(1, 0, 8, a0=500, b0=500) == SaraAction.COMMIT
    # a complete unmixed group is never continued, even when k_min exceeds n
    assert sara_decision(0, 4, 4, k_min=6) == SaraAction.ABANDON


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"k0": 0}, "k0"),
        ({"chunk": 0}, "chunk"),
        ({"tau_lo": 0.96}, "tau_lo < tau_hi"),
        ({"tau_hi": 1.5}, "tau_hi <= 1"),
        ({"a0": 0.0}, "Beta prior"),
        ({"max_waves": 0}, "max_waves"),
        ({"mode": "fixed"}, "mode"),
    ],
)
def test_sara_settings_validate(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SequentialSettings(**kwargs)


# ----------------------------------------------------------------------------------------------------------------------
# SARA's prior


@pytest.mark.parametrize("a, b, k0", [(0.3, 0.6, 2), (2.0, 5.0, 4), (8.0, 2.0, 8)])
def test_fit_beta_prior_recovers_the_population(a, b, k0):
    """Probes of k0 rollouts from 400,000 prompts with p ~ Beta(a, b): the method of moments gives back (a, b) within
    5% (its sampling error at this size is below 2%)."""
    rng = np.random.default_rng(12)
    s = rng.binomial(k0, rng.beta(a, b, 400_000))
    np.testing.assert_allclose(fit_beta_prior(s, k0), (a, b), rtol=0.05)


def test_fit_beta_prior_at_the_clip():
    lo, hi = PRIOR_CLIP
    assert fit_beta_prior(np.tile([0, 2], 500), 2) == (lo, lo)  # saturated: rho = 1, no mass
    assert fit_beta_prior(np.zeros(100), 2) == (lo, hi)  # mu = 0: all mass on failure
    assert fit_beta_prior(np.full(100, 4), 4) == (hi, lo)
    assert fit_beta_prior(np.tile([0, 1, 1, 2], 250), 2) == (hi, hi)  # exactly binomial(2, 1/2): rho = 0
    assert fit_beta_prior(np.ones(100), 2) == (hi, hi)  # under-dispersed: rho < 0
    for args, match in [((np.zeros(0), 2), "no probes"), ((np.ones(3), 1), "k0 >= 2"), ((np.full(3, 3), 2), "lie in")]:
        with pytest.raises(ValueError, match=match):
            fit_beta_prior(*args)


def binomial_window(mu: float, k0: int = 2, size: int = 2000) -> np.ndarray:
    """Probes with no spread beyond the binomial's (rho <= 0): every prompt at p = mu, counts laid out exactly at the
    binomial frequencies so the moments are mu and the binomial variance."""
    freq = np.round(binom.pmf(np.arange(k0 + 1), k0, mu) * size).astype(int)
    return np.repeat(np.arange(k0 + 1), freq)


@pytest.mark.parametrize("mu", [0.02, 0.065, 0.5, 0.9])
def test_fit_beta_prior_keeps_the_mean_without_over_dispersion(mu):
    """rho <= 0 takes the largest mass the upper clip allows with the window's mean kept, not (hi, hi)."""
    lo, hi = PRIOR_CLIP
    probes = binomial_window(mu)
    a0, b0 = fit_beta_prior(probes, 2)
    assert a0 / (a0 + b0) == pytest.approx(probes.mean() / 2, rel=1e-9)
    assert max(a0, b0) == pytest.approx(hi) and min(a0, b0) >= lo


@pytest.mark.parametrize("mu", [0.02, 0.065, 0.5, 0.9])
def test_fit_beta_prior_keeps_the_mean_when_the_fitted_mass_exceeds_the_clip(mu):
    """rho > 0 but 1 / rho - 1 above what the clip allows: capping the mass, not one parameter, keeps the mean."""
    rng = np.random.default_rng(3)
    probes = rng.binomial(2, rng.beta(mu * 400, (1 - mu) * 400, 200_000))  # mass 400, rho = 1/401
    a0, b0 = fit_beta_prior(probes, 2)
    assert a0 / (a0 + b0) == pytest.approx(probes.mean() / 2, rel=1e-9)
    assert max(a0, b0) == pytest.approx(PRIOR_CLIP[1])


def test_a_low_mean_population_abandons_all_fail_probes():
    """The defect the mean-keeping cap fixes: at 6.5% with no k0/k0 probe in the window, (50, 50) said a 0/2 probe
    will most likely turn mixed and committed it; the fitted prior abandons it, and commits a mixed one."""
    probes = np.repeat([1, 0], [130, 870])  # every success a lone 1/2: mu = 6.5%, rho < 0
    a0, b0 = fit_beta_prior(probes, 2)
    n = 8  # the SARA grids' group size
    assert sara_decision(np.array([0]), np.array([2]), n, a0, b0).tolist() == [SaraAction.ABANDON]
    assert sara_decision(np.array([1]), np.array([1]), n, a0, b0).tolist() == [SaraAction.COMMIT]
    assert sara_decision(np.array([0]), np.array([2]), n, 50.0, 50.0).tolist() == [SaraAction.COMMIT]  # the old fit


@pytest.mark.parametrize("probes, expected", [(np.zeros(200), "lo, hi"), (np.full(200, 2), "hi, lo")])
def test_fit_beta_prior_of_an_all_equal_window(probes, expected):
    lo, hi = PRIOR_CLIP
    assert fit_beta_prior(probes, 2) == {"lo, hi": (lo, hi), "hi, lo": (hi, lo)}[expected]


def test_population_prior_is_flat_until_data_then_fits_the_last_window_steps():
    config = SequentialSettings(window=2)  # population, k0 = 2
    prior = SaraPrior(config)
    assert [x.tolist() for x in prior.beta([3, 4])] == [[1.0, 1.0], [1.0, 1.0]]
    steps = [np.tile([0, 2], 50), np.tile([0, 1, 1, 2], 25), np.full(100, 1)]
    for i, probes in enumerate(steps):
        prior.observe(np.arange(100), probes, 2 - probes, probes)
        expected = fit_beta_prior(np.concatenate(steps[max(0, i - 1) : i + 1]), 2)
        assert (prior.a0, prior.b0) == expected
        assert prior.beta([7])[0][0] == expected[0] and prior.beta([7])[1][0] == expected[1]
    copy = SaraPrior(config)
    copy.load_state_dict(prior.state_dict())
    prior.observe([0], [2], [0], [2])
    copy.observe([0], [2], [0], [2])
    assert (copy.a0, copy.b0) == (prior.a0, prior.b0)


def test_history_prior_by_hand():
    """lam = 0.7. Visit 1 observes 3 successes and 1 failure; at visit 2 the prior is the population's plus
    0.7 * (3, 1) = (2.1, 0.7); visit 2 observes (2, 2), so at visit 3 it adds 0.7 * (0.7 * 3 + 2, 0.7 * 1 + 2)."""
    prior = SaraPrior(SequentialSettings(prior="history"), num_prompts=5)
    prior.observe([1, 2], [3, 0], [1, 2], [1, 0])
    pop = np.array([prior.a0, prior.b0])
    np.testing.assert_allclose(np.stack(prior.beta([1, 2, 0])), pop[:, None] + [[2.1, 0.0, 0.0], [0.7, 1.4, 0.0]])
    prior.observe([1], [2], [2], [1])
    pop = np.array([prior.a0, prior.b0])
    np.testing.assert_allclose(np.ravel(prior.beta([1])), pop + 0.7 * np.array([0.7 * 3 + 2, 0.7 * 1 + 2]))
    np.testing.assert_allclose(np.ravel(prior.beta([2])), pop + [0.0, 1.4])  # not visited: unchanged
    with pytest.raises(ValueError, match="finite set"):
        SaraPrior(SequentialSettings(prior="history"))
    with pytest.raises(ValueError, match="another prior"):
        SaraPrior(SequentialSettings(), 5).load_state_dict(prior.state_dict())


def run_steps(config, p, pool, steps, batch_size=32, seed=0):
    """`steps` SARA steps (n = 8) over a pool of prompts that recurs every step in a new order, the prior carried
    across them; returns the last step's result and its simulator."""
    prior = SaraPrior(config, len(p))
    rng = np.random.default_rng(seed)
    for step in range(steps):
        sim = Simulator(p, seed + step)
        order = iter(rng.permutation(pool))
        stream = lambda k, order=order: np.array(list(itertools.islice(order, k)), dtype=np.int64)  # noqa: E731
        result = sara_step(config, 8, batch_size, None, sim.draw, stream, prior=prior)
        prior.observe(result.drawn_ids, result.drawn_successes, result.drawn_failures, result.probe_successes)
    return result, sim


def test_defaults_continue_groups_on_a_spread_population():
    """p ~ U(0, 1): the fitted prior is near flat, so two identical outcomes (E_2 near 6/9) are continued and the group
    is abandoned later (E_4 near 4/9, just below or above tau_lo = 0.45 as the fit moves; E_6 near 2/9): the rule is
    sequential."""
    config = SequentialSettings()
    assert (config.prior, config.k0, config.chunk) == ("population", 2, 2)
    p = np.random.default_rng(13).uniform(size=4000)
    result, _ = run_steps(config, p, np.arange(4000), steps=3, batch_size=256)
    d = result.decisions
    assert d[SaraAction.CONTINUE, 2] > 0 and d[SaraAction.ABANDON, 4:].sum() == result.groups_abandoned > 0
    assert d[SaraAction.COMMIT, 4:].sum() > 0  # continued groups that turned mixed


def test_defaults_abandon_at_two_on_a_saturated_population():
    """Every prompt has p = 0 or 1: the first step's flat prior abandons after 4, the fitted prior (both parameters
    at the lower clip) after the first probe of 2, and nothing is continued."""
    p = np.tile([0.0, 1.0], 1000)
    first, _ = run_steps(SequentialSettings(max_waves=4), p, np.arange(2000), steps=1)
    assert first.decisions[SaraAction.ABANDON, 4] == first.groups_abandoned > 0
    result, _ = run_steps(SequentialSettings(max_waves=4), p, np.arange(2000), steps=2)
    d = result.decisions
    assert d[SaraAction.ABANDON, 2] == result.groups_abandoned == result.prompts_drawn > 0
    assert d[SaraAction.CONTINUE].sum() == 0


def test_history_prior_commits_before_the_group_is_mixed():
    """A saturated pool of 200 prompts and 100 with p = 1/2, all recurring every step. Under the history prior a
    p = 1/2 prompt's past mixed groups lift its prior so that two identical outcomes already give E_2 >= tau_hi: the
    group is committed before it is mixed. The population prior alone never does that here (its E_2 after two
    identical outcomes stays below tau_hi), so those groups are continued instead."""
    p = np.concatenate([np.full(100, 0.5), np.tile([0.0, 1.0], 100)])
    for prior, commits_unmixed in (("history", True), ("population", False)):
        result, sim = run_steps(SequentialSettings(prior=prior), p, np.arange(300), steps=8, batch_size=64)
        unmixed_at_two = [i for i in result.prompt_ids if len(set(sim.history[int(i)][:2])) == 1]
        assert (result.decisions[SaraAction.COMMIT, 2] > 0 and len(unmixed_at_two) > 0) == commits_unmixed
        assert all(sim.p[i] == 0.5 for i in result.prompt_ids)  # saturated prompts are never trained


# ----------------------------------------------------------------------------------------------------------------------
# SARA's step loop


@pytest.mark.parametrize("k0, delta", [(4, 2), (2, 1), (1, 1), (2, 2)])
def test_sara_step_abandons_unsolvable_prompts_after_four_rollouts(k0, delta):
    """Every schedule that reaches j = 4 decides there (flat prior, n = 8, tau_lo = 0.45)."""
    sim = Simulator(np.zeros(1000))
    config = SequentialSettings(k0=k0, chunk=delta, max_waves=8, prior="flat")
    result = sara_step(config, 8, 16, None, sim.draw, Stream(1000))
    assert result.groups_committed == 0 and result.groups_abandoned >= 16
    assert result.abandoned_failures.tolist() == [4] * result.groups_abandoned
    assert result.abandoned_successes.tolist() == [0] * result.groups_abandoned
    assert all(len(sim.history[int(i)]) == 4 for i in result.abandoned_ids)
    assert result.rollouts_generated == sim.returned


def test_sara_step_fill_mode_accounting_and_probes_kept_in_the_group():
    sim = Simulator(np.random.default_rng(2).uniform(size=5000), seed=3)
    stream = Stream()
    result = sara_step(SequentialSettings(**FLAT), 8, 64, None, sim.draw, stream)
    assert result.groups_committed == 64 and result.shortfall == 0 and not result.hit_wave_cap
    assert np.all(result.counts == 8) and result.rewards.shape == (64 * 8,)
    assert result.rollouts_trained == 64 * 8
    assert result.rollouts_generated == sim.returned
    assert result.prompts_drawn == stream.issued
    assert result.groups_committed + result.groups_abandoned + result.groups_discarded == result.prompts_drawn
    # the flat prior never reaches tau_hi = 0.95 before a group is mixed, so every committed group is effective
    assert result.effective_groups == 64
    for i, r in zip(result.prompt_ids, np.split(result.rewards, np.cumsum(result.counts)[:-1]), strict=True):
        assert r.tolist() == sim.history[int(i)]  # the group is every rollout drawn for the prompt, probes first
    for i, s, f in zip(result.abandoned_ids, result.abandoned_successes, result.abandoned_failures, strict=True):
        assert (s, f) == (sum(sim.history[int(i)]), len(sim.history[int(i)]) - sum(sim.history[int(i)]))
    assert set(result.prompt_ids.tolist()).isdisjoint(result.abandoned_ids.tolist())


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(2, 12),
    batch_size=st.integers(1, 12),
    budget_groups=st.floats(0.0, 3.0),
    k0=st.integers(1, 12),
    delta=st.integers(1, 4),
    k_min=st.integers(1, 6),
    tau_lo=st.floats(0.0, 0.7),
    mode=st.sampled_from(["fill", "budget"]),
    complete=st.booleans(),
    max_waves=st.integers(1, 8),
    prior=st.sampled_from(PRIORS),
    seed=st.integers(0, 2**16),
)
def test_sara_step_never_exceeds_the_budget(
    n, batch_size, budget_groups, k0, delta, k_min, tau_lo, mode, complete, max_waves, prior, seed
):
    """Budget, accounting and group contents over three steps of a pool that recurs, the prior carried across them."""
    rng = np.random.default_rng(seed)
    p = np.where(rng.random(500) < 0.4, rng.integers(0, 2, 500), rng.uniform(size=500))  # 40% saturated prompts
    k0 = min(k0, n) if prior == "flat" else min(max(k0, 2), n)
    config = SequentialSettings(
        k0=k0, chunk=delta, k_min=k_min, tau_lo=tau_lo, mode=mode, max_waves=max_waves, prior=prior,
    )  # fmt: skip
    state = SaraPrior(config, 500)
    budget = int(budget_groups * batch_size * n)
    for step in range(3):
        sim = Simulator(p, seed + step)
        stream = Stream(int(rng.integers(0, 500)))
        result = sara_step(config, n, batch_size, budget, sim.draw, stream, complete_committed=complete, prior=state)
        assert result.rollouts_generated <= budget
        assert result.rollouts_generated == sim.returned
        assert result.prompts_drawn == stream.issued == result.drawn_ids.size
        assert result.waves <= max_waves
        assert result.rollouts_trained == result.counts.sum() == result.rewards.size
        assert np.all(result.counts <= n) and (not complete or np.all(result.counts == n))
        assert result.groups_committed + result.groups_abandoned + result.groups_discarded == result.prompts_drawn
        if mode == "fill":
            assert result.groups_committed <= batch_size
            assert result.shortfall == batch_size - result.groups_committed
        # every verdict counted once, at the rollouts drawn when it was given
        d = result.decisions
        assert d[SaraAction.COMMIT].sum() == result.groups_committed
        assert d[SaraAction.ABANDON].sum() == result.groups_abandoned
        assert d[SaraAction.COMMIT] @ np.arange(n + 1) <= result.rollouts_trained
        # each group is every rollout drawn for its prompt, in draw order; the probe is its first k0
        groups = np.split(result.rewards, np.cumsum(result.counts)[:-1]) if result.counts.size else []
        for i, r in zip(result.prompt_ids, groups, strict=True):
            assert r.tolist() == sim.history[int(i)]
        assert result.drawn_ids.tolist() == sorted(sim.history)  # in the order first drawn (the stream's order)
        for i, s, f, k in zip(result.drawn_ids, result.drawn_successes, result.drawn_failures,
                              result.probe_successes, strict=True):  # fmt: skip
            drawn = sim.history[int(i)]
            assert (s, f, k) == (sum(drawn), len(drawn) - sum(drawn), sum(drawn[:k0]))
        state.observe(result.drawn_ids, result.drawn_successes, result.drawn_failures, result.probe_successes)


@pytest.mark.parametrize("mode", ["fill", "budget"])
def test_all_saturated_batch_terminates_and_reports_the_cap(mode):
    sim = Simulator(np.tile([0.0, 1.0], 50_000))
    budget = 8 * 1000 if mode == "budget" else None  # each wave spends half of what is left: ~10 waves to spend it
    result = sara_step(SequentialSettings(max_waves=5, mode=mode, **FLAT), 8, 32, budget, sim.draw, Stream())
    assert result.hit_wave_cap and result.waves == 5
    assert result.groups_committed == 0 and result.rollouts_trained == 0 and result.rewards.size == 0
    assert result.rollouts_generated == 4 * result.prompts_drawn == sim.returned
    assert result.shortfall == (32 if mode == "fill" else 0)


def test_exhausted_stream_stops_without_the_cap():
    result = sara_step(SequentialSettings(**FLAT), 8, 32, None, Simulator(np.ones(10)).draw, Stream(10))
    assert not result.hit_wave_cap and result.groups_committed == 0 and result.shortfall == 32
    assert result.prompts_drawn == 10 and result.groups_abandoned == 10


def test_budget_mode_spends_the_budget_and_commits_more_than_b_when_prompts_saturate():
    sim = Simulator(np.tile([0.0, 0.5], 5000), seed=4)
    result = sara_step(SequentialSettings(mode="budget", **FLAT), 8, 32, None, sim.draw, Stream())
    assert result.rollouts_generated <= 32 * 8
    assert result.rollouts_generated > 32 * 8 - 8  # stops only when the rest cannot pay for a whole group
    # uniform allocation of the same budget (the first 32 prompts, 16 with p = 0) gets at most 16 mixed groups;
    # the probes freed by p = 0 prompts buy SARA more (fixed-budget yield dominance)
    assert result.effective_groups == result.groups_committed > 16


@pytest.mark.parametrize("a0, b0", [(1.0, 1.0), (0.5, 0.5)])
def test_abandonment_error_is_calibrated_and_below_tau_lo(a0, b0):
    """Property: over prompts with p drawn from SARA's prior, the probability that an abandoned group would have ended
    mixed had it been completed (exact given p: 1 - p^m after all-successes, 1 - (1 - p)^m after all-failures),
    averaged over abandoned groups, equals the mean predicted E_j at abandonment, which the rule keeps <= tau_lo.
    Both are checked within 4 standard errors of the average."""
    n, tau_lo = 8, 0.45
    rng = np.random.default_rng(5)
    sim = Simulator(rng.beta(a0, b0, 20_000), seed=6)
    config = SequentialSettings(a0=a0, b0=b0, tau_lo=tau_lo, mode="budget", **FLAT)
    result = sara_step(config, n, 2000, None, sim.draw, Stream(20_000))
    s, f = result.abandoned_successes, result.abandoned_failures
    assert result.groups_abandoned > 500
    p, m = sim.p[result.abandoned_ids], n - s - f
    error = np.where(f == 0, 1 - p**m, 1 - (1 - p) ** m)
    predicted = effective_probability(a0, b0, s, f, n)
    assert np.all(predicted <= tau_lo)
    se = error.std() / np.sqrt(error.size)
    assert error.mean() == pytest.approx(predicted.mean(), abs=4 * se)
    assert error.mean() <= tau_lo + 4 * se


def test_sara_step_rejects_bad_arguments():
    sim = Simulator(np.full(10, 0.5))
    with pytest.raises(ValueError, match="k0"):
        sara_step(SequentialSettings(k0=9), 8, 4, None, sim.draw, Stream())
    with pytest.raises(ValueError, match="binary"):
        sara_step(SequentialSettings(**FLAT), 8, 4, None, lambda ids, c: np.full(int(c.sum()), 0.5), Stream())
    with pytest.raises(ValueError, match="rewards for counts"):
        sara_step(SequentialSettings(**FLAT), 8, 4, None, lambda ids, c: np.zeros(3), Stream())
    with pytest.raises(ValueError, match="pass prior=SaraPrior"):  # the default prior carries state: never implicit
        sara_step(SequentialSettings(), 8, 4, None, sim.draw, Stream())


# ----------------------------------------------------------------------------------------------------------------------
# The combinations


def test_sara_plus_dps_takes_a_dps_ranked_prompt_stream():
    predictor = DynamicsPredictor(400, decay=0.7)
    # history: even prompts were partial last time, odd ones solved; so DPS should feed SARA only even prompts
    predictor.update(np.arange(400), np.where(np.arange(400) % 2 == 0, 4, 8), 8)
    sim = Simulator(np.full(400, 0.5), seed=7)
    stream = Stream(400)
    result = sara_step(SequentialSettings(**FLAT), 8, 16, None, sim.draw, dps_prompts(predictor, stream, ratio=4))
    assert result.groups_committed == 16
    assert set(sim.history) and all(i % 2 == 0 for i in sim.history)
    assert stream.issued == 4 * result.prompts_drawn  # each pool holds ratio * k candidates
    predictor.update(result.prompt_ids, result.successes, result.counts)  # the loop closes: observe what was trained


@pytest.mark.parametrize("mode", ["fill", "budget"])
def test_sara_plus_sera_spreads_the_rest_of_the_budget_over_the_probed_groups(mode):
    n, batch_size = 8, 32
    budget = n * batch_size
    sim = Simulator(np.random.default_rng(8).uniform(0.02, 0.98, 2000), seed=9)
    config = SequentialSettings(mode=mode, **FLAT)
    budget_arg = budget if mode == "budget" else None
    result = sara_step(config, n, batch_size, budget_arg, sim.draw, Stream(), complete_committed=False)
    assert np.all(result.counts < n)  # committed on their probes, not completed
    if mode == "fill":
        assert result.groups_committed == batch_size
        total = budget  # the training budget B n0; abandoned probes are overhead, as in SARA's fill mode
    else:
        total = result.rollouts_trained + budget - result.rollouts_generated  # everything left
    extra = sera_counts_after_probe(result, total, n_max=8 * n)
    n_i = result.counts + extra
    assert np.all(extra >= 0) and np.all(n_i >= result.counts.max()) and n_i.sum() == total
    if mode == "budget":
        assert result.rollouts_generated + extra.sum() == budget  # the whole budget, abandoned probes included
    k_rate = result.successes / result.counts
    assert n_i[np.argmin(k_rate)] >= n_i[np.argmax(k_rate)]  # SERA: the hardest probe gets at least as many


# ----------------------------------------------------------------------------------------------------------------------
# DS: DAPO dynamic sampling


def test_ds_trains_the_first_b_mixed_groups_never_duplicates_and_caps_rounds():
    p = np.tile([0.0, 1.0, 0.5, 0.5], 1000)
    sim = Simulator(p, seed=10)
    stream = Stream()
    result = ds_step(8, 32, 48, 10, sim.draw, stream)
    assert result.groups_committed == 32 and result.shortfall == 0 and not result.hit_wave_cap
    assert np.unique(result.prompt_ids).size == 32
    assert sim.calls == result.waves <= 10
    assert result.rollouts_generated == sim.returned == 8 * result.prompts_drawn == 8 * stream.issued
    k = result.successes
    assert np.all((k > 0) & (k < 8)) and result.effective_groups == 32
    mixed_drawn = [i for i in range(result.prompts_drawn) if 0 < sum(sim.history[i]) < 8]
    assert result.prompt_ids.tolist() == mixed_drawn[:32]  # the first B kept, in order
    assert result.groups_discarded == len(mixed_drawn) - 32
    assert result.groups_abandoned == result.prompts_drawn - len(mixed_drawn)


def test_ds_at_the_cap_trains_on_what_was_kept():
    sim = Simulator(np.tile([0.0, 1.0], 1000))
    result = ds_step(8, 16, 16, 4, sim.draw, Stream())
    assert result.hit_wave_cap and result.waves == sim.calls == 4
    assert result.groups_committed == 0 and result.shortfall == 16 and result.rollouts_generated == 4 * 16 * 8
    sim = Simulator(np.where(np.arange(100) == 5, 0.5, 0.0), seed=11)
    result = ds_step(8, 16, 16, 4, sim.draw, Stream())
    assert result.groups_committed <= 1 and result.shortfall == 16 - result.groups_committed


def test_ds_stops_when_the_stream_runs_out():
    result = ds_step(8, 16, 16, 10, Simulator(np.zeros(20)).draw, Stream(20))
    assert result.waves == 2 and result.prompts_drawn == 20 and not result.hit_wave_cap


# ----------------------------------------------------------------------------------------------------------------------
# DPS


def test_dps_reference_values():
    """One observation from the uniform belief: xi puts 1/3 on each entry of the observed row, so the observed state's
    column of alpha is (1, 4/3, 1) up to order, and the next prior is that column over its sum 10/3."""
    dps = DynamicsPredictor(4, decay=0.7)
    dps.update([0, 1, 2], [0, 3, 8], 8)  # unsolved, partial, solved
    np.testing.assert_allclose(dps.partial_probability([0, 1, 2, 3]), [0.3, 0.4, 0.3, 1 / 3])
    np.testing.assert_allclose(dps.prior[1], [0.3, 0.4, 0.3])
    np.testing.assert_allclose(dps.prior[0], [0.4, 0.3, 0.3])
    np.testing.assert_allclose(dps.alpha[1], [[1, 1, 1], [4 / 3, 4 / 3, 4 / 3], [1, 1, 1]])
    np.testing.assert_allclose(dps.belief[1], [0, 1, 0])
    assert dps.partial_probability([3])[0] == 1 / 3  # unseen: untouched, exactly


def test_dps_decay_and_second_observation_by_hand():
    # lam = 0.5. Step 1: prompt 0 partial -> alpha row 1 = 4/3 (see above); prompt 1 partial as well.
    dps = DynamicsPredictor(3, decay=0.5)
    dps.update([0, 1], [4, 4], 8)
    # Step 2: prompt 0 unobserved: alpha <- 0.5 alpha + 0.5 -> row 1 = 7/6, other rows 1; every column is
    # (1, 7/6, 1) / (19/6), so the prior is (6/19, 7/19, 6/19) whatever the belief; the belief becomes the old prior.
    # Prompt 1 solved: xi[2, j] is proportional to Phi[2, j] mu[j] with mu = (0, 1, 0), so xi[2, 1] = 1; alpha after
    # the decay has row 1 = 7/6 and alpha[2, 1] = 1 + 1 = 2; the next prior is column 2 = (1, 7/6, 1) / (19/6).
    dps.update([1], [8], 8)
    np.testing.assert_allclose(dps.alpha[0], [[1, 1, 1], [7 / 6, 7 / 6, 7 / 6], [1, 1, 1]])
    np.testing.assert_allclose(dps.belief[0], [0.3, 0.4, 0.3])
    np.testing.assert_allclose(dps.prior[0], [6 / 19, 7 / 19, 6 / 19])
    np.testing.assert_allclose(dps.alpha[1], [[1, 1, 1], [7 / 6, 7 / 6, 7 / 6], [1, 2, 1]])
    np.testing.assert_allclose(dps.prior[1], [6 / 19, 7 / 19, 6 / 19])
    np.testing.assert_allclose(dps.belief[1], [0, 0, 1])
    # Step 3: prompt 0 partial again, from mu = (0.3, 0.4, 0.3): xi[1, j] is proportional to
    # Phi[1, j] mu[j] = (7/19)(0.3, 0.4, 0.3), i.e. (0.3, 0.4, 0.3); after the decay row 1 = 0.5 * 7/6 + 0.5 = 13/12,
    # so column 1 of alpha is (1, 13/12 + 0.4, 1) = (1, 89/60, 1) and P(partial) = (89/60) / (209/60) = 89/209.
    dps.update([0], [2], 8)
    np.testing.assert_allclose(dps.alpha[0][1], [13 / 12 + 0.3, 13 / 12 + 0.4, 13 / 12 + 0.3])
    assert dps.partial_probability([0])[0] == pytest.approx(89 / 209)
    assert dps.partial_probability([2])[0] == 1 / 3


def test_dps_state_dict_round_trip_and_validation():
    dps = DynamicsPredictor(6, decay=0.7)
    dps.update([0, 3], [1, 8], 8)
    dps.update([1], [0], 8)
    copy = DynamicsPredictor(6, decay=0.7)
    copy.load_state_dict(dps.state_dict())
    dps.update([2], [4], 8)
    copy.update([2], [4], 8)
    np.testing.assert_array_equal(copy.prior, dps.prior)
    np.testing.assert_array_equal(copy.alpha, dps.alpha)
    with pytest.raises(ValueError, match="shape"):
        DynamicsPredictor(5, decay=0.7).load_state_dict(dps.state_dict())
    with pytest.raises(ValueError, match="unique"):
        dps.update([1, 1], [0, 0], 8)
    with pytest.raises(ValueError, match=r"\[0, n\]"):
        dps.update([1], [9], 8)
    with pytest.raises(ValueError, match="decay"):
        DynamicsPredictor(3, decay=1.5)


def test_dps_order_top_b_with_ties_in_pool_order():
    dps = DynamicsPredictor(10, decay=0.7)
    dps.update([1, 2, 3], [4, 0, 8], 8)  # P(partial): 1 -> 0.4, 2 and 3 -> 0.3, the rest 1/3
    assert np.array([2, 5, 1, 7, 3])[dps_order(dps, [2, 5, 1, 7, 3], 3)].tolist() == [1, 5, 7]
    assert np.array([7, 5, 1, 2, 3])[dps_order(dps, [7, 5, 1, 2, 3], 4)].tolist() == [1, 7, 5, 2]
    with pytest.raises(ValueError, match="select 6 of 5"):
        dps_order(dps, [2, 5, 1, 7, 3], 6)
