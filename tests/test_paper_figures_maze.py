"""Table 4 (maze) from fixture run directories in the LM contract (eval_step<N>_heldout.json, eval/heldout/ keys):
known cells, maze-paired intervals, the base model's seeds, and real-world mess."""

import csv
import json

import numpy as np
import pytest
import yaml

from paper_figures import maze as maze_tables
from sera.passk import pass_at_k
from sera.runlog import CONFIG_FILE, DONE_FILE, METRICS_FILE, eval_record_file
from sera.stats import paired_bootstrap_ci


def maze_run(
    root,
    name,
    method,
    correct,
    experiment="maze",
    aggregation="token-mean",
    n=64,
    seed=0,
    steps=100,
    ids=None,
    distinct=3.0,
    done=True,
    tail=(),
):
    """One maze run (or, with experiment='maze-base', a base model) with one evaluation on the held-out set."""
    path = root / "maze-cpu" / name
    path.mkdir(parents=True)
    config = {"experiment": experiment, "seed": seed, "sft": {"steps": 240}, "eval": {"samples": n}}
    if experiment == "maze":
        config |= {"n0": 16, "method": {"name": method, "aggregation": aggregation}, "train": {"steps": steps}}
    (path / CONFIG_FILE).write_text(yaml.safe_dump(config))
    metrics = {"step": steps - 1, "alloc/rollouts": 512, "eval/heldout/distinct_answers": distinct}
    if experiment == "maze-base":
        metrics = {"step": 240, "eval/heldout/distinct_answers": distinct, "eval/heldout/best_fixed_answer_rate": 0.05}
    (path / METRICS_FILE).write_text("\n".join([json.dumps(metrics), *tail]) + "\n")
    record = {"ids": list(range(len(correct))) if ids is None else ids, "n": n, "correct": list(correct)}
    (path / eval_record_file(steps, "heldout")).write_text(json.dumps(record))
    if done:
        (path / DONE_FILE).write_text("{}")
    return path


def table4_rows(tmp_path):
    text = maze_tables.table4(tmp_path, "cpu", tmp_path / "out")
    with open(tmp_path / "out" / "maze-cpu" / "table4.csv") as f:
        return list(csv.DictReader(f)), text


def reproduced(rows, method):
    return [r for r in rows if r["method"].startswith(method) and not r["normalization"].startswith("paper")]


def passk(correct, k, n=64):
    return 100 * pass_at_k(n, np.array(correct), k).mean()


def test_table4_from_maze_runs(tmp_path):
    maze_run(tmp_path, "base_seed-0", "none", [0, 1, 2, 0], experiment="maze-base", distinct=40.0)
    maze_run(tmp_path, "maxrl", "maxrl", [10, 0, 64, 5])
    path = maze_run(tmp_path, "sera_pilot", "sera_pilot", [12, 3, 64, 9], distinct=5.0)
    (path / eval_record_file(100, "other")).write_text(json.dumps({"ids": [0], "n": 64, "correct": [64]}))
    rows, text = table4_rows(tmp_path)
    sera = next(r for r in rows if r["method"] == "SERA with pilots" and r["normalization"] == "token-mean")
    assert float(sera["Pass@8"]) == pytest.approx(passk([12, 3, 64, 9], 8), abs=0.005)
    assert sera["distinct answers"] == "5.00" and sera["seeds"] == "1" and sera["rollouts/step"] == "512.00"
    base = next(r for r in rows if r["method"] == "Base model")
    assert base["distinct answers"] == "40.00" and float(base["Pass@1"]) == pytest.approx(
        passk([0, 1, 2, 0], 1), abs=0.005
    )
    assert "Best single fixed answer solves 5.00%" in text
    assert "| seqnorm | not run" in text
    assert (tmp_path / "out" / "maze-cpu" / "passk_curves.png").exists()


def test_labels_come_from_the_method_registry(tmp_path):
    maze_run(tmp_path, "pkpo", "pkpo", [1, 2])
    maze_run(tmp_path, "dars", "dars_hw", [1, 2])
    maze_run(tmp_path, "mystery", "mystery", [1, 2])  # not in the registry: its raw name
    rows, _ = table4_rows(tmp_path)
    assert [r["method"] for r in rows if r["normalization"] == "token-mean"] == ["PKPO (T=16)", "DARS-HW", "mystery"]


