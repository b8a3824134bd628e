"""Tables 2 and 3 from fixture run directories: known cells, paired CIs, and real-world mess (corrupt lines,
unfinished runs, runs with other settings, missing runs, NaN values)."""

import csv
import json

import numpy as np
import pytest
import yaml

from paper_figures import imagenet
from paper_figures.runs import load_runs, paper_row_method
from sera.runlog import CONFIG_FILE, DONE_FILE, METRICS_FILE, VAL_P_FILE, alloc_snapshot_file
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
    tail=(),
    pearson=(0.5, 0.5, 0.5, 0.5),
    data=None,
    final=None,
):
    """A classification run: 4 RL steps (MAE 0.1 .. 0.4, one Pearson r each), `extra_lines`, then one evaluation at
    step 4 with Pass@k = pass1 * (1 + k / 2048) logging an epoch of 4 steps (`final` overrides its cells), then
    `tail` lines."""
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
            "naming": 2,
            "estimator": estimator if method == "sera_pilot" else "none",
            "pilot_m": m if method == "sera_pilot" else 0,
        },
        "data": {"name": "digits1000", "num_train": 40, "num_val": 50, **(data or {})},
        "train": {"steps": steps, "batch_size": 10},
    }
    (path / CONFIG_FILE).write_text(yaml.safe_dump(config))
    lines = [
        json.dumps(
            {
                "step": s,
                "grad/cos_ce": cos,
                "phat/mae": 0.1 * (s + 1),
                "phat/moments": [2, 1.0, 1.0, 0.5 + s, 0.5 + s, 0.5 + s],
                "phat/pearson": pearson[s],
            }
        )
        for s in range(4)
    ]
    evals = {f"eval/pass@{k}": min(1.0, pass1 * (1 + k / 2048)) for k in imagenet.KS}
    final_line = json.dumps({"step": 4, **evals, "train/steps_per_epoch": 4, **(final or {})})
    (path / METRICS_FILE).write_text("\n".join([*lines, *extra_lines, final_line, *tail]) + "\n")
    if val_p is not None:
        np.save(path / VAL_P_FILE, np.asarray(val_p))
    if method == "sera_pilot":  # one batch's allocation snapshot, for the allocation and p_hat figures
        p = np.linspace(0.01, 0.9, 10)
        np.savez(
            path / alloc_snapshot_file(4), p_exact=p, p_hat=np.clip(p, 1 / 16, 15 / 16), counts=np.arange(25, 5, -2)
        )
    if done:
        (path / DONE_FILE).write_text("{}\n")
    return path


def read_csv_rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def table2_rows(tmp_path):
    imagenet.table2(tmp_path, "cpu", tmp_path / "out")
    return read_csv_rows(tmp_path / "out" / "imagenet-cpu" / "table2.csv")


def reproduced(rows, method):
    return [r for r in rows if r["method"].startswith(method) and r["source"].startswith("reproduced")]


def test_table2_cells_seed_means_and_paper_rows(tmp_path):
    make_run(tmp_path, "maxrl", seed=0, pass1=0.40, cos=0.30)
    make_run(tmp_path, "maxrl", seed=1, pass1=0.50, cos=0.40)
    make_run(tmp_path, "sera_pilot", seed=0, pass1=0.60, cos=0.70)
    rows = table2_rows(tmp_path)
    (maxrl,) = reproduced(rows, "MaxRL")
    assert maxrl["seeds"] == "2" and float(maxrl["Pass@1"]) == pytest.approx(100 * 0.45 * (1 + 1 / 2048), abs=0.01)
    assert float(maxrl["cos(g, CE)"]) == pytest.approx(0.35, abs=0.01)
    paper = next(r for r in rows if r["method"] == "SERA" and r["source"].startswith("paper"))
    assert paper["Pass@1"] == "12.37" and paper["n0"] == "16"
    tex = (tmp_path / "out" / "imagenet-cpu" / "table2.tex").read_text()
    assert "\\toprule" in tex and "\\textbf{" in tex  # the better of the MaxRL/SERA pair is bold
    assert (tmp_path / "out" / "imagenet-cpu" / "training_curves.png").exists()
    assert (tmp_path / "out" / "imagenet-cpu" / "allocation.pdf").exists()


