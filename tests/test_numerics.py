"""The numeric kernel level (sera.numerics): in force inside a run, recorded, the same level giving identical records
and another level different ones, and the fresh-against-committed comparison (paper_figures.numerics)."""

import json
import os
import subprocess
import sys

import pytest

from paper_figures import numerics as table_numerics
from sera.numerics import NUMERICS_FILE, PINNED_VARS, cpu_flags
from sera.runlog import RunDir, RunExistsError, read_jsonl

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline"}
HAS_AVX512 = "avx512f" in cpu_flags()


def smoke_run(root, level, *overrides, check=True):
    cmd = [sys.executable, "-m", "experiments.imagenet.train", "scale=imagenet/smoke", "method=sera_pilot", "threads=1"]
    env = {**ENV, "SERA_NUMERICS": level}
    return subprocess.run([*cmd, *overrides, f"run.root={root}"], env=env, capture_output=True, text=True, check=check)


def records(root):
    """A smoke run's metrics without its wall times."""
    rows = read_jsonl(root / "imagenet-smoke" / "sera-m8_n0-16_seed-0" / "metrics.jsonl")
    return [{k: v for k, v in row.items() if not k.startswith("time/")} for row in rows]


def fingerprint(root):
    return json.loads((root / "imagenet-smoke" / "sera-m8_n0-16_seed-0" / NUMERICS_FILE).read_text())


@pytest.mark.slow
def test_the_level_is_in_force_inside_a_run_and_decides_its_records(tmp_path):
    smoke_run(tmp_path / "a", "avx2")
    smoke_run(tmp_path / "b", "avx2")
    fp = fingerprint(tmp_path / "a")
    assert fp["level"] == "avx2" and fp["torch_cpu_capability"] == "AVX2"  # torch's own report, inside the run
    assert fp["env"]["ATEN_CPU_CAPABILITY"] == "avx2" and fp["threads"] == 1
    assert records(tmp_path / "a") == records(tmp_path / "b")
    if not HAS_AVX512:
        pytest.skip("this CPU has no AVX-512: the second level cannot run here")
    smoke_run(tmp_path / "c", "avx512")
    assert fingerprint(tmp_path / "c")["torch_cpu_capability"] == "AVX512"
    assert records(tmp_path / "c") != records(tmp_path / "a")


def test_an_unknown_level_is_refused_before_any_work(tmp_path):
    out = smoke_run(tmp_path, "avx9", check=False)
    assert out.returncode != 0 and "unknown SERA_NUMERICS='avx9'" in out.stderr
    assert not (tmp_path / "imagenet-smoke").exists()


def test_a_level_cannot_be_applied_after_torch_loaded():
    code = "import torch, os; os.environ['SERA_NUMERICS'] = 'avx2'; import experiments"  # avx2: every x86-64 has it
    env = {k: v for k, v in ENV.items() if k not in PINNED_VARS} | {"SERA_NUMERICS": "native"}  # nothing pinned
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode != 0 and "torch was imported before SERA_NUMERICS=avx2" in out.stderr


def test_a_run_is_not_resumed_at_another_level(tmp_path):
    with RunDir(tmp_path, {"seed": 0}) as run:
        run.log(0, {"train/loss": 1.0})
    recorded = json.loads((tmp_path / NUMERICS_FILE).read_text())
    assert recorded["level"] == os.environ["SERA_NUMERICS"]
    (tmp_path / NUMERICS_FILE).write_text(json.dumps({**recorded, "level": "elsewhere"}))
    with pytest.raises(RunExistsError, match="resume it with SERA_NUMERICS=elsewhere"):
        RunDir(tmp_path, {"seed": 0})


def committed_folder(tmp_path, table: str, level: str):
    results, archive = tmp_path / "results", tmp_path / "archive"
    (results / "g").mkdir(parents=True)
    (results / "g" / "t.md").write_text(table)
    run = archive / "g" / "r_seed-0"
    run.mkdir(parents=True)
    (run / "DONE").write_text("{}")
    (run / NUMERICS_FILE).write_text(json.dumps({"level": level, "torch_cpu_capability": "X", "cpu": "C"}))
    return results, archive


TABLE = "| method | Pass@1 |\n|---|---|\n| SERA | {} |\n"


def test_a_grid_joins_the_level_its_committed_runs_recorded(tmp_path):
    results, archive = committed_folder(tmp_path, TABLE.format("1.00"), "avx512")
    assert table_numerics.grid_level("g", archive, results) == "avx512"
    assert table_numerics.grid_level("other", archive, results) == "avx2"  # nothing recorded: the default


