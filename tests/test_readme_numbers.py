"""Every measured number README.md quotes agrees with the committed results file it comes from.

The rule, in three parts.

Tables. A README table that quotes measured results is preceded by a marker `<!-- results: PATH -->` (PATH relative
to results/, written by `make tables`), with only blank lines between the marker and the table. Within the level-2
README section that holds the markers (the results section), every table must be marked. Each README row is found in
the results file by its key columns (n0, method, normalization, estimator, m, seed, k): the one row whose cells in
those columns are the same (`seed` = `all` names the pooled table, the one without a seed column). Each other README
cell must hold the same numbers, in the same order, as the cell of that row under the same column header (the `+`
sign, `**` bold and `seed N:` labels aside; `n/a` and an empty cell hold none). A column `paper X` reads column
`paper X` of that row when the file has one, else column X of the paper's row with the same key (the row whose
source or normalization says "paper"). README may shorten a header or a row label where COLUMN_ALIASES or
LABEL_ALIASES says so; a number inside an aliased label must appear in the row it names.

Prose. In each level-3 subsection of the results section that holds a marked table, every number of the prose (not
headings, tables, markers or `code`) that is written with % or pp after it, or as a decimal, must be a value of the
results files in the folders the subsection's markers name, rounded to the decimals written: a number written with %
or pp must be a percentage there (a cell under a header with %, Pass@, pp, delta, CI, low or high, or a figure
written with %; an unsigned pp number may also be the difference of two cells in one such column); a number written
with a sign must match it with the sign, one without matches it or its negative. A range (10.6-11.7%, +3 to +5 pp)
gives both ends the unit. Not checked: integers without % or pp (settings such as n0 = 16), numbers glued to letters
(1.05M, 4.7x, SmolLM2-360M), numbers followed by a unit of time (wall times), and sentences that begin with
"Earlier" or "An earlier" (measurements no longer committed). Prose is checked against its files, not cell by cell:
a number changed to another value of the same files passes. Seed counts ("3 seeds", "one seed", "two seeds of
three": the total after "of") must be a value of a `seeds` column of those files. Sections outside the results
section (benchmarks, wall times of the test suite, TRL, vLLM) hold numbers that are not in results/ and are not
checked.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from sera.runlog import EVAL_RECORD

ROOT = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"<!-- results: (\S+) -->")
KEYS = ("claim", "endpoint", "value", "n0", "method", "normalization", "estimator", "m", "seed", "k")
# README header -> results header (a tuple: the README cell holds those cells' numbers in order)
COLUMN_ALIASES = {
    "cos(E[g given n], CE)": "cos(E[g | n], CE)",  # a | would split the markdown cell
    "dPass@1 (pp)": "dPass@1 (pp) [95% CI]",
    "dPass@1024 (pp)": "dPass@1024 (pp) [95% CI]",
    "paper r": "paper Pearson r",
    "distinct answers / maze": "distinct answers",
    "delta": "delta (pp)",
    "95% CI": ("95% CI low", "95% CI high"),
    "seed 95% CI": ("seed 95% low", "seed 95% high"),
}
MATH_TABLE1_LABELS = {
    "Base (after SFT)": "Base",
    "GRPO": "GRPO (token-mean)",
    "PKPO (T=16)": "PKPO (T=16) (token-mean)",
    "DARS-HW (1.86x the rollouts)": "DARS-HW (token-mean)",  # the previous default's
    "DARS-HW (1.84x the rollouts)": "DARS-HW (token-mean)",
}
LABEL_ALIASES = {  # results file -> {README row label: results row label}
    "cpu/math-cpu/table1.md": MATH_TABLE1_LABELS,
    "cpu/math-cpu_sft3000/table1.md": MATH_TABLE1_LABELS,
}
CELL_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?%?")
PERCENT_HEADER = re.compile(r"%|Pass@|pp|delta|CI|low|high")
WORDS = {w: i for i, w in enumerate("zero one two three four five six seven eight nine ten".split())}
COUNT = r"\d+|" + "|".join(WORDS)
SEEDS = re.compile(rf"\b({COUNT})\s+seeds?\b(?:\s+of\s+({COUNT})\b)?", re.IGNORECASE)
EVALUATIONS = re.compile(rf"\b({COUNT})\s+evaluations\b", re.IGNORECASE)
PROSE_NUMBER = re.compile(r"(?<![\w.@/^=])([-+]?)(\d+(?:\.\d+)?)(?![\w.])")
UNIT = re.compile(r"\s?(%|pp\b)")
RANGE_END = re.compile(r"(?:-|–| to )[-+]?\d+(?:\.\d+)?\s?(%|pp\b)")
TIME_UNIT = re.compile(r"\s?(ms|s|min|minutes?|h|hours?|seconds?)\b")
SENTENCE = re.compile(r"(?<=[.;])\s+(?=[A-Z(])")


# ---------------------------------------------------------------------------------------------------------------
# Markdown tables
# ---------------------------------------------------------------------------------------------------------------
def split_row(line: str) -> list[str]:
    """A markdown table line's cells; a | inside brackets (cos(E[g | n], CE)) does not split."""
    cells, depth, cell = [], 0, ""
    for ch in line.strip().strip("|"):
        depth += (ch in "([{") - (ch in ")]}")
        if ch == "|" and depth == 0:
            cells.append(cell.strip())
            cell = ""
        else:
            cell += ch
    return [*cells, cell.strip()]


