"""`make tables` never destroys measured results (paper_figures/guard.py): over a temporary copy of results/ and tiny
run trees built here, a poorer build (no runs, smoke runs only, fewer seeds, unfinished runs) changes no committed
file and says why; the explicit choice (FORCE) writes, and prints the cells it changes."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from paper_figures import guard, imagenet, render, report, sara
from sera.runlog import CONFIG_FILE, DONE_FILE, METRICS_FILE

ROOT = Path(__file__).resolve().parents[1]
TABLE2 = "imagenet-cpu/table2"


def classification_run(runs, method, seed, pass1=0.5, scale="cpu", done=True):
    """A finished classification run at n0 = 16 (SERA with its 8 pilots): four RL steps, one evaluation."""
    path = runs / f"imagenet-{scale}" / f"{method}_n0-16_seed-{seed}"
    path.mkdir(parents=True)
    config = {
        "experiment": "imagenet",
        "scale_name": scale,
        "seed": seed,
        "n0": 16,
        "method": {"name": method, "estimator": "pilot" if method == "sera_pilot" else "none", "pilot_m": 8},
        "data": {"name": "digits1000", "num_train": 40, "num_val": 50},
        "train": {"steps": 4, "batch_size": 10},
    }
    (path / CONFIG_FILE).write_text(yaml.safe_dump(config))
    steps = [
        {"step": s, "grad/cos_ce": 0.5, "phat/mae": 0.1, "phat/pearson": 0.9, "phat/moments": [2, 1, 1, 1, 1, 1]}
        for s in range(4)
    ]
    final = {"step": 4, "train/steps_per_epoch": 4, **{f"eval/pass@{k}": pass1 for k in imagenet.KS}}
    (path / METRICS_FILE).write_text("\n".join(json.dumps(r) for r in [*steps, final]) + "\n")
    if done:
        (path / DONE_FILE).write_text("{}\n")
    return path


def files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def no_figures(monkeypatch):
    """Figures are not what these tests check, and drawing them is most of a build's time."""
    for module in (render, imagenet, sara):
        monkeypatch.setattr(module, "save_figure", lambda fig, stem: render.pyplot().close(fig))


@pytest.fixture
def committed(tmp_path):
    """A copy of the committed results/cpu (the real one is never written)."""
    copy = tmp_path / "results" / "cpu"
    shutil.copytree(ROOT / "results" / "cpu", copy)
    return copy


def committed_cell(results: Path, table: str, label: tuple, column: str) -> str:
    """A cell of a committed markdown table, found by its row label."""
    for parsed in guard.parse((results / table).read_text())[0].values():
        if label in parsed.keyed():
            return parsed.keyed()[label][parsed.header.index(column)]
    raise KeyError(label)


def build(runs: Path, out: Path, scale="cpu", only=None) -> list[report.Table]:
    jobs = [j for j in report.plan(runs, scale) if only is None or j.name == only]
    return report.build_tables(jobs, runs, out)


def publish(tables, results, force=(), capsys=None) -> str:
    report.publish(tables, results, set(force))
    return capsys.readouterr().out


