"""The pre-registered test as code (paper_figures.prereg): endpoints read at the registered steps and K, seeds paired,
the three-way decision withheld until every registered seed is in, and the committed table rebuilt from the archive."""

import csv
import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from paper_figures import archive, prereg
from paper_figures.runs import load_runs
from sera.runlog import CONFIG_FILE, DONE_FILE, METRICS_FILE, eval_record_file

ROOT = Path(__file__).resolve().parents[1]
CLAIM = replace(prereg.CLAIMS[0], k=1, seeds=(0, 1, 2), new_seeds=(1, 2))  # maze token-mean at Pass@1, three seeds


def maze_run(root, method, seed, correct_by_step, experiment="maze"):
    """A finished maze run with a held-out record (64 samples, 4 mazes) at each step of `correct_by_step`."""
    name = f"{method}_seed-{seed}" if experiment == "maze" else f"base_seed-{seed}"
    path = root / "maze-cpu" / name
    path.mkdir(parents=True)
    config = {"experiment": experiment, "seed": seed}
    if experiment == "maze":
        config |= {"method": {"name": method, "naming": 2, "aggregation": "token-mean"}}
    (path / CONFIG_FILE).write_text(yaml.safe_dump(config))
    (path / METRICS_FILE).write_text(json.dumps({"step": 0}) + "\n")
    for step, correct in correct_by_step.items():
        record = {"ids": [0, 1, 2, 3], "n": 64, "correct": correct}
        (path / eval_record_file(step, "heldout")).write_text(json.dumps(record))
    (path / DONE_FILE).write_text("{}")


def rows_for(root, claim=CLAIM):
    return prereg.claim_rows(load_runs(root / "maze-cpu"), claim)


def steps(final, earlier=None):
    """Records at steps 600, 700 and 800: `final` (64ths solved per maze) at 800, `earlier` before."""
    earlier = final if earlier is None else earlier
    return {600: earlier, 700: earlier, 800: final}


def test_endpoints_read_the_registered_steps_and_pair_seeds(tmp_path):
    # Pass@1 is the mean solved share: SERA minus MaxRL is +25 pp at step 800 on every seed, 0 before it
    for seed in (0, 1, 2):
        maze_run(tmp_path, "sera_pilot", seed, steps([32, 32, 32, 32], earlier=[16, 16, 16, 16]))
        maze_run(tmp_path, "maxrl", seed, steps([16, 16, 16, 16]))
    primary, secondary, sensitivity = rows_for(tmp_path)
    assert primary[2] == "3 of 3 (0-2)" and primary[3] == "+25.00 [+25.00, +25.00]" and primary[4] == "supported"
    assert secondary[3] == "+8.33 [+8.33, +8.33]"  # the mean of 0, 0 and 25 over steps 600-800
    assert primary[6] == "larger than the paper's"  # +25 against the paper's +3.70
    assert sensitivity[2] == "2 of 2 (1-2)" and sensitivity[4] == "supported"
    assert primary[7] == "0: +25.00, 1: +25.00, 2: +25.00" and sensitivity[7] == "1: +25.00, 2: +25.00"
    assert secondary[7] == "0: +8.33, 1: +8.33, 2: +8.33"


def test_no_decision_until_every_registered_seed_is_in(tmp_path):
    for seed in (0, 1):  # seed 2 not run
        maze_run(tmp_path, "sera_pilot", seed, steps([32] * 4))
        maze_run(tmp_path, "maxrl", seed, steps([16] * 4))
    primary = rows_for(tmp_path)[0]
    assert primary[2] == "2 of 3 (0-2)" and primary[4] == "in progress (2 of 3 seeds): no decision"
    assert primary[6] == ""


@pytest.mark.parametrize(
    "sera, decision",
    [([[16] * 4, [20] * 4, [24] * 4], "not decided at this power"), ([[10] * 4, [11] * 4, [9] * 4], "contradicted")],
)
def test_the_three_way_rule(tmp_path, sera, decision):
    for seed, correct in enumerate(sera):
        maze_run(tmp_path, "sera_pilot", seed, steps(correct))
        maze_run(tmp_path, "maxrl", seed, steps([16] * 4))
    assert rows_for(tmp_path)[0][4] == decision


