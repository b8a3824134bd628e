"""`make ablate` on the smoke scales: the sweep's runs land in folders of their own (sera.identity), and the table
(paper_figures.ablate) gives Pass@K per value with the paired differences to the first value."""

import csv
import os
import subprocess
import sys

import numpy as np
import pytest

from paper_figures import ablate
from paper_figures.runs import load_runs

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline"}


def sweep(study, root, *overrides):
    cmd = [sys.executable, "-m", f"experiments.{study}.train", "--multirun", f"scale={study}/smoke", "threads=1",
           f"run.root={root}", *overrides]  # fmt: skip
    subprocess.run(cmd, env=ENV, check=True, capture_output=True)


def table_rows(out, study, setting):
    with open(out / f"{study}-smoke" / f"ablate_{setting.replace('.', '_')}.csv") as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
def test_a_classifier_ablation_of_the_p_hat_clip(tmp_path):
    sweep("imagenet", tmp_path, "method=sera_pilot", "method.p_lo=0.0625,0.25", "seed=0,1")
    names = sorted(p.name for p in (tmp_path / "imagenet-smoke").iterdir() if not p.name.startswith("."))
    assert names == [
        "sera-m8_n0-16_method.p_lo=0.25_seed-0",
        "sera-m8_n0-16_method.p_lo=0.25_seed-1",
        "sera-m8_n0-16_seed-0",
        "sera-m8_n0-16_seed-1",
    ]  # fmt: skip  (0.0625 is the default)
    text = ablate.ablation_table(
        tmp_path, "imagenet", "smoke", "sera_pilot", "method.p_lo", ["0.0625", "0.25"], tmp_path
    )
    rows = table_rows(tmp_path, "imagenet", "method.p_lo")
    assert [r["value"] for r in rows] == ["0.0625", "0.25"] and rows[1]["seeds"] == "2"
    # Pass@1 of a value is the mean over its seeds of the runs' own final exact Pass@1
    runs = [r for r in load_runs(tmp_path / "imagenet-smoke") if r.get("method.p_lo") == 0.25]
    assert float(rows[1]["Pass@1"]) == pytest.approx(100 * np.mean([r.last("eval/pass@1") for r in runs]), abs=0.006)
    cell = rows[1]["dPass@1 vs 0.0625 (seed 95% t)"]
    assert cell.count("[") == 1 and rows[0]["dPass@1 vs 0.0625 (seed 95% t)"] == ""
    assert "question-paired" in text and (tmp_path / "imagenet-smoke" / "ablate_method_p_lo.png").exists()


def test_the_plot_puts_numbers_on_a_numeric_axis_and_says_where_it_wrote(tmp_path, capsys):
    assert ablate.x_positions(["8", "0", "2", "16"]) == ([8.0, 0.0, 2.0, 16.0], False)  # 0 rules out a log axis
    assert ablate.x_positions(["1e-3", "1e-1"]) == ([1e-3, 1e-1], True)  # all positive, a 100x span
    assert ablate.x_positions(["flat", "population"]) == ([0, 1], False)  # words: evenly spaced, in order
    ablate.plot(["0", "8", "2"], [[1.0, 3.0, 2.0]] * 11, list(range(11)), "method.pilot_m", tmp_path / "plot")
    figure = tmp_path / "plot.png"
    assert figure.exists()


@pytest.mark.slow
def test_a_language_model_ablation_reads_the_held_out_records(tmp_path):
    sweep("maze", tmp_path, "method=maxrl", "optim.lr=3e-4,1e-3", "seed=0")
    ablate.ablation_table(tmp_path, "maze", "smoke", "maxrl", "optim.lr", ["3e-4", "1e-3"], tmp_path)
    rows = table_rows(tmp_path, "maze", "optim.lr")
    assert [r["seeds"] for r in rows] == ["1", "1"] and "Pass@8" in rows[0]
    assert rows[1]["dPass@1 vs 3e-4 (seed 95% t)"] == "n/a"  # one seed: no seed-level interval
    assert rows[1]["dPass@1 vs 3e-4 (question-paired 95%)"].count("[") == 1


def test_an_ablation_of_values_not_run_is_refused_with_what_to_do(tmp_path):
    (tmp_path / "imagenet-smoke").mkdir()
    with pytest.raises(ValueError, match="no finished sera_pilot run with method.p_lo=0.5 .*make ablate"):
        ablate.ablation_table(tmp_path, "imagenet", "smoke", "sera_pilot", "method.p_lo", ["0.5", "0.25"], tmp_path)


def test_values_are_read_as_hydra_reads_them():
    assert [ablate.parse_value(v) for v in ("0.05", "8", "true", "seqnorm", "3e-4")] == [0.05, 8, True, "seqnorm", 3e-4]


@pytest.mark.slow
def test_two_ablations_in_one_folder_each_read_their_own_sweep(tmp_path):
    """A folder holding two sweeps (the p_hat clip and the pilot count) has two groups of the default runs' method at
    each ablation's default value: each table takes the group whose other settings are its other values' runs'."""
    sweep("imagenet", tmp_path, "method=sera_pilot", "method.p_lo=0.0625,0.25", "seed=0")
    sweep("imagenet", tmp_path, "method=sera_pilot", "method.pilot_m=4", "seed=0")
    runs = load_runs(tmp_path / "imagenet-smoke")
    clip = ablate.groups_by_value(runs, "sera_pilot", "method.p_lo", [0.0625, 0.25])
    pilots = ablate.groups_by_value(runs, "sera_pilot", "method.pilot_m", [8, 4])
    assert [g[0].path.name for g in clip.values()] == ["sera-m8_n0-16_seed-0", "sera-m8_n0-16_method.p_lo=0.25_seed-0"]
    assert [g[0].path.name for g in pilots.values()] == ["sera-m8_n0-16_seed-0", "sera-m4_n0-16_seed-0"]
    sweep("imagenet", tmp_path, "method=sera_pilot", "method.pilot_m=4", "method.p_lo=0.25", "seed=0")
    with pytest.raises(ValueError, match="differ in other settings too"):  # now no value has a single group
        ablate.groups_by_value(load_runs(tmp_path / "imagenet-smoke"), "sera_pilot", "method.p_lo", [0.0625, 0.25])
