"""The guard on results/: a rebuilt table is compared, cell by cell, with the committed one it would replace. No torch.

results/<scale>/ holds the measured tables README.md quotes; `make tables` rebuilds every table from runs/ into
paper_figures/out/, and paper_figures/report.py (`publish`) copies them into results/ under this guard:
- a table not yet in results/ is added when it has a measured cell (a number that is not the paper's);
- a committed table is never written over without an explicit choice (`make tables FORCE=1`, or FORCE naming the
  tables); without it the command says, for each table, that it is unchanged, kept because this build is poorer (and
  which rows make it so), or kept with the cells this build would change; a forced write, poorer or not, prints
  every changed cell;
- smoke-scale tables never leave paper_figures/out/.

"Poorer" is read from the tables, not from file or folder names: a build is poorer when a measured cell of the
committed table has no number in this build (its runs are missing; an unfinished or corrupt run relabels its row, "SERA
(unfinished)", so the committed row's numbers are missing too), or when a row counts fewer seeds (the `seeds` column,
"a vs b" in the verdicts). Rows are matched by their label columns (KEY_COLUMNS), columns by name (by position where
a header names a column after its data, e.g. the SARA table's equal-rollouts column, and keeps its width); the
markdown is compared, the CSV beside it holds the same cells.

Granularity: the unit is a table, all the files one table command writes (e.g. table2.md, table2.csv and
table2_verdict.md), never a row. The rows of a table are not independent: bold marks the better of a SERA/MaxRL
pair, a verdict row pairs the runs of two rows, Table 4's K columns stop at the smallest sample count among all its
runs, the SARA table's "vs DS" and equal-rollouts columns are read off other rows, and REPORT.md's section line
counts the folder's runs. Committed rows spliced into a rebuilt table would show numbers that no single build
produced, so a table is kept or replaced whole, and the reasons name the rows that decided it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from paper_figures.render import NOT_RUN
from paper_figures.runs import CORRUPT_FINAL, UNFINISHED

# Header names of the columns that say which row a row is (the rest hold its values), across every table.
KEY_COLUMNS = ("dataset", "study", "normalization", "n0", "estimator", "m", "method", "seed", "k", "value", "claim",
               "endpoint", "intervention", "pair", "run")  # fmt: skip
SOURCE = "source"  # where a row's numbers come from: "reproduced (...)", "not run", "paper (...)", "baseline"
# Columns that describe a row's runs or read its numbers without measuring anything (diffed, never lost): a verdict
# that goes from "in progress (7 of 12 seeds)" to "supported" is news, not a lost measurement
DESCRIBING = (SOURCE, "steps", "decision", "verdict", "reading", "vs the paper")
SEEDS = "seeds"
PAPER = "paper"  # a label or header starting with it marks the paper's numbers, not a measurement
STATUS_TAGS = (UNFINISHED, CORRUPT_FINAL)
VALUE = re.compile(r"\d|\bnan\b|\binf\b")
NUMBER = re.compile(r"[+-]?\d+(?:\.\d+)?")


@dataclass
class MarkdownTable:
    header: list[str]
    rows: list[list[str]]

    def key_columns(self) -> list[int]:
        return [j for j, name in enumerate(self.header) if name in KEY_COLUMNS]

    def label_columns(self) -> list[int]:
        """Columns that say which row it is or describe its runs, rather than measure anything."""
        return [j for j, name in enumerate(self.header) if name in (*KEY_COLUMNS, *DESCRIBING)]

    def keyed(self) -> dict[tuple, list[str]]:
        """Rows by their label cells, plus PAPER for the paper's rows (so a reproduced row that is now 'not run' is
        the same row); a repeated label gets a '#' per earlier occurrence; a table without labels keys by position."""
        cols, out = self.key_columns(), {}
        source = self.header.index(SOURCE) if SOURCE in self.header else None
        for i, row in enumerate(self.rows):
            key = tuple(row[j] if j < len(row) else "" for j in cols) if cols else (str(i),)
            if source is not None and source < len(row) and row[source].startswith(PAPER):
                key = (*key, PAPER)
            while key in out:
                key = (*key, "#")
            out[key] = row
        return out

    def measured_columns(self, key: tuple) -> list[int]:
        """The columns of the row `key` that hold measurements: none in the paper's rows, never a label or a paper
        column."""
        if any(cell.startswith(PAPER) for cell in key):
            return []
        labels = self.label_columns()
        return [j for j, name in enumerate(self.header) if j not in labels and not name.startswith(PAPER)]


@dataclass
class Comparison:
    """What a rebuilt table changes against the committed one: `changes`, one line per changed cell, row, table or text
    line; `losses`, one line per row (or text line) whose committed measurement this build does not have."""

    changes: list[str] = field(default_factory=list)
    losses: list[str] = field(default_factory=list)


def split_cells(line: str) -> list[str]:
    """The cells of a markdown table line; a '|' inside brackets is text ("cos(E[g | n], CE)"); bold is dropped."""
    cells, depth, cell = [], 0, ""
    for char in line.strip()[1:-1]:
        depth += (char in "([{") - (char in ")]}")
        if char == "|" and depth == 0:
            cells.append(cell)
            cell = ""
        else:
            cell += char
    return [c.replace("**", "").strip() for c in [*cells, cell]]


def parse(text: str) -> tuple[dict[tuple, MarkdownTable], list[str]]:
    """The tables of a markdown file by identity (their label columns and occurrence) and its other non-empty lines."""
    tables, lines, block = {}, [], []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            block.append(split_cells(line))
            continue
        if block:
            table = MarkdownTable(block[0], [r for r in block[1:] if not all(set(c) <= set("-:") for c in r)])
            signature = tuple(table.header[j] for j in table.key_columns())
            tables[(signature, sum(s == signature for s, _ in tables))] = table
            block = []
        if line.strip():
            lines.append(line.strip())
    return tables, lines


def has_value(cell: str | None) -> bool:
    """Whether a cell holds a number (NaN and infinities included), not 'not run', 'n/a', empty or 'refused: ...'."""
    return cell is not None and not cell.startswith(("refused", NOT_RUN)) and bool(VALUE.search(cell))


def seed_counts(cell: str | None) -> tuple[int, ...] | None:
    """A seeds cell: '3' -> (3,), '3 vs 2' -> (3, 2); None when it holds no count."""
    if cell is None or not re.fullmatch(r"\d+( vs \d+)*", cell):
        return None
    return tuple(int(n) for n in cell.split(" vs "))


def measured(text: str) -> bool:
    """Whether a markdown file has a measured cell: a number outside the paper's rows and columns."""
    for table in parse(text)[0].values():
        for key, row in table.keyed().items():
            if any(has_value(row[j]) for j in table.measured_columns(key) if j < len(row)):
                return True
    return False