@dataclass
class Table:
    line: int  # 1-based line of the header
    header: list[str]
    rows: list[list[str]]

    def column(self, name: str) -> int | None:
        return self.header.index(name) if name in self.header else None


def tables_in(lines: list[str], first_line: int = 1) -> list[Table]:
    """Every markdown table (header, |---| line, rows) in lines."""
    out, i = [], 0
    while i < len(lines):
        if lines[i].lstrip().startswith("|"):
            j = i
            while j < len(lines) and lines[j].lstrip().startswith("|"):
                j += 1
            block = [split_row(line) for line in lines[i:j]]
            out.append(Table(first_line + i, block[0], block[2:]))
            i = j
        else:
            i += 1
    return out


def numbers(cell: str) -> list[str]:
    """The numbers a cell holds, in order, without `+` signs, bold or `seed N:` labels."""
    cell = re.sub(r"seed \d+:", "", cell.replace("**", ""))
    return [n.lstrip("+") for n in CELL_NUMBER.findall(cell)]


def is_paper(row: list[str]) -> bool:
    return any(cell.startswith("paper") for cell in row)


# ---------------------------------------------------------------------------------------------------------------
# README structure
# ---------------------------------------------------------------------------------------------------------------
@dataclass
class Subsection:
    title: str
    lines: list[tuple[int, str]]  # (1-based line number, text)
    marked: list[tuple[str, Table]]  # (results path, README table)


def results_subsections(readme: str) -> tuple[list[Subsection], list[str]]:
    """The level-3 subsections of every level-2 section that holds a marker, and the problems found on the way: a
    marker without a table right after it, a table of the results section without a marker."""
    lines = readme.splitlines()
    problems, sections, current = [], [], None
    for number, line in enumerate(lines, 1):
        if line.startswith("## "):
            current = [line, []]
            sections.append(current)
        elif current is not None:
            current[1].append((number, line))
    out = []
    for _, body in (s for s in sections if any(MARKER.search(text) for _, text in s[1])):
        sub = Subsection("(section start)", [], [])
        out.append(sub)
        pending = None  # (line, path) of a marker waiting for its table
        in_table = False
        for number, text in body:
            if text.startswith("### "):
                sub = Subsection(text, [], [])
                out.append(sub)
            is_table = text.lstrip().startswith("|")
            if match := MARKER.search(text):
                if pending:
                    problems.append(f"README line {pending[0]}: marker for {pending[1]} has no table after it")
                pending = (number, match.group(1))
            elif is_table and not in_table:
                if pending is None:
                    problems.append(f"README line {number}: a table in the results section without a marker")
                else:
                    idx = [n for n, _ in body].index(number)
                    rows = [t for _, t in body[idx:]]
                    end = next((i for i, t in enumerate(rows) if not t.lstrip().startswith("|")), len(rows))
                    sub.marked.append((pending[1], tables_in(rows[:end], number)[0]))
                    pending = None
            elif text.strip() and pending is not None and not is_table:
                problems.append(f"README line {pending[0]}: marker for {pending[1]} is not followed by its table")
                pending = None
            in_table = is_table
            sub.lines.append((number, text))
        if pending:
            problems.append(f"README line {pending[0]}: marker for {pending[1]} has no table after it")
    return [s for s in out if s.marked], problems