def test_table2_labels_come_from_the_method_registry(tmp_path, monkeypatch):
    from sera.methods import METHODS

    monkeypatch.setitem(METHODS, "maxrl", METHODS["maxrl"].__class__(**{**vars(METHODS["maxrl"]), "label": "MaxRL*"}))
    make_run(tmp_path, "maxrl")
    make_run(tmp_path, "mystery")  # not in the registry: its raw name
    rows = table2_rows(tmp_path)
    assert [r["method"] for r in rows if r["source"].startswith("reproduced")] == ["MaxRL*", "mystery"]


def test_table2_verdict_uses_question_paired_bootstrap(tmp_path):
    rng = np.random.default_rng(0)
    p_maxrl = rng.random(50)
    p_sera = np.clip(p_maxrl + 0.05 * rng.random(50), 0, 1)
    make_run(tmp_path, "maxrl", val_p=p_maxrl)
    make_run(tmp_path, "sera_pilot", val_p=p_sera)
    imagenet.table2(tmp_path, "cpu", tmp_path / "out")
    verdict = (tmp_path / "out" / "imagenet-cpu" / "table2_verdict.md").read_text()
    ci = paired_bootstrap_ci(p_sera, p_maxrl)
    assert f"{100 * ci.delta:+.2f} [{100 * ci.low:+.2f}, {100 * ci.high:+.2f}]" in verdict


def test_mess_is_reported_not_mixed(tmp_path, capsys):
    make_run(tmp_path, "maxrl", steps=100, pass1=0.4, extra_lines=["{not json", '{"no_step": 1}'])
    make_run(tmp_path, "maxrl", steps=200, pass1=0.6)  # another setting: its own row, never averaged in
    make_run(tmp_path, "sera_pilot", done=False, pass1=0.5)
    rows = table2_rows(tmp_path)
    err = capsys.readouterr().err
    assert "metrics.jsonl:5: corrupt line skipped" in err and "metrics.jsonl:6: corrupt line skipped" in err
    assert "unfinished (no DONE)" in err and "train.steps" in err
    assert sorted(r["steps"] for r in reproduced(rows, "MaxRL")) == ["100", "200"]
    short = next(r for r in reproduced(rows, "MaxRL") if r["steps"] == "100")
    assert short["seeds"] == "1" and float(short["Pass@1"]) == pytest.approx(40, abs=0.1)  # the lines after, kept
    assert [r["method"] for r in reproduced(rows, "SERA")] == ["SERA with pilots (unfinished)"]


def test_non_utf8_byte_is_a_corrupt_line(tmp_path):
    path = make_run(tmp_path, "maxrl")
    with open(path / METRICS_FILE, "ab") as f:
        f.write(b'{"step": 5, "note": "\xff"}\n{"step": 6}\n')
    (run,) = load_runs(tmp_path / "imagenet-cpu")
    reason = "'utf-8' codec can't decode byte 0xff in position 21: invalid start byte"
    assert run.problems == [f"{path / METRICS_FILE}:6: corrupt line skipped ({reason})"]
    assert [r["step"] for r in run.records] == [0, 1, 2, 3, 4, 6] and not run.corrupt_final


def test_corrupt_final_record_is_marked_never_replaced(tmp_path, capsys):
    make_run(tmp_path, "maxrl", seed=0, pass1=0.4)
    corrupt = make_run(tmp_path, "maxrl", seed=1, pass1=0.8, tail=['{"step": 5, "eval/pass@1": 0.'])  # torn write
    rows = table2_rows(tmp_path)
    (maxrl,) = reproduced(rows, "MaxRL")
    assert maxrl["method"] == "MaxRL (corrupt final record)" and maxrl["seeds"] == "1"
    assert float(maxrl["Pass@1"]) == pytest.approx(100 * 0.4 * (1 + 1 / 2048), abs=0.01)  # seed 1's step 4 unused
    err = capsys.readouterr().err
    assert f"{corrupt / METRICS_FILE}: the last line of a finished run is corrupt" in err


