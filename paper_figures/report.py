"""Every paper table that has runs, reproduced beside the paper's numbers, in one REPORT.md; and the guarded copy of
the tables into results/. No torch.

Run: python -m paper_figures.report --scale cpu --results results/cpu [--force all|NAME,...]   (make tables [FORCE=1])
Writes paper_figures/out/REPORT.md plus each table's markdown, CSV and LaTeX, and the figures. Each section names the
scale, steps and budget its rows were run at; a table without runs still appears, with its cells marked "not run".
With --results DIR the markdown and CSV tables also go into DIR under paper_figures/guard.py: a table not there yet
is added when it holds a measured number; a committed table (results/<scale>/ holds the measured tables README.md
quotes, and tests/test_readme_numbers.py checks them) is written over only when --force names it (or `all`), which
prints every cell it changes; otherwise the command says which tables it kept and why. Smoke-scale tables stay in
out/. DIR/REPORT.md is rewritten when a table is written into DIR, with the committed sections of the kept tables.
"""

from __future__ import annotations

import argparse
import io
import shutil
import sys
import tempfile
from collections.abc import Callable
from contextlib import redirect_stdout
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from paper_figures import guard, imagenet, maze, sara
from paper_figures import math as math_tables
from paper_figures.numerics import describe, run_fingerprints
from paper_figures.runs import load_runs, read_once

OUT = Path(__file__).parent / "out"
REPORT = "REPORT.md"
SETTINGS_LINE = 2  # a section's lines: its title, a blank line, the settings line of its runs, the table's text
PREAMBLE = [
    "# Reproduced tables beside the paper's",
    "",
    "Rows marked 'reproduced' come from run directories; 'paper' rows are the paper's numbers "
    "(paper_figures/reference/). CPU-scale rows are a small stand-in for the paper's setup: compare the "
    "direction of differences, not values.",
    "",
]
TABLE_FILES = (".md", ".csv")  # what goes into results/ (the LaTeX and the figures stay in out/)
SMOKE_SCALES = ("smoke",)  # seconds-long test runs (configs/scale/*/smoke.yaml): their tables never go to results/
# the classifier's other CPU scales: the from-scratch protocol on digits1000 and the default in the paper's regime
TABLE2_ALSO = {"cpu": ("cpu_scratch", "gauss1000")}
CLASSIFICATION_PREREG = {"cpu": "gauss1000"}  # the scale whose runs decide C7 and C8
SARA_STUDY = ("cpu",)  # scales with a sequential-allocation study (make reproduce-sara), shown even before it runs
ALL = "all"
SHOWN = 20  # lines of reasons or differences printed for a table that is kept (a forced write prints them all)


@dataclass
class Job:
    name: str  # what --force names: <folder>/<table> (e.g. imagenet-cpu/table2), or the folder for a study
    scale: str  # the scale of the runs it reads
    folder: str  # the runs folder its REPORT.md section describes
    make: Callable[[Path], str]  # builds the table into an output folder; returns its text, title line first


@dataclass
class Table:
    name: str
    scale: str
    section: str  # its REPORT.md section
    files: dict[str, str]  # the markdown and CSV files it wrote (path relative to the output folder -> text)

    @property
    def title(self) -> str:
        return self.section.partition("\n")[0]


def markdown(files: dict[str, str]) -> dict[str, str]:
    """The markdown files of a table (the CSV files beside them hold the same cells)."""
    return {name: text for name, text in files.items() if name.endswith(".md")}


def settings_line(root: Path) -> str:
    """Scale, steps and budget (B x n0) of the runs in one folder, as found in their configs, and the numeric
    fingerprints they recorded (paper_figures.numerics)."""
    runs = load_runs(root, report=io.StringIO())
    if not runs:
        return f"No runs under `{root}`: every reproduced cell below is 'not run'."
    seen = sorted(
        {
            (r.get("scale_name"), r.get("train.steps"), r.get("train.batch_size"), r.get("n0"))
            for r in runs
            if r.get("train.steps") is not None
        },
        key=repr,
    )
    parts = [f"scale={s}, steps={t}, budget={b}x{n}={b * n if b and n else '?'}" for s, t, b, n in seen]
    return f"{len(runs)} runs under `{root}`: " + "; ".join(parts) + f"; {describe(run_fingerprints(root))}"