# ---------------------------------------------------------------------------------------------------------------
# Tables: cell by cell
# ---------------------------------------------------------------------------------------------------------------
def find_row(tables: list[Table], keys: dict[str, str], paper: bool) -> tuple[Table, list[str]] | str:
    """The one (table, row) with these key cells, among paper rows or the others; else a description of why not."""
    found = []
    for table in tables:
        ok = True
        for name, value in keys.items():
            col = table.column(name)
            if col is None:
                ok = ok and name == "seed" and value == "all"
        if not ok:
            continue
        for row in table.rows:
            if is_paper(row) != paper:
                continue
            if all(
                (table.column(n) is None) or row[table.column(n)].replace("**", "").strip() == v
                for n, v in keys.items()
            ):
                found.append((table, row))
    if len(found) != 1:
        return f"{len(found)} {'paper ' if paper else ''}rows with {keys}"
    return found[0]


def table_problems(path: str, quoted: Table, results: Path) -> list[str]:
    source = results / path
    if not source.exists():
        return [f"README line {quoted.line} quotes {path}, which is not committed under results/"]
    tables = tables_in(source.read_text().splitlines())
    labels = LABEL_ALIASES.get(path, {})
    problems = []
    key_cols = [i for i, h in enumerate(quoted.header) if h in KEYS]
    for offset, row in enumerate(quoted.rows):
        where = f"README line {quoted.line + 2 + offset} ({path})"
        keys = {quoted.header[i]: labels.get(row[i], row[i]).replace("**", "").strip() for i in key_cols}
        measured = find_row(tables, keys, paper=False)
        for i, name in enumerate(quoted.header):
            if i in key_cols:
                if row[i] in labels and isinstance(measured, tuple):  # a shortened label keeps its numbers
                    held = {n for cell in measured[1] for n in numbers(cell)}
                    problems += [f"{where}: {n} in the label {row[i]!r} is not in its row" for n in
                                 numbers(row[i]) if n not in held]  # fmt: skip
                continue
            target, paper = COLUMN_ALIASES.get(name, name), False
            if name.startswith("paper ") and not (isinstance(measured, tuple) and measured[0].column(target)):
                target, paper = COLUMN_ALIASES.get(name[6:], name[6:]), True
            found = find_row(tables, keys, paper=True) if paper else measured
            if isinstance(found, str):
                problems.append(f"{where}: column {name!r}: {found}")
                continue
            table, source_row = found
            columns = target if isinstance(target, tuple) else (target,)
            if any(table.column(c) is None for c in columns):
                problems.append(f"{where}: no column {target!r} in results/{path}")
                continue
            expected = [n for c in columns for n in numbers(source_row[table.column(c)])]
            if numbers(row[i]) != expected:
                problems.append(f"{where}: {keys} {name!r} is {row[i]!r}, results/{path} has {expected}")
    return problems


# ---------------------------------------------------------------------------------------------------------------
# Prose: numbers against the subsection's results files
# ---------------------------------------------------------------------------------------------------------------
@dataclass
class Pool:
    values: list[float]  # every number of the files
    percents: list[float]  # those that are percentages
    differences: list[float]  # differences of two cells in one percentage column (for pp)
    seeds: set[int]
    evaluations: set[int]  # evaluations per run in the archived records of the folders (empty: none archived)


