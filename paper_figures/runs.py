"""Reading run directories for tables and figures: robust to the folders real work leaves behind.

A run directory holds config.yaml, metrics.jsonl and (when finished) DONE. Corrupt JSONL lines are reported with
file and line and skipped; unfinished runs are kept but marked; runs whose settings differ (budget, steps, scale)
are never averaged together: `group_runs` keys them by every config value except the seed. No torch.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

# Config keys that do not change what a run measures (so runs differing only in these may share a row).
NON_RESULT_KEYS = ("seed", "threads", "progress", "wandb", "device", "run", "data.workers")


@dataclass
class Run:
    path: Path
    config: dict
    records: list[dict]
    finished: bool
    problems: list[str] = field(default_factory=list)

    def get(self, dotted: str, default=None):
        """A config value by dotted key, e.g. run.get('method.name')."""
        node = self.config
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node

    def series(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        """(steps, values) of a metric over the records that carry it (None values skipped)."""
        pairs = [(r["step"], r[key]) for r in self.records if r.get(key) is not None]
        if not pairs:
            return np.array([], dtype=int), np.array([])
        steps, values = zip(*pairs, strict=True)
        return np.asarray(steps), np.asarray(values, dtype=float)

    def last(self, key: str):
        """The last logged value of a metric, or None."""
        _, values = self.series(key)
        return float(values[-1]) if values.size else None


def read_jsonl(path: Path) -> tuple[list[dict], list[str]]:
    """Records of a JSONL file, and one message per corrupt line (file:line: reason), which is skipped."""
    records, problems = [], []
    with open(path) as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                if not isinstance(record, dict) or "step" not in record:
                    raise ValueError("not a JSON object with a 'step'")
                records.append(record)
            except ValueError as err:
                problems.append(f"{path}:{number}: corrupt line skipped ({err})")
    return records, problems


def load_run(path: Path) -> Run:
    config = yaml.safe_load((path / "config.yaml").read_text()) or {}
    metrics = path / "metrics.jsonl"
    records, problems = read_jsonl(metrics) if metrics.exists() else ([], [f"{path}: no metrics.jsonl"])
    return Run(path, config, records, (path / "DONE").exists(), problems)


def load_runs(root: str | Path, report=None) -> list[Run]:
    """Every run directory (a folder with config.yaml) under root, problems reported to `report` (stderr)."""
    report = report or sys.stderr
    root = Path(root)
    if not root.exists():
        return []
    runs = [load_run(p.parent) for p in sorted(root.rglob("config.yaml")) if ".sweeps" not in p.parts]
    for run in runs:
        for problem in run.problems:
            print(problem, file=report)
        if not run.finished:
            print(f"{run.path}: unfinished (no DONE); its cells are marked", file=report)
    return runs


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v if not isinstance(v, list) else tuple(v)
    return out


def setting(run: Run) -> tuple:
    """Everything in the config that changes results, except the seed: runs with equal settings are seeds of one row."""
    flat = _flatten(run.config)
    keep = {k: v for k, v in flat.items() if not any(k == n or k.startswith(n + ".") for n in NON_RESULT_KEYS)}
    return tuple(sorted(keep.items()))


def group_runs(runs: list[Run]) -> list[list[Run]]:
    """Runs grouped by setting (seeds of one configuration together), in first-seen order."""
    groups: dict[tuple, list[Run]] = {}
    for run in runs:
        groups.setdefault(setting(run), []).append(run)
    return list(groups.values())


def differing_keys(groups: list[list[Run]]) -> list[str]:
    """Config keys whose values differ between the given groups (to label rows that would otherwise collide)."""
    flats = [dict(setting(g[0])) for g in groups]
    keys = set().union(*flats) if flats else set()
    return sorted(k for k in keys if len({repr(f.get(k)) for f in flats}) > 1)


def label_groups(groups: list[list[Run]], row_label, key=lambda g: None) -> list[tuple[str, list[Run]]]:
    """(label, group) rows. Groups that would share a row (same key and label, other settings: steps, budget,
    scale...) are kept apart, with the differing settings added to their labels and a message on stderr."""
    by_row: dict[tuple, list[list[Run]]] = {}
    for g in groups:
        by_row.setdefault((repr(key(g)), row_label(g)), []).append(g)
    out = []
    for same in by_row.values():
        keys = differing_keys(same) if len(same) > 1 else []
        if keys:
            print(f"rows kept apart, settings differ in {keys}: {[str(g[0].path) for g in same]}", file=sys.stderr)
        for g in same:
            extra = ", ".join(f"{k}={dict(setting(g[0])).get(k)}" for k in keys)
            out.append((row_label(g, extra) if extra else row_label(g), g))
    return out
