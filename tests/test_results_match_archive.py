"""Every committed file under results/cpu/ is what the table builders make from the archive (results/runs/) as it is
checked out: `make tables FORCE=1` on a clean checkout (the commands make's dry run prints, run here in one process),
plus the tables of earlier scales and ablations that other commands publish (OTHER_BUILDS), would leave results/ as
it is. No runs are trained: the archive is restored into a temporary runs folder and the real builders read it. The
test names each committed file that differs from the build, each committed file that no builder writes and the
exclusions do not explain, and each built table that is not committed. A new archived run therefore needs its tables
rebuilt in the same commit (`make tables FORCE=<table>`), and so does a change to a builder.
"""

from __future__ import annotations

import importlib
import io
import shlex
import shutil
import subprocess
import sys
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from paper_figures import ablate, maze, render, report
from paper_figures import math as math_tables
from paper_figures.runs import load_run, read_once
from sera.runlog import CONFIG_FILE, METRICS_FILE

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results" / "cpu"
ARCHIVE = ROOT / "results" / "runs"
TABLE_FILES = (".md", ".csv")
PY = "python"  # the interpreter make's dry run names; the commands run in this process

# Committed files under results/cpu/ that no table command writes (glob patterns relative to it), and why
NOT_BUILT = {
    "PREREGISTRATION*.md": "pre-registration texts, written before their runs and amended by hand, never built",
    "PLAN_*.md": "plans committed before any of their runs, never built",
}

# Tables committed by other commands than `make tables` (the same builder functions, at the settings they were run
# with): folder under results/cpu/ -> a callable that writes that folder's tables under out/<folder>/
OTHER_BUILDS = {
    # the previous CPU defaults, kept beside the current ones (`make reproduce-maze SCALE=cpu_earlier`,
    # `make reproduce-math SCALE=cpu_sft3000`)
    "maze-cpu_earlier": lambda runs, out: maze.table4(runs, "cpu_earlier", out),
    "math-cpu_sft3000": lambda runs, out: [
        math_tables.passk_table("table1", runs, "cpu_sft3000", out),
        math_tables.delta_table("table5", runs, "cpu_sft3000", out),
    ],
    # `make ablate STUDY=imagenet METHOD=sera_pilot SETTING=method.p_lo VALUES=0.0625,0.03125,0.125` and
    # `make ablate-pilot` (METHOD=sera_pilot SETTING=method.pilot_m VALUES=8,0,2,4,16), docs/classification.md
    "imagenet-cpu": lambda runs, out: [
        ablate.ablation_table(
            runs, "imagenet", "cpu", "sera_pilot", "method.p_lo", ["0.0625", "0.03125", "0.125"], out
        ),
        ablate.ablation_table(runs, "imagenet", "cpu", "sera_pilot", "method.pilot_m", ["8", "0", "2", "4", "16"], out),
    ],
}


def table_files(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file() and p.suffix in TABLE_FILES}


def excluded(name: str) -> bool:
    return any(Path(name).match(pattern) for pattern in NOT_BUILT)


def make_tables_recipe(cwd: Path) -> list[tuple[str, list[str]]]:
    """The commands `make tables SCALE=cpu FORCE=1` runs in `cwd`, as (module, arguments): read from make's dry run,
    so that this test runs what the Makefile runs (the environment's stamp taken as made)."""
    done = subprocess.run(
        [
            "make",
            "--no-print-directory",
            "-n",
            "-C",
            str(cwd),
            "-f",
            str(ROOT / "Makefile"),
            "-o",
            ".venv/.installed-stamp",
        ]
        + ["tables", "SCALE=cpu", "FORCE=1", f"PY={PY}"],
        capture_output=True,
        text=True,
        check=True,
    )
    words = [shlex.split(line) for line in done.stdout.splitlines()]
    recipe = [(w[2], w[3:]) for w in words if w[:2] == [PY, "-m"] and w[2].startswith("paper_figures.")]
    assert [m for m, _ in recipe[:2]] == ["paper_figures.archive", "paper_figures.report"], done.stdout
    return recipe


