"""The sequential-allocation table (paper_figures/sara.py) on synthetic run directories: cumulative rollouts, the
ratio to DS, the effective yield, the saturated share and the abstract's claims, computed by hand here."""

import csv
import json

import pytest
import yaml

from paper_figures import sara
from sera.runlog import CONFIG_FILE, DONE_FILE, METRICS_FILE


def write_run(root, method, steps, seed=0, finished=True):
    """steps: list of per-step dicts; every 2nd step also evaluates (Pass@1 = step / 100)."""
    path = root / f"{method}_n0-8_seed-{seed}"
    path.mkdir(parents=True)
    config = {"experiment": "imagenet", "method": {"name": method}, "seed": seed, "n0": 8, "train": {"steps": 4}}
    (path / CONFIG_FILE).write_text(yaml.safe_dump(config))
    lines = []
    for i, record in enumerate(steps):
        record = {"step": i, **record}
        if i % 2 == 1:
            record |= {"eval/pass@1": i / 100, "eval/pass@8": 2 * i / 100}
        lines.append(json.dumps(record))
    (path / METRICS_FILE).write_text("\n".join(lines) + "\n")
    if finished:
        (path / DONE_FILE).write_text("{}")


def step(generated, trained, effective, **extra):
    return {"alloc/generated": generated, "alloc/rollouts": trained, "alloc/effective_rollouts": effective, **extra}


def test_table_and_claims_from_runs(tmp_path):
    root = tmp_path / "imagenet-x"
    write_run(root, "grpo", [step(100, 100, 20, **{"alloc/saturated_share": s}) for s in (0.7, 0.9, 0.8, 0.8)])
    write_run(root, "ds", [step(400, 100, 100)] * 4)
    write_run(root, "ds", [step(600, 100, 100)] * 4, seed=1)
    write_run(root, "sara", [step(300, 80, 80, **{"alloc/abandon_error_mean": 0.1})] * 3 + [{"alloc/generated": 50,
              "train/skipped_empty": 1}])  # fmt: skip
    write_run(root, "sara+dps", [step(100, 100, 100)] * 2, finished=False)
    text = sara.build(tmp_path, "x", tmp_path / "out")
    with open(tmp_path / "out" / "sara-x" / "imagenet.csv") as f:
        rows = {r["method"]: r for r in csv.DictReader(f)}
    assert rows["DS (DAPO)"]["seeds"] == "2" and rows["DS (DAPO)"]["generated (k)"] == "2.0"  # (1600 + 2400) / 2
    assert rows["GRPO"]["vs DS"] == "-80%" and rows["GRPO"]["effective yield (%)"] == "20.00"
    assert rows["SARA"]["generated (k)"] == "0.9" and rows["SARA"]["vs DS"] == "-52%"  # 950 vs 2000
    assert rows["SARA"]["trained (k)"] == "0.2" and rows["SARA"]["abandon error (%)"] == "10.00"
    assert rows["SARA"]["empty steps (all seeds)"] == "1" and rows["SARA"]["Pass@1 (%)"] == "3.00"
    assert rows["SARA+DPS (unfinished)"]["seeds"] == "0"  # an unfinished run gives no numbers
    at = "Pass@1 at 0.4k generated (%)"  # the smallest total (GRPO's 400), where every curve is read
    assert rows["GRPO"][at] == "3.00" and rows["DS (DAPO)"][at] == "n/a"  # DS's first evaluation is past 400
    assert "Saturated share under uniform GRPO" in text and "80.0%" in text
    assert "| imagenet | 52% fewer | n/a | 3.00 / n/a / 3.00 / n/a |" in text
    assert (tmp_path / "out" / "sara-x" / "pass1_vs_rollouts.png").exists()


def test_pass1_curve_is_against_cumulative_rollouts_generated(tmp_path):
    root = tmp_path / "imagenet-x"
    write_run(root, "ds", [step(g, 8, 8) for g in (10, 20, 30, 40)])
    run = sara.load_runs(root)[0]
    x, y = sara.pass1_curve(run, "eval/pass@")
    assert x.tolist() == [30, 100] and y.tolist() == [0.01, 0.03]
    assert sara.at_rollouts((x, y), 65) == pytest.approx(0.02) and sara.at_rollouts((x, y), 101) is None