def evaluation_counts(folders: set[str], archive: Path) -> set[int]:
    """How many evaluations each archived RL run of these folders holds, per evaluation set (base models aside)."""
    counts = set()
    for folder in folders:
        for done in (archive / folder).rglob("DONE"):
            run = done.parent
            if run.name.startswith("base_"):
                continue
            sets = [m.group(2) for f in run.iterdir() if (m := EVAL_RECORD.fullmatch(f.name))]
            counts |= {sets.count(name) for name in set(sets)}
    return counts


def pool_for(sub: Subsection, results: Path) -> Pool:
    files = sorted({f for path, _ in sub.marked for f in (results / path).parent.glob("*.md")})
    values, percents, differences, seeds = [], [], [], set()
    for f in files:
        lines = f.read_text().splitlines()
        for line in lines:
            if not line.lstrip().startswith("|"):
                values += [float(n.rstrip("%")) for n in CELL_NUMBER.findall(line)]
            percents += [float(n.rstrip("%")) for n in CELL_NUMBER.findall(line) if n.endswith("%")]
        for table in tables_in(lines):
            for col, name in enumerate(table.header):
                cells = [numbers(row[col]) for row in table.rows if col < len(row)]
                flat = [float(n.rstrip("%")) for c in cells for n in c]
                values += flat
                if name == "seeds":
                    seeds |= {int(float(c[0])) for c in cells if c}
                if PERCENT_HEADER.search(name):
                    percents += flat
                    firsts = [float(c[0].rstrip("%")) for c in cells if c]
                    differences += [a - b for a in firsts for b in firsts if a != b]
    folders = {Path(path).parts[1] for path, _ in sub.marked if len(Path(path).parts) > 2}
    return Pool(values, percents, differences, seeds, evaluation_counts(folders, results / "runs"))


def prose_sentences(sub: Subsection) -> list[tuple[int, str]]:
    """(first line, sentence) of the subsection's prose: no headings, tables, markers or inline code."""
    paragraphs, current, fenced = [], [], False
    for number, text in sub.lines:
        if text.lstrip().startswith("```"):
            fenced = not fenced
        skip = fenced or text.startswith("#") or text.lstrip().startswith("|") or MARKER.search(text)
        if skip or not text.strip():
            if current:
                paragraphs.append(current)
            current = []
            continue
        current.append((number, re.sub(r"`[^`]*`", "", text.strip())))
    if current:
        paragraphs.append(current)
    out = []
    for paragraph in paragraphs:
        text = " ".join(t for _, t in paragraph)
        for sentence in SENTENCE.split(text):
            line = next((n for n, t in paragraph if sentence[:30] in t), paragraph[0][0])
            if not re.match(r"(An e|E)arlier\b", sentence):
                out.append((line, sentence))
    return out


def matches(x: str, signed: bool, candidates: list[float]) -> bool:
    decimals = len(x.split(".")[1]) if "." in x else 0
    value, tolerance = float(x), 0.5 * 10**-decimals + 1e-9
    return any(abs(v - value) <= tolerance or (not signed and abs(-v - value) <= tolerance) for v in candidates)


def prose_problems(sub: Subsection, results: Path) -> list[str]:
    pool, problems = pool_for(sub, results), []
    for line, sentence in prose_sentences(sub):
        for m in PROSE_NUMBER.finditer(sentence):
            sign, digits = m.groups()
            after = sentence[m.end() :]
            unit = UNIT.match(after) or RANGE_END.match(after)
            unit = unit.group(1) if unit else None
            if (unit is None and "." not in digits) or (unit is None and TIME_UNIT.match(after)):
                continue
            x = sign + digits
            differences = pool.differences if unit == "pp" and not sign else []  # "7.28 pp below": two cells apart
            candidates = pool.values if unit is None else pool.percents + differences
            if not matches(x, bool(sign), candidates):
                kind = "percentage" if unit else "value"
                problems.append(f"README line {line}: {x}{unit or ''} is no {kind} of the files beside "
                                f"{[p for p, _ in sub.marked]} ({sentence[:80]!r}...)")  # fmt: skip
        for m in SEEDS.finditer(sentence):
            word = (m.group(2) or m.group(1)).lower()
            count = WORDS[word] if word in WORDS else int(word)
            if count not in pool.seeds:
                problems.append(f"README line {line}: '{m.group(0)}' but the tables have {sorted(pool.seeds)} seeds")
        for m in EVALUATIONS.finditer(sentence):
            word = m.group(1).lower()
            count = WORDS[word] if word in WORDS else int(word)
            if pool.evaluations and count not in pool.evaluations:
                problems.append(f"README line {line}: '{m.group(0)}' but the archived runs hold "
                                f"{sorted(pool.evaluations)} evaluations each")  # fmt: skip
    return problems