@pytest.fixture(scope="module")
def build(tmp_path_factory) -> tuple[Path, set[str], Path, Path]:
    """A clean checkout's `make tables FORCE=1`, in a temporary folder with a copy of results/cpu/ and the archive
    (read only): the archive restored into its runs/ and every table built from it. Returns (the copy of results/cpu/
    after the build, the names the table commands wrote there, the build's paper_figures/out/, the other builds'
    folder)."""
    tmp = tmp_path_factory.mktemp("tables")
    shutil.copytree(RESULTS, tmp / "results" / "cpu")
    (tmp / "results" / "runs").symlink_to(ARCHIVE, target_is_directory=True)
    recipe = make_tables_recipe(tmp)
    modules = [importlib.import_module(name) for name, _ in recipe]
    # every builder reads each restored run once, and draws no figure (only the tables are compared; drawing the
    # figures is two fifths of the build's time); make's paths are relative (REPORT.md names its runs folders)
    with redirect_stdout(io.StringIO()), read_once(), pytest.MonkeyPatch.context() as patch:
        patch.chdir(tmp)
        for module in [m for name, m in sys.modules.items() if name.startswith("paper_figures.")]:
            if hasattr(module, "save_figure"):
                patch.setattr(module, "save_figure", lambda fig, stem: render.pyplot().close(fig))
            if hasattr(module, "OUT"):  # a command's default output folder is this checkout's, not the repository's
                patch.setattr(module, "OUT", tmp / "paper_figures" / "out")
        for module, (name, argv) in zip(modules, recipe, strict=True):
            assert module.main(argv) in (None, 0), f"{name} {argv}"
        for make in OTHER_BUILDS.values():
            make(Path("runs"), Path("other"))
    out = tmp / "paper_figures" / "out"
    written = table_files(out) | {"claims.md", "claims.csv"}
    return tmp / "results" / "cpu", written, out, tmp / "other"


def test_every_committed_result_is_what_the_archive_builds(build):
    results, written, out, other = build
    committed = {p.relative_to(RESULTS).as_posix() for p in RESULTS.rglob("*") if p.is_file()}
    others = {f"{folder}/{name}" for folder in OTHER_BUILDS for name in table_files(other / folder)}
    problems = []
    for name in sorted(committed):
        if excluded(name):
            continue
        if name in others:
            built = (other / name).read_text()
        elif name == report.REPORT:
            # the whole build's: a forced publish rewrites results/REPORT.md only when some table changed
            built = (out / name).read_text()
        elif name in written:
            built = (results / name).read_text()
        else:
            problems.append(f"{name}: committed, but no table command writes it (nor does NOT_BUILT say why)")
            continue
        if (RESULTS / name).read_text() != built:  # text, as the guard compares (the CSV writer's line ends aside)
            problems.append(f"{name}: differs from the table built from the archive")
    for name in sorted((table_files(results) | others) - committed):
        problems.append(f"{name}: built from the archive, not committed")
    assert not problems, (
        "results/cpu/ is not what the archive builds (make tables FORCE=<table> rebuilds a committed table; "
        "commit it with the archived runs):\n" + "\n".join(problems)
    )


def test_the_exclusions_name_committed_files():
    """Each exclusion still matches a committed file (a stale pattern could hide a new one)."""
    names = [p.relative_to(RESULTS).as_posix() for p in RESULTS.rglob("*") if p.is_file()]
    for pattern in NOT_BUILT:
        assert any(Path(n).match(pattern) for n in names), pattern


@pytest.mark.parametrize("folder", sorted(OTHER_BUILDS))
def test_other_builds_are_committed_folders(folder):
    assert (RESULTS / folder).is_dir(), folder


def test_read_once_reads_a_run_again_only_when_its_files_change(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / CONFIG_FILE).write_text("seed: 0\n")
    (run / METRICS_FILE).write_text('{"step": 1, "x": 1}\n')
    assert load_run(run) is not load_run(run)  # outside the block every call reads the directory
    with read_once():
        first = load_run(run)
        assert load_run(run) is first
        with (run / METRICS_FILE).open("a") as f:
            f.write('{"step": 2, "x": 2}\n')
        again = load_run(run)
        assert again is not first and again.last("x") == 2.0
        with read_once():  # a nested block shares the outer one's runs
            assert load_run(run) is again
    assert load_run(run) is not again