def make_tables(cwd: Path, *variables: str) -> str:
    """`make tables` as a user runs it, in `cwd` (its runs/, results/cpu/ and paper_figures/out/), with this Python."""
    done = subprocess.run(
        ["make", "--no-print-directory", "-C", str(cwd), "-f", str(ROOT / "Makefile"), "-o", ".venv/.installed-stamp"]
        + ["tables", f"PY={sys.executable}", *variables],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_make_tables_over_no_runs_keeps_every_committed_file_and_force_writes(tmp_path, committed, no_figures, capsys):
    runs, out = tmp_path / "runs", tmp_path / "paper_figures" / "out"
    runs.mkdir()
    before = files(committed)
    seeds = committed_cell(committed, "imagenet-cpu/table2.md", ("16", "MaxRL"), "seeds")
    said = make_tables(tmp_path)
    assert files(committed) == before
    assert "imagenet-cpu/table2: kept the committed table; this build is poorer:" in said
    assert f'imagenet-cpu/table2.md, row "16 | MaxRL": seeds: none here, {seeds} in results/' in said
    assert "maze-cpu/table4: kept the committed table" in said and "sara-cpu_sara: kept the committed table" in said
    shown = (out / report.REPORT).read_text()  # the report still shows every table
    for title in ["Table 2 (classification as a policy), scale=cpu_scratch", "Table 4", "Table1 (tiny-math)", "SARA"]:
        assert title in shown
    assert "| 16 | MaxRL | not run |" in shown

    command = make_tables(tmp_path, "-n", "FORCE=1")  # what FORCE=1 runs, run here without drawing the figures
    assert f"--runs runs --out paper_figures/out --results {Path('results') / 'cpu'} --force 1" in command
    pass1 = committed_cell(committed, "imagenet-cpu/table2.md", ("16", "MaxRL"), "Pass@1")
    report.main(["--runs", str(runs), "--out", str(out), "--results", str(committed), "--force", "1"])
    said = capsys.readouterr().out
    assert f'imagenet-cpu/table2.md, row "16 | MaxRL", Pass@1: {pass1} -> not run' in said
    after = files(committed)
    assert after.keys() == before.keys()  # no smoke or stray folder appears
    assert after["imagenet-cpu/table2.md"] != before["imagenet-cpu/table2.md"]
    assert after[report.REPORT] == (out / report.REPORT).read_bytes()


def test_smoke_runs_stay_in_out(tmp_path, committed, no_figures, capsys):
    runs, out = tmp_path / "runs", tmp_path / "out"
    classification_run(runs, "maxrl", 0, pass1=0.4, scale="smoke")
    classification_run(runs, "sera_pilot", 0, pass1=0.6, scale="smoke")
    before = files(committed)
    args = ["--runs", str(runs), "--out", str(out), "--results", str(committed)]
    report.main(["--scale", "smoke", *args, "--force"])  # not even the explicit choice copies smoke tables
    assert files(committed) == before
    assert "imagenet-smoke/table2: smoke scale, left in paper_figures/out/ only" in capsys.readouterr().out
    assert (
        "| 16 | SERA with pilots | reproduced (digits1000, smoke) | 1 |"
        in (out / "imagenet-smoke" / "table2.md").read_text()
    )
    report.main(["--scale", "cpu", *args])  # the smoke tables now in out/ are not this build's: not copied
    assert files(committed) == before


def test_one_seed_of_a_three_seed_row_keeps_the_committed_table(tmp_path, committed, no_figures, capsys):
    runs = tmp_path / "runs"
    classification_run(runs, "maxrl", 0)
    tables = build(runs, tmp_path / "out")
    before = files(committed)
    seeds = committed_cell(committed, "imagenet-cpu/table2.md", ("16", "MaxRL"), "seeds")
    assert int(seeds) > 1
    said = publish(tables, committed, capsys=capsys)
    assert files(committed) == before
    assert f'imagenet-cpu/table2.md, row "16 | MaxRL": seeds: 1 here, {seeds} in results/' in said

    said = publish(tables, committed, force={TABLE2}, capsys=capsys)  # FORCE=imagenet-cpu/table2: only that table
    after = files(committed)
    assert f'imagenet-cpu/table2.md, row "16 | MaxRL", seeds: {seeds} -> 1' in said
    changed = {name for name in after if after[name] != before[name]}
    assert changed == {
        "imagenet-cpu/table2.md",
        "imagenet-cpu/table2.csv",
        "imagenet-cpu/table2_verdict.md",
        "REPORT.md",
    }
    kept = after[report.REPORT].decode()  # the kept tables keep their committed sections
    assert committed_cell(committed, "imagenet-cpu/table3.md", ("pilot", "8"), "MAE") in kept


def test_fewer_seeds_in_one_row_keeps_the_whole_table_and_force_names_its_cells(tmp_path, capsys):
    results, three, one = tmp_path / "results", tmp_path / "three", tmp_path / "one"
    for seed in range(3):
        classification_run(three, "maxrl", seed, pass1=0.40)
        classification_run(three, "sera_pilot", seed, pass1=0.60 + 0.03 * seed)
        classification_run(one, "maxrl", seed, pass1=0.40)
    classification_run(one, "sera_pilot", 0, pass1=0.60)

    said = publish(build(three, tmp_path / "out", only=TABLE2), results, capsys=capsys)
    assert f"{TABLE2}: added to {results}" in said and (results / report.REPORT).exists()
    committed = files(results)
    assert (
        "| 16 | SERA with pilots | reproduced (digits1000, cpu) | 3 |" in committed["imagenet-cpu/table2.md"].decode()
    )

    tables = build(one, tmp_path / "out", only=TABLE2)
    said = publish(tables, results, capsys=capsys)
    assert files(results) == committed
    assert 'row "16 | SERA with pilots": seeds: 1 here, 3 in results/' in said and 'row "16 | MaxRL":' not in said

    said = publish(tables, results, force={TABLE2}, capsys=capsys)
    assert f"{TABLE2}: written over the committed table (FORCE), poorer" in said
    assert 'imagenet-cpu/table2.md, row "16 | SERA with pilots", seeds: 3 -> 1' in said
    assert (
        'imagenet-cpu/table2.md, row "16 | SERA with pilots", Pass@1: 63.00 -> 60.00' in said
    )  # mean of .60, .63, .66
    assert 'row "16 | MaxRL"' not in said  # its numbers are the same
    assert (
        "| 16 | SERA with pilots | reproduced (digits1000, cpu) | 1 |"
        in (results / "imagenet-cpu" / "table2.md").read_text()
    )


def test_a_stale_report_beside_unchanged_tables_is_rewritten(tmp_path, capsys):
    """Tables committed by another route (copied from a build elsewhere) leave REPORT.md's section behind: a build
    whose tables are all unchanged still rewrites REPORT.md to match them, and leaves a matching one alone."""
    results, runs = tmp_path / "results", tmp_path / "runs"
    for seed in range(3):
        classification_run(runs, "maxrl", seed, pass1=0.40)
        classification_run(runs, "sera_pilot", seed, pass1=0.60)
    tables = build(runs, tmp_path / "out", only=TABLE2)
    publish(tables, results, capsys=capsys)
    fresh = (results / report.REPORT).read_text()
    (results / report.REPORT).write_text(fresh.replace("| 16 | SERA with pilots |", "| 16 | SERA (an old row) |"))

    said = publish(tables, results, capsys=capsys)
    assert f"{TABLE2}: unchanged" in said and f"the sections of {TABLE2} differed from their unchanged tables" in said
    assert (results / report.REPORT).read_text() == fresh
    said = publish(tables, results, capsys=capsys)
    assert "rewrote" not in said and (results / report.REPORT).read_text() == fresh


def test_a_richer_build_waits_for_the_explicit_choice(tmp_path, capsys):
    results, one, three = tmp_path / "results", tmp_path / "one", tmp_path / "three"
    for seed in range(3):
        classification_run(three, "maxrl", seed, pass1=0.4 + 0.01 * seed)
    classification_run(one, "maxrl", 0, pass1=0.4)
    publish(build(one, tmp_path / "out", only=TABLE2), results, capsys=capsys)
    committed = files(results)

    tables = build(three, tmp_path / "out", only=TABLE2)
    said = publish(tables, results, capsys=capsys)
    assert files(results) == committed
    assert f"(make tables FORCE={TABLE2} writes it)" in said and "poorer" not in said
    assert 'row "16 | MaxRL", seeds: 1 -> 3' in said
    publish(tables, results, force={TABLE2}, capsys=capsys)
    assert "| 16 | MaxRL | reproduced (digits1000, cpu) | 3 |" in (results / "imagenet-cpu" / "table2.md").read_text()


def test_an_unfinished_run_makes_a_poorer_build(tmp_path, capsys):
    results, runs = tmp_path / "results", tmp_path / "runs"
    classification_run(runs, "maxrl", 0)
    sera = classification_run(runs, "sera_pilot", 0)
    publish(build(runs, tmp_path / "out", only=TABLE2), results, capsys=capsys)
    committed = files(results)
    (sera / DONE_FILE).unlink()  # e.g. rerun with a longer schedule and stopped
    said = publish(build(runs, tmp_path / "out", only=TABLE2), results, capsys=capsys)
    assert files(results) == committed
    assert (
        'row "16 | SERA with pilots": not in this build (this build has "16 | SERA with pilots (unfinished)")' in said
    )


def test_force_names_are_checked_before_any_work(tmp_path, capsys):
    out = tmp_path / "out"
    args = ["--runs", str(tmp_path), "--out", str(out), "--results", str(tmp_path / "results")]
    with pytest.raises(SystemExit):
        report.main([*args, "--force", "imagenet-cpu/table9"])
    assert "no table ['imagenet-cpu/table9']" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        report.main(["--runs", str(tmp_path), "--out", str(out), "--force"])
    assert "give --results" in capsys.readouterr().err
    assert not out.exists()
    jobs = report.plan(tmp_path, "cpu")
    assert report.forced_names("imagenet-cpu", jobs) == {TABLE2, "imagenet-cpu/table3"}  # a folder: its tables


def test_markdown_cells_rows_and_text_lines():
    assert guard.split_cells("| 16 | **0.75** | cos(E[g | n], CE) |") == ["16", "0.75", "cos(E[g | n], CE)"]
    assert guard.seed_counts("3 vs 2") == (3, 2) and guard.seed_counts("not run") is None
    old = "| method | seeds | Pass@1 at 3.9k (%) |\n|---|---|---|\n| DS | 2 | 50.00 |\nSaturated share: 72.6%.\n"
    new = "| method | seeds | Pass@1 at 4.1k (%) |\n|---|---|---|\n| DS | 2 | 51.00 |\n"
    diff = guard.compare({"t.md": old}, {"t.md": new})
    assert 't.md, row "DS", Pass@1 at 3.9k (%): 50.00 -> 51.00' in diff.changes  # a renamed column, same place
    assert diff.losses == ["t.md: line not in this build: Saturated share: 72.6%."]
    assert guard.compare({"t.md": old.replace("| 2 |", "| 3 |")}, {"t.md": old}).losses == [
        't.md, row "DS": seeds: 2 here, 3 in results/'
    ]
    assert not guard.measured("| method | source | Pass@1 |\n|---|---|---|\n| SERA | paper | 12.37 |\n")


def test_a_decision_reached_is_news_and_a_number_gone_is_a_loss():
    """A pre-registered claim that goes from "in progress" to a decision with all its seeds is published without
    FORCE; the same row without its interval is still a loss."""
    header = "| claim | endpoint | seeds | difference (pp) [seed 95% t] | decision | paper (pp) | vs the paper |\n"
    header += "|---|---|---|---|---|---|---|\n"
    waiting = "in progress (7 of 12 seeds): no decision"
    before = header + f"| C1 | primary | 7 of 12 (0-11) | +4.61 [+1.44, +7.78] | {waiting} | +3.70 |  |\n"
    after = header + "| C1 | primary | 12 of 12 (0-11) | +4.43 [+2.47, +6.39] | supported | +3.70 | consistent |\n"
    decided = guard.compare({"p.md": before}, {"p.md": after})
    assert decided.losses == [] and any("decision: in progress" in c and "-> supported" in c for c in decided.changes)
    gone = after.replace("+4.43 [+2.47, +6.39]", "not run")
    assert guard.compare({"p.md": after}, {"p.md": gone}).losses
