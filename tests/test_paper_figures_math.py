"""Math tables (1, 5-9) from fixture run directories: known cells, paired intervals, not-run cells, runs with other
settings kept apart, and refused pairings."""

import csv
import json

import numpy as np
import pytest
import yaml

from paper_figures import math as math_tables
from sera.passk import pass_at_k
from sera.runlog import CONFIG_FILE, DONE_FILE, METRICS_FILE, eval_record_file
from sera.stats import paired_bootstrap_ci


def math_run(
    root,
    name,
    method,
    correct,
    n=512,
    model="smollm2-360m-instruct",
    dataset="gsm8k-platinum",
    aggregation="token-mean",
    seed=0,
    steps=2000,
    experiment="math",
    done=True,
    scale="paper",
    metrics=None,
):
    path = root / f"math-{scale}" / name
    path.mkdir(parents=True)
    config = {
        "experiment": experiment,
        "seed": seed,
        "n0": 16,
        "model": {"name": model},
        "method": {"name": method, "aggregation": aggregation},
        "train": {"steps": steps, "batch_size": 32},
    }
    (path / CONFIG_FILE).write_text(yaml.safe_dump(config))
    (path / METRICS_FILE).write_text(json.dumps({"step": steps, **(metrics or {})}) + "\n")
    record = {"ids": list(range(len(correct))), "n": n, "correct": [None if c is None else int(c) for c in correct]}
    (path / eval_record_file(steps, dataset)).write_text(json.dumps(record))
    (path / eval_record_file(steps // 2, dataset)).write_text(json.dumps({**record, "correct": [0] * len(correct)}))
    if done:
        (path / DONE_FILE).write_text("{}")
    return path


def rows_of(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def test_table1_cells_come_from_the_last_per_question_counts(tmp_path):
    rng = np.random.default_rng(0)
    c_maxrl, c_sera, c_base = (rng.integers(0, 513, 40) for _ in range(3))
    math_run(tmp_path, "maxrl", "maxrl", c_maxrl)
    math_run(tmp_path, "sera_pilot", "sera_pilot", c_sera)
    math_run(tmp_path, "base", "none", c_base, experiment="math-base")
    math_tables.passk_table("table1", tmp_path, "paper", tmp_path / "out")
    rows = rows_of(tmp_path / "out" / "math-paper" / "table1.csv")
    sera = next(r for r in rows if r["method"] == "SERA with pilots (token-mean)")
    assert float(sera["Pass@32"]) == pytest.approx(100 * pass_at_k(512, c_sera, 32).mean(), abs=0.005)
    base = next(r for r in rows if r["method"] == "Base" and r["source"] == "reproduced")
    assert float(base["Pass@1"]) == pytest.approx(100 * (c_base / 512).mean(), abs=0.005)
    paper = next(r for r in rows if r["method"] == "MaxRL (seqnorm)" and r["source"] == "paper")
    assert paper["Pass@256"] == "68.24"
    assert any(r["method"].startswith("GRPO") and r["source"] == "not run" for r in rows)
    tex = (tmp_path / "out" / "math-paper" / "table1.tex").read_text()
    assert "\\textbf{" in tex and "\\bottomrule" in tex
    assert (tmp_path / "out" / "math-paper" / "table1_gsm8k-platinum_passk.png").exists()


def test_budget_column_shows_the_rollouts_dars_hw_used(tmp_path):
    """DARS-HW adds rollouts: its budget cell gives the nominal B x n0, the mean generated per step and the ratio;
    a method that spends exactly the budget shows the nominal number alone."""
    c = np.arange(40)
    math_run(tmp_path, "dars", "dars_hw", c, metrics={"alloc/generated": 1000})
    math_run(tmp_path, "maxrl", "maxrl", c, metrics={"alloc/generated": 512})
    math_tables.passk_table("table1", tmp_path, "paper", tmp_path / "out")
    rows = {r["method"]: r for r in rows_of(tmp_path / "out" / "math-paper" / "table1.csv") if r["source"] != "paper"}
    assert rows["DARS-HW (token-mean)"]["budget"] == "512 (used 1000, 1.95x)"
    assert rows["MaxRL (token-mean)"]["budget"] == "512"


def test_table5_delta_matches_a_direct_bootstrap(tmp_path):
    rng = np.random.default_rng(1)
    c_maxrl = rng.integers(0, 513, 60)
    c_sera = np.clip(c_maxrl + rng.integers(0, 40, 60), 0, 512)
    math_run(tmp_path, "maxrl", "maxrl", c_maxrl)
    math_run(tmp_path, "sera_pilot", "sera_pilot", c_sera)
    math_tables.delta_table("table5", tmp_path, "paper", tmp_path / "out")
    rows = rows_of(tmp_path / "out" / "math-paper" / "table5.csv")
    ks = [32, 128, 256]
    ci = paired_bootstrap_ci(pass_at_k(512, c_sera, ks), pass_at_k(512, c_maxrl, ks))
    for row, k in zip(rows, ks, strict=True):
        assert int(row["k"]) == k
        assert float(row["delta (pp)"]) == pytest.approx(100 * ci.delta[ks.index(k)], abs=0.005)
        assert float(row["95% CI low"]) == pytest.approx(100 * ci.low[ks.index(k)], abs=0.005)
    assert rows[0]["paper delta"] == "4.69" and rows[2]["paper high"] == "7.86"


def test_delta_tables_without_runs_say_not_run(tmp_path):
    math_tables.delta_table("table9", tmp_path, "paper", tmp_path / "out")
    rows = rows_of(tmp_path / "out" / "math-paper" / "table9.csv")
    assert len(rows) == 16 and all(r["delta (pp)"] == "not run" for r in rows)
    assert rows[0]["dataset"] == "BeyondAIME" and rows[0]["paper delta"] == "5.51"


def test_table6_keeps_other_settings_apart_and_samples_cap_k(tmp_path, capsys):
    math_run(tmp_path, "a", "maxrl", [1, 2], n=64, model="qwen2.5-math-1.5b", dataset="aime2025", steps=100)
    math_run(tmp_path, "b", "maxrl", [3, 4], n=64, model="qwen2.5-math-1.5b", dataset="aime2025", steps=200)
    math_tables.passk_table("table6", tmp_path, "paper", tmp_path / "out")
    assert "train.steps" in capsys.readouterr().err
    rows = rows_of(tmp_path / "out" / "math-paper" / "table6.csv")
    mine = [r for r in rows if r["source"] == "reproduced" and r["dataset"] == "AIME 2025" and "MaxRL" in r["method"]]
    assert sorted(r["steps"] for r in mine) == ["100", "200"]
    assert all(r["Pass@128"] == "not run" for r in mine)  # 64 samples cannot estimate Pass@128


def test_delta_refuses_to_pair_different_questions(tmp_path):
    math_run(tmp_path, "maxrl", "maxrl", [1, 2, 3])
    path = math_run(tmp_path, "sera_pilot", "sera_pilot", [1, 2, 3])
    record_file = path / eval_record_file(2000, "gsm8k-platinum")
    record_file.write_text(json.dumps({**json.loads(record_file.read_text()), "ids": [5, 6, 7]}))
    with pytest.raises(ValueError, match="GSM8K-Platinum SERA with pilots vs MaxRL .* different questions") as err:
        math_tables.delta_table("table5", tmp_path, "paper", tmp_path / "out")
    assert f"3 ids only in ['{path}']" in str(err.value)


def test_question_order_does_not_matter(tmp_path):
    math_run(tmp_path, "maxrl", "maxrl", [10, 20, 30])
    path = math_run(tmp_path, "sera_pilot", "sera_pilot", [30, 20, 10])
    (path / eval_record_file(2000, "gsm8k-platinum")).write_text(
        json.dumps({"ids": [2, 1, 0], "n": 512, "correct": [30, 20, 10]})
    )
    math_tables.delta_table("table5", tmp_path, "paper", tmp_path / "out")
    rows = rows_of(tmp_path / "out" / "math-paper" / "table5.csv")
    assert all(float(r["delta (pp)"]) == 0 for r in rows)  # the same counts per question id


def test_two_sera_groups_for_one_maxrl_are_refused(tmp_path, capsys):
    math_run(tmp_path, "maxrl", "maxrl", [1, 2, 3])
    a = math_run(tmp_path, "sera-1000", "sera_pilot", [4, 5, 6], steps=1000)
    b = math_run(tmp_path, "sera-2000", "sera_pilot", [4, 5, 6], steps=2000)
    math_tables.delta_table("table5", tmp_path, "paper", tmp_path / "out")
    rows = rows_of(tmp_path / "out" / "math-paper" / "table5.csv")
    assert [r["delta (pp)"] for r in rows] == [
        "refused: 2 SERA with pilots groups differ in train.steps (sera-1000 vs sera-2000)"
    ] * 3
    assert rows[0]["95% CI low"] == "" and rows[0]["paper delta"] == "4.69"
    err = capsys.readouterr().err
    assert (
        f"GSM8K-Platinum, token-mean: refused to pair, 2 SERA with pilots groups differ in train.steps: {a} | {b}"
        in err
    )


def test_seeds_count_runs_with_a_record_of_the_dataset(tmp_path):
    kw = {"model": "qwen2.5-math-1.5b", "n": 8}
    math_run(tmp_path, "s0", "sera_pilot", [1, 2], dataset="aime2025", seed=0, **kw)
    math_run(tmp_path, "s1", "sera_pilot", [3, 4], dataset="beyondaime", seed=1, **kw)
    math_run(tmp_path, "s2", "sera_pilot", [5, 6], dataset="aime2025", seed=2, done=False, **kw)
    math_tables.passk_table("table6", tmp_path, "paper", tmp_path / "out")
    rows = [r for r in rows_of(tmp_path / "out" / "math-paper" / "table6.csv") if r["source"] == "reproduced"]
    assert [(r["dataset"], r["method"], r["seeds"]) for r in rows] == [
        ("BeyondAIME", "SERA with pilots (token-mean, unfinished)", "1"),
        ("AIME 2025", "SERA with pilots (token-mean, unfinished)", "2"),
    ]
    assert float(rows[1]["Pass@1"]) == pytest.approx(100 * np.mean([1, 2, 5, 6]) / 8, abs=0.005)


def test_nan_counts_show_as_nan_and_are_never_bold(tmp_path):
    math_run(tmp_path, "maxrl", "maxrl", [None, 100])
    math_run(tmp_path, "sera_pilot", "sera_pilot", [10, 20])
    math_tables.passk_table("table1", tmp_path, "paper", tmp_path / "out")
    rows = rows_of(tmp_path / "out" / "math-paper" / "table1.csv")
    assert next(r for r in rows if r["method"] == "MaxRL (token-mean)")["Pass@1"] == "nan"
    md = (tmp_path / "out" / "math-paper" / "table1.md").read_text()
    assert "**" not in next(line for line in md.splitlines() if "| SERA with pilots (token-mean) | reproduced" in line)


CPU = {"model": "tiny-math", "dataset": "chain-sum", "scale": "cpu", "n": 64, "steps": 200}


def test_cpu_table1_is_the_tiny_models_with_the_guessing_floor(tmp_path):
    rng = np.random.default_rng(2)
    c_maxrl, c_sera, c_base = (rng.integers(0, 65, 50) for _ in range(3))
    guess = {f"eval/chain-sum/guess_pass@{k}": k / 1000 for k in [1, 4, 16, 64, 128]}
    guess |= {f"eval/chain-sum/guess_top_pass@{k}": k / 500 for k in [1, 4, 16, 64, 128]}
    math_run(tmp_path, "maxrl", "maxrl", c_maxrl, **CPU)
    math_run(tmp_path, "sera_pilot", "sera_pilot", c_sera, **CPU)
    math_run(tmp_path, "base", "none", c_base, experiment="math-base", metrics=guess, **CPU)
    math_run(tmp_path, "other-model", "grpo", c_base, **{**CPU, "model": "smollm2-360m-instruct"})
    text = math_tables.passk_table("table1", tmp_path, "cpu", tmp_path / "out")
    assert "not comparable in absolute value" in text
    rows = rows_of(tmp_path / "out" / "math-cpu" / "table1.csv")
    assert list(rows[0])[6:] == [f"Pass@{k}" for k in [1, 4, 16, 64, 128]]
    sera = next(r for r in rows if r["method"] == "SERA with pilots (token-mean)")
    assert float(sera["Pass@16"]) == pytest.approx(100 * pass_at_k(64, c_sera, 16).mean(), abs=0.005)
    assert sera["Pass@128"] == "not run"  # 64 samples cannot estimate Pass@128
    base = next(r for r in rows if r["method"] == "Base" and r["source"] == "reproduced")
    assert float(base["Pass@4"]) == pytest.approx(100 * pass_at_k(64, c_base, 4).mean(), abs=0.005)
    sample = next(r for r in rows if r["method"] == "Guessing: answers at training frequency")
    top = next(r for r in rows if r["method"] == "Guessing: k commonest answers")
    assert (sample["source"], sample["Pass@64"], top["Pass@16"], top["Pass@128"]) == (
        "baseline",
        "6.40",
        "3.20",
        "25.60",
    )
    assert not any(r["method"].startswith("GRPO") and r["source"] == "reproduced" for r in rows)  # another model
    paper = next(r for r in rows if r["method"] == "Base model")
    assert (paper["source"], paper["Pass@1"], paper["Pass@4"]) == (
        "paper (SmolLM2-360M, GSM8K-Platinum)",
        "6.80",
        "n/a",
    )


def test_cpu_table5_bootstraps_the_tiny_models_runs(tmp_path):
    rng = np.random.default_rng(3)
    c_maxrl = rng.integers(0, 65, 40)
    c_sera = np.clip(c_maxrl + rng.integers(0, 20, 40), 0, 64)
    math_run(tmp_path, "maxrl", "maxrl", c_maxrl, **CPU)
    math_run(tmp_path, "sera_pilot", "sera_pilot", c_sera, **CPU)
    math_tables.delta_table("table5", tmp_path, "cpu", tmp_path / "out")
    rows = rows_of(tmp_path / "out" / "math-cpu" / "table5.csv")
    assert [int(r["k"]) for r in rows] == [1, 4, 16, 64, 128]
    ks = [1, 4, 16, 64]
    ci = paired_bootstrap_ci(pass_at_k(64, c_sera, ks), pass_at_k(64, c_maxrl, ks))
    for row, k in zip(rows, ks, strict=False):
        assert float(row["delta (pp)"]) == pytest.approx(100 * ci.delta[ks.index(k)], abs=0.005)
    assert rows[-1]["delta (pp)"] == "not run" and rows[-1]["paper delta"] == "5.54" and rows[0]["paper delta"] == "n/a"


def test_the_cpu_scale_builds_only_its_own_tables(tmp_path):
    math_run(tmp_path, "sera_pilot", "sera_pilot", [1, 2], **CPU)
    math_tables.main(["--scale", "cpu", "--runs", str(tmp_path), "--out", str(tmp_path / "out")])
    built = sorted(p.name for p in (tmp_path / "out" / "math-cpu").glob("*.csv"))
    assert built == ["table1.csv", "table5.csv"]


def test_table5_seed_level_columns_take_seeds_as_the_unit(tmp_path):
    """Seed 0: SERA solves one of four questions that MaxRL never does (+25 pp at every k); seed 1: two (+50 pp).
    The seed-level delta is their mean, +37.5, with the t half-width t_{0.975, 1} * sd / sqrt(2) = 12.7062 * 12.5;
    the per-seed cell lists both; with one seed the interval is left empty. The regime figure is drawn."""
    math_run(tmp_path, "maxrl0", "maxrl", [0, 0, 0, 0], seed=0)
    math_run(tmp_path, "sera0", "sera_pilot", [512, 0, 0, 0], seed=0)
    math_tables.delta_table("table5", tmp_path, "paper", tmp_path / "out")
    first = rows_of(tmp_path / "out" / "math-paper" / "table5.csv")[0]
    assert first["seeds"] == "1" and first["seed 95% low"] == "" and first["per seed (pp)"] == "0: +25.00"
    math_run(tmp_path, "maxrl1", "maxrl", [0, 0, 0, 0], seed=1)
    math_run(tmp_path, "sera1", "sera_pilot", [512, 512, 0, 0], seed=1)
    math_tables.delta_table("table5", tmp_path, "paper", tmp_path / "out")
    math_tables.passk_table("table1", tmp_path, "paper", tmp_path / "out")
    for row in rows_of(tmp_path / "out" / "math-paper" / "table5.csv")[:3]:  # k = 32, 128, 256
        assert row["seeds"] == "2" and float(row["seed-level delta (pp)"]) == pytest.approx(37.5, abs=0.005)
        assert float(row["seed 95% high"]) == pytest.approx(37.5 + 12.7062 * 12.5, abs=0.01)
        assert row["per seed (pp)"] == "0: +25.00, 1: +50.00"
    assert (tmp_path / "out" / "math-paper" / "table1_gsm8k-platinum_regime.png").exists()


def test_table5_without_a_shared_seed_keeps_its_columns(tmp_path):
    """SERA ran seed 0, MaxRL seed 1: the question-paired cells are there, the seed-level ones say 0 seeds, and the
    paper's numbers stay in their own columns."""
    math_run(tmp_path, "maxrl1", "maxrl", [0, 0, 0, 0], seed=1)
    math_run(tmp_path, "sera0", "sera_pilot", [512, 0, 0, 0], seed=0)
    math_tables.delta_table("table5", tmp_path, "paper", tmp_path / "out")
    row = rows_of(tmp_path / "out" / "math-paper" / "table5.csv")[0]
    assert float(row["delta (pp)"]) == pytest.approx(25.0) and row["seeds"] == "0" and row["per seed (pp)"] == ""
    assert row["paper delta"] == "4.69"