def untagged(cell: str) -> str:
    """A row label without its run-status tags: 'SERA (m=2, unfinished)' -> 'SERA (m=2)'."""
    match = re.fullmatch(r"(.*) \(([^()]*)\)", cell)
    if not match:
        return cell
    tags = [t for t in match.group(2).split(", ") if t not in STATUS_TAGS]
    return match.group(1) + (f" ({', '.join(tags)})" if tags else "")


def show(key: tuple) -> str:
    return '"' + " | ".join(c for c in key if c and c != "#") + '"'


def compare(committed: dict[str, str], built: dict[str, str]) -> Comparison:
    """Compare markdown files (relative path -> text) of one table: the committed copy and this build."""
    out = Comparison()
    for name in sorted(committed.keys() | built.keys()):
        old_tables, old_lines = parse(committed.get(name, ""))
        new_tables, new_lines = parse(built.get(name, ""))
        for identity, old in old_tables.items():
            where = name if identity[1] == 0 else f"{name} (table {identity[1] + 1} of its kind)"
            compare_table(where, old, new_tables.get(identity), out)
        out.changes += [
            f"{name}: table added ({' | '.join(table.header)})"
            for identity, table in new_tables.items()
            if identity not in old_tables
        ]
        compare_lines(name, old_lines, new_lines, out)
    return out


def column_map(old: list[str], new: list[str]) -> list[int | None]:
    """For each committed column, its column in the new header: by name, else by position when the widths agree."""
    return [new.index(h) if h in new else (j if len(new) == len(old) else None) for j, h in enumerate(old)]


