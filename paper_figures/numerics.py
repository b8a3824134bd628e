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
from sera.runlog import ARCHIVED_FILE, DONE_FILE

ARCHIVE = Path("results/runs")
RESULTS = Path("results/cpu")
OUT = Path("paper_figures/out")


UNRECORDED = {"level": "unrecorded"}


def finished_runs(root: Path) -> list[Path]:
    """The run directories under `root` (at any depth) that hold DONE, in sorted order."""
    return sorted(p.parent for p in root.rglob(DONE_FILE)) if root.is_dir() else []


def fingerprint(run: Path, before: dict = UNRECORDED) -> dict:
    """A run's numerics.json, or `before` for a run made before runs recorded one."""
    return json.loads((run / NUMERICS_FILE).read_text()) if (run / NUMERICS_FILE).exists() else before


def made_here(root: Path) -> tuple[list[dict], int]:
    """The fingerprints of the finished runs under `root` made on this machine (not restored from the archive), and
    how many were restored (ARCHIVED: records only, not rerun)."""
    runs = finished_runs(root)
    restored = [run for run in runs if (run / ARCHIVED_FILE).exists()]
    return [fingerprint(run) for run in runs if run not in restored], len(restored)


def run_fingerprints(root: Path) -> list[dict]:
    """The numerics.json of every run under `root` (at any depth), in sorted order. A run made before runs recorded
    one takes the folder's own numerics.json (what was found out about those runs later), else counts as
    {'level': 'unrecorded'}."""
    folder = root / NUMERICS_FILE
    before = json.loads(folder.read_text()) if folder.exists() else UNRECORDED
    return [fingerprint(run, before) for run in finished_runs(root)]


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


PREREG = "preregistered.md"
DECISION, DIFFERENCE = "decision", "difference (pp) [seed 95% t]"


def prereg_rows(text: str, folder: str | None) -> dict[tuple[str, str], tuple[str, float | None]]:
    """(claim, endpoint) -> (decision, the difference's point estimate) of a pre-registered table's rows; `folder`
    keeps only the claims of that table folder (the global table holds every study's)."""
    from paper_figures.prereg import CLAIMS  # the claims' folders

    folders = {c.name: f"{c.study}-{c.scale or 'cpu'}" for c in CLAIMS}
    rows = {}
    for table in guard.parse(text)[0].values():
        if not {"claim", "endpoint", DECISION, DIFFERENCE} <= set(table.header):
            continue
        col = {name: table.header.index(name) for name in ("claim", "endpoint", DECISION, DIFFERENCE)}
        for row in table.rows:
            if folder is not None and folders.get(row[col["claim"]]) != folder:
                continue
            number = guard.NUMBER.match(row[col[DIFFERENCE]].strip())
            rows[(row[col["claim"]], row[col["endpoint"]])] = (
                row[col[DECISION]],
                float(number.group()) if number else None,
            )
    return rows


def verdict_lines(folder: str, out: Path, results: Path) -> list[str]:
    """What a newcomer needs first: whether every pre-registered verdict of the folder's claims held in the fresh
    build, whether each difference kept its sign (the direction README states), and the largest move of one."""
    pairs = [(results / folder / PREREG, out / folder / PREREG, None), (results / PREREG, out / PREREG, folder)]
    committed, fresh = {}, {}
    for old, new, only in pairs:
        if old.exists() and new.exists():
            committed |= prereg_rows(old.read_text(), only)
            fresh |= prereg_rows(new.read_text(), only)
    if not committed:
        return ["verdicts: no pre-registered claim of this folder was rebuilt"]
    changed = [f"{' '.join(k)}: {committed[k][0]} -> {fresh.get(k, ('missing',))[0]}"
               for k in committed if fresh.get(k, ("missing",))[0] != committed[k][0]]  # fmt: skip
    moves = [(abs(fresh[k][1] - v), k, v, fresh[k][1]) for k, (_, v) in committed.items()
             if v is not None and k in fresh and fresh[k][1] is not None]  # fmt: skip
    flipped = [" ".join(k) for _, k, old, new in moves if (old > 0) != (new > 0)]
    held = f"verdicts: all {len(committed)} pre-registered verdicts held"
    lines = [held if not changed else f"verdicts: {len(changed)} of {len(committed)} CHANGED: {'; '.join(changed)}"]
    lines.append("directions: every difference kept its sign" if not flipped
                 else f"directions: {len(flipped)} difference(s) changed sign: {'; '.join(flipped)}")  # fmt: skip
    if moves:
        size, key, old, new = max(moves)
        lines.append(
            f"largest move of a headline cell: {' '.join(key)}: {old:+.2f} -> {new:+.2f} ({new - old:+.2f} pp)"
        )
    return lines


def build_prereg(folder: str, runs: Path, out: Path) -> None:
    """The pre-registered table (every study's claims) built from `runs` into `out`, when the folder has claims in
    it, so that the comparison reads their verdicts; never published into results/ (`make tables` does that)."""
    from paper_figures.prereg import CLAIMS, HEADER, prereg_table
    from paper_figures.render import write_table

    if any(f"{c.study}-{c.scale or 'cpu'}" == folder for c in CLAIMS):
        write_table(out / "preregistered", HEADER, prereg_table(runs)[1])


def compare_folder(
    folder: str, out: Path = OUT, results: Path = RESULTS, runs: Path = Path("runs"), archive: Path = ARCHIVE
) -> list[str]:
    """Lines that compare the fresh tables of a folder (out/<folder>, and the pre-registered table) with the committed
    ones, leading with the answer: where each side ran, how many runs were made here and how many restored, whether
    the pre-registered verdicts and the differences' directions held and the largest move; then cell by cell."""
    committed_dir, fresh_dir = results / folder, out / folder
    names = sorted(p.name for p in committed_dir.glob("*.md"))
    if not names:
        return [f"{folder}: no committed tables under {committed_dir} to compare with"]
    committed = {n: (committed_dir / n).read_text() for n in names}
    fresh = {n: (fresh_dir / n).read_text() for n in names if (fresh_dir / n).exists()}
    if not fresh:
        return [f"{folder}: no fresh tables under {fresh_dir}; build them first"]
    here, restored = made_here(runs / folder)
    where = (f"{len(here)} run(s) made here ({describe(here).removeprefix('numerics ')}), {restored} restored from "
             "the archive and not rerun")  # fmt: skip
    if not here:
        where = (
            f"nothing was rerun here ({restored} run(s) restored from the archive): the archive compared with itself"
        )
    missing = [n for n in names if n not in fresh]
    diff = guard.compare({n: t for n, t in committed.items() if n in fresh}, fresh)
    # a loss (a measured row gone, a number missing) is also a change: counted once, and marked
    lines = diff.changes + [f"lost: {loss}" for loss in diff.losses] + [f"not rebuilt: {n}" for n in missing]
    cells = (f"identical to the committed tables ({', '.join(sorted(fresh))})" if not lines else
             f"{len(diff.changes)} difference(s) from the committed tables, {len(diff.losses)} of them losses "
             f"({', '.join(sorted(fresh))}{'; not rebuilt: ' + ', '.join(missing) if missing else ''})")  # fmt: skip
    return [
        f"{folder}: committed tables made with {describe(table_fingerprints(folder, archive, results))}; {where}",
        *[f"  {line}" for line in verdict_lines(folder, out, results)],
        f"  cells: {cells}",
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
            continue
        build_prereg(folder, args.runs, args.out)
        print("\n".join(compare_folder(folder, args.out, args.results, args.runs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
