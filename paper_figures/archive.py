"""Finished runs kept in git (results/runs/), so that a grid spread over several sessions or machines builds its
tables from every seed run so far. No torch.

    python -m paper_figures.archive save    --runs runs --archive results/runs --folder maze-cpu
    python -m paper_figures.archive restore --runs runs --archive results/runs --folder maze-cpu

save: every finished run under runs/<folder>/ (a directory with DONE, at any depth: math runs sit under the model's
name) that the archive lacks is copied to <archive>/<folder>/, records only: its config, DONE, metrics (gzipped),
numeric fingerprint (numerics.json) and per-question evaluation records (the classifier's: val_p.npy); never
checkpoints, model weights or locks. An archived run is never written over: a run of the same name that is already
archived with the same config is left alone (if it was trained again and its evaluation records differ, save says
so), one with another config is refused (a changed default makes new runs: move the old archive aside first).

restore: every archived run that runs/<folder>/ lacks is copied back, marked ARCHIVED. `run.if_finished=skip` then
skips it and the tables read it like any other run. A base run restored this way has no weights: an RL run that needs
them (a new row for an archived seed) is refused with a message saying to remove the folder and train it again
(with the study's entry point: `make reproduce-*` restores the archive first).
"""

from __future__ import annotations

import argparse
import gzip
import os
import shutil
import sys
from pathlib import Path

import yaml

from sera.numerics import NUMERICS_FILE
from sera.runlog import (
    ARCHIVED_FILE,
    BASE_FILE,
    CONFIG_FILE,
    DONE_FILE,
    EVAL_RECORD,
    METRICS_FILE,
    SET_ASIDE,
    VAL_P_FILE,
    RunExistsError,
    check_same_config,
)

GZIPPED = METRICS_FILE + ".gz"
PARTIAL = (".saving-", ".restoring")  # a copy under way: renamed to the run's name once whole


def is_evaluation_record(name: str) -> bool:
    """A run's per-question evaluation record (the classifier's: val_p.npy)."""
    return name == VAL_P_FILE or EVAL_RECORD.fullmatch(name) is not None


def kept(name: str) -> bool:
    """The files of a run the archive keeps: what the tables and figures read."""
    return name in (CONFIG_FILE, DONE_FILE, METRICS_FILE, NUMERICS_FILE, BASE_FILE) or is_evaluation_record(name)


def finished_runs(root: Path) -> list[Path]:
    """Run directories under `root` with DONE, as paths relative to it, in sorted order; copies under way are not
    runs."""
    if not root.is_dir():
        return []
    runs = (p.parent.relative_to(root) for p in root.rglob(DONE_FILE))
    return sorted(r for r in runs if not any(mark in r.name for mark in PARTIAL) and not r.name.endswith(SET_ASIDE))


def save(runs: Path, archive: Path) -> list[Path]:
    """Copy the finished runs the archive lacks (records only); returns them. ValueError, before anything is copied,
    when an archived run of the same name has another config."""
    new = []
    for rel in finished_runs(runs):
        target = archive / rel
        if (target / DONE_FILE).exists():
            try:
                check_same_config(target, yaml.safe_load((runs / rel / CONFIG_FILE).read_text()))
            except RunExistsError as err:
                raise ValueError(
                    f"{runs / rel} is not the run archived at {target} (a changed default makes new runs: move the "
                    f"old archive aside before saving): {err}"
                ) from None
            continue
        new.append(rel)
    for rel in new:
        source, target = runs / rel, archive / rel
        partial = target.with_name(f"{target.name}{PARTIAL[0]}{os.getpid()}")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        files = [f for f in sorted(source.iterdir()) if f.is_file() and kept(f.name)]
        for f in sorted(files, key=lambda f: f.name == DONE_FILE):  # DONE last
            if f.name == METRICS_FILE:
                with f.open("rb") as src, gzip.GzipFile(partial / GZIPPED, "wb", mtime=0) as dst:
                    shutil.copyfileobj(src, dst)
            else:
                shutil.copyfile(f, partial / f.name)
        try:
            partial.rename(target)  # whole or not at all: two grids saving at once never leave a half run
        except OSError:
            if not (target / DONE_FILE).exists():
                raise
            shutil.rmtree(partial)  # the other grid saved it first: the same records
    return new