def plan(runs_root: Path, scale: str, math_scale: str = "paper") -> list[Job]:
    """The tables a report at `scale` builds, in REPORT.md order."""
    jobs = [
        Job(f"imagenet-{s}/table2", s, f"imagenet-{s}", partial(imagenet.table2, runs_root, s))
        for s in (scale, *TABLE2_ALSO.get(scale, ()))
    ]
    if scale in CLASSIFICATION_PREREG:
        s = CLASSIFICATION_PREREG[scale]
        prereg = partial(imagenet.classification_prereg, runs_root, s)
        jobs.append(Job(f"imagenet-{s}/preregistered", s, f"imagenet-{s}", prereg))
    jobs.append(Job(f"imagenet-{scale}/table3", scale, f"imagenet-{scale}", partial(imagenet.table3, runs_root, scale)))
    jobs.append(Job(f"maze-{scale}/table4", scale, f"maze-{scale}", partial(maze.table4, runs_root, scale)))
    for ms in ([scale] if scale in math_tables.CPU_TABLES and scale != math_scale else []) + [math_scale]:
        own = math_tables.CPU_TABLES.get(ms)  # a scale with its own math tables builds only those
        for names, make in [
            (math_tables.PASSK_TABLES, math_tables.passk_table),
            (math_tables.DELTA_TABLES, math_tables.delta_table),
        ]:
            for n in names:
                if own is None or n in own:
                    jobs.append(Job(f"math-{ms}/{n}", ms, f"math-{ms}", partial(make, n, runs_root, ms)))
    study = f"{scale}_sara"
    if scale in SARA_STUDY or any((runs_root / f"{s}-{study}").exists() for s in sara.STUDIES):
        jobs.append(Job(f"sara-{study}", scale, f"imagenet-{study}", partial(sara.build, runs_root, study)))
    return jobs


def build_tables(jobs: list[Job], runs_root: Path, out_root: Path) -> list[Table]:
    """Run each job into a folder of its own (so its files are exactly what it wrote), then into out_root."""
    tables = []
    for job in jobs:
        with tempfile.TemporaryDirectory() as tmp:
            with redirect_stdout(io.StringIO()):
                text = job.make(Path(tmp))
            written = sorted(p for p in Path(tmp).rglob("*") if p.suffix in TABLE_FILES)
            files = {p.relative_to(tmp).as_posix(): p.read_text() for p in written}
            shutil.copytree(tmp, out_root, dirs_exist_ok=True)
        title, _, body = text.partition("\n")
        section = "\n".join([title.replace("# ", "## ", 1), "", settings_line(runs_root / job.folder), body, ""])
        tables.append(Table(job.name, job.scale, section, files))
    return tables


def write_report(sections: list[str], path: Path) -> str:
    report = "\n".join([*PREAMBLE, *sections])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(report)
    return report


def build(runs_root: Path, scale: str, out_root: Path = OUT, math_scale: str = "paper") -> str:
    tables = build_tables(plan(runs_root, scale, math_scale), runs_root, out_root)
    return write_report([t.section for t in tables], out_root / REPORT)


def forced_names(value: str | None, jobs: list[Job]) -> set[str]:
    """The tables --force names ('all' or '1': every one; a folder: its tables); an unknown name is an error."""
    if value is None:
        return set()
    names = {j.name for j in jobs}
    if value in (ALL, "1"):
        return names
    asked = [v for v in value.split(",") if v]
    unknown = [v for v in asked if not any(n == v or n.startswith(v + "/") for n in names)]
    if unknown or not asked:
        raise ValueError(f"--force: no table {unknown or value!r} at this scale; name {ALL} or some of {sorted(names)}")
    return {n for n in names if any(n == v or n.startswith(v + "/") for v in asked)}


def committed_sections(path: Path, titles: set[str]) -> dict[str, str]:
    """The sections of a committed REPORT.md, by their title line (one of `titles`)."""
    if not path.exists():
        return {}
    lines = path.read_text().split("\n")
    starts = [i for i, line in enumerate(lines) if line in titles]
    return {lines[a]: "\n".join(lines[a:b]) for a, b in zip(starts, [*starts[1:], len(lines)], strict=True)}


