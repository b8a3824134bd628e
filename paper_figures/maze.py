"""Table 4 (maze navigation) and its Pass@K curves, from run directories. No torch.

Run: python -m paper_figures.maze --scale cpu   (after make reproduce-maze)
The run-directory contract: RL runs (config experiment: maze) and the base model (experiment: maze-base, in
runs/maze-<scale>/base_seed-<s>/) each write a per-maze record of their evaluation on the one held-out set, named
EVAL_SET: eval_step<N>_heldout.json (sera.runlog.eval_record_file) = {"ids": [...], "n": samples, "correct": [...]},
and the metrics eval/heldout/pass@<k>, eval/heldout/distinct_answers (and, for the base model,
eval/heldout/best_fixed_answer_rate) in metrics.jsonl. Pass@K comes from each run's newest record with the unbiased
estimator; the SERA-minus-MaxRL rows use a maze-paired 95% bootstrap per normalisation, pairing mazes by id. The base
model rows, the best single fixed answer (the shortcut baseline) and the distinct answers per maze are reported
beside Pass@K. Seeds, unfinished and corrupt runs, NaN values and refused pairings follow paper_figures/runs.py.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from paper_figures.render import passk_figure, read_reference, regime_figure, write_table
from paper_figures.runs import (
    PerQuestion,
    Run,
    baseline_pair,
    group_runs,
    label_groups,
    load_runs,
    mean_over,
    method_label,
    method_order,
    pair_by_question,
    per_question,
    seed_differences,
    status_tags,
    tagged,
    tested_and_baselines,
    trainer_tag,
    verdict_methods,
    with_results,
)
from sera.methods import METHODS
from sera.stats import paired_bootstrap_ci, seed_t_interval

OUT = Path(__file__).parent / "out"
PAPER_KS = [1, 2, 4, 8, 16, 32]
EVAL_SET = "heldout"  # the maze's one evaluation set


def metric(name: str) -> str:
    """The metrics.jsonl key of an evaluation metric on the held-out set, e.g. eval/heldout/distinct_answers."""
    return f"eval/{EVAL_SET}/{name}"


def evaluated(run: Run) -> bool:
    return EVAL_SET in run.eval_records


def table4_verdict(rl_groups: list[list[Run]], base: list[Run], ks: list[int]) -> str:
    """What Table 4's verdict file says: each tested method minus its registry baseline (SERA - MaxRL), maze-paired
    95% bootstrap per normalisation, the same seed by seed, and the base model's best single fixed answer."""
    lines, per_seed = [], {}
    for name in verdict_methods(rl_groups):  # each tested method against its registry baseline (SERA - MaxRL)
        what = f"{method_label(name)} minus {method_label(METHODS[name].baseline)}"
        lines += [
            *([""] if lines else []),
            f"## {what} (maze-paired 95% bootstrap, pp)",
            "",
            "| normalization | " + " | ".join(f"dPass@{k}" for k in ks) + " |",
            "|---|" + "---|" * len(ks),
        ]
        for norm in ("token-mean", "seqnorm"):
            candidates = [g for g in rl_groups if g[0].get("method.aggregation") == norm and with_results(g, evaluated)]
            pair = baseline_pair(candidates, f"maze, {norm}", name)
            if not isinstance(pair, tuple):
                lines.append(f"| {norm} | " + " | ".join([pair or "not run"] + [""] * (len(ks) - 1)) + " |")
                continue
            a, b = (per_question(g, EVAL_SET, ks) for g in pair)
            x, y, _ = pair_by_question(a, b, f"maze {what} ({norm})")
            ci = paired_bootstrap_ci(x, y)
            cells = [f"{100 * d:+.2f} [{100 * lo:+.2f}, {100 * hi:+.2f}]" for d, lo, hi in zip(*ci, strict=True)]
            lines.append(f"| {norm} | " + " | ".join(cells) + " |")
            per_seed.setdefault(what, []).extend(seed_by_seed(norm, *pair, ks))
    rate = base[0].last(metric("best_fixed_answer_rate")) if base else None
    extra = ""
    if rate is not None:
        extra = f"\nBest single fixed answer solves {100 * rate:.2f}% of the held-out mazes (the shortcut baseline).\n"
    for what, rows in per_seed.items():  # the interval above covers the choice of mazes, not training randomness
        lines += [
            "",
            f"## {what} seed by seed (pp; each seed's training mazes differ)",
            "",
            "| normalization | seed | " + " | ".join(f"dPass@{k}" for k in ks) + " |",
            "|---|---|" + "---|" * len(ks),
            *rows,
        ]
    return "\n".join(lines) + "\n" + extra


