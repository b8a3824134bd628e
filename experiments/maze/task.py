"""The maze navigation task (docs/design.md section 5): Prim's-algorithm mazes, their token encoding, and the reward.

A maze of `cells` x `cells` cells is a (2*cells+1)-square uint8 grid (1 = wall, 0 = open): cells sit at odd
coordinates, the squares between two cells are walls or open passages, and the outer border is all walls. The
start is the top-left cell (1, 1), the goal the bottom-right cell (2*cells-1, 2*cells-1). A move steps ONE grid
square, so going from one cell to the next takes two moves (through the passage square between them). The prompt
is the grid as tokens (<bos>, rows of `#`/`.` with S and G marked, <nl> after each row, <sep>); the answer is moves
then DONE. Reward is 1 iff the answer is well formed, never leaves the grid or enters a wall, and ends on the goal.
Held-out mazes use seeds from 10_000 upward, training mazes seeds from 1_000_000 upward, so the two never meet.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from sera.estimation import epoch_stream_ids

UP, DOWN, LEFT, RIGHT, DONE = "UP", "DOWN", "LEFT", "RIGHT", "DONE"
MOVES = (UP, DOWN, LEFT, RIGHT)
# One grid square per move: (row delta, column delta).
MOVE_DELTAS = {UP: (-1, 0), DOWN: (1, 0), LEFT: (0, -1), RIGHT: (0, 1)}

PAD, BOS, SEP, WALL, OPEN, START, GOAL, NEWLINE = "<pad>", "<bos>", "<sep>", "#", ".", "S", "G", "<nl>"
VOCAB = [PAD, BOS, SEP, WALL, OPEN, START, GOAL, NEWLINE, UP, DOWN, LEFT, RIGHT, DONE]
TOKEN_TO_ID = {token: i for i, token in enumerate(VOCAB)}
ID_TO_TOKEN = dict(enumerate(VOCAB))
PAD_ID, BOS_ID, SEP_ID = TOKEN_TO_ID[PAD], TOKEN_TO_ID[BOS], TOKEN_TO_ID[SEP]
WALL_ID, OPEN_ID, START_ID, GOAL_ID, NEWLINE_ID = (TOKEN_TO_ID[t] for t in (WALL, OPEN, START, GOAL, NEWLINE))
UP_ID, DOWN_ID, LEFT_ID, RIGHT_ID, DONE_ID = (TOKEN_TO_ID[t] for t in (UP, DOWN, LEFT, RIGHT, DONE))
MOVE_IDS = {TOKEN_TO_ID[m]: m for m in MOVES}

START_POS = (1, 1)
START_CODE, GOAL_CODE = 2, 3  # a grid loaded from a maze set marks its start and goal (experiments/maze/data.py)
HELDOUT_SEED = 10_000
TRAIN_SEED_OFFSET = 1_000_000
MAX_TRAIN_MAZES = 4_000_000  # per run: keeps RL maze seeds below the SFT mazes' (5_000_000 + ...)
RUN_SEED_SHIFT = 2**32  # run seed s > 0 draws its training mazes from s * 2**32 + ... (seed 0 keeps its mazes)


def cells_for_grid(size: int) -> int:
    """Cells per side of a `size` x `size` grid; size must be odd and >= 5 (17 in the paper -> 8 cells)."""
    if isinstance(size, bool) or not isinstance(size, int | np.integer) or size < 5 or size % 2 == 0:
        raise ValueError(f"maze grid size must be an odd integer >= 5 (cells = (size - 1) / 2), got {size!r}")
    return (int(size) - 1) // 2


def start_position(grid: np.ndarray) -> tuple[int, int]:
    """The start: the square marked START_CODE in a loaded grid, else the top-left cell (a generated maze)."""
    marked = np.argwhere(np.asarray(grid) == START_CODE)
    return (int(marked[0][0]), int(marked[0][1])) if marked.size else START_POS


def goal_position(grid: np.ndarray) -> tuple[int, int]:
    """The goal: the square marked GOAL_CODE in a loaded grid, else the bottom-right cell (a generated maze)."""
    marked = np.argwhere(np.asarray(grid) == GOAL_CODE)
    return (int(marked[0][0]), int(marked[0][1])) if marked.size else (grid.shape[0] - 2, grid.shape[1] - 2)


def generate_maze(cells: int, seed: int) -> np.ndarray:
    """A perfect maze (its cells and passages form a spanning tree) by randomized Prim's algorithm.

    Prim's frontier-cell form: grow the maze from a uniformly random cell; each step picks a uniformly random frontier
    cell (outside the maze, next to it) and opens the passage to a uniformly random neighbour already in the maze. This
    variant reproduces docs/history/calibration.md's shortcut figures at 5x5 cells (81% of solutions only go right and
    down, the commonest answer solves 3.1%, longest ~28 moves); growing from the top-left cell gives 91%. Returns a
    (2*cells+1, 2*cells+1) uint8 grid, 1 = wall, 0 = open. Deterministic in `seed`.
    """
    if cells < 2:
        raise ValueError(f"a maze needs at least 2 x 2 cells, got {cells}")
    rng = np.random.default_rng(seed)
    grid = np.ones((2 * cells + 1, 2 * cells + 1), dtype=np.uint8)
    in_maze = np.zeros((cells, cells), dtype=bool)
    on_frontier = np.zeros((cells, cells), dtype=bool)
    frontier: list[tuple[int, int]] = []

    def neighbours(r: int, c: int) -> list[tuple[int, int]]:
        steps = ((r - 1, c), (r + 1, c), (r, c - 1), (r, c + 1))
        return [(a, b) for a, b in steps if 0 <= a < cells and 0 <= b < cells]

    def add(r: int, c: int) -> None:
        in_maze[r, c] = True
        grid[2 * r + 1, 2 * c + 1] = 0
        for a, b in neighbours(r, c):
            if not in_maze[a, b] and not on_frontier[a, b]:
                on_frontier[a, b] = True
                frontier.append((a, b))

    add(int(rng.integers(cells)), int(rng.integers(cells)))
    while frontier:
        i = int(rng.integers(len(frontier)))
        frontier[i], frontier[-1] = frontier[-1], frontier[i]
        r, c = frontier.pop()
        linked = [(a, b) for a, b in neighbours(r, c) if in_maze[a, b]]
        a, b = linked[int(rng.integers(len(linked)))]
        grid[r + a + 1, c + b + 1] = 0  # the passage square between cell (r, c) and cell (a, b)
        add(r, c)
    return grid


def encode_prompt(grid: np.ndarray) -> list[int]:
    """<bos>, the grid row by row (# wall, . open, S start, G goal, <nl> after each row), <sep>.

    Length 1 + h * (w + 1) + 1: 134 tokens for an 11x11 grid, 308 for the paper's 17x17.
    """
    ids = np.where(np.asarray(grid) == 1, WALL_ID, OPEN_ID)
    ids[start_position(grid)] = START_ID
    ids[goal_position(grid)] = GOAL_ID
    rows = np.concatenate([ids, np.full((ids.shape[0], 1), NEWLINE_ID)], axis=1)
    return [BOS_ID, *rows.reshape(-1).tolist(), SEP_ID]


def encode_answer(moves: list[str]) -> list[int]:
    """The moves as token ids, then DONE."""
    if any(m not in MOVE_DELTAS for m in moves):
        raise ValueError(f"moves must be among {MOVES}, got {moves!r}")
    return [TOKEN_TO_ID[m] for m in moves] + [DONE_ID]


def decode_answer(token_ids) -> list[str] | None:
    """The moves of a generated answer, read up to the first DONE; None if malformed.

    Malformed: no DONE at all, or any token before DONE that is not a move (pad included). Tokens after the first
    DONE are ignored (padding). `[DONE]` alone is well formed: the empty move list.
    """
    moves = []
    for t in np.asarray(token_ids, dtype=np.int64).reshape(-1).tolist():
        if t == DONE_ID:
            return moves
        if t not in MOVE_IDS:
            return None
        moves.append(MOVE_IDS[t])
    return None


def reward(grid: np.ndarray, token_ids) -> float:
    """1.0 iff the answer is well formed (moves then DONE), every move stays in the grid and off walls, and the
    final position is the goal; else 0.0. Passing through the goal and moving on counts only where it ends."""
    moves = decode_answer(token_ids)
    if moves is None:
        return 0.0
    h, w = grid.shape
    r, c = start_position(grid)
    for m in moves:
        dr, dc = MOVE_DELTAS[m]
        r, c = r + dr, c + dc
        if not (0 <= r < h and 0 <= c < w) or grid[r, c] == 1:
            return 0.0
    return float((r, c) == goal_position(grid))


def solve(grid: np.ndarray) -> list[str]:
    """A shortest path from start to goal by BFS, as moves (no DONE); unique in a perfect maze.

    Raises ValueError if the goal is unreachable.
    """
    h, w = grid.shape
    start, goal = start_position(grid), goal_position(grid)
    came_from: dict[tuple[int, int], tuple[tuple[int, int], str] | None] = {start: None}
    queue = deque([start])
    while queue:
        pos = queue.popleft()
        if pos == goal:
            break
        for m in MOVES:
            dr, dc = MOVE_DELTAS[m]
            nxt = (pos[0] + dr, pos[1] + dc)
            if 0 <= nxt[0] < h and 0 <= nxt[1] < w and grid[nxt] != 1 and nxt not in came_from:
                came_from[nxt] = (pos, m)
                queue.append(nxt)
    if goal not in came_from:
        raise ValueError("the goal is not reachable from the start")
    moves, pos = [], goal
    while came_from[pos] is not None:
        pos, m = came_from[pos]
        moves.append(m)
    return moves[::-1]


def heldout_mazes(num: int, cells: int, seed: int = HELDOUT_SEED) -> list[np.ndarray]:
    """The fixed held-out set: mazes from seeds seed, seed + 1, ..., seed + num - 1 (all below the training seeds)."""
    if seed < 0 or seed + num > TRAIN_SEED_OFFSET:
        raise ValueError(f"held-out seeds [{seed}, {seed + num}) must lie in [0, {TRAIN_SEED_OFFSET})")
    return [generate_maze(cells, seed + i) for i in range(num)]


def train_maze_seed(step: int, index: int, batch: int, run_seed: int = 0) -> int:
    """Seed of training maze `index` of step `step` (batch mazes a step) of a run with seed run_seed:
    run_seed * 2**32 + TRAIN_SEED_OFFSET + step * batch + index.

    Every training maze is fresh, differs between run seeds, and, being >= TRAIN_SEED_OFFSET, is never one of the
    held-out mazes.
    """
    if step < 0 or batch < 1 or not 0 <= index < batch or run_seed < 0:
        raise ValueError(
            f"need step >= 0, 0 <= index < batch and run_seed >= 0, got {step}, {index}, {batch}, {run_seed}"
        )
    if step * batch + index >= MAX_TRAIN_MAZES:
        raise ValueError(f"more than {MAX_TRAIN_MAZES} training mazes in one run")
    return run_seed * RUN_SEED_SHIFT + TRAIN_SEED_OFFSET + step * batch + index


def best_fixed_answer_rate(mazes: list[np.ndarray]) -> tuple[list[str], float]:
    """The shortcut baseline (docs/history/calibration.md, Maze): among the mazes' shortest-path answers, the one answer
    that solves the largest fraction of the mazes, and that fraction. Ties go to the answer of the earliest maze."""
    if not mazes:
        raise ValueError("need at least one maze")
    candidates = list(dict.fromkeys(tuple(solve(g)) for g in mazes))
    rates = [np.mean([reward(g, encode_answer(list(a))) for g in mazes]) for a in candidates]
    best = int(np.argmax(rates))
    return list(candidates[best]), float(rates[best])


def distinct_answers(answers: list) -> int:
    """Number of distinct well-formed decoded answers among `answers` (token id lists); malformed ones are excluded,
    so a maze whose samples are all malformed scores 0."""
    decoded = (decode_answer(a) for a in answers)
    return len({tuple(m) for m in decoded if m is not None})


EVAL_SET = "heldout"  # the name of the maze's one evaluation set (records eval_step<N>_heldout.json)


EPOCH_STREAM = 1  # keeps the epoch permutations' seeds apart from the per-step orders'


class MazeTask:
    """Training mazes (fresh every step, per run seed; or a finite pool), a fixed held-out set (sera.lm_loop.Task).

    Fresh mazes are identified by their maze seed. With pool_size P, the training mazes are a fixed pool of P (ids
    0..P-1, below the held-out seeds), each step taking them in its own seeded order: prompts recur across steps,
    which the historical p_hat and DPS need, and a step can draw more than B of them (DS, DPS, SARA). With
    pool_order="epoch" the pool is read in epochs instead, as the math task's set is: per-epoch permutations seeded by
    (run seed, epoch), step t's prompts from position t*B, so with P a multiple of B every step lies in one epoch and
    every maze is seen once an epoch (what the authors' Beta history needs).
    """

    eos_id, pad_id = DONE_ID, PAD_ID

    def __init__(self, cells: int, num_eval: int, run_seed: int = 0, pool_size: int | None = None,
                 pool_order: str = "step", batch_size: int | None = None, train_grids: list | None = None,
                 eval_grids: list | None = None):  # fmt: skip
        """train_grids / eval_grids: a loaded maze set (experiments/maze/data.py) instead of generated mazes: the
        training pool is its grids (pool_size their number), the held-out set its first num_eval grids."""
        if train_grids is not None:
            if pool_size not in (None, len(train_grids)):
                raise ValueError(f"task.pool_size={pool_size} but the training set holds {len(train_grids)} mazes")
            pool_size = len(train_grids)
        self.train_grids = train_grids
        if pool_size is not None and not 1 <= pool_size <= HELDOUT_SEED:
            raise ValueError(f"task.pool_size must lie in [1, {HELDOUT_SEED}] or be null, got {pool_size}")
        if pool_order not in ("step", "epoch") or (pool_order == "epoch" and (pool_size is None or not batch_size)):
            raise ValueError(f"task.pool_order must be step or epoch (epoch: with task.pool_size), got {pool_order!r}")
        self.cells, self.run_seed, self.num_prompts = cells, run_seed, pool_size
        self.epoch_order, self.batch_size = pool_order == "epoch", batch_size
        if eval_grids is not None and len(eval_grids) < num_eval:
            raise ValueError(f"eval.num_mazes={num_eval} but the held-out set holds {len(eval_grids)} mazes")
        self.eval_ids = np.arange(HELDOUT_SEED, HELDOUT_SEED + num_eval)
        held_out = heldout_mazes(num_eval, cells) if eval_grids is None else list(eval_grids[:num_eval])
        self.eval_grids = {int(s): g for s, g in zip(self.eval_ids, held_out, strict=True)}
        self.grids = dict(self.eval_grids)

    def epoch_permutation(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.run_seed, EPOCH_STREAM, epoch]).permutation(self.num_prompts)

    def maze_seed(self, prompt_id: int) -> int:
        """The generating seed of a training maze: its id, or for pool maze j, run_seed * 2**32 + offset + j."""
        if self.num_prompts is None:
            return prompt_id
        return self.run_seed * RUN_SEED_SHIFT + TRAIN_SEED_OFFSET + prompt_id

    def train_prompts(self, step: int, batch: int, start: int = 0):
        if self.num_prompts is None:
            if start > 0:
                raise ValueError("fresh training mazes give B prompts a step; set task.pool_size to draw more")
            ids = np.array([train_maze_seed(step, i, batch, self.run_seed) for i in range(batch)])
        elif self.epoch_order:  # the pool in epochs: step t reads from position t*B on
            ids = epoch_stream_ids(step, self.batch_size, start, batch, self.num_prompts, self.epoch_permutation)
        else:  # the pool in this step's own order; fewer than asked once the pool is used up
            order = np.random.default_rng([self.run_seed, step]).permutation(self.num_prompts)
            ids = order[start : start + batch]
        if start == 0:  # a new step: forget the previous step's mazes
            self.grids = dict(self.eval_grids)
        self.grids |= {int(i): self.train_grid(int(i)) for i in ids}
        return ids, [encode_prompt(self.grids[int(i)]) for i in ids]

    def train_grid(self, prompt_id: int) -> np.ndarray:
        """Training maze `prompt_id`: the loaded set's grid, or the maze generated from its seed."""
        if self.train_grids is not None:
            return self.train_grids[prompt_id]
        return generate_maze(self.cells, self.maze_seed(prompt_id))

    def eval_sets(self):
        return {EVAL_SET: (self.eval_ids, [encode_prompt(self.eval_grids[int(s)]) for s in self.eval_ids])}

    def train_pool_set(self):
        """The finite training pool as an evaluation set (ids 0..P-1), its grids kept for scoring until the next
        step starts (sera.lm_loop.TrainPool)."""
        if self.num_prompts is None:
            raise ValueError("fresh training mazes have no pool to evaluate; set task.pool_size")
        ids = np.arange(self.num_prompts)
        self.grids |= {int(i): self.train_grid(int(i)) for i in ids}
        return ids, [encode_prompt(self.grids[int(i)]) for i in ids]

    def rewards(self, ids, responses, truncated):
        """1 iff the moves reach the goal (a truncated answer has no DONE, so it is malformed and scores 0)."""
        return np.array([reward(self.grids[int(i)], r) for i, r in zip(ids, responses, strict=True)])

    def eval_extras(self, name, ids, rollouts) -> dict:
        """Diversity: distinct well-formed answers per held-out maze (the shortcut trap collapses it)."""
        index = rollouts.prompt_index.numpy()
        answers = [rollouts.tokens[r][rollouts.mask[r].bool()].tolist() for r in range(len(index))]
        per_maze = [
            distinct_answers([a for a, i in zip(answers, index, strict=True) if i == j]) for j in range(len(ids))
        ]
        return {"distinct_answers": np.asarray(per_maze, dtype=np.float64)}
