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
    """A paper table from paper_figures/reference/ (copied from shared/paper/tables)."""
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