def test_config_only_folder_is_no_seed(tmp_path, capsys):
    make_run(tmp_path, "sera_pilot", seed=0, pass1=0.5, val_p=np.full(50, 0.5))
    make_run(tmp_path, "maxrl", seed=0, pass1=0.4, val_p=np.full(50, 0.4))
    folder = tmp_path / "imagenet-cpu" / "sera_seed-1"
    folder.mkdir()
    config = yaml.safe_load(
        (tmp_path / "imagenet-cpu" / "sera_pilot_n0-16_seed-0_steps-100_pilot8" / CONFIG_FILE).read_text()
    )
    (folder / CONFIG_FILE).write_text(yaml.safe_dump({**config, "seed": 1}))
    rows = table2_rows(tmp_path)
    (sera,) = reproduced(rows, "SERA")
    assert sera["method"] == "SERA with pilots (unfinished)" and sera["seeds"] == "1"
    assert float(sera["Pass@1"]) == pytest.approx(100 * 0.5 * (1 + 1 / 2048), abs=0.01)
    verdict = (tmp_path / "out" / "imagenet-cpu" / "table2_verdict.md").read_text()
    assert "| 16 | 1 vs 1 | +10.00 [+10.00, +10.00] |" in verdict
    assert f"{folder}: no metrics.jsonl" in capsys.readouterr().err


def test_nan_and_inf_are_shown_never_bold_never_a_crash(tmp_path):
    make_run(tmp_path, "maxrl", seed=0, pass1=0.4, val_p=np.full(50, 0.4))
    nan_final = {"eval/pass@1": None, "eval/pass@2": "inf"}  # how metrics.jsonl stores NaN and infinity
    make_run(tmp_path, "sera_pilot", seed=0, pass1=0.6, final=nan_final, val_p=np.r_[np.nan, np.full(49, 0.6)])
    rows = table2_rows(tmp_path)
    (sera,) = reproduced(rows, "SERA")
    assert sera["Pass@1"] == "nan" and sera["Pass@2"] == "inf" and sera["Pass@4"] != "nan"
    md = (tmp_path / "out" / "imagenet-cpu" / "table2.md").read_text()
    assert "**nan**" not in md and "**inf**" not in md
    maxrl_line = next(line for line in md.splitlines() if "| MaxRL | reproduced" in line)
    assert maxrl_line.split(" | ")[5:7] == ["40.02", "40.04"]  # not bold against nan / inf
    assert "**60." in md  # finite columns are still compared
    verdict = (tmp_path / "out" / "imagenet-cpu" / "table2_verdict.md").read_text()
    assert "| 16 | 1 vs 1 | +nan [" in verdict and "seed 0: +nan" in verdict


def test_val_p_of_different_lengths_is_an_error_naming_the_runs(tmp_path):
    a = make_run(tmp_path, "sera_pilot", seed=0, val_p=np.full(50, 0.5))
    b = make_run(tmp_path, "sera_pilot", seed=1, val_p=np.full(40, 0.5))
    make_run(tmp_path, "maxrl", seed=0, val_p=np.full(50, 0.5))
    with pytest.raises(ValueError, match="val_p.npy lengths differ") as err:
        imagenet.table2(tmp_path, "cpu", tmp_path / "out")
    assert f"{a} (50 images)" in str(err.value) and f"{b} (40 images)" in str(err.value)


def test_verdict_refuses_runs_on_other_validation_sets(tmp_path):
    a = make_run(tmp_path, "sera_pilot", val_p=np.full(50, 0.5), data={"split_seed": 1})
    b = make_run(tmp_path, "maxrl", val_p=np.full(50, 0.5), data={"split_seed": 2})
    with pytest.raises(ValueError, match=r"validation sets differ in \['data.split_seed'\]") as err:
        imagenet.table2(tmp_path, "cpu", tmp_path / "out")
    assert str(a) in str(err.value) and str(b) in str(err.value)


def test_verdict_refuses_two_sera_groups_for_one_maxrl(tmp_path, capsys):
    make_run(tmp_path, "maxrl", val_p=np.full(50, 0.4))
    a = make_run(tmp_path, "sera_pilot", steps=100, val_p=np.full(50, 0.5))
    b = make_run(tmp_path, "sera_pilot", steps=200, val_p=np.full(50, 0.6))
    imagenet.table2(tmp_path, "cpu", tmp_path / "out")
    verdict = (tmp_path / "out" / "imagenet-cpu" / "table2_verdict.md").read_text()
    assert f"| 16 | refused: 2 SERA with pilots groups differ in train.steps ({a.name} vs {b.name}) |" in verdict
    err = capsys.readouterr().err
    assert "n0 = 16: refused to pair" in err and f"{a} | {b}" in err


def test_missing_runs_give_not_run_cells(tmp_path):
    make_run(tmp_path, "sera_pilot", n0=128)
    imagenet.table2(tmp_path, "cpu", tmp_path / "out")
    verdict = (tmp_path / "out" / "imagenet-cpu" / "table2_verdict.md").read_text()
    assert "| 128 | not run |" in verdict


