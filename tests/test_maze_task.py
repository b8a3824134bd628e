"""The maze task: Prim's mazes are perfect and solvable, generation is seeded, the reward fails every way docs/design.md
names, the token encoding round-trips, and the held-out / training seeds and the shortcut baseline behave."""

import numpy as np
import pytest
from scipy import ndimage

from experiments.maze.task import (
    BOS_ID,
    DONE,
    DONE_ID,
    DOWN,
    ID_TO_TOKEN,
    LEFT,
    PAD_ID,
    RIGHT,
    SEP_ID,
    TOKEN_TO_ID,
    UP,
    VOCAB,
    best_fixed_answer_rate,
    cells_for_grid,
    decode_answer,
    distinct_answers,
    encode_answer,
    encode_prompt,
    generate_maze,
    heldout_mazes,
    reward,
    solve,
    train_maze_seed,
)


def grid_from(rows):
    return np.array([[ch == "#" for ch in row] for row in rows], dtype=np.uint8)


def ids(*tokens):
    return [TOKEN_TO_ID[t] for t in tokens]


# The four perfect 2x2-cell mazes, named by the passage that is closed, and their hand-computed solutions.
NO_LEFT = grid_from(["#####", "#...#", "###.#", "#...#", "#####"])  # RIGHT RIGHT DOWN DOWN
NO_BOTTOM = grid_from(["#####", "#...#", "#.#.#", "#.#.#", "#####"])  # RIGHT RIGHT DOWN DOWN
NO_TOP = grid_from(["#####", "#.#.#", "#.#.#", "#...#", "#####"])  # DOWN DOWN RIGHT RIGHT
NO_RIGHT = grid_from(["#####", "#...#", "#.###", "#...#", "#####"])  # DOWN DOWN RIGHT RIGHT
RRDD, DDRR = [RIGHT, RIGHT, DOWN, DOWN], [DOWN, DOWN, RIGHT, RIGHT]
# A 3x3-cell snake: right along the top, left along the middle, right along the bottom.
SNAKE = grid_from(["#######", "#.....#", "#####.#", "#.....#", "#.#####", "#.....#", "#######"])
# NO_LEFT with openings in the top and bottom border of column 1, so a move can leave the grid.
LEAKY = grid_from(["#.###", "#...#", "###.#", "#...#", "#.###"])


@pytest.mark.parametrize("cells", [2, 3, 5, 6, 8])
def test_generated_mazes_are_perfect_and_solved_by_bfs(cells):
    size = 2 * cells + 1
    for seed in range(40):
        grid = generate_maze(cells, seed)
        assert grid.shape == (size, size) and grid.dtype == np.uint8 and set(np.unique(grid)) <= {0, 1}
        assert grid[0].all() and grid[-1].all() and grid[:, 0].all() and grid[:, -1].all()
        assert not grid[1::2, 1::2].any()  # every cell is open
        assert grid[::2, ::2].all()  # posts between cells are always wall
        # A tree on cells*cells cells has cells*cells - 1 passages; with one connected component, that is a tree.
        assert (grid[1:-1, 1:-1] == 0).sum() == cells * cells + cells * cells - 1
        assert ndimage.label(grid == 0)[1] == 1
        moves = solve(grid)
        assert len(moves) >= 4 * (cells - 1) and len(moves) % 2 == 0
        assert reward(grid, encode_answer(moves)) == 1.0


def test_generation_is_deterministic_by_seed_and_varies_across_seeds():
    assert np.array_equal(generate_maze(5, 3), generate_maze(5, 3))
    grids = {generate_maze(5, seed).tobytes() for seed in range(50)}
    assert len(grids) == 50
    with pytest.raises(ValueError):
        generate_maze(1, 0)


def test_cells_for_grid():
    assert [cells_for_grid(s) for s in (5, 11, 13, 17)] == [2, 5, 6, 8]
    for bad in (4, 10, 16, 3, 1, 0, -11, 11.0, True):
        with pytest.raises(ValueError, match="odd"):
            cells_for_grid(bad)


