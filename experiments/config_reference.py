"""The config reference (docs/reference/config.md), generated from configs/: every key of each study's composed
default config with its default and the comment that explains it, and every option of the `method` and `scale` groups
with the keys it sets. `make docs` writes it; `--check` (and tests/test_config_reference.py) fails when the committed
page no longer matches configs/.

    python -m experiments.config_reference [--check] [--out docs/reference/config.md]
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from sera.methods import get_method

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
OUT = ROOT / "docs" / "reference" / "config.md"
STUDIES = ("imagenet", "maze", "math")
# where a study's keys are explained, most specific first: the study's file, then the files it composes
_SOURCES = {
    "imagenet": ("imagenet.yaml", "base.yaml", "method/common.yaml"),
    "maze": ("maze.yaml", "lm.yaml", "base.yaml", "method/common.yaml"),
    "math": ("math.yaml", "lm.yaml", "base.yaml", "method/common.yaml"),
}
_KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z_][\w+\-]*):(?P<rest>.*)$")


def _split_comment(text: str) -> tuple[str, str | None, int]:
    """A YAML line's value and its trailing comment (outside quotes), and the comment's column (-1 if none)."""
    quote = None
    for i, ch in enumerate(text):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or text[i - 1] == " "):
            return text[:i].rstrip(), text[i + 1 :].strip(), i
    return text.rstrip(), None, -1


def comments(path: Path) -> dict[str, str]:
    """Each key path's explanation in a block-style YAML file: its trailing comment, continued by comment-only lines
    aligned with it. Keys inside flow mappings ({a: 1}) and the `defaults` list are not described."""
    found: dict[str, str] = {}
    stack: list[tuple[int, str]] = []  # (indent, key) of the enclosing mappings
    last_key, last_col = None, -1
    for line in path.read_text().splitlines():
        stripped = line.lstrip(" ")
        if stripped.startswith("#"):
            col = len(line) - len(stripped)
            if last_key is not None and col == last_col:  # a comment continued on its own line
                found[last_key] += " " + stripped[1:].strip()
            continue
        match = _KEY.match(line)
        if not match:
            last_key = None
            continue
        indent = len(match["indent"])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        key = ".".join([k for _, k in stack] + [match["key"]])
        value, comment, col = _split_comment(match["rest"])
        if not value:
            stack.append((indent, match["key"]))
        if comment is not None:
            found[key] = comment
            last_key, last_col = key, col + len(line) - len(match["rest"])
        else:
            last_key = None
    return found


def header(path: Path) -> str:
    """The first comment block of a config file (after `# @package`), joined into one paragraph."""
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            if lines:
                break
            continue
        text = line[1:].strip()
        if not text.startswith("@package"):
            lines.append(text)
    return " ".join(lines)


def _flatten(node, prefix: str = "") -> dict[str, object]:
    if isinstance(node, dict) and node:
        out: dict[str, object] = {}
        for key, value in node.items():
            out.update(_flatten(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: node}


def _yaml(value) -> str:
    """A value as it would be written in a config file, on one line."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return "[" + ", ".join(_yaml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_yaml(v)}" for k, v in value.items()) + "}"
    return str(value)


def _show(value) -> str:
    return "`" + _yaml(value).replace("|", "\\|") + "`"


def _cell(text: str) -> str:
    """Text safe inside a Markdown table cell (no column breaks, no HTML tags)."""
    return text.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def composed(study: str) -> dict[str, object]:
    """A study's default config as its entry point composes it (no overrides), flattened; `hydra` left out."""
    with initialize_config_dir(config_dir=str(CONFIGS), version_base=None):
        cfg = compose(config_name=study)
    return _flatten(OmegaConf.to_container(cfg, resolve=False))


def _group_options(group: str) -> list[Path]:
    return sorted(p for p in (CONFIGS / group).rglob("*.yaml") if p.name != "common.yaml")


def render() -> str:
    out = [
        "# Config reference",
        "",
        "Generated from `configs/` by `python -m experiments.config_reference` (run by `make docs`; a test fails when",
        "this page and the files disagree). Each entry point composes `configs/<study>.yaml` with Hydra: a study file,",
        "the shared files it names (`lm.yaml`, `base.yaml`), one option of the `method` group and one of the `scale`",
        "group. Any key is set on the command line (`key=value`), any option chosen by `group=option`",
        "([Running experiments](../running.md)). Checks of the values live in each entry point's `validate()`; bad",
        "values are refused before any work starts.",
        "",
    ]
    for study in STUDIES:
        explained: dict[str, str] = {}
        for source in reversed(_SOURCES[study]):
            prefix = "method." if source.startswith("method/") else ""  # the group's package
            explained.update({prefix + k: v for k, v in comments(CONFIGS / source).items()})
        cfg = composed(study)
        out += [
            f"## `{study}`: the default config",
            "",
            f"`python -m experiments.{study}.train` with no overrides.",
            "",
        ]
        out += ["| key | default | meaning |", "|---|---|---|"]
        for key, value in cfg.items():
            if key.split(".")[0] == "hydra":
                continue
            meaning = explained.get(key) or _nearest(explained, key)
            out.append(f"| `{key}` | {_show(value)} | {_cell(meaning)} |")
        out.append("")
    for group, title in (("method", "methods"), ("scale", "scales")):
        out += [f"## The `{group}` group: {title}", ""]
        out += ["| option | what it is | keys it sets |", "|---|---|---|"]
        for path in _group_options(group):
            option = path.relative_to(CONFIGS / group).with_suffix("").as_posix()
            sets = _flatten(OmegaConf.to_container(OmegaConf.load(path), resolve=False))
            sets.pop("defaults", None)
            keys = ", ".join(f"`{k}={_yaml(v)}`" for k, v in sets.items() if k)
            what = _method_summary(path) if group == "method" else header(path)
            out.append(f"| `{option}` | {_cell(what)} | {_cell(keys)} |")
        out.append("")
    return "\n".join(out)


def _method_summary(path: Path) -> str:
    """A method option: its registry entry (sera.methods.METHODS) in words, then the comment on its `name` key."""
    method = get_method(OmegaConf.load(path).name)
    parts = [f"**{method.label}**", f"advantage {method.advantage or 'none (exact likelihood)'}"]
    parts.append(f"allocation {method.allocator}")
    if method.estimator != "none":
        parts.append(f"p_hat {method.estimator}" + (f" ({method.pilot_m} pilots)" if method.pilot_m else ""))
    if method.multiplicity_correction:
        parts.append("weights n0 / n_i")
    note = comments(path).get("name")
    return ", ".join(parts) + (f". {note[0].upper()}{note[1:]}" if note else "")


def _nearest(explained: dict[str, str], key: str) -> str:
    """A key without a comment of its own (for example inside a flow mapping): its parent's comment, marked as such."""
    parts = key.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        parent = ".".join(parts[:cut])
        if parent in explained:
            return f"(in `{parent}`: {explained[parent]})"
    return ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the page differs from what configs/ gives")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    text = render() + "\n"
    if args.check:
        if not args.out.exists() or args.out.read_text() != text:
            print(f"{args.out} is out of date: run python -m experiments.config_reference", file=sys.stderr)
            return 1
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