def test_tables_2_and_3_show_the_paper_rows_without_runs(tmp_path):
    rows = table2_rows(tmp_path)
    assert [(r["n0"], r["method"], r["source"]) for r in rows] == [
        (n0, method, source)
        for n0, method in [("", "Direct CE"), ("16", "MaxRL"), ("16", "SERA"), ("128", "MaxRL"), ("128", "SERA")]
        for source in ("not run", "paper (ImageNet, ResNet-50)")
    ]
    assert rows[0]["Pass@1"] == "not run" and rows[1]["Pass@1"] == "60.81"
    imagenet.table3(tmp_path, "cpu", tmp_path / "out")
    rows = read_csv_rows(tmp_path / "out" / "imagenet-cpu" / "table3.csv")
    assert [(r["estimator"], r["m"], r["MAE"], r["paper MAE"]) for r in rows] == [
        ("historical", "0", "not run", "0.0386"),
        ("pilot", "8", "not run", "0.0634"),
    ]


def test_table2_places_runs_beside_their_paper_rows(tmp_path):
    make_run(tmp_path, "sera_pilot", n0=128)
    rows = table2_rows(tmp_path)
    assert [(r["n0"], r["method"], r["source"][:5]) for r in rows][-4:] == [
        ("128", "MaxRL", "not r"),
        ("128", "MaxRL", "paper"),
        ("128", "SERA with pilots", "repro"),
        ("128", "SERA", "paper"),
    ]


def test_table2_verdict_lists_the_difference_seed_by_seed(tmp_path):
    for seed, (a, b) in enumerate([(0.50, 0.40), (0.45, 0.47), (0.60, 0.30)]):
        make_run(tmp_path, "sera_pilot", seed=seed, pass1=a, val_p=np.full(50, a))
        make_run(tmp_path, "maxrl", seed=seed, pass1=b, val_p=np.full(50, b))
    make_run(
        tmp_path, "sera_pilot", seed=3, pass1=0.9, val_p=np.full(50, 0.9)
    )  # no MaxRL partner: not in the per-seed column
    imagenet.table2(tmp_path, "cpu", tmp_path / "out")
    verdict = (tmp_path / "out" / "imagenet-cpu" / "table2_verdict.md").read_text()
    scale = 1 + 1 / 2048  # the fixture's Pass@1 is pass1 * (1 + k / 2048)
    expected = ", ".join(f"seed {s}: {100 * d * scale:+.2f}" for s, d in enumerate([0.10, -0.02, 0.30]))
    assert f"| {expected} |" in verdict and "seed 3" not in verdict


def test_table3_averages_the_last_epoch(tmp_path):
    # an epoch of 3 steps: the last three RL steps (1, 2, 3) of each run
    make_run(
        tmp_path,
        "sera_pilot",
        estimator="pilot",
        m=2,
        final={"train/steps_per_epoch": 3},
        pearson=(0.9, None, 0.2, 0.4),
    )
    make_run(tmp_path, "sera_pilot", estimator="history", m=0)
    imagenet.table3(tmp_path, "cpu", tmp_path / "out")
    rows = read_csv_rows(tmp_path / "out" / "imagenet-cpu" / "table3.csv")
    assert [r["m"] for r in rows] == ["0", "2", "8"]  # m = 8: the paper's row, not run here
    assert float(rows[0]["MAE"]) == pytest.approx(0.25, abs=1e-4)  # epoch of 4: mean of 0.1 .. 0.4
    assert float(rows[1]["MAE"]) == pytest.approx(0.3, abs=1e-4)  # epoch of 3: mean of 0.2 .. 0.4
    assert float(rows[1]["Pearson r (per batch)"]) == pytest.approx(0.3)  # r per batch, the null batch left out
    assert rows[1]["paper MAE"] == "n/a" and rows[0]["paper MAE"] == "0.0386"  # the paper reports m = 0, 8 only
    # pooled moments over steps 1..3: n = 6, sx = sy = 3, sxx = syy = sxy = 7.5 -> r = 1
    assert float(rows[1]["Pearson r (pooled)"]) == pytest.approx(1.0)
    assert rows[2]["seeds"] == "" and rows[2]["Pearson r (per batch)"] == "not run"
    assert (tmp_path / "out" / "imagenet-cpu" / "phat_vs_p.png").exists()