def table4(runs_root: Path, scale: str, out_root: Path = OUT) -> str:
    runs = load_runs(runs_root / f"maze-{scale}")
    base_groups = group_runs([r for r in runs if r.get("experiment") == "maze-base"])
    rl_groups = sorted(
        group_runs([r for r in runs if r.get("experiment") == "maze"]),
        key=lambda g: (g[0].get("method.aggregation"), method_order(g[0].get("method.name"))),
    )
    samples = min([r.eval_records[EVAL_SET]["n"] for r in with_results(runs, evaluated)] or [max(PAPER_KS)])
    ks = [k for k in [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048] if k <= samples]  # k <= every run's n
    header = ["normalization", "method", "seeds", "steps", "rollouts/step", *[f"Pass@{k}" for k in ks]]
    header.append("distinct answers")
    rows, curves = [], {}
    for label, g in label_groups(base_groups, lambda g, extra="": tagged("Base model", [extra, *status_tags(g)])):
        row, curves[label] = maze_row("", label, g, g[0].get("sft.steps"), ks)
        rows.append(row)
    rl_rows = label_groups(
        rl_groups,
        lambda g, extra="": tagged(method_label(g[0].get("method.name")), [trainer_tag(g[0]), extra, *status_tags(g)]),
        key=lambda g: g[0].get("method.aggregation"),
    )
    for label, g in rl_rows:
        norm = g[0].get("method.aggregation")
        row, curves[f"{label} ({norm})"] = maze_row(norm, label, g, g[0].get("train.steps"), ks)
        rows.append(row)
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
    base = with_results([r for g in base_groups for r in g], evaluated)
    verdict = table4_verdict(rl_groups, base, ks)
    (out / "table4_verdict.md").write_text(verdict)
    passk_figure(curves, out / "passk_curves", "Maze navigation: held-out Pass@K")
    regime = {f"{label} ({g[0].get('method.aggregation')})": with_results(g, evaluated) for label, g in rl_rows
              if g[0].get("method.name") in tested_and_baselines()}  # fmt: skip
    regime_figure(regime, EVAL_SET, ks[-1], out / "regime", "Maze", base=base)
    text = f"# Table 4 (maze navigation), scale={scale}\n\n{md}\n{verdict}"
    print(text)
    return text


def seed_by_seed(norm: str, sera: list[Run], maxrl: list[Run], ks: list[int]) -> list[str]:
    """One row per seed that both groups ran: the mean over mazes of SERA's minus MaxRL's Pass@k, in pp; then, with
    two seeds or more, their mean and seed-level 95% t-interval (seeds are the unit: it covers training randomness)."""
    seeds, _, diffs = seed_differences(sera, maxrl, EVAL_SET, ks, f"maze, {norm}")
    rows = [f"| {norm} | {seed} | " + " | ".join(f"{100 * d:+.2f}" for d in row) + " |" for seed, row in
            zip(seeds, diffs if diffs is not None else [], strict=True)]  # fmt: skip
    if len(seeds) >= 2:
        ci = seed_t_interval(diffs)
        cells = [f"{100 * d:+.2f} [{100 * lo:+.2f}, {100 * hi:+.2f}]" for d, lo, hi in zip(*ci, strict=True)]
        rows.append(f"| {norm} | mean of {len(seeds)} (t 95%) | " + " | ".join(cells) + " |")
    return rows


def maze_row(norm: str, label: str, group: list[Run], steps, ks: list[int]) -> tuple[list, PerQuestion | None]:
    """(one Table 4 row, the group's per-maze Pass@K): seed means over the runs with a held-out record."""
    runs = with_results(group, evaluated)
    pq = per_question(runs, EVAL_SET, ks)
    rollouts = mean_over(runs, lambda r: float(v.mean()) if (v := r.series("alloc/rollouts")[1]).size else None)
    row = [
        norm,
        label,
        len(runs),
        steps,
        "" if rollouts is None else rollouts,
        *(100 * pq.values.mean(axis=0) if pq is not None else [None] * len(ks)),
        mean_over(runs, lambda r: r.last(metric("distinct_answers"))),
    ]
    return row, pq


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", default="cpu")
    parser.add_argument("--runs", type=Path, default=Path("runs"))
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    table4(args.runs, args.scale, args.out)


if __name__ == "__main__":
    main()