def readme_problems(readme: str, results: Path = ROOT / "results") -> list[str]:
    """Every disagreement between README's quoted numbers and the committed results files (empty: all agree)."""
    subsections, problems = results_subsections(readme)
    if not subsections:
        return ["README.md marks no measured table"]
    for sub in subsections:
        for path, table in sub.marked:
            problems += table_problems(path, table, results)
        problems += prose_problems(sub, results)
    return problems


# README.md and every docs page: the pages that quote measured tables (those with a marker) are checked alike.
DOC_FILES = [ROOT / "README.md", *sorted(ROOT.glob("docs/**/*.md"))]
PAGES = {p.relative_to(ROOT).as_posix(): p.read_text() for p in DOC_FILES}


@pytest.mark.parametrize("page", sorted(name for name, text in PAGES.items() if MARKER.search(text)))
def test_every_quoted_number_is_in_its_results_file(page):
    problems = readme_problems(PAGES[page])
    assert not problems, f"{page}:\n" + "\n".join(problems)


def test_readme_and_the_study_pages_quote_measured_tables():
    for page in ("README.md", "docs/classification.md", "docs/maze.md", "docs/math.md", "docs/sequential.md"):
        assert MARKER.search(PAGES[page]), f"{page} marks no measured table"


# ---------------------------------------------------------------------------------------------------------------
# Breaks that the previous version of this test let through, each on a mutated copy of the page that holds them
# ---------------------------------------------------------------------------------------------------------------
def page_with(old: str, count: int = 1) -> str:
    """The text of the one page that holds `old`, `count` times."""
    holders = [text for text in PAGES.values() if old in text]
    assert len(holders) == 1 and holders[0].count(old) == count, f"no page holds {old!r} {count} time(s); update it"
    return holders[0]


def mutated(old: str, new: str, count: int = 1) -> str:
    return page_with(old, count).replace(old, new)


def assert_caught(text: str, *expected: str):
    problems = readme_problems(text)
    assert problems, "the mutated README passed"
    for fragment in expected:
        assert any(fragment in p for p in problems), f"no problem mentions {fragment!r}: {problems}"


def row_of(prefix: str) -> str:
    (line,) = [line for text in PAGES.values() for line in text.splitlines() if line.startswith(prefix)]
    return line


def test_swapped_table_cells_are_caught():
    """MaxRL's and SERA's Pass@1 at n0 = 16 exchanged in Table 2."""
    maxrl, sera = row_of("| 16 | MaxRL | 76.73"), row_of("| 16 | SERA with pilots | **81.72**")
    text = mutated(maxrl, maxrl.replace("76.73", "81.72")).replace(sera, sera.replace("**81.72**", "**76.73**"))
    assert_caught(text, "'Pass@1' is '81.72'", "'Pass@1' is '**76.73**'")


def test_swapped_rows_are_caught():
    """The two SERA rows of Table 1 (math, the previous default's) exchange their numbers (each keeps its
    normalization label)."""
    token_label, seq_label = "| SERA with pilots (token-mean) |", "| SERA with pilots (seqnorm) |"
    token, seq = row_of(f"{token_label} 5 | 20.28 |"), row_of(f"{seq_label} 3 | 18.57 |")
    swap = {token: token_label + seq.split(seq_label)[1], seq: seq_label + token.split(token_label)[1]}
    text = "\n".join(swap.get(line, line) for line in page_with(token).splitlines())
    assert_caught(text, "'method': 'SERA with pilots (token-mean)'", "'method': 'SERA with pilots (seqnorm)'")


