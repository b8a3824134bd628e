"""Writing tables: markdown, CSV and LaTeX (booktabs) from one list of rows. No torch."""

from __future__ import annotations

import csv
import math
from numbers import Real
from pathlib import Path

NOT_RUN = "not run"


def fmt(value, digits: int = 2) -> str:
    """A cell: numbers rounded (NaN and infinities as 'nan', 'inf', '-inf'), None as 'not run', strings as given."""
    if value is None:
        return NOT_RUN
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def bold_better(rows: list[list], i: int, j: int, columns) -> set:
    """(row, column) cells to set in bold: in each column, the larger of rows i and j when both are finite numbers
    that differ (a NaN, an infinity, a text cell or a tie is never 'better')."""
    bold = set()
    for col in columns:
        a, b = rows[i][col], rows[j][col]
        if all(isinstance(v, Real) and math.isfinite(v) for v in (a, b)) and a != b:
            bold.add((i, col) if a > b else (j, col))
    return bold


def write_table(out_stem: Path, header: list[str], rows: list[list], digits: int = 2, bold: set | None = None) -> str:
    """Write out_stem.{md,csv,tex}; `bold` holds (row, column) cells set in bold in the markdown and LaTeX."""
    out_stem.parent.mkdir(parents=True, exist_ok=True)
    bold = bold or set()
    cells = [[fmt(v, digits) for v in row] for row in rows]
    md_cells = [[f"**{c}**" if (i, j) in bold else c for j, c in enumerate(row)] for i, row in enumerate(cells)]
    md = "\n".join(
        ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |" for r in md_cells]
    )
    out_stem.with_suffix(".md").write_text(md + "\n")
    with open(out_stem.with_suffix(".csv"), "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(cells)
    tex_cells = [
        [
            ("\\textbf{" + c + "}") if (i, j) in bold else c.replace("%", "\\%").replace("_", "\\_")
            for j, c in enumerate(r)
        ]
        for i, r in enumerate(cells)
    ]
    tex = "\n".join(
        [
            "\\begin{tabular}{" + "l" * len(header) + "}",
            "\\toprule",
            " & ".join(h.replace("@", "@") for h in header) + " \\\\",
            "\\midrule",
        ]
        + [" & ".join(r) + " \\\\" for r in tex_cells]
        + ["\\bottomrule", "\\end{tabular}"]
    )
    out_stem.with_suffix(".tex").write_text(tex + "\n")
    return md


def read_reference(name: str) -> list[dict]:
    """A paper table from paper_figures/reference/ (the paper's tables, as CSV)."""
    with open(Path(__file__).parent / "reference" / name) as f:
        return list(csv.DictReader(f))


def pyplot():
    """matplotlib's pyplot on the file-only Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, stem: Path) -> None:
    """Write the figure as stem.png and stem.pdf, then close it."""
    fig.tight_layout()
    stem.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(stem.with_suffix(".png"), dpi=120)
    fig.savefig(stem.with_suffix(".pdf"))
    pyplot().close(fig)


def passk_figure(curves: dict, stem: Path, title: str) -> None:
    """Pass@K (%) against K on a log2 axis, one line per label; curves hold PerQuestion results (ks, values) or None."""
    fig, ax = pyplot().subplots(figsize=(6, 4))
    for label, per_question in curves.items():
        if per_question is not None:
            ax.plot(per_question.ks, 100 * per_question.values.mean(axis=0), marker="o", ms=3, label=label)
    ax.set_xscale("log", base=2)
    ax.set(xlabel="K", ylabel="Pass@K (%)", title=title)
    if ax.lines:
        ax.legend(fontsize=7)
    save_figure(fig, stem)


def regime_figure(groups: dict, eval_set: str, k: int, stem: Path, title: str, base: list | None = None) -> dict:
    """The regime a method acts on, one line per label (a group of seeds, Run objects): held-out Pass@1 and Pass@k
    over training (the seeds' mean, a band from their minimum to their maximum at the steps every seed evaluated),
    and the histogram of per-question success rates (correct / samples) of each group's final policies, pooled over
    seeds, as the fraction of questions in each bin (groups with different seed counts compare). `base`: the base
    model's runs, drawn at step 0 and as a dashed histogram (the rates the first RL steps act on). SERA re-weights by
    these rates: at rates near 0 for most questions it changes little. Returns what it drew: label -> {"steps",
    "pass@1", "pass@<k>" (seed means, %), "seeds", "hist" (fractions over 20 bins of [0, 1])}."""
    import numpy as np

    bins = np.linspace(0, 1, 21)
    fig, axes = pyplot().subplots(1, 3, figsize=(15, 4))
    drawn = {}

    def histogram(label, runs, **style):
        rates = [np.asarray(r.eval_records[eval_set]["correct"], dtype=float) / r.eval_records[eval_set]["n"]
                 for r in runs if eval_set in r.eval_records]  # fmt: skip
        rates = np.concatenate(rates) if rates else np.zeros(0)
        rates = rates[np.isfinite(rates)]  # a question logged as null (NaN) has no rate
        if rates.size:
            weights = np.full(rates.size, 1 / rates.size)
            drawn[label]["hist"] = np.histogram(rates, bins=bins, weights=weights)[0].tolist()
            axes[2].hist(rates, bins=bins, weights=weights, histtype="step", label=label, **style)

    base_runs = [r for r in base or [] if eval_set in r.eval_records]
    if base_runs:
        drawn["Base model"] = {"steps": [0], "seeds": len(base_runs)}
        for ax, key in zip(axes[:2], (1, k), strict=True):
            values = [v for r in base_runs if (v := r.last(f"eval/{eval_set}/pass@{key}")) is not None]
            if values:
                drawn["Base model"][f"pass@{key}"] = [100 * float(np.mean(values))]
                ax.plot([0], [100 * np.mean(values)], "kx", ms=8, label=f"Base model ({len(values)} seeds)")
        histogram("Base model", base_runs, color="black", linestyle="--")
    for label, runs in groups.items():
        drawn[label] = {"seeds": len(runs)}
        for ax, key in zip(axes[:2], (1, k), strict=True):
            series = [r.series(f"eval/{eval_set}/pass@{key}") for r in runs]
            common = sorted(set.intersection(*(set(s.tolist()) for s, _ in series))) if series else []
            if not common:
                continue
            values = np.array([[v[list(s).index(t)] for t in common] for s, v in series])  # (seeds, steps)
            drawn[label]["steps"], drawn[label][f"pass@{key}"] = common, (100 * values.mean(axis=0)).tolist()
            line = ax.plot(common, 100 * values.mean(axis=0), marker="o", ms=3, label=f"{label} ({len(runs)} seeds)")
            ax.fill_between(common, 100 * values.min(axis=0), 100 * values.max(axis=0), alpha=0.2,
                            color=line[0].get_color())  # fmt: skip
        histogram(label, runs)
    axes[0].set(xlabel="step", ylabel="held-out Pass@1 (%)", title=f"{title}: Pass@1")
    axes[1].set(xlabel="step", ylabel=f"held-out Pass@{k} (%)", title=f"{title}: Pass@{k}")
    axes[2].set(xlabel="per-question success rate (final policy; base model dashed)", ylabel="fraction of questions",
                title="the regime: success rates")  # fmt: skip
    for ax in axes:
        if ax.lines or ax.patches:
            ax.legend(fontsize=7)
    save_figure(fig, stem)
    return drawn
