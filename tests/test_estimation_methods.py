"""p_hat estimators and the method registry."""

import numpy as np
import pytest

from sera.advantages import ADVANTAGES
from sera.estimation import HistoricalEstimator, pilot_p_hat
from sera.methods import METHODS, get_method


def test_pilot_p_hat_clips():
    np.testing.assert_allclose(pilot_p_hat([0, 2, 8], 8), [1 / 16, 0.25, 15 / 16])
    with pytest.raises(ValueError, match="m = 0"):
        pilot_p_hat([0], 0)
    with pytest.raises(ValueError, match=r"\[0, m=4\]"):
        pilot_p_hat([5], 4)


def test_historical_estimator_last_rate_and_fallback():
    est = HistoricalEstimator(5)
    np.testing.assert_allclose(est.estimate([0, 1]), [0.5, 0.5])  # prior before any data
    est.update([0, 1], successes=[1, 0], counts=[4, 4])
    # seen prompts: their last rate, clipped; unseen: the clipped running mean 1/8
    np.testing.assert_allclose(est.estimate([0, 1, 2]), [0.25, 1 / 16, 1 / 8])
    est.update([0], successes=[3], counts=[4])
    assert est.estimate([0])[0] == pytest.approx(0.75)  # the last time, not an average
    copy = HistoricalEstimator(5)
    copy.load_state_dict(est.state_dict())
    np.testing.assert_allclose(copy.estimate(np.arange(5)), est.estimate(np.arange(5)))


def test_registry_is_consistent():
    for name, method in METHODS.items():
        assert method.name == name
        assert method.advantage is None or method.advantage in ADVANTAGES
    assert get_method("sera_pilot").multiplicity_correction and get_method("sera_pilot").allocator == "waterline"
    with pytest.raises(ValueError, match="unknown method 'serra'"):
        get_method("serra")
