"""The studies' data files: rows read from and written to .jsonl / .parquet, and the one way a study loads a set by
name (the maze's `load_maze_set`, math's `load_dataset_spec`). A name in the study's registry reads its local copy
under the study's data folder, fetched from the hub only when asked (then written there, so later runs are offline);
any other name is a file path. No torch; pyarrow is imported only to read a .parquet file.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

SUFFIXES = (".jsonl", ".parquet")


def read_rows(path: Path) -> list[dict]:
    """The records of a .jsonl (one JSON object a line, blank lines skipped) or .parquet file."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    if path.suffix != ".jsonl":
        raise ValueError(f"{path}: expected a {' or '.join(SUFFIXES)} file")
    rows = []
    with path.open(encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as err:
                    raise ValueError(f"{path}:{line_no}: not a JSON object ({err.msg})") from None
    return rows


def write_jsonl(rows: list[dict], path: Path) -> None:
    """Write rows one JSON object a line (creating the folder)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")


def local_path(slug: str, split: str, data_dir: Path) -> Path:
    """Where a registry set's split is kept: <data_dir>/<slug>-<split>.jsonl (a .parquet of that name also serves)."""
    return Path(data_dir) / f"{slug}-{split}.jsonl"


def load_named(name: str, split: str | None, registry: Mapping[str, Any], data_dir: Path, *,
               read: Callable[[Path, Any], Any], fetch: Callable[[Any, str, Path], Any], allow_download: bool,
               loader: str, kind: str) -> Any:  # fmt: skip
    """A study's set by registry name, or a file. A registry name (`split` resolved: the study checks or defaults it)
    reads its local copy (local_path, or a .parquet of that name) with read(path, spec); missing, it is fetched only
    with `allow_download` (fetch(spec, split, path) returns the set and writes the copy there), else
    FileNotFoundError names the path, the hub dataset and the call `loader`(...) that fetches it. Any other name is a
    file path, read with read(path, None); a split there is a ValueError. `kind` names the registry's sets."""
    if name in registry:
        spec = registry[name]
        path = local_path(name, split, data_dir)
        for candidate in (path, path.with_suffix(".parquet")):
            if candidate.exists():
                return read(candidate, spec)
        if not allow_download:
            config = getattr(spec, "config", None)
            where = f"config {config}, split {split}" if config is not None else f"split {split}"
            raise FileNotFoundError(
                f"{path} not found: {name} is the hub dataset {spec.hub} ({where}). Fetch it once with "
                f"{loader}({name!r}, split={split!r}, allow_download=True) (network needed), which writes that file, "
                "or put a .jsonl/.parquet of it there."
            )
        return fetch(spec, split, path)
    if split is not None:
        raise ValueError(f"split={split!r} applies to the {kind} ({sorted(registry)}), not to a file path")
    path = Path(name)
    if not path.exists():
        raise FileNotFoundError(f"{path} not found (and {name!r} is not one of the {kind} {sorted(registry)})")
    return read(path, None)