@pytest.mark.parametrize(
    "grpo, decision, versus",
    [(8, "supported", "consistent with the paper's"), (12, "supported", "smaller than the paper's"),
     (24, "contradicted", "smaller than the paper's"), (4, "supported", "larger than the paper's")],
)  # fmt: skip
def test_a_claimed_loss_is_supported_below_zero(tmp_path, grpo, decision, versus):
    # amendment 2: a row that claims a loss (GRPO below the base model) is supported by an interval below zero, and
    # its size is compared with the paper's in that direction. Pass@1 of a base solving 16/64 a maze: 25%
    claim = replace(prereg.CLAIMS[4], k=1, paper=-12.5, retrained=())  # every seed in one folder
    assert claim.claimed == -1
    spread = {0: -1, 1: 0, 2: 1}  # GRPO's solved count per seed, around `grpo`
    for seed in (0, 1, 2):
        maze_run(tmp_path, "grpo", seed, steps([grpo + spread[seed]] * 4))
        maze_run(tmp_path, "base", seed, {320: [16] * 4}, experiment="maze-base")
    primary = rows_for(tmp_path, claim)[0]
    assert (primary[4], primary[6]) == (decision, versus)


def test_a_base_model_side_reads_its_own_final_record(tmp_path):
    claim = replace(prereg.CLAIMS[4], k=1, seeds=(0,))  # GRPO minus the base model
    maze_run(tmp_path, "grpo", 0, steps([8] * 4))
    maze_run(tmp_path, "base", 0, {320: [16] * 4}, experiment="maze-base")
    assert rows_for(tmp_path, claim)[0][3] == "-12.50"


def test_retrained_seeds_pair_runs_of_the_retrained_folder_only(tmp_path, monkeypatch):
    # amendment 1: seeds 1 and 2 of an R row compare the runs made from their retrained base model. The main folder's
    # runs of those seeds (another base model) must not enter, nor the retrained folder's seed 0
    claim = replace(prereg.CLAIMS[4], k=1)  # R1, GRPO minus the base model, seeds 0-2 with 1 and 2 retrained
    assert claim.retrained == (1, 2)
    main, again = tmp_path / "main", tmp_path / "main" / prereg.RETRAINED
    for seed in (0, 1, 2):
        maze_run(main, "grpo", seed, steps([8] * 4))  # main: -12.50 pp against its base on every seed
        maze_run(main, "base", seed, {320: [16] * 4}, experiment="maze-base")
    for seed in (0, 1, 2):
        maze_run(again, "grpo", seed, steps([32] * 4))  # retrained: +25.00 pp against its own base
        maze_run(again, "base", seed, {320: [16] * 4}, experiment="maze-base")
    diffs = prereg.differences(load_runs(main / "maze-cpu"), claim, (800,), load_runs(again / "maze-cpu"))
    assert diffs == pytest.approx({0: -12.5, 1: 25.0, 2: 25.0})
    monkeypatch.setattr(prereg, "CLAIMS", (claim,))  # the table finds the retrained folder under the runs root
    assert prereg.prereg_table(main)[1][0][3] == "+12.50 [-41.28, +66.28]"  # mean 12.5, se 12.5, t(2) 4.303
    # a retrained seed with one side missing from its folder is not in, even when the main folder has both
    (again / "maze-cpu" / "base_seed-2" / DONE_FILE).unlink()
    diffs = prereg.differences(load_runs(main / "maze-cpu"), claim, (800,), load_runs(again / "maze-cpu"))
    assert diffs == pytest.approx({0: -12.5, 1: 25.0})
    # the SERA claims read the main folders only
    assert all(not c.retrained for c in prereg.CLAIMS if c.tested == "sera_pilot")


def test_the_committed_table_is_what_the_archive_gives(tmp_path):
    folders = {f"{c.study}-{c.scale or 'cpu'}" for c in prereg.CLAIMS} | {prereg.RETRAINED}  # C5: maze-cpu_pool
    for folder in sorted(folders):
        archive.restore(ROOT / "results" / "runs" / folder, tmp_path / folder)
    header, rows = prereg.prereg_table(tmp_path)
    lines = (ROOT / "results" / "cpu" / "preregistered.md").read_text().splitlines()
    assert lines[0] == "| " + " | ".join(header) + " |"
    assert lines[2:] == ["| " + " | ".join(r) + " |" for r in rows]
    # C1's and C2's primary endpoints are Table 4's seed-level rows at Pass@32, computed there another way
    # (paper_figures.maze) over the complete grids
    verdict = (ROOT / "results/cpu/maze-cpu/table4_verdict.md").read_text().splitlines()
    by_seed = [line.split(" | ") for line in verdict if "(t 95%)" in line]
    column = verdict[[i for i, line in enumerate(verdict) if "| seed |" in line][0]].split(" | ").index("dPass@32")
    table4 = {cells[0].strip("| "): (cells[1], cells[column]) for cells in by_seed}
    assert table4 == {"token-mean": ("mean of 12 (t 95%)", rows[0][3]), "seqnorm": ("mean of 6 (t 95%)", rows[3][3])}
    # C3's and C4's primary endpoints are Table 5's rows at Pass@16 (paper_figures.math), over their complete grids
    with open(ROOT / "results/cpu/math-cpu/table5.csv", newline="") as f:
        table5 = {r["normalization"]: r for r in csv.DictReader(f) if r["k"] == "16"}
    for claim, seeds in (("C3 math token-mean", "20"), ("C4 math seqnorm", "3")):
        row = table5[claim.split()[-1]]
        low, high = float(row["seed 95% low"]), float(row["seed 95% high"])
        primary = next(r for r in rows if r[0] == claim and r[1].startswith("primary"))
        cell = f"{float(row['seed-level delta (pp)']):+.2f} [{low:+.2f}, {high:+.2f}]"
        assert (row["seeds"], cell) == (seeds, primary[3]), claim


