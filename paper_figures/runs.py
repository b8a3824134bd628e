"""Reading run directories for tables and figures: robust to the folders real work leaves behind. No torch.

A run directory holds the files named in sera.runlog (config, metrics, DONE, and per-question evaluation records
or val_p.npy). The rules every table follows, so that none reports a wrong number:
- A corrupt JSONL line (bad JSON, no step, a non-UTF-8 byte) is reported with file and line and skipped.
- A finished run whose last metrics line is corrupt, or any run whose newest per-question record is unreadable, has
  lost its final evaluation: it contributes nothing, its row is tagged "corrupt final record", and stderr says why.
  An earlier evaluation is never used in its place.
- Only runs with results count as seeds; a folder with only config.yaml is an unfinished run with no numbers. Rows
  with an unfinished run are tagged "unfinished".
- NaN (logged as null) and infinities (logged as "inf"/"-inf") are read as such and shown as "nan"/"inf".
- Runs whose settings differ (budget, steps, scale) are never averaged together: `group_runs` keys them by every
  config value except the seed, and `label_groups` keeps rows that would collide apart.
- Pairing for SERA-minus-MaxRL intervals: per-question records pair by question id (`pair_by_question`). Data that
  cannot be paired (different question ids or array lengths) is an error naming the runs: no table should be built
  over such runs. An ambiguous pairing (two differently configured SERA or MaxRL groups for one partner, e.g. two
  step counts) is a legitimate state of a scale folder, so `baseline_pair` refuses it with a "refused: ..." cell
  and names both groups' run paths on stderr, and the rest of the tables are still built.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

from sera.identity import result_settings
from sera.methods import METHODS, current_names
from sera.passk import pass_at_k
from sera.runlog import CONFIG_FILE, DONE_FILE, EVAL_RECORD, METRICS_FILE, SET_ASIDE

# Config keys that do not change what a run measures (so runs differing only in these may share a row).
CORRUPT_FINAL = "corrupt final record"
UNFINISHED = "unfinished"
# libyaml's parser where PyYAML has it (the same documents, about ten times faster than the pure-Python one)
YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_loaded: dict[Path, tuple[tuple, Run]] | None = None  # load_run's runs while read_once() is open


@dataclass
class Run:
    path: Path
    config: dict
    records: list[dict]  # metrics.jsonl, one dict a line
    finished: bool
    problems: list[str] = field(default_factory=list)
    eval_records: dict[str, dict] = field(default_factory=dict)  # set -> newest record {"ids", "n", "correct"}
    corrupt_final: bool = False  # final evaluation lost: a finished run's last line, or a newest record, is corrupt

    def get(self, dotted: str, default=None):
        """A config value by dotted key, e.g. run.get('method.name')."""
        node = self.config
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node

    def series(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        """(steps, values) of a metric over the records that carry it; null reads as NaN, "inf"/"-inf" as such."""
        pairs = [(r["step"], np.nan if r[key] is None else float(r[key])) for r in self.records if key in r]
        if not pairs:
            return np.array([], dtype=int), np.array([])
        steps, values = zip(*pairs, strict=True)
        return np.asarray(steps), np.asarray(values, dtype=float)

    def last(self, key: str) -> float | None:
        """The last logged value of a metric (NaN if logged as null), or None when never logged."""
        _, values = self.series(key)
        return float(values[-1]) if values.size else None


def method_label(name: str) -> str:
    """The paper's display name of a method (sera.methods registry), or the raw name for one not in it."""
    return METHODS[name].label if name in METHODS else str(name)


def method_order(name: str) -> int:
    """Position of a method in the registry (the paper's row order); unknown names last."""
    return list(METHODS).index(name) if name in METHODS else len(METHODS)


def method_setting(run: Run, key: str):
    """A method setting of the run (e.g. 'estimator', 'pilot_m'), its default filled in where the config is null, as
    run identity reads it (sera.identity.result_settings)."""
    return result_settings(run.config).get(f"method.{key}")


