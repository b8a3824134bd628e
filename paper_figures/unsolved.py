"""Exploratory analysis E2 (results/cpu/PREREGISTRATION_AUTHORS.md): where the authors' rule puts its rollouts on the
maze pool, read from reruns of archived runs that log it. No torch; it decides nothing.

    python -m paper_figures.unsolved --runs runs/e2/maze-cpu_pool --archive results/runs/maze-cpu_pool

For each finished rerun of the authors' rule under --runs (`sera_authors-beta-*`), first the check that the logging
changed nothing else: its evaluation records must be the archived run's byte for byte, and its step records the
archived ones on every key but the timings (`time/`) and the logged values E2 adds. A rerun that fails either check
is reported and not described. Then, per seed, over the steps that read the history (epoch 1 on): the mean share of
the step's rollouts given to never-solved prompts (`alloc/unsolved_share`), over all those steps and over three equal
spans of them, how many never-solved prompts got rollouts (`alloc/unsolved_active`) against the active set
(`alloc/active`), and the median count of the other prompts (`alloc/solved_n_median`, the median over steps).
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

import numpy as np

from paper_figures.archive import GZIPPED, differing_records
from paper_figures.runs import Run, load_run, read_jsonl
from sera.runlog import DONE_FILE, METRICS_FILE

ADDED = ("alloc/unsolved_share", "alloc/unsolved_active", "alloc/solved_n_median")
PATTERN = "sera_authors-beta-*"


def archived_records(run: Path) -> list[dict]:
    """An archived run's step records, from its gzipped metrics (or a plain one, as a restored run has)."""
    if (run / GZIPPED).exists():
        with gzip.open(run / GZIPPED, "rt", encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]
    return read_jsonl(run / METRICS_FILE)[0]


# Logged values computed through numpy's exp/log/power (c(p_hat, n); Pass@K's log1p and expm1), whose kernels numpy
# picks by the CPU's SIMD level: the same run on another CPU logs them a few ulps apart while every count, loss and
# per-question evaluation record is the same (docs/numerics.md)
ULP_KEYS = ("alloc/c_min_phat", "eval/")


def comparable(record: dict) -> dict:
    """A step record less its timings and what the sink monitor adds (E2's values, the epoch-end pool measures)."""
    return {k: v for k, v in record.items() if not k.startswith(("time/", "pool/", "sink/")) and k not in ADDED}


def same_record(a: dict, b: dict) -> bool:
    """Equal step records: every value exact, but those of ULP_KEYS within 4 ulps."""
    a, b = comparable(a), comparable(b)
    if a.keys() != b.keys():
        return False
    for key, value in a.items():
        other = b[key]
        if key.startswith(ULP_KEYS) and isinstance(value, float) and isinstance(other, float):
            if abs(value - other) > 4 * np.spacing(max(abs(value), abs(other))):
                return False
        elif value != other:
            return False
    return True


def check(rerun: Run, archived: Path) -> list[str]:
    """What differs between a rerun and its archived run, apart from timings and E2's values; [] when nothing."""
    if not (archived / DONE_FILE).exists():
        return [f"no finished archived run at {archived}"]
    problems = [f"evaluation record {n} differs or is missing" for n in differing_records(rerun.path, archived)]
    mine, theirs = rerun.records, archived_records(archived)
    if len(mine) != len(theirs):
        problems.append(f"{len(mine)} step records where the archive has {len(theirs)}")
    for a, b in zip(mine, theirs, strict=False):
        if not same_record(a, b):
            problems.append(f"the step record at step {a.get('step')} differs")
            break
    return problems


def describe(run: Run, spans: int = 3) -> dict:
    """Per-seed description of a rerun's E2 values over the steps that log them (see the module docstring)."""
    steps, share = run.series("alloc/unsolved_share")
    if not steps.size:
        raise ValueError(f"{run.path} logs no alloc/unsolved_share: not a run of the authors' rule with E2's logging")
    _, active = run.series("alloc/active")
    _, unsolved_active = run.series("alloc/unsolved_active")
    _, median = run.series("alloc/solved_n_median")
    parts = np.array_split(np.arange(steps.size), spans)
    return {
        "seed": run.get("seed"),
        "steps": f"{int(steps[0])}-{int(steps[-1])}",
        "share": float(share.mean()),
        "spans": [(int(steps[p[0]]), int(steps[p[-1]]), float(share[p].mean())) for p in parts],
        "unsolved_active": float(unsolved_active.mean()),
        "active": float(active.mean()),
        "solved_n_median": float(np.median(median)) if median.size else float("nan"),
    }


def table(rows: list[dict]) -> str:
    spans = [f"steps {a}-{b}" for a, b, _ in rows[0]["spans"]]
    head = ["seed", "steps read", "share to never-solved", *spans, "never-solved given rollouts / active",
            "median count of the others"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [str(r["seed"]), r["steps"], f"{r['share']:.3f}", *(f"{s:.3f}" for _, _, s in r["spans"]),
                 f"{r['unsolved_active']:.1f} / {r['active']:.1f}", f"{r['solved_n_median']:g}"]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=Path, required=True, help="the reruns' study folder, e.g. runs/e2/maze-cpu_pool")
    parser.add_argument("--archive", type=Path, default=Path("results/runs/maze-cpu_pool"))
    args = parser.parse_args(argv)
    if not args.runs.is_dir():
        parser.error(f"no folder {args.runs}")
    reruns = sorted(p for p in args.runs.glob(PATTERN) if (p / DONE_FILE).exists())
    if not reruns:
        parser.error(f"no finished run {PATTERN} under {args.runs}")
    rows, failed = [], 0
    for path in reruns:
        rerun = load_run(path)
        problems = check(rerun, args.archive / path.name)
        if problems:
            failed += 1
            print(f"{path}: not the archived run, so not described: " + "; ".join(problems), file=sys.stderr)
            continue
        print(f"{path}: evaluation and step records are the archived run's (timings and E2's values aside; values "
              "through numpy's transcendentals within 4 ulps)")  # fmt: skip
        rows.append(describe(rerun))
    if rows:
        print("\nExploratory (E2, no test): where the authors' rule puts its rollouts\n")
        print(table(rows))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