def test_a_poorer_build_leaves_the_committed_table_alone(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    committed = (ROOT / "results" / "cpu" / "preregistered.md").read_text()
    (results / "preregistered.md").write_text(committed)
    prereg.main(["--runs", str(tmp_path / "no-runs"), "--out", str(tmp_path / "out"), "--results", str(results)])
    assert (results / "preregistered.md").read_text() == committed  # every row lost its numbers: kept
    assert "not run" in (tmp_path / "out" / "preregistered.md").read_text()
    prereg.main(["--runs", str(tmp_path / "no-runs"), "--out", str(tmp_path / "out"), "--results", str(results),
                 "--force"])  # fmt: skip
    assert "not run" in (results / "preregistered.md").read_text()


def test_the_committed_classification_claims_are_what_the_archive_gives(tmp_path):
    """C7 and C8 (results/cpu/PREREGISTRATION_CLASSIFICATION.md): the committed table equals the one rebuilt from the
    archived runs, and it decides at the 8 registered seeds."""
    from paper_figures import archive, imagenet

    folder = "imagenet-gauss1000"
    archive.restore(ROOT / "results" / "runs" / folder, tmp_path / folder)
    imagenet.classification_prereg(tmp_path, "gauss1000", tmp_path / "out")
    committed = (ROOT / "results" / "cpu" / folder / "preregistered.md").read_text()
    assert (tmp_path / "out" / folder / "preregistered.md").read_text() == committed
    primary = [line for line in committed.splitlines() if "| primary" in line]
    assert len(primary) == 2 and all("| 8 of 8 |" in line for line in primary)


def test_runs_from_different_base_models_are_not_paired(tmp_path):
    """An RL run records the base model it started from (sera.runlog.BASE_FILE); the pre-registered table refuses to
    pair two runs of a seed that recorded different ones, and pairs runs that recorded the same one."""
    from paper_figures.prereg import check_same_base
    from paper_figures.runs import load_runs
    from sera.runlog import BASE_FILE, base_identity, record_base

    base_a, base_b = tmp_path / "base_seed-0", tmp_path / "other" / "base_seed-0"
    for base, text in ((base_a, "[1, 0]"), (base_b, "[0, 1]")):
        base.mkdir(parents=True)
        (base / "eval_step0_heldout.json").write_text(text)
    assert base_identity(base_a)["base"] == base_identity(base_b)["base"] == "base_seed-0"
    assert base_identity(base_a) != base_identity(base_b)  # same folder name, another model: the hash tells
    root = tmp_path / "runs"
    maze_run(root, "maxrl", 0, {800: [1, 2, 3, 4]})
    maze_run(root, "sera_pilot", 0, {800: [1, 2, 3, 4]})
    runs = {r.get("method.name"): r for r in load_runs(root / "maze-cpu")}
    check_same_base(runs["sera_pilot"], runs["maxrl"])  # neither recorded one and the folder has no base: paired
    folder_base = root / "maze-cpu" / "base_seed-0"
    folder_base.mkdir()
    (folder_base / "eval_step0_heldout.json").write_text("[1, 0]")
    record_base(runs["sera_pilot"].path, base_b)
    check_same_base(runs["sera_pilot"], runs["maxrl"])  # the folder's base still training (no DONE): nothing to compare
    (runs["sera_pilot"].path / BASE_FILE).unlink()
    (folder_base / DONE_FILE).write_text("{}")
    record_base(runs["sera_pilot"].path, base_b)  # trained again elsewhere, against a run from before the record:
    with pytest.raises(ValueError, match="different base models"):  # that run stands for its folder's base
        check_same_base(runs["sera_pilot"], runs["maxrl"])
    (runs["sera_pilot"].path / BASE_FILE).unlink()
    record_base(runs["sera_pilot"].path, folder_base)  # a base trained again that reproduced the folder's records
    check_same_base(runs["sera_pilot"], runs["maxrl"])
    (runs["sera_pilot"].path / BASE_FILE).unlink()
    record_base(runs["maxrl"].path, base_a)
    record_base(runs["sera_pilot"].path, base_a)
    check_same_base(runs["sera_pilot"], runs["maxrl"])
    (runs["sera_pilot"].path / BASE_FILE).write_text(json.dumps(base_identity(base_b)))
    with pytest.raises(ValueError, match="different base models"):
        check_same_base(runs["sera_pilot"], runs["maxrl"])
    with pytest.raises(ValueError, match="started from base model"):
        record_base(runs["sera_pilot"].path, base_a)  # a resumed run refuses to continue from another base


def test_a_power_plan_takes_the_larger_sd_and_keeps_to_its_minimum_and_cap(tmp_path, monkeypatch):
    """The reference claim (MaxRL and SERA at seeds 0-2) measured +12.5 pp with SD 6.25; the exploratory seeds 3-5
    of the authors' rule decide which SD sizes the plan."""
    from sera.stats import seeds_for_power

    monkeypatch.setattr(prereg, "CLAIMS", (CLAIM,))
    root = tmp_path / "runs"
    for seed, extra in enumerate((16, 32, 48)):  # Pass@1 differences 16, 32, 48 / 256 = 6.25, 12.5, 18.75 pp
        maze_run(root, "maxrl", seed, steps([10, 10, 10, 10]))
        maze_run(root, "sera_pilot", seed, steps([10 + extra, 10, 10, 10]))

    def plan_for(explored, minimum=2, cap=40):
        for seed, extra in zip((3, 4, 5), explored, strict=True):
            for method, first in (("maxrl", 32), ("sera", 32 + extra)):
                shutil.rmtree(root / "maze-cpu" / f"{method}_seed-{seed}", ignore_errors=True)
                maze_run(root, method, seed, steps([first, 10, 10, 10]))
        plan = prereg.PowerPlan(replace(CLAIM, name="X", tested="sera", seeds=(3, 4, 5), new_seeds=()),
                                reference=CLAIM.name, minimum=minimum, cap=cap)  # fmt: skip
        runs = load_runs(root / "maze-cpu")
        return prereg.power_plan(runs, plan, runs)

    calm = plan_for((30, 32, 32))  # SD 1.2 pp: the reference's 6.25 sizes it
    assert calm["effect"] == pytest.approx(12.5) and calm["sd"] == pytest.approx(6.25)
    assert calm["seeds"] == calm["needed"] == seeds_for_power(12.5, 6.25) < 12
    assert plan_for((30, 32, 32), minimum=12)["seeds"] == 12
    noisy = plan_for((-30, 0, 30))  # SD 11.7 pp: larger, so more seeds
    assert noisy["sd"] == pytest.approx(30 / 2.56) and noisy["seeds"] > calm["seeds"]
    hopeless = plan_for((-30, 0, 30), cap=calm["seeds"])
    assert hopeless["underpowered"] and hopeless["seeds"] == calm["seeds"] and hopeless["needed"] is None


def test_an_exploratory_row_shows_its_interval_and_decides_nothing(tmp_path):
    claim = replace(CLAIM, name="E", tested="sera", against="sera_pilot", exploratory=True, new_seeds=())
    for seed, (a, b) in enumerate([(40, 10), (41, 10), (42, 10)]):  # far above zero at every seed
        maze_run(tmp_path, "sera", seed, steps([a, 10, 10, 10]))
        maze_run(tmp_path, "sera_pilot", seed, steps([b, 10, 10, 10]))
    primary = rows_for(tmp_path, claim)[0]
    assert primary[3].startswith("+") and primary[4] == "exploratory: decides nothing" and primary[6] == ""


def test_a_claim_refuses_two_runs_of_one_seed_rather_than_pick_one(tmp_path):
    """An intervention or ablation run of the registered method in the claim's own folder (same method, aggregation
    and seed, other settings) would otherwise replace the registered run in the table without a word."""
    from paper_figures.prereg import CLAIMS, runs_of
    from paper_figures.runs import Run

    claim = next(c for c in CLAIMS if c.name.startswith("C5"))
    config = {"experiment": "maze", "seed": 17, "method": {"name": "sera", "aggregation": "token-mean"}}
    one = Run(tmp_path / "sera_seed-17", config, [], True)
    other = Run(tmp_path / "sera_alloc.n_min=4_seed-17", {**config, "alloc": {"n_min": 4}}, [], True)
    assert runs_of([one], claim, "sera") == {17: one}
    with pytest.raises(ValueError, match="two finished sera runs of seed 17"):
        runs_of([one, other], claim, "sera")