def test_solve_on_hand_made_mazes():
    assert solve(NO_LEFT) == RRDD and solve(NO_BOTTOM) == RRDD
    assert solve(NO_TOP) == DDRR and solve(NO_RIGHT) == DDRR
    assert solve(SNAKE) == [RIGHT] * 4 + [DOWN] * 2 + [LEFT] * 4 + [DOWN] * 2 + [RIGHT] * 4
    open_room = grid_from(["#####", "#...#", "#...#", "#...#", "#####"])
    assert len(solve(open_room)) == 4  # shortest, even with cycles
    with pytest.raises(ValueError):
        solve(grid_from(["#####", "#.#.#", "###.#", "#...#", "#####"]))


def test_reward_success_and_every_failure():
    assert reward(NO_LEFT, ids(RIGHT, RIGHT, DOWN, DOWN, DONE)) == 1.0
    assert reward(NO_LEFT, ids(RIGHT, RIGHT, DOWN, DOWN, DONE, "<pad>", "<pad>")) == 1.0  # padding ignored
    assert reward(NO_LEFT, ids(RIGHT, RIGHT, DOWN, DOWN, DONE, UP, "<bos>")) == 1.0  # anything after DONE ignored
    assert reward(NO_LEFT, np.array(ids(RIGHT, RIGHT, DOWN, DOWN, DONE))) == 1.0
    assert reward(NO_LEFT, ids(RIGHT, RIGHT, DOWN, DOWN, UP, DOWN, DONE)) == 1.0  # leaves the goal but ends there
    failures = {
        "wall hit on the way to the goal": ids(DOWN, DOWN, RIGHT, RIGHT, DONE),
        "UP from the start (border wall)": ids(UP, DONE),
        "LEFT from the start (border wall)": ids(LEFT, RIGHT, RIGHT, RIGHT, DOWN, DOWN, DONE),
        "pad inside the answer": ids(RIGHT, "<pad>", RIGHT, DOWN, DOWN, DONE),
        "grid token inside the answer": ids(RIGHT, RIGHT, "G", DOWN, DOWN, DONE),
        "missing DONE": ids(RIGHT, RIGHT, DOWN, DOWN),
        "missing DONE, padded": ids(RIGHT, RIGHT, DOWN, DOWN, "<pad>"),
        "empty answer": ids(DONE),
        "nothing at all": [],
        "ends short of the goal": ids(RIGHT, RIGHT, DOWN, DONE),
        "passes the goal then leaves": ids(RIGHT, RIGHT, DOWN, DOWN, UP, DONE),
    }
    for name, answer in failures.items():
        assert reward(NO_LEFT, answer) == 0.0, name
    assert reward(NO_LEFT, [*ids(RIGHT, RIGHT, DOWN, DOWN), 99, DONE_ID]) == 0.0  # id outside the vocabulary


def test_reward_out_of_bounds_on_a_grid_with_an_open_border():
    assert reward(LEAKY, ids(RIGHT, RIGHT, DOWN, DOWN, DONE)) == 1.0
    # Off the top and back: row -1 must not wrap to the (open) bottom row.
    assert reward(LEAKY, ids(UP, UP, DOWN, DOWN, RIGHT, RIGHT, DOWN, DOWN, DONE)) == 0.0
    assert reward(LEAKY, ids(UP, DOWN, RIGHT, RIGHT, DOWN, DOWN, DONE)) == 1.0  # the open border square is fine
    # Off the bottom (row 5) and back.
    assert reward(LEAKY, ids(RIGHT, RIGHT, DOWN, DOWN, LEFT, LEFT, DOWN, DOWN, UP, UP, RIGHT, RIGHT, DONE)) == 0.0


def test_vocabulary_and_answer_round_trip():
    assert len(set(VOCAB)) == len(VOCAB) and len(VOCAB) <= 16
    assert all(ID_TO_TOKEN[TOKEN_TO_ID[t]] == t for t in VOCAB)
    assert len({PAD_ID, BOS_ID, SEP_ID, DONE_ID}) == 4
    assert encode_answer([]) == [DONE_ID]
    assert encode_answer([UP, LEFT]) == ids(UP, LEFT, DONE)
    assert decode_answer(ids(UP, DONE, LEFT)) == [UP]
    assert decode_answer(ids(DONE)) == []
    assert decode_answer(ids(UP, LEFT)) is None
    assert decode_answer(ids(UP, "<sep>", DONE)) is None
    for seed in range(20):
        moves = solve(generate_maze(5, seed))
        assert decode_answer(encode_answer(moves) + [PAD_ID] * 3) == moves
    with pytest.raises(ValueError):
        encode_answer(["NORTH"])


