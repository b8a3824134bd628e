"""The paper's claims beside this suite's measurements: one row per claim, read off the committed tables. No torch.

Run: python -m paper_figures.claims --results results/cpu      (make tables runs it; README.md quotes the file)

Each row names a claim, the paper's number for it, this suite's number (SERA minus MaxRL in pp, with the seed-level
95% t-interval over the per-seed differences that the study's verdict table lists) and the verdict by the rule of
results/cpu/PREREGISTRATION.md: supported when the interval lies above zero, contradicted when below, not decided when
it covers zero. For the language-model claims that rule is applied only once the pre-registered seeds are all in;
until then the row says how many of them there are and decides nothing.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from paper_figures.guard import MarkdownTable, parse
from paper_figures.render import write_table
from sera.stats import seed_t_interval

HEADER = ["claim", "paper", "this suite", "seeds", "verdict", "detail"]
SEED_VALUE = re.compile(r"(?:seed )?(\d+): ([+-]?\d+(?:\.\d+)?)")
PREREGISTERED = {"maze token-mean": 12, "maze seqnorm": 6, "math token-mean": 20}  # seeds the test needs


@dataclass
class Claim:
    claim: str
    paper: str
    diffs: list[float]  # per-seed SERA minus MaxRL (pp)
    detail: str
    preregistered: int | None = None  # the seeds the pre-registered test decides at

    def row(self) -> list[str]:
        n = len(self.diffs)
        ci = seed_t_interval(np.array(self.diffs))
        value = f"{ci.delta:+.2f} [{ci.low:+.2f}, {ci.high:+.2f}]" if n > 1 else f"{ci.delta:+.2f}"
        if n < 2:
            verdict = "one seed: no interval"
        elif self.preregistered and n < self.preregistered:
            verdict = f"no decision yet ({n} of {self.preregistered} pre-registered seeds)"
        elif ci.low > 0:
            verdict = "supported"
        elif ci.high < 0:
            verdict = "contradicted"
        else:
            verdict = "not decided at this power"
        return [self.claim, self.paper, value, str(n), verdict, self.detail]


def only_table(path: Path, first_header: str) -> MarkdownTable:
    """The table of a committed markdown file whose first column is `first_header` (the first such)."""
    tables, _ = parse(path.read_text())
    found = [t for t in tables.values() if t.header and t.header[0] == first_header]
    if not found:
        raise ValueError(f"{path} has no table starting with column {first_header!r}")
    return found[0]


def per_seed(cell: str) -> list[float]:
    """'seed 0: +4.98, seed 1: +4.24' or '0: +0.28, 1: +3.09' -> [4.98, 4.24]."""
    return [float(v) for _, v in SEED_VALUE.findall(cell)]


def classification_claims(results: Path) -> list[Claim]:
    table = only_table(results / "imagenet-cpu" / "table2_verdict.md", "n0")
    paper = {"16": "+7.94 (12.37 vs 4.43)", "128": "+18.21 (54.80 vs 36.59)"}
    out = []
    for row in table.rows:
        n0 = row[0]
        diffs = per_seed(row[table.header.index("dPass@1 per seed (pp)")])
        claim = f"classification n0 = {n0}: SERA above MaxRL at Pass@1"
        out.append(Claim(claim, paper[n0], diffs, "classification.md"))
    return out


def maze_claims(results: Path) -> list[Claim]:
    """Pass@32 (the pre-registered endpoint), seed by seed, from the verdict table's per-seed rows."""
    tables, _ = parse((results / "maze-cpu" / "table4_verdict.md").read_text())
    table = next(t for t in tables.values() if "seed" in t.header)
    col = table.header.index("dPass@32")
    paper = {"token-mean": "+3.70 (74.45 vs 70.75)", "seqnorm": "+3.03 (74.97 vs 71.94)"}
    out = []
    for norm in ("token-mean", "seqnorm"):
        diffs = [float(r[col]) for r in table.rows if r[0] == norm and r[1].isdigit()]
        out.append(
            Claim(
                f"maze {norm}: SERA above MaxRL at Pass@32",
                paper[norm],
                diffs,
                "maze.md",
                PREREGISTERED.get(f"maze {norm}"),
            )  # fmt: skip
        )
    return out


def math_claims(results: Path) -> list[Claim]:
    """Pass@16 (the pre-registered endpoint: our base model's coverage there is the paper's base at Pass@128)."""
    table = only_table(results / "math-cpu" / "table5.md", "dataset")
    k, col = table.header.index("k"), table.header.index("per seed (pp)")
    out = []
    for norm in ("token-mean", "seqnorm"):
        (row,) = [r for r in table.rows if r[1] == norm and r[k] == "16"]
        out.append(
            Claim(
                f"math {norm}: SERA above MaxRL at Pass@16",
                "+5.54 [+3.09, +8.01] at Pass@128",
                per_seed(row[col]),
                "math.md",
                PREREGISTERED.get(f"math {norm}"),
            )  # fmt: skip
        )
    return out


def claims_table(results: Path) -> tuple[list[str], list[list[str]]]:
    claims = classification_claims(results) + maze_claims(results) + math_claims(results)
    return HEADER, [c.row() for c in claims]


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
