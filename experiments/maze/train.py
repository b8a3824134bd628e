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
        task = MazeTask(maze.cells_for_grid(cfg.task.grid_size), cfg.eval.num_mazes, cfg.seed)
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
        ensure_base(cfg, loop, root, device, need_weights=False)
        return {}

    def prepare():
        base = ensure_base(cfg, loop, root, device)
        torch.manual_seed(cfg.seed)
        model = build_model(cfg.model.name, str(base)).to(device)
        task = MazeTask(maze.cells_for_grid(cfg.task.grid_size), cfg.eval.num_mazes, cfg.seed, cfg.task.pool_size,
                        cfg.task.get("pool_order", "step"), cfg.train.batch_size)  # fmt: skip
        return model, task, make_engine(cfg, model, base, maze.DONE_ID, maze.PAD_ID)

    base = base_path(root, cfg, base_run_config)
    return run_rl(cfg, settings, loop, root / run_name(cfg, settings), prepare, threads, base)


if __name__ == "__main__":
    lm_main("maze", run)
