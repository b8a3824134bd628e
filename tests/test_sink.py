"""sera.sink: the never-solved measures and the guard (results/cpu/PLAN_SINK.md), on hand-made streams of outcomes."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import yaml

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


ROOT = Path(__file__).resolve().parents[1]


def test_the_committed_footprint_is_recomputed_from_the_archive_and_quoted_as_it_is(tmp_path):
    """results/cpu/sink/footprint.md, rebuilt from C5's and C6's archived runs, cell by cell; and the numbers README's
    C5 sentence quotes from it (rounded to integers there) are its cells."""
    from paper_figures import archive, guard, sink
    from paper_figures.prereg import CLAIMS
    from paper_figures.render import write_table
    from paper_figures.runs import load_runs

    for folder in ("maze-cpu_pool", "math-cpu"):
        archive.restore(ROOT / "results" / "runs" / folder, tmp_path / folder)
    c6 = next(c for c in CLAIMS if c.name.startswith("C6"))
    rows = sink.footprint_rows(sink.C5, load_runs(tmp_path / "maze-cpu_pool"))
    rows += sink.footprint_rows(c6, load_runs(tmp_path / "math-cpu"))
    built = write_table(tmp_path / "footprint", sink.FOOTPRINT, rows)
    committed = (ROOT / "results" / "cpu" / "sink" / "footprint.md").read_text()
    assert built.strip() == committed.strip()
    table = next(iter(guard.parse(committed)[0].values()))
    cell = {(r[0].split()[0], r[1]): dict(zip(table.header, r, strict=True)) for r in table.rows}
    rule, maxrl = cell[("C5", "sera")], cell[("C5", "maxrl")]
    readme = " ".join((ROOT / "README.md").read_text().split())
    mixed = "mixed groups a step (median of run means)"
    quoted = (f"every one of the rule's {rule['seeds']} runs has such steps, a median of "
              f"{float(rule['steps with no gradient (median a run)']):.0f} a run; MaxRL {maxrl['in total']} in all "
              f"{maxrl['seeds']} runs) and as {float(rule[mixed]):.0f} mixed groups a step against MaxRL's "
              f"{float(maxrl[mixed]):.0f}")  # fmt: skip
    assert quoted in readme
    assert rule["runs with one"] == f"{rule['seeds']} of {rule['seeds']}"


def fake_run(root: Path, name: str, method: str, seed: int, passed: int, base: str, **config) -> None:
    """A finished maze-pool run whose held-out record at step 800 has `passed` of 4 mazes solved in every sample."""
    run = root / name
    run.mkdir(parents=True)
    cfg = {"experiment": "maze", "seed": seed, "method": {"name": method, "naming": 2, "aggregation": "token-mean"},
           **config}  # fmt: skip
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    (run / "DONE").write_text("{}")
    (run / "metrics.jsonl").write_text(json.dumps({"step": 799, "train/live_rollouts": 5}) + "\n")
    (run / "base.json").write_text(json.dumps({"eval_sha256": base}))
    record = {"ids": [0, 1, 2, 3], "n": 64, "correct": [64] * passed + [0] * (4 - passed)}
    (run / "eval_step800_heldout.json").write_text(json.dumps(record))


def test_an_intervention_pairs_with_the_archived_maxrl_run_of_its_seed_only_from_one_base_model(tmp_path):
    from paper_figures import sink
    from paper_figures.runs import load_runs

    registered, interventions = tmp_path / "maze-cpu_pool", tmp_path / "sink" / "maze-cpu_pool"
    for seed in (17, 18, 19):
        fake_run(registered, f"maxrl_seed-{seed}", "maxrl", seed, 3, f"b{seed}")
        fake_run(registered, f"sera_seed-{seed}", "sera", seed, 1, f"b{seed}")
        base = "other" if seed == 19 else f"b{seed}"  # seed 19's base model did not reproduce: no pair
        fake_run(interventions, f"sera_floor_seed-{seed}", "sera", seed, 2 + (seed == 18), base, alloc={"n_min": 4})
    rows = {r[0]: r for r in sink.intervention_rows(load_runs(registered), load_runs(interventions))}
    name, seeds, own, rule, versus, reading, each = rows["floor"]
    assert seeds == 2 and each == "17: -25.00, 18: +0.00"  # Pass@32 50% and 75% against MaxRL's 75%
    assert own.startswith("-12.50 [") and rule.startswith("-50.00") and versus.startswith("+37.50 [")
    assert reading == "in progress (2 of 6 seeds)" and rows["leave_out"][1] == 0


def test_capped_prompts_keep_at_most_the_cap_and_the_others_take_what_it_frees():
    from sera.allocation import capped_waterline

    p = np.array([0.002, 0.3, 0.002, 0.6, 0.05])
    rule = active_waterline(p, 80, 2, 64, 0.05)
    capped = capped_waterline(p, 80, 2, 64, 0.05, np.array([True, False, True, False, False]), 16)
    assert rule[[0, 2]].max() > 16 and capped[[0, 2]].max() <= 16 and capped.sum() == 80
    assert (capped[[1, 3, 4]] >= rule[[1, 3, 4]]).all() and capped[[1, 3, 4]].sum() > rule[[1, 3, 4]].sum()
    np.testing.assert_array_equal(capped_waterline(p, 80, 2, 64, 0.05, np.zeros(5, dtype=bool), 16), rule)
    full = capped_waterline(np.array([0.002, 0.5]), 128, 2, 64, 0.05, np.array([True, False]), 16)
    assert full.tolist() == [64, 64]  # the other prompt at n_max: the capped one keeps the rest


def test_the_interventions_that_change_maxrl_rerun_it_in_make_sink_and_in_the_tables():
    """An intervention with a setting outside `alloc` (the optimiser, the base model) changes MaxRL too: make sink
    trains MaxRL beside SERA for it, and paper_figures.sink pairs SERA with that rerun instead of C5's archived
    MaxRL. The two read the config files separately; they must agree for every intervention."""
    from paper_figures import sink
    from tests.test_makefile import dry_run, trained

    assert sink.reruns_maxrl("authors_optim") and sink.reruns_maxrl("strong_base")
    assert not any(sink.reruns_maxrl(name) for name in ("floor", "leave_out", "cap", "uniform3", "weight_cap"))
    for name in sink.interventions():
        methods = {m for m, _ in trained(dry_run("sink", f"INTERVENTION={name}", "SINK_SEEDS=17"), "maze")}
        assert methods == ({"maxrl,sera"} if sink.reruns_maxrl(name) else {"sera"}), name


def test_the_warning_quotes_what_the_committed_interventions_table_gives_and_nothing_else():
    """sera.sink.EVIDENCE (the warning's numbers) is the committed results/cpu/sink/interventions.csv: every
    intervention with a seed, with its setting as its config spells it, its seeds, its difference, the authors' rule
    on those seeds and the plan's reading; an intervention without a seed is not quoted."""
    import csv

    from paper_figures import sink
    from sera import sink as core

    table = Path(__file__).resolve().parents[1] / "results" / "cpu" / "sink" / "interventions.csv"
    rows = {r["intervention"]: r for r in csv.DictReader(table.open())}
    run = {name: r for name, r in rows.items() if int(r["seeds"]) > 0}
    assert {e[0] for e in core.EVIDENCE} == set(run)
    for name, setting, seeds, diff, rule, reading in core.EVIDENCE:
        row = run[name]
        config = ",".join(f"{k}={v}" for k, v in sink.interventions()[name].items())
        assert (setting, seeds) == (config, int(row["seeds"]))
        assert (diff, rule) == (row["SERA minus MaxRL (pp) [seed 95% t]"], row["the authors' rule on those seeds"])
        assert reading == row["reading (exploratory)"]
    with pytest.warns(SinkWarning) as caught:
        monitor = SinkMonitor(2)
        epoch_of(monitor, 0, [([0, 1], [0, 1], [4, 4], [0, 4])])
        epoch_of(monitor, 1, [([0, 1], [0, 1], [6, 2], [0, 2])])
        epoch_of(monitor, 2, [])
    message = str(caught[0].message)
    assert all(f"{setting}: {diff} over {seeds} seed" in message for _, setting, seeds, diff, *_ in core.EVIDENCE)


def test_the_regime_slope_needs_three_distinct_shares_and_is_the_least_squares_line():
    """regime_fit: points on a line give its slope with a zero-width interval; on noisy points the slope and the
    interval are scipy's linregress with its standard error; two distinct shares (however many pairs) give no slope,
    and the table says why."""
    from scipy.stats import linregress, t

    from paper_figures import sink

    line = [("a", s, x, 10 - 40 * x) for s, x in enumerate([0.2, 0.4, 0.6, 0.4])]
    slope, low, high = sink.regime_fit(line)
    assert slope == pytest.approx(-40) and low == pytest.approx(-40) and high == pytest.approx(-40)
    noisy = [("a", 0, 0.2, 2.0), ("a", 1, 0.4, -9.0), ("a", 2, 0.6, -14.0), ("b", 3, 0.8, -30.0)]
    slope, low, high = sink.regime_fit(noisy)
    fit = linregress([0.2, 0.4, 0.6, 0.8], [2, -9, -14, -30])  # scipy's own fit and standard error, t with n - 2
    assert slope == pytest.approx(fit.slope)
    assert (high - low) / 2 == pytest.approx(t.ppf(0.975, 2) * fit.stderr)
    assert sink.regime_fit(line[:2] + [("c", 9, 0.2, 0.0)]) is None
    rows = sink.regime_rows(line[:2], None)
    assert rows[-1][-1] == "none: 2 distinct share(s), 3 needed" and rows[0] == ["a", 0, 0.2, "+2.00"]


def test_a_share_run_gives_c5s_archived_pair_its_point_only_from_the_archived_base_model(tmp_path):
    """make sink-shares: the authors' rule's first 33 steps again from a seed's base model. Its never-solved share at
    the first allocation (step 32 = pool 1024 / B 32) becomes the regime point of C5's archived pair of that seed,
    only where its base model is the archived one, and not where a control of that seed already gives the point."""
    from paper_figures import sink
    from paper_figures.runs import load_runs

    registered, shares, controls = tmp_path / "maze-cpu_pool", tmp_path / "shares", tmp_path / "e2"
    for seed in (17, 18, 19):
        fake_run(registered, f"maxrl_seed-{seed}", "maxrl", seed, 3, f"b{seed}")
        fake_run(registered, f"sera_seed-{seed}", "sera", seed, 1 + (seed == 18), f"b{seed}")
        run = shares / f"sera_seed-{seed}"
        fake_run(shares, run.name, "sera", seed, 0, "other" if seed == 19 else f"b{seed}",
                 task={"pool_size": 1024}, train={"batch_size": 32, "steps": 33})  # fmt: skip
        steps = [{"step": s, "train/live_rollouts": 5, "alloc/effective_groups": 3} for s in range(33)]
        steps[32] |= {"pool/never_solved": 0.5 + seed / 100, "alloc/unsolved_share": 0.6}
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in steps))
    fake_run(controls, "sera_seed-17", "sera", 17, 1, "b17", task={"pool_size": 1024}, train={"batch_size": 32})
    points = sink.regime_points([], load_runs(controls), load_runs(registered), load_runs(shares))
    assert [(name, seed) for name, seed, *_ in points] == [("C5", 18)]  # 17: the control's; 19: another base model
    assert points[0][2:] == pytest.approx((0.68, -25.0))  # Pass@32 50% against MaxRL's 75%


def test_make_sink_shares_runs_the_authors_rule_for_its_first_allocation_only():
    from tests.test_makefile import dry_run

    lines = [line for line in dry_run("sink-shares", "SINK_SEEDS=17-18") if "experiments.maze.train" in line]
    assert len(lines) == 1 and "run.root=runs/shares" in lines[0] and "rerun_archived" not in lines[0]
    assert all(word in lines[0].split() for word in ("method=sera", "train.steps=33", "seed=17,18"))