def test_relabelled_row_is_caught():
    """Table 5's k = 1 row relabelled as k = 128."""
    assert_caught(mutated("| token-mean | 1 | 1.11 |", "| token-mean | 128 | 1.11 |"), "'delta' is '1.11'")


def test_percentages_integers_and_seed_counts_in_tables_are_checked():
    sara_row = "| SARA | 3 | 2000 | 14300.1 | -61% |"
    assert_caught(mutated(sara_row, sara_row.replace("-61%", "-22%")), "'vs DS' is '-22%'")
    token_sera = row_of("| token-mean | SERA with pilots | 12 | 800 | 512.00 | 48.08 |")  # Table 4 (the default's)
    assert_caught(
        mutated(token_sera, token_sera.replace("| SERA with pilots | 12 |", "| SERA with pilots | 3 |")),
        "'seeds' is '3'",
    )


def test_a_marker_without_its_table_or_a_table_without_a_marker_is_caught():
    marker = "<!-- results: cpu/math-cpu/table5.md -->"
    assert_caught(mutated(marker + "\n", marker + "\nThe table:\n"), "is not followed by its table")
    assert_caught(mutated(marker + "\n", ""), "a table in the results section without a marker")
    last = "<!-- results: cpu/sara-cpu_sara/maze.md -->"
    page = page_with(last)
    assert_caught(page[: page.index(last)] + last + "\n", "has no table after it")


def test_numbers_in_the_prose_are_checked():
    assert_caught(
        mutated(
            "trained (the same per\n  gradient-carrying rollout) and 60.72%",
            "trained (the same per\n  gradient-carrying rollout) and 93.72%",
        ),
        "93.72%",
    )
    assert_caught(mutated("(+4.99 pp, seed", "(+4.39 pp, seed"), "+4.39pp")
    assert_caught(mutated("0.75 vs 0.52", "0.66 vs 0.52"), "0.66")
    # a sign is part of the number
    assert_caught(mutated("+0.80 [+0.04, +1.56] pp", "+0.80 [-0.04, +1.56] pp"), "-0.04 is no value")
    # a difference of two cells, mutated to a value that is no difference of two cells of the files beside (5.42 became
    # one when the tiny-math SARA table grew to 8 seeds: the rule accepts any such difference, so a check may miss one)
    assert_caught(mutated("by 5.37 pp", "by 5.47 pp"), "5.47pp")
    assert_caught(mutated("mean of 3 seeds", "mean of 5 seeds"), "'5 seeds'")
    assert_caught(mutated("on three seeds of five", "on three seeds of seven"), "'three seeds of seven'")


def test_timing_and_settings_are_out_of_scope():
    """A wall time, a setting and a model size may change without a results file: the rule does not read them."""
    for old, new in [("took 21.6 min", "took 25.1 min"), ("hidden 128, 1.05M", "hidden 128, 1.15M"),
                     ("batch 256, 2000 steps", "batch 128, 2000 steps")]:  # fmt: skip
        assert readme_problems(mutated(old, new)) == []


def test_a_count_of_evaluations_that_disagrees_with_the_records_is_caught():
    """The archived maze runs hold 8 evaluations each (steps 100-800); the text once said 9."""
    assert_caught(mutated("with its 8 evaluations", "with its 9 evaluations"), "'9 evaluations'")


def test_the_claims_table_of_readme_is_checked_cell_by_cell():
    row = row_of("| maze token-mean (pilot rule): SERA above MaxRL at Pass@32 |")
    cells = row.split(" | ")
    cells[2] = "+9.99 [+1.00, +19.00]"  # this suite's interval, made up
    assert_caught(mutated(row, " | ".join(cells)), "'this suite'")
