"""The paper's claims beside this suite's measurements: one row per claim, read off the committed tables. No torch.

Run: python -m paper_figures.claims --results results/cpu      (make tables runs it; README.md quotes the file)

Each row names a claim, the paper's number for it, this suite's number (SERA minus MaxRL in pp, with the seed-level
95% t-interval) and the verdict by the rule of results/cpu/PREREGISTRATION.md: supported when the interval lies above
zero, contradicted when below, not decided when it covers zero. The digits1000 classifier's rows take the seed-level
interval its verdict table computes from the unrounded per-seed differences (a bound printed as +0.00 or -0.00 reads
as covering zero); the gauss1000 and language-model rows are the primary endpoints of the pre-registered tables
(paper_figures.imagenet.classification_prereg, paper_figures.prereg), which decide nothing until every seed is in.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from paper_figures.guard import MarkdownTable, parse
from paper_figures.prereg import verdict_of_interval
from paper_figures.render import write_table

HEADER = ["claim", "paper", "this suite", "seeds", "verdict", "detail"]


def only_table(path: Path, first_header: str) -> MarkdownTable:
    """The table of a committed markdown file whose first column is `first_header` (the first such)."""
    tables, _ = parse(path.read_text())
    found = [t for t in tables.values() if t.header and t.header[0] == first_header]
    if not found:
        raise ValueError(f"{path} has no table starting with column {first_header!r}")
    return found[0]


CLASSIFICATION_PAPER = {"16": "+7.94 (12.37 vs 4.43)", "128": "+18.21 (54.80 vs 36.59)"}
INTERVAL = re.compile(r"([+-]\d+\.\d+) \[([+-]\d+\.\d+), ([+-]\d+\.\d+)\]")


def interval_verdict(cell: str) -> str:
    """The pre-registered verdict of a seed-level interval cell '+d [low, high]' for a claimed gain."""
    match = INTERVAL.fullmatch(cell.strip())
    if not match:
        return "one seed: no interval" if cell.startswith("one seed") else "no decision"
    return verdict_of_interval(float(match[2]), float(match[3]), +1)


def classification_claims(results: Path) -> list[list[str]]:
    """The digits1000 rows (the suite's pilot rule): SERA minus MaxRL at Pass@1, the seed-level interval of
    imagenet-cpu/table2_verdict.md."""
    table = only_table(results / "imagenet-cpu" / "table2_verdict.md", "n0")
    column = {name: table.header.index(name) for name in table.header}
    out = []
    for row in table.rows:
        n0, cell = row[0], row[column["dPass@1 (pp) [seed 95% t]"]]
        seeds = row[column["seeds"]].split(" vs ")[0]
        claim = f"classification (digits1000, pilot rule) n0 = {n0}: SERA above MaxRL at Pass@1"
        out.append([claim, CLASSIFICATION_PAPER[n0], cell, seeds, interval_verdict(cell), "classification.md"])
    return out


# The language-model claims: the primary rows of the pre-registered table (paper_figures.prereg), with the paper's
# number as the README states it.
# its Table 5 (SmolLM2-360M), at the paper's K: our base model covers 99.4% at Pass@128, so the claims read Pass@16
MATH_PAPER = "+5.54 [+3.09, +8.01] at Pass@128 (the paper's K)"
MATH_SEQNORM_PAPER = "not reported (token-mean: +5.54 at Pass@128)"  # the paper gives no seqnorm SERA row on math
LM_CLAIMS = {
    "C1 maze token-mean": (
        "maze token-mean (pilot rule): SERA above MaxRL at Pass@32",
        "+3.70 (74.45 vs 70.75)",
        "maze.md",
    ),
    "C2 maze seqnorm": ("maze seqnorm (pilot rule): SERA above MaxRL at Pass@32", "+3.03 (74.97 vs 71.94)", "maze.md"),
    "C3 math token-mean": ("math token-mean (pilot rule): SERA above MaxRL at Pass@16", MATH_PAPER, "math.md"),
    "C4 math seqnorm": ("math seqnorm (pilot rule): SERA above MaxRL at Pass@16", MATH_SEQNORM_PAPER, "math.md"),
    "C5 maze token-mean, the authors' SERA": (
        "maze token-mean (authors' rule, a fixed pool): SERA above MaxRL at Pass@32",
        "+3.70 (74.45 vs 70.75)",
        "maze.md",
    ),
    "C6 math token-mean, the authors' SERA": (
        "math token-mean (authors' rule): SERA above MaxRL at Pass@16",
        MATH_PAPER,
        "math.md",
    ),
}


def lm_rows(results: Path) -> list[list[str]]:
    """The primary endpoint of each language-model claim, as results/<scale>/preregistered.md decided it."""
    table = only_table(results / "preregistered.md", "claim")
    column = {name: table.header.index(name) for name in table.header}
    out = []
    for row in table.rows:
        name = row[column["claim"]]
        if name in LM_CLAIMS and row[column["endpoint"]].startswith("primary"):
            claim, paper, page = LM_CLAIMS[name]
            seeds = row[column["seeds"]].split(" of ")[0]
            out.append(
                [claim, paper, row[column["difference (pp) [seed 95% t]"]], seeds, row[column["decision"]], page]
            )
    return out


def authors_rows(results: Path) -> list[list[str]]:
    """C7 and C8 (the authors' SERA on the classifier in the paper's regime), the primary rows of
    imagenet-gauss1000/preregistered.md (paper_figures.imagenet.classification_prereg); none before it exists."""
    path = results / "imagenet-gauss1000" / "preregistered.md"
    if not path.exists():
        return []
    table = only_table(path, "claim")
    column = {name: table.header.index(name) for name in table.header}
    out = []
    for row in table.rows:
        if row[column["endpoint"]].startswith("primary"):
            n0 = row[column["claim"]].rsplit("= ", 1)[1]
            claim = f"classification (gauss1000, authors' rule) n0 = {n0}: SERA above MaxRL at Pass@1"
            seeds = row[column["seeds"]].split(" of ")[0]
            out.append([claim, CLASSIFICATION_PAPER[n0], row[column["difference (pp) [seed 95% t]"]], seeds,
                        row[column["decision"]], "classification.md"])  # fmt: skip
    return out


def claims_table(results: Path) -> tuple[list[str], list[list[str]]]:
    return HEADER, authors_rows(results) + classification_claims(results) + lm_rows(results)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=Path("results/cpu"))
    args = parser.parse_args(argv)
    header, rows = claims_table(args.results)
    write_table(args.results / "claims", header, rows)
    (args.results / "claims.tex").unlink()  # results/ keeps markdown and CSV
    print(f"wrote {args.results / 'claims.md'} ({len(rows)} claims)")


if __name__ == "__main__":
    main()