def test_table3_per_batch_pearson_is_nan_when_no_batch_has_one(tmp_path):
    make_run(tmp_path, "sera_pilot", estimator="history", m=0, pearson=(None, None, None, None))
    imagenet.table3(tmp_path, "cpu", tmp_path / "out")
    (history, _) = read_csv_rows(tmp_path / "out" / "imagenet-cpu" / "table3.csv")
    assert history["Pearson r (per batch)"] == "nan" and history["seeds"] == "1"


def test_load_runs_ignores_sweep_bookkeeping(tmp_path):
    make_run(tmp_path, "maxrl")
    (tmp_path / "imagenet-cpu" / ".sweeps" / "0").mkdir(parents=True)
    (tmp_path / "imagenet-cpu" / ".sweeps" / "0" / CONFIG_FILE).write_text("{}")
    assert len(load_runs(tmp_path / "imagenet-cpu")) == 1


def test_sequential_settings_do_not_split_batch_method_rows():
    """method.sequential only matters for DS/DPS/SARA: two SERA runs differing only there are seeds of one row."""
    from paper_figures.runs import Run, setting

    a = Run(None, {"method": {"name": "sera_pilot"}, "seed": 0}, [], True)
    b = Run(None, {"method": {"name": "sera_pilot", "sequential": {"k0": 4}}, "seed": 1}, [], True)
    c = Run(None, {"method": {"name": "sara", "sequential": {"k0": 4}}}, [], True)
    d = Run(None, {"method": {"name": "sara", "sequential": {"k0": 2}}}, [], True)
    assert setting(a) == setting(b) and setting(c) != setting(d)


def test_settings_added_later_do_not_split_rows():
    """A run made before the vllm group and train.parallel existed is a seed of the same row as one made after (hf
    engine, ddp); a vllm run's settings, or FSDP2, do split."""
    from paper_figures.runs import Run, setting

    old = Run(None, {"engine": "hf", "train": {"steps": 5}, "seed": 0}, [], True)
    new = Run(None, {"engine": "hf", "vllm": {"dtype": None}, "train": {"steps": 5, "parallel": "ddp"}}, [], True)
    fsdp = Run(None, {"engine": "hf", "train": {"steps": 5, "parallel": "fsdp2"}}, [], True)
    a = Run(None, {"engine": "vllm", "vllm": {"dtype": None}, "train": {"steps": 5}}, [], True)
    b = Run(None, {"engine": "vllm", "vllm": {"dtype": "bfloat16"}, "train": {"steps": 5}}, [], True)
    assert setting(old) == setting(new) and setting(new) != setting(fsdp) and setting(a) != setting(b)


def test_table2_leaves_another_ablations_runs_to_their_table(tmp_path):
    """A `make ablate` sweep of the p_hat clip in the grid's folder: its runs (folders naming the changed setting) are
    not Table 2's, so SERA with pilots still pairs with MaxRL instead of being refused."""
    make_run(tmp_path, "maxrl", val_p=np.full(50, 0.4))
    make_run(tmp_path, "sera_pilot", steps=100, val_p=np.full(50, 0.5))
    swept = make_run(tmp_path, "sera_pilot", steps=200, seed=1, val_p=np.full(50, 0.6))
    swept.rename(swept.with_name("sera-m8_n0-16_method.p_lo=0.125_seed-0"))
    imagenet.table2(tmp_path, "cpu", tmp_path / "out")
    verdict = (tmp_path / "out" / "imagenet-cpu" / "table2_verdict.md").read_text()
    assert "refused" not in verdict and "| 16 | 1 vs 1 |" in verdict


@pytest.mark.parametrize(
    "name, ran, beside",
    [("sera", {"sera", "sera_pilot", "maxrl"}, "sera"), ("sera", {"sera_pilot", "maxrl"}, "sera_pilot"),
     ("sera", set(), "sera_pilot"), ("sera_pilot", {"sera"}, "sera"), ("maxrl", {"sera_pilot"}, "maxrl"),
     ("direct_ce", set(), "direct_ce")],
)  # fmt: skip
def test_a_paper_row_sits_beside_its_method_or_a_tested_method_with_its_baseline(name, ran, beside):
    """Table 2's routing by the registry: the row's own method where it ran; else the first tested method (registry
    order) against the same baseline that ran, or that could; a method without a baseline keeps its own place."""
    assert paper_row_method(name, ran) == beside