def read_jsonl(path: Path) -> tuple[list[dict], list[str], bool]:
    """Records of a JSONL file, one message per corrupt line (file:line: reason), which is skipped, and whether the
    last non-empty line was corrupt."""
    records, problems, last_corrupt = [], [], False
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            try:
                record = json.loads(raw.decode("utf-8"))  # UnicodeDecodeError is a ValueError
                if not isinstance(record, dict) or "step" not in record:
                    raise ValueError("not a JSON object with a 'step'")
                records.append(record)
                last_corrupt = False
            except ValueError as err:
                problems.append(f"{path}:{number}: corrupt line skipped ({err})")
                last_corrupt = True
    return records, problems, last_corrupt


def read_eval_records(path: Path) -> tuple[dict[str, dict], list[str]]:
    """The newest per-question record of each evaluation set in a run directory, and messages for unreadable ones
    (an unreadable newest record is not replaced by an older one)."""
    newest: dict[str, tuple[int, Path]] = {}
    for file in path.iterdir():
        if match := EVAL_RECORD.fullmatch(file.name):
            step, eval_set = int(match.group(1)), match.group(2)
            if eval_set not in newest or step > newest[eval_set][0]:
                newest[eval_set] = (step, file)
    records, problems = {}, []
    for eval_set, (_, file) in sorted(newest.items()):
        try:
            record = json.loads(file.read_bytes().decode("utf-8"))
            if not isinstance(record, dict) or "n" not in record or len(record["ids"]) != len(record["correct"]):
                raise ValueError("not {ids, n, correct} with one count per id")
            records[eval_set] = record
        except (ValueError, TypeError, KeyError) as err:
            problems.append(
                f"{file}: unreadable per-question record ({err}), so the run's final {eval_set} evaluation is lost: "
                f"the run is left out and its row marked '{CORRUPT_FINAL}'"
            )
    return records, problems


@contextmanager
def read_once() -> Iterator[None]:
    """Within this block load_run reads a run directory once and hands out the same Run again while the directory's
    files stay as they were (names, sizes, modification times): a table command builds many tables from the same
    runs (make tables read each run about four times). Callers never change a Run. Nested blocks share the outer
    one's runs; leaving the outermost lets them go."""
    global _loaded
    outer = _loaded
    _loaded = {} if outer is None else outer
    try:
        yield
    finally:
        _loaded = outer


def file_states(path: Path) -> tuple:
    """(name, size, modification time) of each file in a run directory, sorted."""
    return tuple(sorted((f.name, s.st_size, s.st_mtime_ns) for f in path.iterdir() if f.is_file() for s in [f.stat()]))


def load_run(path: Path) -> Run:
    if _loaded is None:
        return read_run(path)
    states = file_states(path)
    if (kept := _loaded.get(path)) is not None and kept[0] == states:
        return kept[1]
    run = read_run(path)
    _loaded[path] = (states, run)
    return run


def read_run(path: Path) -> Run:
    config = current_names(yaml.load((path / CONFIG_FILE).read_text(), Loader=YAML_LOADER) or {})  # today's names
    finished = (path / DONE_FILE).exists()
    metrics = path / METRICS_FILE
    records, problems, last_corrupt = (
        read_jsonl(metrics) if metrics.exists() else ([], [f"{path}: no {METRICS_FILE}"], False)
    )
    eval_records, record_problems = read_eval_records(path)
    problems += record_problems
    if finished and last_corrupt:
        problems.append(
            f"{metrics}: the last line of a finished run is corrupt, so its final evaluation is lost: the run is left "
            f"out and its row marked '{CORRUPT_FINAL}'"
        )
    corrupt_final = bool(record_problems) or (finished and last_corrupt)
    return Run(path, config, records, finished, problems, eval_records, corrupt_final)


def load_runs(root: str | Path, report=None) -> list[Run]:
    """Every run directory (a folder with config.yaml) under root, problems reported to `report` (stderr)."""
    report = report or sys.stderr
    root = Path(root)
    if not root.exists():
        return []
    runs = [
        load_run(p.parent)
        for p in sorted(root.rglob(CONFIG_FILE))
        if ".sweeps" not in p.parts and not p.parent.name.endswith(SET_ASIDE)  # not a base set aside for a retrain
    ]
    for run in runs:
        for problem in run.problems:
            print(problem, file=report)
        if not run.finished:
            print(f"{run.path}: unfinished (no DONE); its row is marked", file=report)
    return runs


