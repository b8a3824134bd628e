"""Every paper table that has runs, reproduced beside the paper's numbers, in one REPORT.md. No torch.

Run: python -m paper_figures.report --scale cpu   (make tables). Writes paper_figures/out/REPORT.md plus each table's
markdown, CSV and LaTeX, and the figures. Each section names the scale, steps and budget its rows were run at; a
table without runs still appears, with its cells marked "not run". With --results DIR (make tables: results/<scale>)
the markdown and CSV files are also copied there: the measured tables README.md quotes are committed in that folder,
and tests/test_readme_numbers.py checks every number README.md quotes from them.
"""

from __future__ import annotations

import argparse
import io
import shutil
from contextlib import redirect_stdout
from pathlib import Path

from paper_figures import imagenet, maze, sara
from paper_figures import math as math_tables
from paper_figures.runs import load_runs

OUT = Path(__file__).parent / "out"


def settings_line(root: Path) -> str:
    """Scale, steps and budget (B x n0) of the runs in one folder, as found in their configs."""
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
    return f"{len(runs)} runs under `{root}`: " + "; ".join(parts)


def build(runs_root: Path, scale: str, out_root: Path = OUT, math_scale: str = "paper") -> str:
    sections = [
        "# Reproduced tables beside the paper's",
        "",
        "Rows marked 'reproduced' come from run directories; 'paper' rows are the paper's numbers "
        "(paper_figures/reference/). CPU-scale rows are a small stand-in for the paper's setup: compare the "
        "direction of differences, not values.",
        "",
    ]
    jobs = [
        (f"imagenet-{scale}", lambda: imagenet.table2(runs_root, scale, out_root)),
        (f"imagenet-{scale}", lambda: imagenet.table3(runs_root, scale, out_root)),
        (f"maze-{scale}", lambda: maze.table4(runs_root, scale, out_root)),
    ]
    for ms in ([scale] if scale in math_tables.CPU_TABLES and scale != math_scale else []) + [math_scale]:
        own = math_tables.CPU_TABLES.get(ms)  # a scale with its own math tables builds only those
        for n in math_tables.PASSK_TABLES:
            if own is None or n in own:
                jobs.append((f"math-{ms}", lambda n=n, ms=ms: math_tables.passk_table(n, runs_root, ms, out_root)))
        for n in math_tables.DELTA_TABLES:
            if own is None or n in own:
                jobs.append((f"math-{ms}", lambda n=n, ms=ms: math_tables.delta_table(n, runs_root, ms, out_root)))
    if (runs_root / f"imagenet-{scale}_sara").exists() or (runs_root / f"maze-{scale}_sara").exists():
        jobs.append((f"imagenet-{scale}_sara", lambda: sara.build(runs_root, f"{scale}_sara", out_root)))
    for folder, job in jobs:
        with redirect_stdout(io.StringIO()):
            text = job()
        title, _, body = text.partition("\n")
        sections += [title.replace("# ", "## ", 1), "", settings_line(runs_root / folder), body, ""]
    report = "\n".join(sections)
    out_root.mkdir(parents=True, exist_ok=True)
    (out_root / "REPORT.md").write_text(report)
    return report


def copy_results(out_root: Path, results: Path) -> list[Path]:
    """Copy every markdown and CSV table under out_root into results/ (same relative paths); returns the copies."""
    copies = []
    for source in sorted(p for p in out_root.rglob("*") if p.suffix in (".md", ".csv")):
        target = results / source.relative_to(out_root)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
        copies.append(target)
    return copies


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", default="cpu", help="scale of the imagenet and maze runs")
    parser.add_argument("--math-scale", default="paper")
    parser.add_argument("--runs", type=Path, default=Path("runs"))
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--results", type=Path, default=None, help="also copy the tables (md, csv) into this folder")
    args = parser.parse_args(argv)
    build(args.runs, args.scale, args.out, args.math_scale)
    print(f"wrote {args.out / 'REPORT.md'}")
    if args.results is not None:
        print(f"copied {len(copy_results(args.out, args.results))} tables into {args.results}")


if __name__ == "__main__":
    main()