@pytest.mark.parametrize(
    "fresh, head",
    [("1.00", "identical"), ("1.50", "1 difference(s) from the committed tables, 0 of them losses"),
     ("", "1 difference(s) from the committed tables, 1 of them losses")],  # a lost number counts once
)  # fmt: skip
def test_fresh_tables_are_compared_cell_by_cell(tmp_path, fresh, head):
    results, archive = committed_folder(tmp_path, TABLE.format("1.00"), "avx512")
    (tmp_path / "out" / "g").mkdir(parents=True)
    (tmp_path / "out" / "g" / "t.md").write_text(TABLE.format(fresh))
    lines = table_numerics.compare_folder("g", tmp_path / "out", results, tmp_path / "runs", archive)
    assert lines[0].startswith("g: committed tables made with numerics avx512 (torch at X, C); nothing was rerun")
    assert lines[1] == "  verdicts: no pre-registered claim of this folder was rebuilt" and head in lines[2]
    if fresh == "1.50":
        assert any("1.00" in line and "1.50" in line for line in lines[3:])
    assert len(lines) == 3 + (fresh != "1.00") + (fresh == "")  # the change, and the loss marked as one


def test_the_comparison_counts_runs_made_here_apart_from_restored_ones(tmp_path):
    results, archive = committed_folder(tmp_path, TABLE.format("1.00"), "avx2")
    (tmp_path / "out" / "g").mkdir(parents=True)
    (tmp_path / "out" / "g" / "t.md").write_text(TABLE.format("1.00"))
    for name, restored in (("a_seed-0", True), ("b_seed-0", False), ("c_seed-0", False)):
        run = tmp_path / "runs" / "g" / name
        run.mkdir(parents=True)
        (run / "DONE").write_text("{}")
        (run / NUMERICS_FILE).write_text(json.dumps({"level": "avx2", "torch_cpu_capability": "AVX2", "cpu": "Here"}))
        if restored:
            (run / "ARCHIVED").write_text("restored\n")
    head = table_numerics.compare_folder("g", tmp_path / "out", results, tmp_path / "runs", archive)[0]
    assert "2 run(s) made here (avx2 (torch at AVX2, Here)), 1 restored from the archive and not rerun" in head


PREREG = (
    "| claim | endpoint | seeds | difference (pp) [seed 95% t] | decision |\n|---|---|---|---|---|\n"
    "| C7 classification n0 = 16 | primary | 8 of 8 | {} | {} |\n"
    "| C8 classification n0 = 128 | primary | 8 of 8 | +21.55 [+20.47, +22.63] | supported |\n"
)


@pytest.mark.parametrize(
    "fresh, decision, expected",
    [("+2.04 [+1.16, +2.92]", "supported", ["verdicts: all 2 pre-registered verdicts held",
                                             "directions: every difference kept its sign",
                                             "C7 classification n0 = 16 primary: +2.15 -> +2.04 (-0.11 pp)"]),
     ("-0.30 [-1.20, +0.60]", "not decided at this power",
      ["verdicts: 1 of 2 CHANGED: C7 classification n0 = 16 primary: supported -> not decided at this power",
       "directions: 1 difference(s) changed sign: C7 classification n0 = 16 primary",
       "C7 classification n0 = 16 primary: +2.15 -> -0.30 (-2.45 pp)"])],
)  # fmt: skip
def test_the_comparison_leads_with_the_verdicts_directions_and_largest_move(tmp_path, fresh, decision, expected):
    results, archive = committed_folder(tmp_path, TABLE.format("1.00"), "avx2")
    (results / "g" / "preregistered.md").write_text(PREREG.format("+2.15 [+1.07, +3.24]", "supported"))
    (tmp_path / "out" / "g").mkdir(parents=True)
    (tmp_path / "out" / "g" / "t.md").write_text(TABLE.format("1.00"))
    (tmp_path / "out" / "g" / "preregistered.md").write_text(PREREG.format(fresh, decision))
    lines = table_numerics.compare_folder("g", tmp_path / "out", results, tmp_path / "runs", archive)
    assert lines[1].strip() == expected[0] and lines[2].strip() == expected[1] and lines[3].endswith(expected[2])


@pytest.mark.parametrize("script", ["examples.trl_vs_loop", "examples.trl_math"])
def test_the_example_scripts_pin_the_level_before_torch(script):
    """`python -m examples.<script>` in a clean environment: the package puts the level in force before the script
    imports torch (the scripts import torch before the suite)."""
    env = {k: v for k, v in os.environ.items() if k not in PINNED_VARS}
    done = subprocess.run([sys.executable, "-m", script, "--help"], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