def test_base_row_counts_its_seeds(tmp_path):
    maze_run(tmp_path, "base_seed-0", "none", [0, 4], experiment="maze-base", seed=0)
    maze_run(tmp_path, "base_seed-1", "none", [8, 0], experiment="maze-base", seed=1)
    started = tmp_path / "maze-cpu" / "base_seed-2"  # only a config: no results yet
    started.mkdir()
    (started / CONFIG_FILE).write_text((tmp_path / "maze-cpu" / "base_seed-0" / CONFIG_FILE).read_text())
    rows, _ = table4_rows(tmp_path)
    (base,) = reproduced(rows, "Base model")
    assert base["method"] == "Base model (unfinished)" and base["seeds"] == "2"
    assert float(base["Pass@1"]) == pytest.approx((passk([0, 4], 1) + passk([8, 0], 1)) / 2, abs=0.005)


def test_a_config_only_folder_is_no_seed_and_no_zero(tmp_path):
    maze_run(tmp_path, "sera_seed-0", "sera_pilot", [1, 2], distinct=4.0)
    started = tmp_path / "maze-cpu" / "sera_seed-1"
    started.mkdir()
    config = yaml.safe_load((tmp_path / "maze-cpu" / "sera_seed-0" / CONFIG_FILE).read_text())
    (started / CONFIG_FILE).write_text(yaml.safe_dump({**config, "seed": 1}))
    rows, _ = table4_rows(tmp_path)
    (sera,) = reproduced(rows, "SERA")
    assert (
        sera["method"] == "SERA with pilots (unfinished)"
        and sera["seeds"] == "1"
        and sera["distinct answers"] == "4.00"
    )


def test_corrupt_final_records_are_marked_never_replaced(tmp_path, capsys):
    maze_run(tmp_path, "sera_seed-0", "sera_pilot", [1, 2], seed=0, distinct=4.0)
    torn = maze_run(tmp_path, "sera_seed-1", "sera_pilot", [60, 60], seed=1, distinct=9.0, tail=['{"step": 99, "eval/'])
    rows, _ = table4_rows(tmp_path)
    (sera,) = reproduced(rows, "SERA")
    assert sera["method"] == "SERA with pilots (corrupt final record)" and sera["seeds"] == "1"
    assert sera["distinct answers"] == "4.00" and float(sera["Pass@1"]) == pytest.approx(passk([1, 2], 1), abs=0.005)
    assert f"{torn / METRICS_FILE}: the last line of a finished run is corrupt" in capsys.readouterr().err


def test_an_unreadable_newest_record_is_not_replaced_by_an_older_one(tmp_path, capsys):
    path = maze_run(tmp_path, "maxrl", "maxrl", [1, 2], steps=100)
    (path / eval_record_file(50, "heldout")).write_text(json.dumps({"ids": [0, 1], "n": 64, "correct": [9, 9]}))
    (path / eval_record_file(100, "heldout")).write_text('{"ids": [0, 1], "n": 64, "corr')
    rows, _ = table4_rows(tmp_path)
    (maxrl,) = reproduced(rows, "MaxRL")
    assert maxrl["method"] == "MaxRL (corrupt final record)" and maxrl["seeds"] == "0" and maxrl["Pass@1"] == "not run"
    assert f"{path / eval_record_file(100, 'heldout')}: unreadable per-question record" in capsys.readouterr().err


def test_nan_and_inf_are_shown_as_such(tmp_path):
    maze_run(tmp_path, "maxrl", "maxrl", [None, 3], distinct=float("inf"))
    maze_run(tmp_path, "sera_pilot", "sera_pilot", [1, 3])
    rows, text = table4_rows(tmp_path)
    maxrl = next(r for r in rows if r["method"] == "MaxRL")
    assert maxrl["Pass@1"] == "nan" and maxrl["distinct answers"] == "inf"
    assert "| token-mean | +nan [+nan, +nan] |" in text


def test_sera_minus_maxrl_pairs_mazes_by_id(tmp_path):
    c_maxrl, c_sera = [10, 0, 64, 5], [12, 3, 64, 9]
    maze_run(tmp_path, "maxrl", "maxrl", c_maxrl)
    maze_run(tmp_path, "sera_pilot", "sera_pilot", c_sera[::-1], ids=[3, 2, 1, 0])  # the same mazes in another order
    _, text = table4_rows(tmp_path)
    ci = paired_bootstrap_ci(pass_at_k(64, np.array(c_sera), [1, 2]), pass_at_k(64, np.array(c_maxrl), [1, 2]))
    assert f"| token-mean | {100 * ci.delta[0]:+.2f} [{100 * ci.low[0]:+.2f}, {100 * ci.high[0]:+.2f}] | " in text