def evaluation_records(run: Path) -> list[str]:
    """The names of a run's evaluation records, sorted."""
    return sorted(f.name for f in run.iterdir() if is_evaluation_record(f.name))


def differing_records(run: Path, other: Path) -> list[str]:
    """The evaluation records that are not the same bytes in both run directories (one side lacking a record counts),
    sorted; [] when the two evaluated the same model alike."""
    names = sorted(set(evaluation_records(run)) | set(evaluation_records(other)))
    return [n for n in names if not ((run / n).exists() and (other / n).exists())
            or (run / n).read_bytes() != (other / n).read_bytes()]  # fmt: skip


def retrained(runs: Path, archive: Path) -> list[Path]:
    """Finished runs under `runs` (not restored ones) whose archived run of the same name and config holds other
    evaluation records: the run was trained again (on another CPU or kernel level the same seed gives another model).
    `save` keeps the archived records; the tables read the local ones until runs/ is cleared."""
    out = []
    for rel in finished_runs(runs):
        local, stored = runs / rel, archive / rel
        if (local / ARCHIVED_FILE).exists() or not (stored / DONE_FILE).exists():
            continue
        if differing_records(local, stored):
            out.append(rel)
    return out


def restore(archive: Path, runs: Path) -> list[Path]:
    """Copy back the archived runs that `runs` lacks, marked ARCHIVED; returns them. A run directory that exists is
    left as it is (a different config there is refused when that run is next started or skipped)."""
    back = []
    record = archive / NUMERICS_FILE  # what was found out later about runs that recorded no fingerprint
    if record.exists() and not (runs / NUMERICS_FILE).exists():
        runs.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(record, runs / NUMERICS_FILE)
    for rel in finished_runs(archive):
        source, target = archive / rel, runs / rel
        if target.exists():
            continue
        partial = target.with_name(target.name + ".restoring")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        for f in sorted(source.iterdir()):
            if f.name == GZIPPED:
                with gzip.open(f, "rb") as src, (partial / METRICS_FILE).open("wb") as dst:
                    shutil.copyfileobj(src, dst)
            elif f.is_file():
                shutil.copyfile(f, partial / f.name)
        (partial / ARCHIVED_FILE).write_text(f"restored from {source}: records only, no checkpoint or weights\n")
        partial.rename(target)  # whole or not at all: an interrupted restore leaves no half run
        back.append(rel)
    return back


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("save", "restore"))
    parser.add_argument("--runs", type=Path, default=Path("runs"))
    parser.add_argument("--archive", type=Path, default=Path("results/runs"))
    parser.add_argument("--folder", help="a study's folder under runs/, e.g. maze-cpu or math-cpu (restore: every "
                        "archived folder when omitted)")  # fmt: skip
    args = parser.parse_args(argv)
    if args.action == "save" and not args.folder:
        parser.error("save needs --folder")
    folders = [args.folder] if args.folder else sorted(p.name for p in args.archive.glob("*") if p.is_dir())
    for folder in folders:
        if "smoke" in folder:
            print(f"{folder}: smoke runs are not archived")
            continue
        runs, archive = args.runs / folder, args.archive / folder
        try:
            moved = save(runs, archive) if args.action == "save" else restore(archive, runs)
        except ValueError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        where = f"into {archive}" if args.action == "save" else f"from {archive} into {runs}"
        print(f"{args.action}: {len(moved)} run(s) {where}" + "".join(f"\n  {rel}" for rel in moved))
        again = retrained(runs, archive) if args.action == "save" else []
        if again:  # one line, however many: on another CPU every rerun differs (docs/numerics.md)
            print(f"note: {len(again)} run(s) under {runs} were trained again and their evaluation records differ from "
                  f"the archived runs', which are kept (first: {again[0]}): tables built from {runs} read the local "
                  "records, a fresh clone's the archived ones; runs that started from them are archived with their "
                  "own records")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