def test_prompt_encoding():
    expected = "<bos> # # # # # <nl> # S . . # <nl> # # # . # <nl> # . . G # <nl> # # # # # <nl> <sep>"
    assert encode_prompt(NO_LEFT) == ids(*expected.split())
    prompt = encode_prompt(generate_maze(5, 0))
    assert len(prompt) == 1 + 11 * 12 + 1  # 134, docs/history/calibration.md's "about 133"
    assert prompt[0] == BOS_ID and prompt[-1] == SEP_ID
    assert prompt.count(TOKEN_TO_ID["<nl>"]) == 11
    assert prompt.index(TOKEN_TO_ID["S"]) == 1 + 12 + 1 and prompt.count(TOKEN_TO_ID["S"]) == 1
    assert prompt.index(TOKEN_TO_ID["G"]) == 1 + 9 * 12 + 9 and prompt.count(TOKEN_TO_ID["G"]) == 1
    assert len(encode_prompt(generate_maze(8, 0))) == 1 + 17 * 18 + 1


def test_heldout_mazes_are_fixed_and_disjoint_from_training_seeds():
    heldout = heldout_mazes(16, 5)
    assert all(np.array_equal(a, b) for a, b in zip(heldout, heldout_mazes(16, 5), strict=True))
    assert np.array_equal(heldout[0], generate_maze(5, 10_000))
    assert np.array_equal(heldout[15], generate_maze(5, 10_015))
    assert not np.array_equal(heldout_mazes(1, 5, seed=7)[0], heldout[0])
    assert train_maze_seed(0, 0, 32) == 1_000_000
    assert train_maze_seed(3, 5, 32) == 1_000_101
    train_seeds = [train_maze_seed(step, i, 32) for step in range(10) for i in range(32)]
    assert len(set(train_seeds)) == 320 and min(train_seeds) > 10_000 + 16
    train_grids = {generate_maze(5, s).tobytes() for s in train_seeds}
    assert not train_grids & {g.tobytes() for g in heldout}
    with pytest.raises(ValueError):
        heldout_mazes(10, 5, seed=999_995)  # would reach the training seeds
    with pytest.raises(ValueError):
        train_maze_seed(0, 32, 32)


def test_best_fixed_answer_rate_on_hand_made_mazes():
    assert best_fixed_answer_rate([NO_LEFT, NO_TOP, NO_BOTTOM]) == (RRDD, pytest.approx(2 / 3))
    assert best_fixed_answer_rate([NO_TOP, NO_LEFT, NO_RIGHT, NO_RIGHT]) == (DDRR, 0.75)
    assert best_fixed_answer_rate([NO_TOP, NO_LEFT, NO_BOTTOM, NO_RIGHT]) == (DDRR, 0.5)  # tie: earliest maze
    assert best_fixed_answer_rate([SNAKE]) == (solve(SNAKE), 1.0)
    with pytest.raises(ValueError):
        best_fixed_answer_rate([])


def test_best_fixed_answer_rate_on_generated_mazes():
    mazes = heldout_mazes(64, 5)
    answer, rate = best_fixed_answer_rate(mazes)
    solved = sum(reward(g, encode_answer(answer)) for g in mazes)
    assert rate == solved / 64 and 1 / 64 <= rate < 0.5


def test_distinct_answers():
    samples = [
        ids(*RRDD, DONE),
        ids(*RRDD, DONE, "<pad>"),
        ids(*DDRR, DONE),
        ids(DONE),
        ids(RIGHT, "<pad>", DONE),  # malformed: excluded
        ids(*RRDD),  # no DONE: excluded
    ]
    assert distinct_answers(samples) == 3
    assert distinct_answers(samples[4:]) == 0
    assert distinct_answers([]) == 0


