"""The generated config reference (docs/reference/config.md): current, complete, and read from the files correctly."""

from pathlib import Path

from experiments import config_reference as ref


def test_committed_page_is_what_the_configs_give():
    assert ref.main(["--check"]) == 0, "run: python -m experiments.config_reference"


def test_check_fails_on_a_stale_page(tmp_path: Path, capsys):
    stale = tmp_path / "config.md"
    stale.write_text(ref.OUT.read_text().replace("| `seed` | `0` |", "| `seed` | `1` |", 1))
    assert ref.main(["--check", "--out", str(stale)]) == 1
    assert "out of date" in capsys.readouterr().err
    assert ref.main(["--check", "--out", str(tmp_path / "missing.md")]) == 1


def test_every_key_of_every_study_is_explained():
    page = ref.render()
    for study in ref.STUDIES:
        keys = [k for k in ref.composed(study) if not k.startswith("hydra")]
        assert len(keys) > 40
        section = page.split(f"## `{study}`: the default config")[1].split("\n## ")[0]
        rows = [line for line in section.splitlines() if line.startswith("| `")]
        assert [row.split("`")[1] for row in rows] == keys
        unexplained = [row for row in rows if row.rstrip().endswith("|  |")]
        assert not unexplained, f"{study}: keys without a comment in configs/: {unexplained}"


def test_comments_are_read_with_their_key_paths(tmp_path: Path):
    path = tmp_path / "x.yaml"
    path.write_text(
        "# header\n"
        "top: 1            # the top\n"
        "group:            # a group\n"
        "  inner: 'a # b'  # quoted hash kept out\n"
        "                  # continued here\n"
        "  deeper:\n"
        "    leaf: null    # a leaf\n"
        "  # a section comment, not a continuation\n"
        "  flow: {a: 1}    # a flow mapping\n"
        "other: 2\n"
        "                  # not continuing `other`, which has no comment\n"
    )
    assert ref.comments(path) == {
        "top": "the top",
        "group": "a group",
        "group.inner": "quoted hash kept out continued here",
        "group.deeper.leaf": "a leaf",
        "group.flow": "a flow mapping",
    }
    assert ref.header(path) == "header"
    assert ref._nearest({"group.flow": "a flow mapping"}, "group.flow.a") == "(in `group.flow`: a flow mapping)"


def test_method_rows_come_from_the_registry():
    page = ref.render()
    row = next(line for line in page.splitlines() if line.startswith("| `sera_pilot` |"))
    assert "**SERA with pilots**" in row and "allocation waterline" in row and "8 pilots" in row
    assert "`name=sera_pilot`" in row
