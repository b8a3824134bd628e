"""The numeric fingerprints behind a table, and a fresh build compared with the committed one. No torch.

A run records the kernel level it ran at and the machine (sera.numerics, numerics.json in its directory); a grid
reruns at the level its archive records, and a reproduce target ends by comparing its fresh tables with the committed
ones, so a user who reruns on another CPU is told which cells moved and why they may have.

    python -m paper_figures.numerics level maze-cpu          # the level a grid's archived runs were made at
    python -m paper_figures.numerics compare imagenet-cpu    # fresh (paper_figures/out) against committed (results/cpu)
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

from paper_figures import guard
from sera.numerics import DEFAULT, NUMERICS_FILE

ARCHIVE = Path("results/runs")
RESULTS = Path("results/cpu")
OUT = Path("paper_figures/out")


def run_fingerprints(root: Path) -> list[dict]:
    """The numerics.json of every run under `root` (at any depth), in sorted order. A run made before runs recorded
    one takes the folder's own numerics.json (what was found out about those runs later), else counts as
    {'level': 'unrecorded'}."""
    if not root.is_dir():
        return []
    folder = root / NUMERICS_FILE
    before = json.loads(folder.read_text()) if folder.exists() else {"level": "unrecorded"}
    runs = sorted(p.parent for p in root.rglob("DONE"))
    return [json.loads((run / NUMERICS_FILE).read_text()) if (run / NUMERICS_FILE).exists() else before for run in runs]


def table_fingerprints(folder: str, archive: Path = ARCHIVE, results: Path = RESULTS) -> list[dict]:
    """The fingerprints behind a committed table folder: the record committed beside its tables
    (results/<scale>/<folder>/numerics.json, for tables whose runs are not archived), else its archived runs'."""
    beside = results / folder / NUMERICS_FILE
    if beside.exists():  # the record of the committed tables themselves (their runs are not archived)
        return [json.loads(beside.read_text())]
    return run_fingerprints(archive / folder)


def describe(fingerprints: list[dict]) -> str:
    """One line: each distinct (level, torch capability, CPU) with how many runs have it."""
    if not fingerprints:
        return "numerics not recorded"
    counts = Counter(
        (fp.get("level", "unrecorded"), fp.get("torch_cpu_capability", "?"), fp.get("cpu", "?")) for fp in fingerprints
    )
    parts = [
        f"{level} (torch at {capability}, {cpu})" + (f" x {n}" if len(counts) > 1 else "")
        for (level, capability, cpu), n in sorted(counts.items())
    ]
    return "numerics " + "; ".join(parts)


def grid_level(folder: str, archive: Path = ARCHIVE, results: Path = RESULTS) -> str:
    """The level new runs of a grid join it at: the one its committed runs recorded (the most common, where runs
    of several levels are mixed), else the default."""
    levels = Counter(fp.get("level") for fp in table_fingerprints(folder, archive, results))
    levels.pop("unrecorded", None)
    levels.pop(None, None)
    return levels.most_common(1)[0][0] if levels else DEFAULT


def compare_folder(
    folder: str, out: Path = OUT, results: Path = RESULTS, runs: Path = Path("runs"), archive: Path = ARCHIVE
) -> list[str]:
    """Lines that compare the fresh tables of a folder (out/<folder>) with the committed ones (results/<folder>),
    cell by cell, with both fingerprints. The first line says "identical" or how many cells differ."""
    committed_dir, fresh_dir = results / folder, out / folder
    names = sorted(p.name for p in committed_dir.glob("*.md"))
    if not names:
        return [f"{folder}: no committed tables under {committed_dir} to compare with"]
    committed = {n: (committed_dir / n).read_text() for n in names}
    fresh = {n: (fresh_dir / n).read_text() for n in names if (fresh_dir / n).exists()}
    if not fresh:
        return [f"{folder}: no fresh tables under {fresh_dir}; build them first"]
    committed = {n: t for n, t in committed.items() if n in fresh}
    diff = guard.compare(committed, fresh)
    # a loss (a measured row gone, a number missing) is also a change: counted once, and marked
    lines = diff.changes + [f"lost: {loss}" for loss in diff.losses]
    head = (
        f"{folder}: identical to the committed tables ({', '.join(sorted(fresh))})"
        if not lines
        else f"{folder}: {len(diff.changes)} difference(s) from the committed tables, {len(diff.losses)} of them "
        f"losses ({', '.join(sorted(fresh))})"
    )
    return [
        head,
        f"  committed: {describe(table_fingerprints(folder, archive, results))}",
        f"  this run:  {describe(run_fingerprints(runs / folder))}",
        *[f"  {line}" for line in lines],
    ]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("level", "compare"))
    parser.add_argument("folders", nargs="+", help="table folders, e.g. imagenet-cpu maze-cpu")
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--runs", type=Path, default=Path("runs"))
    args = parser.parse_args(argv)
    for folder in args.folders:
        if args.action == "level":
            print(grid_level(folder, results=args.results))
        else:
            print("\n".join(compare_folder(folder, args.out, args.results, args.runs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