def with_results(group: list[Run], has_result) -> list[Run]:
    """The runs of a group that contribute numbers (the seeds a row counts): those with a result whose final
    evaluation is not lost."""
    return [r for r in group if not r.corrupt_final and has_result(r)]


def status_tags(group: list[Run]) -> list[str]:
    """Row tags for runs whose numbers are missing or partial."""
    tags = []
    if any(r.corrupt_final for r in group):
        tags.append(CORRUPT_FINAL)
    if not all(r.finished for r in group):
        tags.append(UNFINISHED)
    return tags


def trainer_tag(run: Run) -> str:
    """'TRL' for a run trained by SERA inside TRL (examples/trl_math.py, examples/trl_maze.py), else ''."""
    return "TRL" if run.get("trainer") == "trl" else ""


def tagged(label: str, tags: list[str]) -> str:
    """A row label with its non-empty tags in brackets: 'SERA (m=2, unfinished)'."""
    tags = [t for t in tags if t]
    return label + (f" ({', '.join(tags)})" if tags else "")


def mean_over(runs: list[Run], fn) -> float | None:
    """Mean of fn(run) over the runs where it is not None (NaN stays NaN), or None."""
    values = [v for v in (fn(r) for r in runs) if v is not None]
    return float(np.mean(values)) if values else None


def setting(run: Run) -> tuple:
    """Everything in the config that changes results, except the seed: runs with equal settings are seeds of one row.
    The same settings that name a run's folder and refuse a different config in it (sera.identity.result_settings):
    settings a run does not read, and settings added later at their old value, are left out, so runs made before
    such a setting existed group with runs made after."""
    return tuple(sorted((k, v) for k, v in result_settings(run.config).items() if k != "seed"))


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


def tested_methods() -> list[str]:
    """The methods the tables test against a baseline (the registry's `baseline`), in registry order."""
    return [m.name for m in METHODS.values() if m.baseline]


def verdict_methods(groups: list[list[Run]]) -> list[str]:
    """The tested methods (registry baselines) among the groups, in registry order; the first (SERA) when none ran,
    so a verdict table still shows its header."""
    names = {g[0].get("method.name") for g in groups}
    return [n for n in tested_methods() if n in names] or tested_methods()[:1]


def paper_row_method(name: str, ran: set[str]) -> str:
    """The method whose rows a paper row of method `name` sits beside: `name` where it ran (or has no baseline), else
    the first tested method, in registry order, against the same baseline that ran, or that could (SERA with pilots
    in the place of the authors' SERA on a grid made before it)."""
    baseline = METHODS[name].baseline
    if name in ran or baseline is None:
        return name
    kin = [m for m in tested_methods() if METHODS[m].baseline == baseline]
    return next((m for m in kin if m in ran), kin[0])


def tested_and_baselines() -> set[str]:
    """The tested methods and their baselines (SERA and MaxRL): the rows the regime figures draw."""
    return {n for m in tested_methods() for n in (m, METHODS[m].baseline)}


def baseline_pair(groups: list[list[Run]], where: str, name: str) -> tuple[list[Run], list[Run]] | str | None:
    """The (method, its registry baseline) groups to compare among `groups` (already narrowed to one n0 or
    normalisation, and to groups with results); None when either is missing; a "refused: ..." cell when two
    differently configured groups of one method would be paired with the same partner (stderr then names both
    groups' run paths)."""
    pair = (name, METHODS[name].baseline)
    found = {m: [g for g in groups if g[0].get("method.name") == m] for m in pair}
    for name, candidates in found.items():
        if len(candidates) > 1:
            keys = ", ".join(differing_keys(candidates))
            paths = " | ".join(", ".join(str(r.path) for r in g) for g in candidates)
            message = f"{len(candidates)} {method_label(name)} groups differ in {keys}"
            print(f"{where}: refused to pair, {message}: {paths}", file=sys.stderr)
            names = " vs ".join(g[0].path.name for g in candidates)
            return f"refused: {message} ({names})"
    if not found[pair[0]] or not found[pair[1]]:
        return None
    return found[pair[0]][0], found[pair[1]][0]


