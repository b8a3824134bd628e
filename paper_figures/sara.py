"""The sequential-allocation comparison (make reproduce-sara): uniform GRPO, DS, DPS, SARA, SARA+DPS and SARA+SERA on
the classifier and the maze, set against the SARA abstract's claims. No torch.

Run: python -m paper_figures.sara --scale cpu_sara   (after make reproduce-sara)
Reads runs/imagenet-<scale>/ and runs/maze-<scale>/. Every RL step logs alloc/generated (everything sampled: probes,
abandoned and surplus groups included), alloc/rollouts (trained; absent on a step with nothing to train),
alloc/effective_rollouts (rollouts in trained groups with mixed rewards, the only ones with a GRPO gradient) and, on
the classifier where p is exact, alloc/abandon_error_mean (P(the abandoned group would have ended mixed)) and, for
the batch allocators, alloc/saturated_share (P(a fresh group of n0 is all-equal), averaged over the step's images).
Per method (mean over seeds): cumulative rollouts generated and trained, their ratio to DS, the effective yield
(effective rollouts / generated), the abandonment error, steps with nothing to train, and final Pass@K. The figure is
Pass@1 against cumulative rollouts generated, one panel per study.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from paper_figures.render import pyplot, save_figure, write_table
from paper_figures.runs import Run, group_runs, load_runs, mean_over, method_label, method_order, status_tags, tagged

OUT = Path(__file__).parent / "out"
STUDIES = {  # folder prefix -> (title, Pass@K metric prefix)
    "imagenet": ("Classification (digits1000, exact Pass@K)", "eval/pass@"),
    "maze": ("Maze navigation (held-out mazes)", "eval/heldout/pass@"),
}
ABSTRACT = (
    "The SARA abstract (1.5B/3B models, math and planning): SARA matches DPS (both below the DS oracle) with 22% fewer "
    "rollouts than DS; SARA+DPS gives the best accuracy, slightly above DS, at 67% fewer rollouts."
)


def cumulative(run: Run, key: str) -> float | None:
    _, values = run.series(key)
    return float(np.nansum(values)) if values.size else None


def average(run: Run, key: str) -> float | None:
    """The mean of a per-step metric over the steps that log it, or None when none does."""
    _, values = run.series(key)
    return float(np.nanmean(values)) if values.size else None


def final_passk(run: Run, prefix: str) -> dict[int, float]:
    """{K: value} of the run's last evaluation."""
    last = next((r for r in reversed(run.records) if f"{prefix}1" in r), {})
    return {int(k[len(prefix) :]): float(v) for k, v in last.items() if k.startswith(prefix) and v is not None}


def study_table(runs_root: Path, study: str, scale: str, out_root: Path) -> tuple[str, dict]:
    """The markdown table of one study and its per-method summary {method: {...}}."""
    title, prefix = STUDIES[study]
    runs = [r for r in load_runs(runs_root / f"{study}-{scale}") if r.get("experiment") == study]
    groups = sorted(group_runs(runs), key=lambda g: method_order(g[0].get("method.name")))
    ks = sorted({k for r in runs for k in final_passk(r, prefix)})
    show = [k for k in ks if k in (1, 8, max(ks, default=1))]
    summary = {}
    for g in groups:
        done = [r for r in g if r.finished and final_passk(r, prefix)]
        name = g[0].get("method.name")
        summary[name] = {
            "label": tagged(method_label(name), status_tags(g)),
            "seeds": len(done),
            "steps": g[0].get("train.steps"),
            "generated": mean_over(done, lambda r: cumulative(r, "alloc/generated")),
            "trained": mean_over(done, lambda r: cumulative(r, "alloc/rollouts")),
            "effective": mean_over(done, lambda r: cumulative(r, "alloc/effective_rollouts")),
            "abandon": mean_over(done, lambda r: average(r, "alloc/abandon_error_mean")),
            "saturated": mean_over(done, lambda r: average(r, "alloc/saturated_share")),
            "empty": int(sum(cumulative(r, "train/skipped_empty") or 0 for r in done)),
            "passk": {k: mean_over(done, lambda r, k=k: final_passk(r, prefix).get(k)) for k in show},
            "curve": [pass1_curve(r, prefix) for r in done],
        }
    ds = summary.get("ds", {}).get("generated")
    # Pass@1 at equal rollouts generated: every method's curve read at the smallest total any method reached
    budgets = [s["generated"] for s in summary.values() if s["generated"]]
    common = min(budgets) if budgets else None
    header = ["method", "seeds", "steps", "generated (k)", "vs DS", "trained (k)", "effective yield (%)",
              "abandon error (%)", "empty steps (all seeds)", *[f"Pass@{k} (%)" for k in show],
              f"Pass@1 at {thousands(common)}k generated (%)"]  # fmt: skip
    rows = []
    for s in summary.values():
        ratio = f"{100 * (s['generated'] / ds - 1):+.0f}%" if ds and s["generated"] is not None else "n/a"
        rows.append([
            s["label"], s["seeds"], s["steps"], thousands(s["generated"]), ratio, thousands(s["trained"]),
            percent(s["effective"] / s["generated"] if s["effective"] is not None and s["generated"] else None),
            percent(s["abandon"]), s["empty"], *[percent(s["passk"][k]) for k in show],
            percent(mean_over(s["curve"], lambda curve: at_rollouts(curve, common))),
        ])  # fmt: skip
    md = write_table(out_root / f"sara-{scale}" / f"{study}", header, rows)
    saturated = summary.get("grpo", {}).get("saturated")
    note = ""
    if saturated is not None:
        note = (f"\nSaturated share under uniform GRPO (P[a fresh group of n0 has all-equal rewards], exact p, mean "
                f"over RL steps): {100 * saturated:.1f}%.\n")  # fmt: skip
    elif "grpo" in summary and summary["grpo"]["effective"] is not None and summary["grpo"]["trained"]:
        share = 1 - summary["grpo"]["effective"] / summary["grpo"]["trained"]
        note = f"\nSaturated share under uniform GRPO (rollouts in all-equal groups / rollouts): {100 * share:.1f}%.\n"
    return f"### {title}\n\n{md}{note}", summary


