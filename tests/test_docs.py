"""The documentation ships with the code: the site builds in strict mode, and nothing in the repository points to a
file outside it (a clone must hold every document its code and pages cite)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# A relative path that climbs (../x), and the names of documents that lived beside the repository once.
CLIMB = re.compile(r"(?:\.\./)+[\w.-][\w./-]*")
OUTSIDE_NAMES = re.compile(r"\bshared/|\b(?:DESIGN|CALIBRATION|STYLE|TRL)\.md\b")
TEXT_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".txt", ".cfg", ".sh", ""}
SKIP_DIRS = {".git", ".venv", ".venv-vllm", "runs", "site", "outputs", "multirun", "__pycache__", ".hypothesis"}


def repository_files() -> list[Path]:
    """The repository's text files (git's list where git knows the tree, else a walk that skips outputs)."""
    try:
        names = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                               capture_output=True, text=True, check=True).stdout.split()  # fmt: skip
        files = [ROOT / n for n in names]
    except (OSError, subprocess.CalledProcessError):
        files = [p for p in ROOT.rglob("*") if not SKIP_DIRS & set(p.relative_to(ROOT).parts)]
    return [f for f in files if f.is_file() and f.suffix in TEXT_SUFFIXES and "results/runs" not in f.as_posix()]


def outside_references(path: Path, text: str) -> list[str]:
    """Each place in `text` (the file at `path`) that names a file above the repository root."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for match in CLIMB.finditer(line):
            target = (path.parent / match.group(0)).resolve()
            if ROOT not in (target, *target.parents):
                found.append(f"{path.relative_to(ROOT)}:{number}: {match.group(0)}")
        found += [f"{path.relative_to(ROOT)}:{number}: {m.group(0)}" for m in OUTSIDE_NAMES.finditer(line)]
    return found


def test_nothing_points_outside_the_repository():
    this = Path(__file__).resolve()
    problems = [p for f in repository_files() if f.resolve() != this for p in outside_references(f, f.read_text())]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(
    "line, caught",
    [("see ../shared/DESIGN.md section 4", True), ("docs/design.md section 4", False), ("as CALIBRATION.md says", True),
     ("from ../../elsewhere/notes.txt", True), ("[the design](design.md)", False), ("a ../README.md link", False)],
)  # fmt: skip
def test_the_outside_check_catches_what_it_should(line, caught):
    assert bool(outside_references(ROOT / "docs" / "page.md", line)) == caught


def test_the_site_builds_in_strict_mode(tmp_path):
    """mkdocs --strict: a broken link, a missing page or a page left out of the nav fails the build."""
    out = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-d", str(tmp_path)],
                         cwd=ROOT, capture_output=True, text=True)  # fmt: skip
    assert out.returncode == 0, out.stderr
    built = {p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("index.html")}
    assert {"index.html", "design/index.html", "maze/index.html", "numerics/index.html"} <= built


def code_and_output(page: str, heading: str = "") -> tuple[str, str]:
    """The first python block of a page (from its section `heading` on, when given) and the text block that follows
    it: the code and what the page says it prints. A text block alone (no python block) comes back with code ''."""
    text = (ROOT / page).read_text()
    if heading:
        text = text.split(heading, 1)[1].split("\n## ", 1)[0]
    found = re.search(r"(?:```python\n(.*?)```\n)?```text\n(.*?)```", text, re.S)
    assert found, f"{page}{' ' + heading if heading else ''} shows no text block of output"
    return found[1] or "", found[2]


def test_the_readme_quick_start_prints_what_it_shows(capsys):
    """README's quick start: its python block, run as written, prints exactly the text block below it."""
    code, shown = code_and_output("README.md", "## Quick start")
    exec(compile(code, "README.md", "exec"), {})  # noqa: S102 - the README's own example
    assert capsys.readouterr().out == shown