def test_different_mazes_are_an_error_naming_the_runs(tmp_path):
    maxrl = maze_run(tmp_path, "maxrl", "maxrl", [1, 2, 3])
    sera = maze_run(tmp_path, "sera_pilot", "sera_pilot", [1, 2, 3], ids=[0, 1, 7])
    with pytest.raises(ValueError, match="different questions") as err:
        maze_tables.table4(tmp_path, "cpu", tmp_path / "out")
    assert f"1 ids only in ['{sera}']" in str(err.value) and f"1 only in ['{maxrl}']" in str(err.value)


def test_seeds_with_records_of_different_lengths_are_an_error_naming_them(tmp_path):
    a = maze_run(tmp_path, "sera_seed-0", "sera_pilot", [1, 2, 3], seed=0)
    b = maze_run(tmp_path, "sera_seed-1", "sera_pilot", [1, 2], seed=1)
    with pytest.raises(ValueError, match="seeds of one setting evaluated different heldout questions") as err:
        maze_tables.table4(tmp_path, "cpu", tmp_path / "out")
    assert f"{a} (3 questions)" in str(err.value) and f"{b} (2 questions)" in str(err.value)


def test_two_sera_groups_for_one_maxrl_are_refused(tmp_path, capsys):
    maze_run(tmp_path, "maxrl", "maxrl", [1, 2])
    a = maze_run(tmp_path, "sera-100", "sera_pilot", [1, 2], steps=100)
    b = maze_run(tmp_path, "sera-200", "sera_pilot", [3, 4], steps=200)
    rows, text = table4_rows(tmp_path)
    assert {r["method"] for r in rows if r["normalization"] == "token-mean"} == {
        "MaxRL",
        "SERA with pilots (train.steps=100)",
        "SERA with pilots (train.steps=200)",
    }
    assert "| token-mean | refused: 2 SERA with pilots groups differ in train.steps (sera-100 vs sera-200) |" in text
    assert (
        f"maze, token-mean: refused to pair, 2 SERA with pilots groups differ in train.steps: {a} | {b}"
        in capsys.readouterr().err
    )


def test_report_has_every_table_and_says_what_was_not_run(tmp_path):
    from paper_figures import report

    maze_run(tmp_path, "s", "sera_pilot", [12, 3, 64, 9])
    text = report.build(tmp_path, "cpu", tmp_path / "out")
    for title in ["Table 2", "Table 3", "Table 4", "Table1", "Table5", "Table6", "Table7", "Table8", "Table9"]:
        assert f"## {title}" in text
    assert "No runs under" in text and "1 runs under" in text and "not run" in text
    assert (tmp_path / "out" / "REPORT.md").read_text() == text


def test_a_started_group_without_results_does_not_block_the_pairing(tmp_path):
    maze_run(tmp_path, "maxrl", "maxrl", [1, 2])
    maze_run(tmp_path, "sera", "sera_pilot", [3, 4])
    started = tmp_path / "maze-cpu" / "sera-200"  # another setting, only a config so far
    started.mkdir()
    config = yaml.safe_load((tmp_path / "maze-cpu" / "sera" / CONFIG_FILE).read_text())
    (started / CONFIG_FILE).write_text(yaml.safe_dump({**config, "train": {"steps": 200}}))
    rows, text = table4_rows(tmp_path)
    assert [(r["method"], r["seeds"]) for r in reproduced(rows, "SERA")] == [
        ("SERA with pilots", "1"),
        ("SERA with pilots (unfinished)", "0"),
    ]
    assert "refused" not in text and "| token-mean | +" in text


def test_sera_minus_maxrl_seed_by_seed(tmp_path):
    """Each seed's difference is its own SERA run minus its own MaxRL run, averaged over mazes (ids paired)."""
    maze_run(tmp_path, "maxrl0", "maxrl", [10, 0, 64, 5], seed=0)
    maze_run(tmp_path, "sera0", "sera_pilot", [12, 3, 64, 9], seed=0)
    maze_run(tmp_path, "maxrl1", "maxrl", [20, 1, 30, 0], seed=1)
    maze_run(tmp_path, "sera1", "sera_pilot", [0, 1, 30, 20], ids=[3, 1, 2, 0], seed=1)  # mazes 0 and 3 swapped
    _, text = table4_rows(tmp_path)
    assert "seed by seed" in text
    d0 = passk([12, 3, 64, 9], 1) - passk([10, 0, 64, 5], 1)
    d1 = 0.0  # seed 1's SERA solves each maze exactly as often as its MaxRL once the ids are paired
    assert f"| token-mean | 0 | {d0:+.2f} |" in text and f"| token-mean | 1 | {d1:+.2f} |" in text