def pass1_curve(run: Run, prefix: str) -> tuple[np.ndarray, np.ndarray]:
    """(cumulative rollouts generated at each evaluation, Pass@1 there)."""
    steps, generated = run.series("alloc/generated")
    at, pass1 = run.series(f"{prefix}1")
    total = np.array([generated[steps <= s].sum() for s in at])
    return total, pass1


def at_rollouts(curve, x) -> float | None:
    """Pass@1 of one run's curve at x rollouts generated, linearly interpolated; None outside its evaluations."""
    generated, pass1 = curve
    if x is None or not generated.size or not generated[0] <= x <= generated[-1]:
        return None
    return float(np.interp(x, generated, pass1))


def thousands(x) -> str:
    return "n/a" if x is None else f"{x / 1000:.1f}"


def percent(x) -> str:
    return "n/a" if x is None or not np.isfinite(x) else f"{100 * x:.2f}"


def claims(summaries: dict[str, dict]) -> str:
    """The abstract's three claims, checked against each study's numbers (mean over seeds)."""
    lines = ["## Against the SARA abstract", "", ABSTRACT, "",
             "| study | SARA vs DS rollouts | SARA+DPS vs DS rollouts | Pass@1: DS / DPS / SARA / SARA+DPS (%) |",
             "|---|---|---|---|"]  # fmt: skip
    for study, s in summaries.items():
        ds = s.get("ds", {}).get("generated")

        def saving(name, s=s, ds=ds):
            g = s.get(name, {}).get("generated")
            return f"{100 * (1 - g / ds):.0f}% fewer" if ds and g else "n/a"

        acc = " / ".join(percent(s.get(m, {}).get("passk", {}).get(1)) for m in ("ds", "dps", "sara", "sara+dps"))
        lines.append(f"| {study} | {saving('sara')} | {saving('sara+dps')} | {acc} |")
    return "\n".join(lines) + "\n"


def figure(summaries: dict[str, dict], stem: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, max(1, len(summaries)), figsize=(6 * max(1, len(summaries)), 4), squeeze=False)
    for ax, (study, summary) in zip(axes[0], summaries.items(), strict=False):
        for j, s in enumerate(summary.values()):
            for i, (x, y) in enumerate(s["curve"]):  # one line per seed, one colour per method
                ax.plot(x / 1000, 100 * y, marker="o", ms=3, color=f"C{j}", label=s["label"] if i == 0 else None)
        ax.set(xlabel="cumulative rollouts generated (thousands)", ylabel="Pass@1 (%)", title=STUDIES[study][0])
        if ax.lines:
            ax.legend(fontsize=7)
    save_figure(fig, stem)


def build(runs_root: Path, scale: str, out_root: Path = OUT) -> str:
    parts, summaries = [f"# Sequential allocation (SARA, DS, DPS), scale={scale}", ""], {}
    for study in STUDIES:
        text, summary = study_table(runs_root, study, scale, out_root)
        parts += [text, ""]
        if summary:
            summaries[study] = summary
    parts.append(claims(summaries))
    figure(summaries, out_root / f"sara-{scale}" / "pass1_vs_rollouts")
    text = "\n".join(parts)
    (out_root / f"sara-{scale}" / "sara.md").write_text(text)
    print(text)
    return text


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", default="cpu_sara")
    parser.add_argument("--runs", default="runs")
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args(argv)
    build(Path(args.runs), args.scale, Path(args.out))


if __name__ == "__main__":
    main()
