"""Maze sets (experiments/maze/data.py): the authors' token layout read into grids whose start and goal lie anywhere,
the hub set fetched only when asked and read offline afterwards, and the maze task training and scoring on them."""

import json
from pathlib import Path

import numpy as np
import pytest

from experiments.maze import data
from experiments.maze import task as maze
from experiments.maze.data import load_maze_set, parse_grid

TOKENS = {1: "WALL", 0: "PATH", maze.START_CODE: "START", maze.GOAL_CODE: "GOAL"}
CONFIGS = str(Path(__file__).resolve().parents[1] / "configs")


def authors_prompt(grid: np.ndarray) -> str:
    """A maze in the authors' layout (their data preparation and MaxRL's maze reward describe it)."""
    rows = " ".join(" ".join(TOKENS[int(v)] for v in row) + " NEWLINE" for row in grid)
    return f"<bos> GRID_START {rows} GRID_END PATH_START"


def marked_maze(seed: int, cells: int = 3) -> np.ndarray:
    """A generated maze with its start and goal moved off the corners (the authors' mazes put them anywhere)."""
    grid = maze.generate_maze(cells, seed).copy()
    grid[1, 2 * cells - 1] = maze.START_CODE  # top-right cell
    grid[2 * cells - 1, 1] = maze.GOAL_CODE  # bottom-left cell
    return grid


def test_the_authors_layout_is_read_with_its_start_and_goal_where_they_are():
    grid = marked_maze(0)
    parsed = parse_grid(authors_prompt(grid))
    np.testing.assert_array_equal(parsed, grid)
    assert maze.start_position(parsed) == (1, 5) and maze.goal_position(parsed) == (5, 1)
    answer = maze.solve(parsed)
    assert maze.reward(parsed, maze.encode_answer(answer)) == 1.0  # from the marked start to the marked goal
    assert maze.reward(parsed, maze.encode_answer(maze.solve(maze.generate_maze(3, 0)))) == 0.0  # the corner route
    prompt = maze.encode_prompt(parsed)
    width = parsed.shape[1] + 1  # each row and its <nl>
    assert prompt[1 + 1 * width + 5] == maze.START_ID and prompt[1 + 5 * width + 1] == maze.GOAL_ID
    assert maze.START_ID not in prompt[1 : 1 + width]  # the corner holds no start any more


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("GRID_START WALL PATH NEWLINE GRID_END", "exactly one START and one GOAL"),
        ("GRID_START START WALL GOAL NEWLINE GRID_END", "not reachable"),
        ("GRID_START START PATH NEWLINE GOAL GRID_END", "rectangular"),
        ("GRID_START START DOOR GOAL NEWLINE GRID_END", "unknown grid token 'DOOR'"),
        ("START GOAL", "no GRID_START"),
    ],
)
def test_a_malformed_maze_is_a_clear_error(text, match):
    with pytest.raises(ValueError, match=match):
        parse_grid(text)


def test_the_hub_set_is_fetched_only_when_asked_then_read_offline(tmp_path, monkeypatch):
    monkeypatch.setattr(data, "_download", lambda *a: pytest.fail("nothing may be downloaded unless asked"))
    with pytest.raises(FileNotFoundError, match="capybaraczh/SERA-Maze-17x17"):
        load_maze_set("sera-maze-17x17", "train", data_dir=tmp_path)
    with pytest.raises(ValueError, match="splits"):
        load_maze_set("sera-maze-17x17", "validation", data_dir=tmp_path)
    rows = [{"prompt": [{"role": "user", "content": authors_prompt(marked_maze(s))}]} for s in range(4)]
    calls = []
    monkeypatch.setattr(data, "_download", lambda spec, split: calls.append((spec.hub, split)) or rows)
    fetched = load_maze_set("sera-maze-17x17", "train", data_dir=tmp_path, allow_download=True)
    assert calls == [("capybaraczh/SERA-Maze-17x17", "train")] and len(fetched) == 4
    offline = load_maze_set("sera-maze-17x17", "train", data_dir=tmp_path)  # the local copy, written once
    assert len(calls) == 1 and all(np.array_equal(a, b) for a, b in zip(fetched, offline, strict=True))
    assert all(np.array_equal(a, marked_maze(s)) for s, a in enumerate(offline))


def write_set(path: Path, seeds) -> Path:
    path.write_text("".join(json.dumps({"prompt": authors_prompt(marked_maze(s))}) + "\n" for s in seeds))
    return path


def test_the_maze_task_trains_and_scores_on_a_loaded_set(tmp_path):
    """task.train_set / task.eval_set: the pool is the loaded training mazes read in epochs (method=sera's Beta
    history takes it), the held-out set the loaded test mazes, and the rewards are read from their marked goals."""
    from hydra import compose, initialize_config_dir

    from experiments.maze import train

    train_file, test_file = (
        write_set(tmp_path / "train.jsonl", range(6)),
        write_set(tmp_path / "test.jsonl", [9, 10, 11]),
    )
    overrides = ["scale=maze/smoke", "method=sera", f"task.train_set={train_file}", f"task.eval_set={test_file}",
                 "task.pool_order=epoch"]  # fmt: skip
    with initialize_config_dir(config_dir=CONFIGS, version_base=None):
        cfg = compose("maze", overrides)
        settings, _ = train.validate(cfg)
        task = train.make_task(cfg)
        with pytest.raises(ValueError, match="task.pool_size=4 but task.train_set holds 6"):
            train.validate(compose("maze", [*overrides, "task.pool_size=4"]))
        with pytest.raises(ValueError, match="task.grid_size=11 but the loaded mazes are \\[7\\]"):
            train.validate(compose("maze", [*overrides, "task.grid_size=11"]))
        with pytest.raises(FileNotFoundError, match="nowhere.jsonl"):
            train.validate(compose("maze", [*overrides, f"task.train_set={tmp_path / 'nowhere.jsonl'}"]))
    assert settings.estimator == "beta" and task.num_prompts == 6
    ids, prompts = task.train_prompts(0, 3)
    for i, prompt in zip(ids, prompts, strict=True):
        grid = marked_maze(int(i))
        assert prompt == maze.encode_prompt(grid)
        assert task.rewards([i], [maze.encode_answer(maze.solve(grid))], [False]).tolist() == [1.0]
    eval_ids, eval_prompts = task.eval_sets()[maze.EVAL_SET]
    assert eval_prompts == [maze.encode_prompt(marked_maze(s)) for s in (9, 10, 11)]
