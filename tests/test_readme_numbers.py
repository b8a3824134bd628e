"""Every number README.md quotes from a measured table is in the committed table it names.

A README table that quotes measured results is preceded by a marker `<!-- results: PATH -->` (PATH relative to
results/, written by `make tables`); every number in that table's body must appear in the named file. The paper's
own numbers appear there too (each table sits beside the paper's), so they are checked the same way.
"""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"<!-- results: (\S+) -->")
NUMBER = re.compile(r"[-+]?\d+\.\d+")  # decimals only: counts such as n0 = 16 are labels, not measurements


def quoted_tables(readme: str) -> list[tuple[str, list[str]]]:
    """(results path, table body lines) for every marked table."""
    out, lines = [], readme.splitlines()
    for i, line in enumerate(lines):
        match = MARKER.search(line)
        if not match:
            continue
        body = []
        for row in lines[i + 1 :]:
            if not row.strip():
                if body:
                    break
                continue
            if not row.startswith("|"):
                break
            body.append(row)
        out.append((match.group(1), body[2:]))  # skip the header and the |---| line
    return out


def test_marker_parsing_finds_tables_and_numbers():
    text = "x\n<!-- results: cpu/t.md -->\n\n| a | b |\n|---|---|\n| SERA | 81.60 [+6.06, +7.30] |\n\nafter\n"
    assert quoted_tables(text) == [("cpu/t.md", ["| SERA | 81.60 [+6.06, +7.30] |"])]
    assert NUMBER.findall("| SERA | 81.60 [+6.06, +7.30] |") == ["81.60", "+6.06", "+7.30"]


TABLES = quoted_tables((ROOT / "README.md").read_text())


def test_readme_quotes_measured_tables():
    assert TABLES, "README.md marks no measured table"


@pytest.mark.parametrize("path, body", TABLES, ids=[p for p, _ in TABLES])
def test_every_quoted_number_is_in_its_results_file(path, body):
    source = ROOT / "results" / path
    assert source.exists(), f"README quotes {path}, which is not committed under results/"
    text = source.read_text()
    available = {n.lstrip("+") for n in NUMBER.findall(text)}
    missing = [n for row in body for n in NUMBER.findall(row) if n.lstrip("+") not in available]
    assert not missing, f"README numbers not in results/{path}: {missing}"
