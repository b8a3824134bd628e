"""The claims table README quotes (paper_figures.claims): the verdict rule, and the committed file is what the
committed tables give today."""

from pathlib import Path

import pytest

from paper_figures import claims

RESULTS = Path(__file__).resolve().parents[1] / "results" / "cpu"


@pytest.mark.parametrize(
    "diffs, verdict",
    [([1.0, 1.1, 0.9], "supported"), ([-1.0, -1.1, -0.9], "contradicted"),
     ([-1.0, 2.0, 0.5], "not decided at this power"), ([1.0], "one seed: no interval")],
)  # fmt: skip
def test_the_verdict_follows_the_preregistered_rule(diffs, verdict):
    row = claims.Claim("c", "+1", diffs, "page.md").row()
    assert row[4].startswith(verdict) and row[3] == str(len(diffs))


def test_the_interval_is_the_seed_level_t_interval():
    # mean 2, sd 1, n = 3: half-width t(0.975, 2) * 1 / sqrt(3) = 4.303 / 1.732 = 2.484
    assert claims.Claim("c", "+1", [1.0, 2.0, 3.0], "p").row()[2] == "+2.00 [-0.48, +4.48]"


def test_the_committed_claims_are_what_the_committed_tables_give():
    header, rows = claims.claims_table(RESULTS)
    lines = (RESULTS / "claims.md").read_text().splitlines()
    assert lines[0] == "| " + " | ".join(header) + " |"
    assert lines[2:] == ["| " + " | ".join(r) + " |" for r in rows]
