"""Table 4 (maze navigation) and its Pass@K curves, from run directories. No torch.

Run: python -m paper_figures.maze --scale cpu   (after make reproduce-maze)
Pass@K comes from each run's final per-maze correct counts (eval_step<N>.json) with the unbiased estimator; the
SERA-minus-MaxRL rows use a maze-paired 95% bootstrap, per normalisation. The base model row, the best single fixed
answer (the shortcut baseline) and the distinct answers per maze are reported beside Pass@K.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from paper_figures.render import passk_figure, read_reference, write_table
from paper_figures.runs import Run, group_runs, label_groups, load_runs
from sera.passk import pass_at_k
from sera.stats import paired_bootstrap_ci

OUT = Path(__file__).parent / "out"
LABELS = {"grpo": "GRPO", "maxrl": "MaxRL", "sera": "SERA", "pkpo": "PKPO (T=16)", "dars_hw": "DARS-HW"}
PAPER_KS = [1, 2, 4, 8, 16, 32]


def final_counts(run: Run) -> dict | None:
    """The per-maze record {ids, n, correct} of the run's last evaluation, or None."""
    records = sorted(run.path.glob("eval_step*.json"), key=lambda p: int(p.stem.removeprefix("eval_step")))
    return json.loads(records[-1].read_text()) if records else None


def per_maze_passk(group: list[Run], ks: list[int]) -> np.ndarray | None:
    """(mazes, K) Pass@K per held-out maze, averaged over the group's seeds."""
    counts = [c for c in (final_counts(r) for r in group) if c is not None]
    if not counts:
        return None
    return np.mean([pass_at_k(c["n"], np.asarray(c["correct"]), ks) for c in counts], axis=0)


def table4(runs_root: Path, scale: str, out_root: Path = OUT) -> str:
    runs = load_runs(runs_root / f"maze-{scale}")
    base = [r for r in runs if r.get("experiment") == "maze-base"]
    rl = [r for r in runs if r.get("experiment") == "maze"]
    samples = min([c["n"] for c in (final_counts(r) for r in runs) if c] or [max(PAPER_KS)])  # k <= every run's n
    ks = [k for k in [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048] if k <= samples]
    header = [
        "normalization",
        "method",
        "seeds",
        "steps",
        "rollouts/step",
        *[f"Pass@{k}" for k in ks],
        "distinct answers",
    ]
    rows, curves = [], {}
    if base:
        pk = per_maze_passk(base, ks)
        rows.append(
            [
                "",
                "Base model",
                1,
                base[0].get("sft.steps"),
                "",
                *(100 * pk.mean(0) if pk is not None else [None] * len(ks)),
                base[0].last("eval/distinct_answers"),
            ]
        )
        curves["Base model"] = pk
    groups = sorted(
        group_runs(rl), key=lambda g: (g[0].get("method.aggregation"), list(LABELS).index(g[0].get("method.name")))
    )
    per_maze = {}

    def row_label(g, extra=""):
        tags = [t for t in (extra, "" if all(r.finished for r in g) else "unfinished") if t]
        return LABELS[g[0].get("method.name")] + (f" ({', '.join(tags)})" if tags else "")

    for label, g in label_groups(groups, row_label, key=lambda g: g[0].get("method.aggregation")):
        name, norm = g[0].get("method.name"), g[0].get("method.aggregation")
        pk = per_maze_passk(g, ks)
        rollouts = np.mean([r.series("alloc/rollouts")[1].mean() for r in g if r.series("alloc/rollouts")[1].size])
        rows.append(
            [
                norm,
                label,
                len(g),
                g[0].get("train.steps"),
                float(rollouts),
                *(100 * pk.mean(0) if pk is not None else [None] * len(ks)),
                float(np.mean([r.last("eval/distinct_answers") or 0 for r in g])),
            ]
        )
        curves[f"{label} ({norm})"] = pk
        per_maze[(name, norm)] = pk
    paper_rows = [
        [
            "paper: " + (p["normalization"] or ""),
            p["method"],
            "",
            "",
            "",
            *[float(p[f"pass@{k}"]) if f"pass@{k}" in p else "n/a" for k in ks],
            "n/a",
        ]
        for p in read_reference("table4_maze_passk.csv")
    ]
    out = out_root / f"maze-{scale}"
    md = write_table(out / "table4", header, rows + paper_rows)
    lines = [
        "## SERA minus MaxRL (maze-paired 95% bootstrap, pp)",
        "",
        "| normalization | " + " | ".join(f"dPass@{k}" for k in ks) + " |",
        "|---|" + "---|" * len(ks),
    ]
    for norm in ("token-mean", "seqnorm"):
        a, b = per_maze.get(("sera", norm)), per_maze.get(("maxrl", norm))
        if a is not None and b is not None and a.shape != b.shape:
            raise ValueError(f"SERA and MaxRL ({norm}) were evaluated on different held-out mazes; refusing to pair")
        if a is None or b is None:
            lines.append(f"| {norm} | " + " | ".join(["not run"] * len(ks)) + " |")
            continue
        ci = paired_bootstrap_ci(a, b)
        lines.append(
            f"| {norm} | "
            + " | ".join(
                f"{100 * d:+.2f} [{100 * lo:+.2f}, {100 * hi:+.2f}]"
                for d, lo, hi in zip(ci.delta, ci.low, ci.high, strict=True)
            )
            + " |"
        )
    extra = ""
    if base:
        extra = (
            f"\nBest single fixed answer solves {100 * (base[0].last('eval/best_fixed_answer_rate') or 0):.2f}% "
            "of the held-out mazes (the shortcut baseline).\n"
        )
    verdict = "\n".join(lines) + "\n" + extra
    (out / "table4_verdict.md").write_text(verdict)
    passk_figure(curves, ks, out / "passk_curves", "Maze navigation: held-out Pass@K")
    text = f"# Table 4 (maze navigation), scale={scale}\n\n{md}\n{verdict}"
    print(text)
    return text


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", default="cpu")
    parser.add_argument("--runs", type=Path, default=Path("runs"))
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    table4(args.runs, args.scale, args.out)


if __name__ == "__main__":
    main()