def test_seed_level_interval_row_follows_the_seeds(tmp_path):
    """With two seeds whose Pass@1 differences are d0 and 0, the seed-level row is their mean d0 / 2 with the t
    half-width t_{0.975, 1} * sd / sqrt(2) = 12.7062 * |d0| / 2 (sd = |d0| / sqrt(2)); one seed gives no such row."""
    maze_run(tmp_path, "maxrl0", "maxrl", [10, 0, 64, 5], seed=0)
    maze_run(tmp_path, "sera0", "sera_pilot", [12, 3, 64, 9], seed=0)
    _, text = table4_rows(tmp_path)
    assert "mean of" not in text
    maze_run(tmp_path, "maxrl1", "maxrl", [20, 1, 30, 0], seed=1)
    maze_run(tmp_path, "sera1", "sera_pilot", [20, 1, 30, 0], seed=1)
    _, text = table4_rows(tmp_path)
    d0 = passk([12, 3, 64, 9], 1) - passk([10, 0, 64, 5], 1)
    half = 12.7062 * abs(d0) / 2
    assert f"| token-mean | mean of 2 (t 95%) | {d0 / 2:+.2f} [{d0 / 2 - half:+.2f}, {d0 / 2 + half:+.2f}] |" in text
    assert (tmp_path / "out" / "maze-cpu" / "regime.png").exists()  # Pass@1, Pass@K over training, success rates


def test_regime_figure_draws_the_base_model_and_fractions(tmp_path):
    """The regime figure's numbers: seed means over training with the base model at step 0, and success-rate
    histograms as fractions of questions, so a group of 2 seeds and one of 1 compare."""
    from paper_figures.render import regime_figure
    from paper_figures.runs import load_runs

    tail = lambda p1: [json.dumps({"step": 100, "eval/heldout/pass@1": p1, "eval/heldout/pass@64": 0.5})]  # noqa: E731
    maze_run(tmp_path, "base", "none", [0, 0, 64, 32], experiment="maze-base",
             tail=[json.dumps({"step": 240, "eval/heldout/pass@1": 0.02, "eval/heldout/pass@64": 0.4})])  # fmt: skip
    maze_run(tmp_path, "m0", "maxrl", [0, 64, 64, 64], tail=tail(0.1))
    maze_run(tmp_path, "m1", "maxrl", [0, 0, 64, 64], seed=1, tail=tail(0.3))
    maze_run(tmp_path, "s0", "sera_pilot", [32, 32, 32, 32], tail=tail(0.2))
    runs = {r.path.name: r for r in load_runs(tmp_path / "maze-cpu")}
    drawn = regime_figure({"MaxRL": [runs["m0"], runs["m1"]], "SERA": [runs["s0"]]}, "heldout", 64,
                          tmp_path / "regime", "Maze", base=[runs["base"]])  # fmt: skip
    assert drawn["Base model"]["pass@1"] == pytest.approx([2.0]) and drawn["Base model"]["steps"] == [0]
    assert drawn["MaxRL"]["steps"] == [100] and drawn["MaxRL"]["pass@1"] == pytest.approx([20.0])
    assert drawn["MaxRL"]["seeds"] == 2 and drawn["MaxRL"]["pass@64"] == pytest.approx([50.0])
    for label in drawn:  # 20 bins of [0, 1], each a fraction of that group's questions
        assert len(drawn[label]["hist"]) == 20 and sum(drawn[label]["hist"]) == pytest.approx(1.0)
    assert drawn["MaxRL"]["hist"][0] == pytest.approx(3 / 8) and drawn["MaxRL"]["hist"][-1] == pytest.approx(5 / 8)
    assert drawn["SERA"]["hist"][10] == pytest.approx(1.0)  # rate 0.5 falls in [0.5, 0.55)
    assert drawn["Base model"]["hist"][0] == pytest.approx(0.5)
    assert (tmp_path / "regime.png").exists() and (tmp_path / "regime.pdf").exists()
