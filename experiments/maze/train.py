"""Maze navigation (the paper's Table 4): a small Llama policy learns to solve mazes with GRPO, MaxRL or SERA.

Run (one run; the base SFT model is trained on first use and shared; the same command resumes an interrupted run):
    python -m experiments.maze.train method=sera_pilot                            # CPU default, fresh mazes
    python -m experiments.maze.train scale=maze/cpu_pool method=sera              # the authors' rule: a fixed pool
    python -m experiments.maze.train method=maxrl method.aggregation=seqnorm
    python -m experiments.maze.train scale=maze/smoke method=grpo                 # seconds
    python -m experiments.maze.train scale=maze/paper method=sera_pilot           # 17x17, maze-3m (GPU advised)
The grid of Table 4 is `make reproduce-maze`.
"""

from __future__ import annotations

from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from experiments.maze import task as maze
from experiments.maze.data import REGISTRY as MAZE_SETS
from experiments.maze.data import load_maze_set
from experiments.maze.model import PRESETS, build_model
from experiments.maze.sft import base_config, train_base
from experiments.maze.task import EVAL_SET, MazeTask
from sera.lm_loop import LoopSettings, evaluate_into, run_rl
from sera.lm_study import base_path, base_run, lm_main, make_engine, resolve_device, run_name, study_root, validate_lm
from sera.methods import MethodSettings, Study
from sera.rollout import HFEngine
from sera.threads import set_torch_threads


def validate(cfg) -> tuple[MethodSettings, LoopSettings]:
    """Every cross-field check, before any work starts (the base model included)."""
    pool = cfg.task.pool_size
    train_grids, eval_grids = maze_sets(cfg)  # a missing maze set fails here, before the base model is trained
    if train_grids is not None:
        if pool not in (None, len(train_grids)):
            raise ValueError(f"task.pool_size={pool} but task.train_set holds {len(train_grids)} mazes")
        pool = len(train_grids)
    sizes = {g.shape[0] for g in (train_grids or []) + (eval_grids or [])}
    if sizes - {cfg.task.grid_size}:
        raise ValueError(f"task.grid_size={cfg.task.grid_size} but the loaded mazes are {sorted(sizes)} squares a side")
    order = cfg.task.get("pool_order", "step")
    if order not in ("step", "epoch") or (order == "epoch" and pool is None):
        raise ValueError(f"task.pool_order must be step or epoch (epoch needs task.pool_size), got {order!r}")
    name = "maze" if pool is not None else "maze with fresh mazes every step (task.pool_size=N gives a finite pool)"
    settings, loop = validate_lm(cfg, Study(name, repeated_prompts=pool is not None, sequential=pool is not None))
    maze.cells_for_grid(cfg.task.grid_size)
    if settings.estimator == "beta" and order != "epoch":
        raise ValueError(f"the Beta history reads the pool in epochs: set task.pool_order=epoch (got {order})")
    if pool is not None and not 1 <= pool <= maze.HELDOUT_SEED:
        raise ValueError(f"task.pool_size must lie in [1, {maze.HELDOUT_SEED}] or be null, got {pool}")
    if cfg.model.path is None and cfg.model.name not in PRESETS:
        raise ValueError(f"unknown model.name {cfg.model.name!r}; choose from {sorted(PRESETS)} or set model.path")
    if cfg.model.path is not None and not Path(cfg.model.path).expanduser().exists():
        raise FileNotFoundError(f"model.path {cfg.model.path} does not exist")
    if cfg.sft.steps < 1 or cfg.sft.batch_size < 1 or not cfg.sft.lr > 0:
        raise ValueError(f"sft.steps and sft.batch_size must be >= 1 and sft.lr > 0, got {dict(cfg.sft)}")
    return settings, loop


def maze_sets(cfg) -> tuple[list | None, list | None]:
    """(training grids, held-out grids) of task.train_set / task.eval_set (experiments/maze/data.py: a registry set's
    train and test splits, or files); None for a generated side."""
    directory = cfg.task.get("data_dir")

    def load(name, split):
        if name is None:
            return None
        return load_maze_set(name, split if name in MAZE_SETS else None, data_dir=directory)

    return load(cfg.task.get("train_set"), "train"), load(cfg.task.get("eval_set"), "test")


def make_task(cfg, pool: bool = True) -> MazeTask:
    """The run's maze task: generated or loaded training and held-out mazes; `pool`: the RL run's training pool
    settings (the base model's evaluation needs only the held-out mazes)."""
    train_grids, eval_grids = maze_sets(cfg)
    cells = maze.cells_for_grid(cfg.task.grid_size)
    if not pool:
        return MazeTask(cells, cfg.eval.num_mazes, cfg.seed, eval_grids=eval_grids)
    return MazeTask(cells, cfg.eval.num_mazes, cfg.seed, cfg.task.pool_size, cfg.task.get("pool_order", "step"),
                    cfg.train.batch_size, train_grids=train_grids, eval_grids=eval_grids)  # fmt: skip


def base_run_config(cfg) -> dict:
    """The base run's config: what its model and its evaluation depend on."""
    return {**base_config(cfg), "experiment": "maze-base", "eval": OmegaConf.to_container(cfg.eval)}


def ensure_base(cfg, loop: LoopSettings, root: Path, device: str, need_weights: bool = True) -> Path:
    """The shared base model: trained (and evaluated) once, reused by every RL run of the same settings.
    need_weights=False (run.base_only) accepts a base restored from the archive with its records only."""
    config = base_run_config(cfg)
    path = base_path(root, cfg, base_run_config)

    def train_and_evaluate(run_dir):
        torch.manual_seed(cfg.seed)
        loss = train_base(cfg, path, device)
        model = build_model(cfg.model.name, str(path)).to(device)
        task = make_task(cfg, pool=False)
        engine = HFEngine(model, maze.DONE_ID, maze.PAD_ID, cfg.temperature)
        metrics = evaluate_into(run_dir, cfg.sft.steps, loop, task, engine, torch.Generator().manual_seed(cfg.seed))
        fixed, rate = maze.best_fixed_answer_rate(list(task.eval_grids.values()))
        metrics.update({"train/sft_loss": loss, f"eval/{EVAL_SET}/best_fixed_answer_rate": rate})
        return cfg.sft.steps, metrics, {"best_fixed_answer": fixed}

    base_run(path, config, train_and_evaluate, weights=need_weights)
    return path


def run(cfg: DictConfig) -> dict:
    """Train one RL run from the shared base model (or resume it) and return the final evaluation."""
    settings, loop = validate(cfg)
    threads = set_torch_threads(cfg.threads)
    device, root = resolve_device(cfg), study_root(cfg)
    if cfg.run.get("base_only", False):
        ensure_base(cfg, loop, root, device, need_weights=bool(cfg.run.get("base_weights", False)))
        return {}

    def prepare():
        base = ensure_base(cfg, loop, root, device)
        torch.manual_seed(cfg.seed)
        model = build_model(cfg.model.name, str(base)).to(device)
        task = make_task(cfg)
        return model, task, make_engine(cfg, model, base, maze.DONE_ID, maze.PAD_ID)

    base = base_path(root, cfg, base_run_config)
    return run_rl(cfg, settings, loop, root / run_name(cfg, settings), prepare, threads, base)


if __name__ == "__main__":
    lm_main("maze", run)
