"""Maze sets from files or the hub: the SERA authors' maze set, read into the maze task's grids.

The authors' recipe trains on `capybaraczh/SERA-Maze-17x17` (7,424 training mazes subsampled from a larger set;
their held-out mazes in its test split). A row's prompt is whitespace-separated tokens, one a grid square between
GRID_START and GRID_END (WALL, PATH, START, GOAL, NEWLINE after each row), then PATH_START; the answer is moves then
DONE, as here. Start and goal lie anywhere on the grid, so a loaded grid marks them (experiments/maze/task.py:
START_CODE, GOAL_CODE); the maze task reads them from there.

    python -c "from experiments.maze.data import load_maze_set as l; l('sera-maze-17x17', 'train', allow_download=True)"

fetches a split once into data/maze/<slug>-<split>.jsonl (one {"grid": ["#S..#", ...]} a line); afterwards, and
offline, it is read from there. A missing file without allow_download is a FileNotFoundError naming the hub dataset.
A local .jsonl or .parquet file in either layout (the authors' rows or the grid rows) is read the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from experiments.maze.task import GOAL_CODE, START_CODE, solve
from sera.datafiles import load_named, read_rows, write_jsonl

DATA_DIR = Path(__file__).resolve().parents[2] / "data" / "maze"
SQUARES = {"WALL": 1, "PATH": 0, "START": START_CODE, "GOAL": GOAL_CODE}  # the authors' tokens -> grid codes
CHARS = {1: "#", 0: ".", START_CODE: "S", GOAL_CODE: "G"}  # the local file's rows


@dataclass(frozen=True)
class HubMazes:
    hub: str
    splits: tuple[str, ...]


# The hub id is the one the authors' README names; the row layout (a `prompt` of chat messages or text) follows their
# data preparation and MaxRL's maze reward, unverified against the hub here (no hub access on this machine).
REGISTRY = {"sera-maze-17x17": HubMazes("capybaraczh/SERA-Maze-17x17", ("train", "test"))}


def parse_grid(text: str) -> np.ndarray:
    """The grid of an authors' maze prompt (tokens between GRID_START and GRID_END); ValueError when it is not one
    rectangular grid with one start, one goal and a path between them."""
    tokens = text.split()
    if "GRID_START" not in tokens or "GRID_END" not in tokens:
        raise ValueError(f"no GRID_START ... GRID_END in the maze prompt {text[:80]!r}")
    body = tokens[tokens.index("GRID_START") + 1 : tokens.index("GRID_END")]
    rows, row = [], []
    for token in body:
        if token == "NEWLINE":
            rows.append(row)
            row = []
        elif token in SQUARES:
            row.append(SQUARES[token])
        else:
            raise ValueError(f"unknown grid token {token!r} in a maze prompt")
    if row:
        rows.append(row)
    return checked(rows)


def checked(rows: list[list[int]]) -> np.ndarray:
    if not rows or len({len(r) for r in rows}) != 1:
        raise ValueError("a maze grid must be rectangular and non-empty")
    grid = np.asarray(rows, dtype=np.uint8)
    if (grid == START_CODE).sum() != 1 or (grid == GOAL_CODE).sum() != 1:
        raise ValueError("a maze grid needs exactly one START and one GOAL")
    solve(grid)  # ValueError when the goal cannot be reached
    return grid


def prompt_text(row: dict) -> str:
    """A row's prompt as text: a string, or the contents of its chat messages joined."""
    prompt = row.get("prompt", row.get("question"))
    if prompt is None:
        raise ValueError(f"a maze row needs a 'prompt' (or 'question') field; it has {sorted(row)}")
    if isinstance(prompt, list | tuple):
        return " ".join(str(m.get("content", "")) for m in prompt)
    return str(prompt)


def grids_from_rows(rows: list[dict]) -> list[np.ndarray]:
    """Grids from rows in the local layout ({"grid": ["#S.", ...]}) or the authors' ({"prompt": ...})."""
    codes = {char: code for code, char in CHARS.items()}
    out = []
    for index, row in enumerate(rows):
        try:
            if "grid" in row:
                out.append(checked([[codes[c] for c in line] for line in row["grid"]]))
            else:
                out.append(parse_grid(prompt_text(row)))
        except (ValueError, KeyError) as err:
            raise ValueError(f"maze row {index}: {err}") from None
    return out


def load_maze_set(name_or_path: str | Path, split: str | None = None, *, data_dir: Path | None = None,
                  allow_download: bool = False) -> list[np.ndarray]:  # fmt: skip
    """The grids of a registry maze set's split (fetched from the hub only with allow_download, then kept in
    data_dir) or of a local .jsonl / .parquet file (sera.datafiles.load_named)."""
    name = str(name_or_path)
    if name in REGISTRY and split not in REGISTRY[name].splits:
        raise ValueError(f"{name} has the splits {REGISTRY[name].splits}, not {split!r}")

    def read(path: Path, _) -> list[np.ndarray]:
        return grids_from_rows(read_rows(path))

    def fetch(spec: HubMazes, split: str, path: Path) -> list[np.ndarray]:
        grids = grids_from_rows(_download(spec, split))
        write_jsonl([{"grid": ["".join(CHARS[int(v)] for v in row) for row in g]} for g in grids], path)
        return grids

    return load_named(name, split, REGISTRY, Path(data_dir or DATA_DIR), read=read, fetch=fetch,
                      allow_download=allow_download, loader="load_maze_set", kind="maze sets")  # fmt: skip


def _download(spec: HubMazes, split: str) -> list[dict]:
    import datasets

    return list(datasets.load_dataset(spec.hub, split=split))
