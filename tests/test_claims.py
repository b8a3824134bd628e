"""The claims table README quotes (paper_figures.claims): the verdict rule, and the committed file is what the
committed tables give today."""

from pathlib import Path

import pytest

from paper_figures import claims

RESULTS = Path(__file__).resolve().parents[1] / "results" / "cpu"


@pytest.mark.parametrize(
    "cell, verdict",
    [("+1.00 [+0.50, +1.50]", "supported"), ("-1.00 [-1.50, -0.50]", "contradicted"),
     ("+0.50 [-1.00, +2.00]", "not decided at this power"), ("+0.50 [+0.00, +1.00]", "not decided at this power"),
     ("one seed: no interval", "one seed: no interval"), ("not run", "no decision")],
)  # fmt: skip
def test_the_verdict_follows_the_preregistered_rule(cell, verdict):
    assert claims.interval_verdict(cell) == verdict


def test_the_classification_rows_read_the_seed_level_interval(tmp_path):
    """The interval is the verdict table's seed-level cell, not one recomputed from the rounded per-seed column."""
    (tmp_path / "imagenet-cpu").mkdir()
    (tmp_path / "imagenet-cpu" / "table2_verdict.md").write_text(
        "| n0 | seeds | dPass@1 (pp) [95% CI] | dPass@1024 (pp) [95% CI] | dPass@1 per seed (pp) "
        "| dPass@1 (pp) [seed 95% t] | d cos(g, CE) | d cos(E[g \\| n], CE) |\n"
        "|---|---|---|---|---|---|---|---|\n"
        "| 16 | 3 vs 3 | +4.81 [+4.21, +5.41] | +7.48 [+6.92, +8.04] | seed 0: +4.98, seed 1: +4.24, seed 2: +5.23 "
        "| +4.81 [+3.52, +6.10] | +0.238 | +0.230 |\n"
        "| 128 | 3 vs 3 | +0.77 [+0.34, +1.20] | +0.56 [+0.32, +0.81] | seed 0: +1.07, seed 1: +1.85, seed 2: -0.61 "
        "| +0.77 [-2.35, +3.89] | +0.100 | +0.096 |\n"
    )
    rows = claims.classification_claims(tmp_path)
    assert [r[2:5] for r in rows] == [["+4.81 [+3.52, +6.10]", "3", "supported"],
                                      ["+0.77 [-2.35, +3.89]", "3", "not decided at this power"]]  # fmt: skip
    assert rows[0][1] == claims.CLASSIFICATION_PAPER["16"]


def test_the_committed_claims_are_what_the_committed_tables_give():
    header, rows = claims.claims_table(RESULTS)
    lines = (RESULTS / "claims.md").read_text().splitlines()
    assert lines[0] == "| " + " | ".join(header) + " |"
    assert lines[2:] == ["| " + " | ".join(r) + " |" for r in rows]