@dataclass
class PerQuestion:
    """Pass@k per question of one group on one evaluation set, averaged over its seeds."""

    ids: tuple  # question ids, sorted
    ks: list[int]  # the k every seed's sample count allows
    values: np.ndarray  # (questions, len(ks)); NaN where a count was NaN
    runs: list[Run]  # the seeds that contributed


def _passk_per_question(record: dict, ks: list[int]) -> tuple[tuple, np.ndarray]:
    """(sorted ids, (questions, K) Pass@k in that order) of one record; a NaN (or null) count gives NaN."""
    order = sorted(range(len(record["ids"])), key=lambda i: record["ids"][i])
    counts = np.array([np.nan if record["correct"][i] is None else record["correct"][i] for i in order], dtype=float)
    values = np.full((counts.size, len(ks)), np.nan)
    finite = np.isfinite(counts)
    values[finite] = pass_at_k(record["n"], counts[finite].astype(np.int64), ks)
    return tuple(record["ids"][i] for i in order), values


def per_question(runs: list[Run], eval_set: str, ks: list[int]) -> PerQuestion | None:
    """Pass@k per question (sorted by id) from each run's newest record on `eval_set`, averaged over the runs that
    have one; None when none has. Seeds evaluated on different questions are an error naming them."""
    runs = with_results(runs, lambda r: eval_set in r.eval_records)
    if not runs:
        return None
    usable = [k for k in ks if k <= min(r.eval_records[eval_set]["n"] for r in runs)]
    per_run = [_passk_per_question(r.eval_records[eval_set], usable) for r in runs]
    if len({ids for ids, _ in per_run}) > 1:
        sizes = ", ".join(f"{r.path} ({len(ids)} questions)" for r, (ids, _) in zip(runs, per_run, strict=True))
        raise ValueError(f"seeds of one setting evaluated different {eval_set} questions: {sizes}")
    return PerQuestion(per_run[0][0], usable, np.mean([v for _, v in per_run], axis=0), runs)


def pair_by_question(a: PerQuestion, b: PerQuestion, what: str) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """(a values, b values, ks): the two groups' per-question Pass@k aligned by question id over the k both allow.
    Different question-id sets are an error naming the runs of both."""
    if a.ids != b.ids:
        only_a, only_b = len(set(a.ids) - set(b.ids)), len(set(b.ids) - set(a.ids))
        raise ValueError(
            f"{what}: refusing to pair runs evaluated on different questions ({only_a} ids only in "
            f"{[str(r.path) for r in a.runs]}, {only_b} only in {[str(r.path) for r in b.runs]})"
        )
    ks = [k for k in a.ks if k in b.ks]
    return a.values[:, [a.ks.index(k) for k in ks]], b.values[:, [b.ks.index(k) for k in ks]], ks


def seed_differences(a: list[Run], b: list[Run], eval_set: str | None, ks: list[int], what: str, questions=None):
    """Per seed that both groups ran: the mean over questions of a's minus b's Pass@k. Returns (seeds, ks,
    diffs (S, K)), the unit of the seed-level interval (sera.stats.seed_t_interval); (seeds [], ks, None) when no seed
    is shared. `questions(runs, ks) -> PerQuestion | None` reads a seed's per-question Pass@k (default: the newest
    record on `eval_set`, per_question)."""
    questions = questions or (lambda runs, ks: per_question(runs, eval_set, ks))
    seeds, rows, common = [], [], ks
    for seed in sorted({r.get("seed") for r in a} & {r.get("seed") for r in b}):
        x = questions([r for r in a if r.get("seed") == seed], ks)
        y = questions([r for r in b if r.get("seed") == seed], ks)
        if x is None or y is None:
            continue
        xv, yv, common = pair_by_question(x, y, f"{what}, seed {seed}")
        seeds.append(seed)
        rows.append((xv - yv).mean(axis=0))
    if len({len(r) for r in rows}) > 1:  # seeds whose sample counts allow different k: keep the k all allow
        width = min(len(r) for r in rows)
        rows, common = [r[:width] for r in rows], common[:width]
    return seeds, common, (np.stack(rows) if rows else None)
