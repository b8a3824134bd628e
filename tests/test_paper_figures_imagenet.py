"""Tables 2 and 3 from fixture run directories: known cells, paired CIs, and real-world mess (corrupt lines,
unfinished runs, runs with other settings, missing runs)."""

import json

import numpy as np
import pytest
import yaml

from paper_figures import imagenet
from paper_figures.runs import load_runs
from sera.stats import paired_bootstrap_ci


def make_run(
    root,
    method,
    n0=16,
    seed=0,
    steps=100,
    pass1=0.5,
    cos=0.5,
    estimator="pilot",
    m=8,
    done=True,
    val_p=None,
    extra_lines=(),
):
    name = f"{method}_n0-{n0}_seed-{seed}_steps-{steps}_{estimator}{m}"
    path = root / "imagenet-cpu" / name
    path.mkdir(parents=True)
    config = {
        "experiment": "imagenet",
        "seed": seed,
        "n0": n0,
        "threads": 1,
        "method": {
            "name": method,
            "estimator": estimator if method == "sera" else "none",
            "pilot_m": m if method == "sera" else 0,
        },
        "data": {"name": "digits1000", "num_train": 40},
        "train": {"steps": steps, "batch_size": 10},
    }
    (path / "config.yaml").write_text(yaml.safe_dump(config))
    lines = [
        json.dumps(
            {
                "step": s,
                "grad/cos_ce": cos,
                "phat/mae": 0.1 * (s + 1),
                "phat/moments": [2, 1.0, 1.0, 0.5 + s, 0.5 + s, 0.5 + s],
            }
        )
        for s in range(4)
    ]
    evals = {f"eval/pass@{k}": min(1.0, pass1 * (1 + k / 2048)) for k in imagenet.KS}
    lines.append(json.dumps({"step": 4, **evals}))
    (path / "metrics.jsonl").write_text("\n".join([*lines, *extra_lines]) + "\n")
    if val_p is not None:
        np.save(path / "val_p.npy", np.asarray(val_p))
    if method == "sera":  # one batch's allocation snapshot, for the allocation and p_hat figures
        p = np.linspace(0.01, 0.9, 10)
        np.savez(path / "alloc_step4.npz", p_exact=p, p_hat=np.clip(p, 1 / 16, 15 / 16), counts=np.arange(25, 5, -2))
    if done:
        (path / "DONE").write_text("{}\n")
    return path


def read_csv_rows(path):
    import csv

    with open(path) as f:
        return list(csv.DictReader(f))


def test_table2_cells_seed_means_and_paper_rows(tmp_path):
    make_run(tmp_path, "maxrl", seed=0, pass1=0.40, cos=0.30)
    make_run(tmp_path, "maxrl", seed=1, pass1=0.50, cos=0.40)
    make_run(tmp_path, "sera", seed=0, pass1=0.60, cos=0.70)
    imagenet.table2(tmp_path, "cpu", tmp_path / "out")
    rows = read_csv_rows(tmp_path / "out" / "imagenet-cpu" / "table2.csv")
    maxrl = next(r for r in rows if r["method"] == "MaxRL" and r["source"].startswith("reproduced"))
    assert maxrl["seeds"] == "2" and float(maxrl["Pass@1"]) == pytest.approx(100 * 0.45 * (1 + 1 / 2048), abs=0.01)
    assert float(maxrl["cos(g, CE)"]) == pytest.approx(0.35, abs=0.01)
    paper = next(r for r in rows if r["method"] == "SERA" and r["source"].startswith("paper"))
    assert paper["Pass@1"] == "12.37" and paper["n0"] == "16"
    tex = (tmp_path / "out" / "imagenet-cpu" / "table2.tex").read_text()
    assert "\\toprule" in tex and "\\textbf{" in tex  # the better of the MaxRL/SERA pair is bold
    assert (tmp_path / "out" / "imagenet-cpu" / "training_curves.png").exists()
    assert (tmp_path / "out" / "imagenet-cpu" / "allocation.pdf").exists()


def test_table2_verdict_uses_question_paired_bootstrap(tmp_path):
    rng = np.random.default_rng(0)
    p_maxrl = rng.random(50)
    p_sera = np.clip(p_maxrl + 0.05 * rng.random(50), 0, 1)
    make_run(tmp_path, "maxrl", val_p=p_maxrl)
    make_run(tmp_path, "sera", val_p=p_sera)
    imagenet.table2(tmp_path, "cpu", tmp_path / "out")
    verdict = (tmp_path / "out" / "imagenet-cpu" / "table2_verdict.md").read_text()
    ci = paired_bootstrap_ci(p_sera, p_maxrl)
    assert f"{100 * ci.delta:+.2f} [{100 * ci.low:+.2f}, {100 * ci.high:+.2f}]" in verdict