def publish(tables: list[Table], results: Path, force: set[str] = frozenset(), out=None) -> list[str]:
    """Copy the tables into `results` under the guard (paper_figures/guard.py) and say what happened to each; a
    committed table that differs is written over only when `force` names it. Returns the names written."""
    out = out or sys.stdout
    old_sections = committed_sections(results / REPORT, {t.title for t in tables})
    written, sections, unchanged = [], [], []
    for t in tables:
        if t.scale in SMOKE_SCALES:
            print(f"{t.name}: smoke scale, left in paper_figures/out/ only", file=out)
            continue
        committed = {name: (results / name).read_text() for name in t.files if (results / name).exists()}
        if committed == t.files:
            unchanged.append(t)
            print(f"{t.name}: unchanged", file=out)
        elif not committed and not any(guard.measured(text) for text in markdown(t.files).values()):
            print(f"{t.name}: not added, nothing measured (every reproduced cell is 'not run')", file=out)
        elif not committed:
            write_files(t, results)
            written.append(t.name)
            print(f"{t.name}: added to {results}", file=out)
        else:
            diff = guard.compare(markdown(committed), markdown(t.files))
            if t.name in force:
                write_files(t, results)
                written.append(t.name)
                poorer = f", poorer than the committed one ({len(diff.losses)} rows or lines)" if diff.losses else ""
                print(f"{t.name}: written over the committed table (FORCE){poorer}; what changed:", file=out)
                print_lines(diff.changes, out)
            else:
                sections.append(old_sections.get(t.title) or kept_note(t))
                if diff.losses:
                    print(f"{t.name}: kept the committed table; this build is poorer:", file=out)
                    print_lines(diff.losses, out, SHOWN)
                else:
                    print(
                        f"{t.name}: kept the committed table; this build differs in {len(diff.changes)} places "
                        f"(make tables FORCE={t.name} writes it):",
                        file=out,
                    )
                    print_lines(diff.changes, out, SHOWN)
                continue
        sections.append(t.section)
    if written:
        write_report(sections, results / REPORT)
        print(f"rewrote {results / REPORT} (the kept tables keep their committed sections)", file=out)
    elif stale := {t.name: (part, t.section) for t in unchanged if (part := stale_part(old_sections.get(t.title), t))}:
        # tables committed by another route (copied from a build elsewhere) left their REPORT.md sections behind
        text = (results / REPORT).read_text()
        for part, section in stale.values():
            text = text.replace(part, section)
        (results / REPORT).write_text(text)
        names = ", ".join(stale)
        print(f"rewrote {results / REPORT}: the sections of {names} differed from their unchanged tables", file=out)
    return written


def stale_part(committed: str | None, table: Table) -> str | None:
    """The part of a committed REPORT.md section that is out of step with this build's section of the same
    (unchanged) table, or None. The part ends at the first heading the table's own section does not have
    (committed_sections splits only at this build's titles, so a section can run on into the sections of tables this
    build does not make); it is out of step when it differs in more than its settings line, which counts the runs
    found and so changes in a poorer build while the tables stay."""
    if committed is None:
        return None
    headings = {line for line in table.section.split("\n") if line.startswith("## ")}
    lines = committed.split("\n")
    end = next((i for i, line in enumerate(lines) if i and line.startswith("## ") and line not in headings), len(lines))
    part = lines[:end]
    fresh = table.section.split("\n")
    del part[SETTINGS_LINE : SETTINGS_LINE + 1], fresh[SETTINGS_LINE : SETTINGS_LINE + 1]
    return "\n".join(lines[:end]) if part != fresh else None


def kept_note(table: Table) -> str:
    """The REPORT.md section of a kept table that the committed REPORT.md does not have."""
    files = ", ".join(f"`{name}`" for name in markdown(table.files))
    return "\n".join([table.title, "", f"Kept from an earlier build: {files} in this folder.", ""])


def write_files(table: Table, results: Path) -> None:
    for name, text in table.files.items():
        (results / name).parent.mkdir(parents=True, exist_ok=True)
        (results / name).write_text(text)


def print_lines(lines: list[str], out, limit: int | None = None) -> None:
    for line in lines[:limit]:
        print(f"  {line}", file=out)
    if limit is not None and len(lines) > limit:
        print(f"  ... and {len(lines) - limit} more", file=out)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", default="cpu", help="scale of the imagenet and maze runs")
    parser.add_argument("--math-scale", default="paper")
    parser.add_argument("--runs", type=Path, default=Path("runs"))
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--results", type=Path, default=None, help="also copy the tables (md, csv) into this folder")
    parser.add_argument(
        "--force",
        nargs="?",
        const=ALL,
        default=None,
        help="write over these committed tables in --results (all, or names/folders separated by commas)",
    )
    args = parser.parse_args(argv)
    if args.force is not None and args.results is None:
        parser.error("--force writes over tables in --results; give --results")
    jobs = plan(args.runs, args.scale, args.math_scale)
    try:
        force = forced_names(args.force, jobs)
    except ValueError as err:
        parser.error(str(err))
    with read_once():  # the tables share their runs: each run directory is read once
        tables = build_tables(jobs, args.runs, args.out)
    write_report([t.section for t in tables], args.out / REPORT)
    print(f"wrote {args.out / REPORT}")
    if args.results is not None:
        publish(tables, args.results, force)


if __name__ == "__main__":
    main()
