"""sera.sink: the never-solved measures and the guard (results/cpu/PLAN_SINK.md), on hand-made streams of outcomes."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from sera.allocation import active_waterline
from sera.sink import SinkMonitor, SinkWarning


def epoch_of(monitor, epoch, steps):
    """Feed one epoch: each step (ids, prompts, counts, successes); returns the boundary's and the steps' metrics."""
    boundary = monitor.start(epoch)
    return boundary, [monitor.observe(np.array(i), np.array(p), np.array(c), np.array(k)) for i, p, c, k in steps]


def test_the_share_counts_a_prompt_left_out_as_zero_rollouts_and_starts_in_epoch_one():
    monitor = SinkMonitor(4)
    _, first = epoch_of(monitor, 0, [([0, 1, 2, 3], [0, 1, 2, 3], [4, 4, 4, 4], [0, 2, 0, 1])])
    assert first == [{}]  # epoch 0: no prompt has an estimate yet
    # prompts 0 and 2 never solved; prompt 2 left out (no rollouts), prompt 3 one of the others
    _, (step,) = epoch_of(monitor, 1, [([0, 1, 2, 3], [0, 1, 3], [10, 4, 2], [0, 1, 1])])
    assert step == {"alloc/unsolved_share": 10 / 16, "alloc/unsolved_active": 1, "alloc/solved_n_median": 3.0}


@pytest.mark.filterwarnings("ignore::sera.sink.SinkWarning")
def test_the_epoch_end_gives_the_pools_success_by_the_p_hat_bin_it_was_read_at():
    monitor = SinkMonitor(4)
    epoch_of(monitor, 0, [([0, 1, 2, 3], [0, 1, 2, 3], [4, 4, 4, 4], [0, 2, 0, 4])])
    # epoch 1 reads Beta means 0.1 (0, 2: 0.5 / 5), 0.5 (1) and 0.9 (3: 4.5 / 5)
    boundary, _ = epoch_of(monitor, 1, [([0, 1, 2, 3], [0, 1, 2, 3], [8, 4, 2, 2], [1, 2, 0, 2])])
    assert boundary["pool/success"] == 6 / 16 and boundary["pool/never_solved"] == 0.5  # the epoch-0 summary
    boundary, _ = epoch_of(monitor, 2, [])
    assert boundary["pool/success"] == 5 / 16
    assert boundary["pool/success_phat_0.05-0.2"] == 1 / 10 and boundary["pool/prompts_phat_0.05-0.2"] == 2
    assert boundary["pool/success_phat_0.4-0.6"] == 2 / 4 and boundary["pool/success_phat_0.8-1"] == 2 / 2
    assert boundary["pool/never_solved"] == 0.25  # prompt 0 solved in epoch 1, prompt 2 still not
    assert boundary["sink/epoch_unsolved_share"] == 10 / 16  # prompts 0 and 2 had 8 + 2 of 16


def test_the_guard_warns_once_for_each_epoch_that_spends_more_than_half_on_never_solved_prompts():
    monitor = SinkMonitor(4)
    epoch_of(monitor, 0, [([0, 1, 2, 3], [0, 1, 2, 3], [4, 4, 4, 4], [0, 2, 0, 4])])  # 0 and 2 never solved
    sunk = [([0, 1, 2, 3], [0, 1, 2, 3], [6, 2, 6, 2], [0, 1, 0, 1])] * 3  # 12 of each step's 16 on 0 and 2
    epoch_of(monitor, 1, sunk)
    with pytest.warns(SinkWarning, match=r"epoch 1: 75% of the rollouts .*alloc.never_solved=leave_out") as caught:
        boundary, _ = epoch_of(monitor, 2, sunk)
    assert len(caught) == 1 and boundary["sink/warned"] == 1 and boundary["sink/epoch_unsolved_share"] == 0.75
    with pytest.warns(SinkWarning, match="epoch 2: 75%"):  # the next epoch that sinks warns again
        epoch_of(monitor, 3, [([0, 1, 2, 3], [0, 1, 2, 3], [2, 2, 2, 2], [0, 1, 0, 1])])
    with warnings.catch_warnings():  # half exactly (4 of 8): no warning
        warnings.simplefilter("error", SinkWarning)
        boundary, _ = epoch_of(monitor, 4, [])
    assert boundary["sink/epoch_unsolved_share"] == 0.5 and "sink/warned" not in boundary


def test_the_monitor_resumes_from_its_state():
    steps = [([0, 1, 2, 3], [0, 1, 2, 3], [4, 4, 4, 4], [0, 1, 0, 2])]
    a, b = SinkMonitor(4), SinkMonitor(4)
    epoch_of(a, 0, steps), epoch_of(a, 1, steps)
    epoch_of(b, 0, steps), epoch_of(b, 1, steps[:0])
    c = SinkMonitor(4)
    c.load_state_dict(b.state_dict())
    c.observe(*map(np.array, steps[0]))
    assert epoch_of(a, 2, [])[0] == epoch_of(c, 2, [])[0]


def test_excluded_prompts_get_no_rollouts_unless_the_budget_needs_them():
    p = np.array([0.002, 0.3, 0.002, 0.6])
    keep = active_waterline(p, 64, 2, 64, 0.05)
    assert keep[[0, 2]].sum() > 0  # the authors' rule: the hopeless prompts stay active (score 0.12 > 0.05)
    left = active_waterline(p, 64, 2, 64, 0.05, exclude=np.array([True, False, True, False]))
    assert left[[0, 2]].tolist() == [0, 0] and left.sum() == 64
    few = active_waterline(p, 64 * 3, 2, 64, 0.05, exclude=np.array([True, False, True, False]))
    assert (few > 0).sum() == 3 and few.sum() == 192  # three prompts needed under n_max = 64: one excluded comes back
    everyone = active_waterline(p, 64, 2, 64, 0.0, exclude=np.array([True, False, False, False]))
    assert everyone[0] == 0 and (everyone[1:] >= 2).all() and everyone.sum() == 64
