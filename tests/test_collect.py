"""The shared collection step (sera.collect): every sampler's budget accounting and grouping, with a fake draw."""

import numpy as np
import pytest

from sera.allocators import SAMPLERS
from sera.collect import COLLECTORS, collect
from sera.methods import METHODS, MethodSettings

P = np.array([0.02, 0.3, 0.6, 0.97, 0.5, 0.1])  # true success probabilities of the step's six prompts


def settings(name, estimator="none", pilot_m=0, n0=8):
    method = METHODS[name]
    return MethodSettings(
        method, n0, estimator, pilot_m, 1 / 16, 15 / 16, max(2, pilot_m), 8 * n0, 1,
        method.multiplicity_correction, "token-mean", {},
    )  # fmt: skip


class FakeDraw:
    """Draws Bernoulli(P) rewards; each payload row is (prompt, call, index within the call's group)."""

    def __init__(self, seed=0):
        self.rng, self.calls = np.random.default_rng(seed), []

    def __call__(self, counts):
        self.calls.append(counts.copy())
        rows = np.repeat(np.arange(counts.size), counts)
        within = np.arange(rows.size) - np.repeat(np.cumsum(counts) - counts, counts)
        payload = np.stack([rows, np.full(rows.size, len(self.calls) - 1), within], axis=1)
        return payload, (self.rng.random(rows.size) < P[rows]).astype(float)


CASES = [
    ("grpo", "none", 0),
    ("maxrl", "none", 0),
    ("sera_pilot", "pilot", 4),
    ("sera_pilot", "oracle", 0),
    ("dars_hw", "none", 0),
]


@pytest.mark.parametrize("name, estimator, m", CASES)
def test_every_sampler_accounts_for_its_budget_and_groups_by_prompt(name, estimator, m):
    draw = FakeDraw()
    out = collect(settings(name, estimator, m), P.size, draw, lambda: P)
    drawn = np.sum(draw.calls, axis=0)
    np.testing.assert_array_equal(out.counts, drawn)  # every drawn rollout is in the step, none twice
    assert out.rollouts_generated == out.rollouts_trained == int(drawn.sum())
    if name == "dars_hw":
        assert out.rollouts_generated >= P.size * 8  # DARS-HW adds rollouts; its real count is what is reported
    else:
        assert out.rollouts_generated == P.size * 8  # the budget B * n0, pilots included
    rows = np.concatenate(out.payloads)[out.order] if out.order is not None else out.payloads[0]
    np.testing.assert_array_equal(rows[:, 0], out.rows)  # grouped by prompt
    for i in range(P.size):  # within a group: the first call's rollouts (the pilots) first, in draw order
        group = rows[out.rows == i]
        assert np.all(np.diff(group[:, 1]) >= 0)
    np.testing.assert_array_equal(out.rewards, draw_rewards(draw, out))


def draw_rewards(draw, out):
    """The rewards the fake draw returned, regrouped the way the step's payloads are (checks the two line up)."""
    replay = FakeDraw()
    rewards = np.concatenate([replay(c)[1] for c in draw.calls])
    return rewards[out.order] if out.order is not None else rewards


def test_pilots_set_p_hat_and_stay_in_their_group():
    draw = FakeDraw(seed=3)
    out = collect(settings("sera_pilot", "pilot", 4), P.size, draw)
    assert draw.calls[0].tolist() == [4] * P.size  # the pilot call
    first = np.cumsum(out.counts) - out.counts
    pilot_rewards = out.rewards[first[:, None] + np.arange(4)]  # (B, m): the first m rewards of each group
    np.testing.assert_allclose(out.p_hat, np.clip(pilot_rewards.mean(1), 1 / 16, 15 / 16))
    assert out.counts.min() >= 4 and 0 < out.tau < 1
    assert out.counts[np.argmin(out.p_hat)] >= out.counts[np.argmax(out.p_hat)]  # harder prompts get more


def test_history_without_data_allocates_uniformly():
    out = collect(settings("sera_pilot", "history"), P.size, FakeDraw(), lambda: None)
    assert out.counts.tolist() == [8] * P.size and out.p_hat is None and out.tau is None


def test_bad_draw_and_missing_source_are_errors():
    with pytest.raises(ValueError, match="needs a p_hat source"):
        collect(settings("sera_pilot", "history"), P.size, FakeDraw())
    with pytest.raises(ValueError, match="returned 1 rewards"):
        collect(settings("maxrl"), P.size, lambda counts: (None, np.zeros(1)))


def test_every_registry_allocator_has_a_sampler():
    assert {m.allocator for m in METHODS.values() if m.advantage is not None} <= set(SAMPLERS)
    assert set(COLLECTORS) == set(SAMPLERS) - {"none"}  # every allocator with rollouts has its collection function


def test_sara_resumes_a_checkpoint_from_before_its_prior():
    """Checkpoints written before SARA had a prior carried nothing for SARA (None) and the DPS predictor's state alone
    for SARA+DPS: the flat prior resumes from them; a fitted prior, which has state, refuses them with a message."""
    from sera.collect import SequentialState
    from sera.sequential import DynamicsPredictor, SaraPrior, SequentialSettings

    flat = SequentialState(None, SaraPrior(SequentialSettings(prior="flat", k0=4)))
    flat.load_state_dict(None)
    with_dps = SequentialState(DynamicsPredictor(4, 0.5), SaraPrior(SequentialSettings(prior="flat", k0=4), 4))
    with_dps.load_state_dict(DynamicsPredictor(4, 0.5).state_dict())
    fitted = SequentialState(None, SaraPrior(SequentialSettings(prior="population")))
    with pytest.raises(ValueError, match="lacks a prior"):
        fitted.load_state_dict(None)


def test_the_authors_rule_draws_only_for_its_active_set_and_trains_those_groups():
    from sera.allocation import active_waterline
    from sera.methods import Study

    s = MethodSettings.build(Study("toy"), "sera", 8, estimator="beta")
    p = np.array([1e-4, 0.3, 0.6, 0.9999, 0.5, 0.1])  # the first and fourth have little chance of a mixed group
    draw = FakeDraw()
    out = collect(s, p.size, draw, lambda: p)
    expected = active_waterline(p, p.size * 8, 2, 32)
    np.testing.assert_array_equal(draw.calls[0], expected)  # one draw: nothing for the prompts left out
    np.testing.assert_array_equal(out.prompts, np.flatnonzero(expected))
    np.testing.assert_array_equal(out.counts, expected[expected > 0])
    assert out.rollouts_trained == out.rollouts_generated == p.size * 8 and out.metrics["alloc/active"] == 4
    np.testing.assert_array_equal(out.p_hat, p[expected > 0])
    with_unseen = collect(s, p.size, FakeDraw(), lambda: np.where(np.arange(6) == 2, np.nan, p))
    assert with_unseen.counts.tolist() == [8] * 6 and with_unseen.p_hat is None  # the cold-start rule: uniform