def test_mess_is_reported_not_mixed(tmp_path, capsys):
    make_run(tmp_path, "maxrl", steps=100, pass1=0.4, extra_lines=["{not json", '{"no_step": 1}'])
    make_run(tmp_path, "maxrl", steps=200, pass1=0.6)  # another setting: its own row, never averaged in
    make_run(tmp_path, "sera", done=False, pass1=0.5)
    imagenet.table2(tmp_path, "cpu", tmp_path / "out")
    err = capsys.readouterr().err
    assert "metrics.jsonl:6: corrupt line skipped" in err and "metrics.jsonl:7: corrupt line skipped" in err
    assert "unfinished (no DONE)" in err and "train.steps" in err
    rows = read_csv_rows(tmp_path / "out" / "imagenet-cpu" / "table2.csv")
    reproduced = [r for r in rows if r["source"].startswith("reproduced")]
    assert sorted(r["steps"] for r in reproduced if r["method"].startswith("MaxRL")) == ["100", "200"]
    assert any("unfinished" in r["method"] for r in reproduced)
    verdict = (tmp_path / "out" / "imagenet-cpu" / "table2_verdict.md").read_text()
    assert "not run" in verdict  # the unfinished SERA run saved no per-image p


def test_missing_runs_give_not_run_cells(tmp_path):
    make_run(tmp_path, "sera", n0=128)
    imagenet.table2(tmp_path, "cpu", tmp_path / "out")
    verdict = (tmp_path / "out" / "imagenet-cpu" / "table2_verdict.md").read_text()
    assert "| 128 | not run |" in verdict


def test_table2_verdict_lists_the_difference_seed_by_seed(tmp_path):
    for seed, (a, b) in enumerate([(0.50, 0.40), (0.45, 0.47), (0.60, 0.30)]):
        make_run(tmp_path, "sera", seed=seed, pass1=a)
        make_run(tmp_path, "maxrl", seed=seed, pass1=b)
    make_run(tmp_path, "sera", seed=3, pass1=0.9)  # no MaxRL partner: left out of the per-seed column
    imagenet.table2(tmp_path, "cpu", tmp_path / "out")
    verdict = (tmp_path / "out" / "imagenet-cpu" / "table2_verdict.md").read_text()
    scale = 1 + 1 / 2048  # the fixture's Pass@1 is pass1 * (1 + k / 2048)
    expected = ", ".join(f"seed {s}: {100 * d * scale:+.2f}" for s, d in enumerate([0.10, -0.02, 0.30]))
    assert f"| {expected} |" in verdict and "seed 3" not in verdict


def test_table3_pools_the_last_epoch(tmp_path):
    make_run(tmp_path, "sera", estimator="pilot", m=2)
    make_run(tmp_path, "sera", estimator="history", m=0)
    imagenet.table3(tmp_path, "cpu", tmp_path / "out")
    rows = read_csv_rows(tmp_path / "out" / "imagenet-cpu" / "table3.csv")
    assert [r["m"] for r in rows] == ["0", "2"]
    # epoch = 40 // 10 = 4 batches: MAE mean of 0.1..0.4
    assert float(rows[0]["MAE"]) == pytest.approx(0.25, abs=1e-4)
    assert rows[1]["paper MAE"] == "n/a" and rows[0]["paper MAE"] == "0.0386"  # the paper reports m = 0, 8 only
    # pooled moments: n = 8, sx = sy = 4, sxx = syy = sxy = 8 -> r = 1
    assert float(rows[0]["Pearson r"]) == pytest.approx(1.0)
    assert (tmp_path / "out" / "imagenet-cpu" / "phat_vs_p.png").exists()


def test_load_runs_ignores_sweep_bookkeeping(tmp_path):
    make_run(tmp_path, "maxrl")
    (tmp_path / "imagenet-cpu" / ".sweeps" / "0").mkdir(parents=True)
    (tmp_path / "imagenet-cpu" / ".sweeps" / "0" / "config.yaml").write_text("{}")
    assert len(load_runs(tmp_path / "imagenet-cpu")) == 1