def test_train_pool_set_is_the_pool_and_scores_its_mazes():
    """The finite training pool as an evaluation set (sera.lm_loop.TrainPool): ids 0..P-1, the same mazes a training
    step draws, each scored 1 for its BFS solution; fresh training mazes have no pool."""
    from experiments.maze.task import MazeTask

    task = MazeTask(cells_for_grid(7), num_eval=2, run_seed=3, pool_size=6)
    step_ids, step_prompts = task.train_prompts(0, 6)
    ids, prompts = task.train_pool_set()
    assert ids.tolist() == list(range(6))
    assert {int(i): p for i, p in zip(step_ids, step_prompts, strict=True)} == dict(enumerate(prompts))
    answers = [encode_answer(solve(task.grids[int(i)])) for i in ids]
    assert task.rewards(ids, answers, np.zeros(6, dtype=bool)).tolist() == [1.0] * 6
    assert task.rewards(ids[:1], [encode_answer([])], np.zeros(1, dtype=bool)).tolist() == [0.0]
    with pytest.raises(ValueError, match="pool_size"):
        MazeTask(cells_for_grid(7), num_eval=2).train_pool_set()


def test_the_pool_in_epochs_shows_every_maze_once_an_epoch_and_step_order_is_unchanged():
    from experiments.maze.task import MazeTask

    task = MazeTask(cells=9, num_eval=2, run_seed=3, pool_size=12, pool_order="epoch", batch_size=4)
    epochs = [np.concatenate([task.train_prompts(step, 4)[0] for step in range(e * 3, e * 3 + 3)]) for e in range(3)]
    for ids in epochs:
        assert sorted(ids.tolist()) == list(range(12))  # each epoch covers the pool exactly once
    assert not np.array_equal(epochs[0], epochs[1])  # in a new order each epoch
    again = MazeTask(cells=9, num_eval=2, run_seed=3, pool_size=12, pool_order="epoch", batch_size=4)
    np.testing.assert_array_equal(again.train_prompts(4, 4)[0], epochs[1][4:8])  # deterministic in (seed, step)
    step_order = MazeTask(cells=9, num_eval=2, run_seed=3, pool_size=12)
    np.testing.assert_array_equal(step_order.train_prompts(5, 4)[0], np.random.default_rng([3, 5]).permutation(12)[:4])
    with pytest.raises(ValueError, match="pool_order"):
        MazeTask(cells=9, num_eval=2, pool_size=None, pool_order="epoch", batch_size=4)


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ([], "MaxRL under SERA's name"),  # fresh mazes every step: the history would never have an estimate
        (["task.pool_order=epoch"], "pool_order must be step or epoch"),  # epochs of what: no pool
        (["task.pool_size=40"], "pool_order=epoch"),  # a pool, but each step its own order: no epochs
    ],
)
def test_the_authors_rule_on_the_maze_needs_a_pool_read_in_epochs(overrides, match):
    from pathlib import Path

    from hydra import compose, initialize_config_dir

    from experiments.maze import train

    configs = str(Path(__file__).resolve().parents[1] / "configs")
    with initialize_config_dir(config_dir=configs, version_base=None):
        cfg = compose("maze", ["scale=maze/smoke", "method=sera", *overrides])
    with pytest.raises(ValueError, match=match):
        train.validate(cfg)


def test_the_paper_scale_follows_the_authors_maze_recipe():
    """scale=maze/paper: n0 = 128, B = 256, 3000 steps, 180 tokens, lr 1e-4, 7,424 fixed mazes read in epochs (29
    steps an epoch), and method=sera (their rule) with its Beta history and n_max = 4 n0 = 512."""
    from pathlib import Path

    from hydra import compose, initialize_config_dir

    from experiments.maze import train

    configs = str(Path(__file__).resolve().parents[1] / "configs")
    with initialize_config_dir(config_dir=configs, version_base=None):
        cfg = compose("maze", ["scale=maze/paper", "method=sera", "device=cpu"])
    settings, loop = train.validate(cfg)
    assert (cfg.n0, loop.batch_size, loop.steps, cfg.max_new_tokens, loop.lr) == (128, 256, 3000, 180, 1e-4)
    assert (cfg.task.pool_size, cfg.task.pool_order, cfg.task.pool_size // loop.batch_size) == (7424, "epoch", 29)
    assert (settings.estimator, settings.n_min, settings.n_max) == ("beta", 2, 512)
    # the optimiser the recipe leaves at verl's defaults: AdamW (0.9, 0.999), weight decay 0.01, constant, clip 1.0
    optim = cfg.optim
    assert (tuple(optim.betas), optim.weight_decay, optim.warmup_steps, optim.grad_clip) == ((0.9, 0.999), 0.01, 0, 1.0)