def fewer_seeds(before: tuple[int, ...] | None, after: tuple[int, ...] | None) -> bool:
    """Whether a row counts fewer seeds than the committed one (either side of 'a vs b' counts)."""
    if not before or not any(before):
        return False
    return after is None or len(after) != len(before) or any(a < b for a, b in zip(after, before, strict=True))


def compare_table(name: str, old: MarkdownTable, new: MarkdownTable | None, out: Comparison) -> None:
    """Cell by cell, rows matched by label and columns by name; a committed measured row that is gone, lost a
    number or counts fewer seeds is a loss."""
    new = new or MarkdownTable(old.header, [])
    old_rows, new_rows = old.keyed(), new.keyed()
    columns = column_map(old.header, new.header)
    keys = old.key_columns()
    for key, row in old_rows.items():
        where = f"{name}, row {show(key)}"
        measured_cols = [j for j in old.measured_columns(key) if j < len(row) and has_value(row[j])]
        if key not in new_rows:
            out.changes.append(f"{where}: removed")
            if measured_cols:
                renamed = [show(k) for k in new_rows if k != key and tuple(untagged(c) for c in k) == key]
                hint = f" (this build has {', '.join(renamed)})" if renamed else ""
                out.losses.append(f"{where}: not in this build{hint}")
            continue
        new_row, reasons, lost = new_rows[key], [], []
        for j, cell in enumerate(row[: len(old.header)]):
            if j in keys:
                continue
            k = columns[j]
            new_cell = new_row[k] if k is not None and k < len(new_row) else None
            if new_cell != cell:
                shown = "(no column)" if new_cell is None else new_cell or "(empty)"
                out.changes.append(f"{where}, {old.header[j]}: {cell or '(empty)'} -> {shown}")
            if old.header[j] == SEEDS:
                if fewer_seeds(seed_counts(cell), seed_counts(new_cell)):
                    reasons.append(f"seeds: {new_cell if seed_counts(new_cell) else 'none'} here, {cell} in results/")
            elif j in measured_cols and not has_value(new_cell):
                lost.append(old.header[j])
        if lost:
            reasons.append(
                f"no number here for {len(lost)} measured cells ({', '.join(lost[:3])}{', ...' * (len(lost) > 3)})"
            )
        if reasons:
            out.losses.append(f"{where}: {'; '.join(reasons)}")
    out.changes += [f"{name}, row {show(key)}: added" for key in new_rows if key not in old_rows]


def compare_lines(name: str, old: list[str], new: list[str], out: Comparison) -> None:
    """Text outside the tables (notes, headings): lines are matched with their numbers masked."""
    by_shape = {NUMBER.sub("#", line): line for line in new}
    for line in old:
        now = by_shape.get(NUMBER.sub("#", line))
        if now is None:
            out.changes.append(f"{name}: line removed: {line}")
            if VALUE.search(line):
                out.losses.append(f"{name}: line not in this build: {line}")
        elif now != line:
            out.changes.append(f"{name}: {line} -> {now}")
    shapes = {NUMBER.sub("#", line) for line in old}
    out.changes += [f"{name}: line added: {line}" for line in new if NUMBER.sub("#", line) not in shapes]


def publish_table(stem: str, built: Path, results: Path, force: bool = False) -> str:
    """Copy one table (built/<stem>.md and .csv) into results/ unless the committed copy has measurements this build
    lacks (fewer seeds, a number gone), which `force` overrides. Returns what it did, in a line."""
    from shutil import copyfile

    committed = results / f"{stem}.md"
    new = (built / f"{stem}.md").read_text()
    if committed.exists() and not force:
        losses = compare({committed.name: committed.read_text()}, {committed.name: new}).losses
        if losses:
            return f"kept {committed}: this build is poorer ({'; '.join(losses[:3])}); FORCE=1 writes over it"
    results.mkdir(parents=True, exist_ok=True)
    for suffix in (".md", ".csv"):
        copyfile(built / f"{stem}{suffix}", results / f"{stem}{suffix}")
    return f"wrote {committed}"
