"""Maze navigation (the paper's Table 4): a small Llama policy learns to solve mazes with GRPO, MaxRL or SERA.

Run (one run; the base SFT model is trained on first use and shared; the same command resumes an interrupted run):
    python -m experiments.maze.train method=sera                                  # CPU default
    python -m experiments.maze.train method=maxrl method.aggregation=seqnorm
    python -m experiments.maze.train scale=maze/smoke method=grpo                 # seconds
    python -m experiments.maze.train scale=maze/paper method=sera                 # 17x17, maze-3m (GPU advised)
The grid of Table 4 is `make reproduce-maze`.
"""

from __future__ import annotations

from pathlib import Path

import hydra
import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from experiments.maze import task as maze
from experiments.maze.model import PRESETS, build_model
from experiments.maze.sft import base_config, train_base
from sera.lm_loop import evaluate, train, validate_method
from sera.methods import get_method
from sera.rollout import HFEngine, VLLMEngine
from sera.runlog import RunDir, finished_summary
from sera.threads import set_torch_threads


class MazeTask:
    """Fresh training mazes every step, a fixed held-out set for evaluation; prompts are identified by maze seed."""

    eos_id, pad_id, num_prompts = maze.DONE_ID, maze.PAD_ID, None  # fresh mazes: no historical p_hat

    def __init__(self, cells: int, num_eval: int, max_new_tokens: int):
        self.cells, self.max_new_tokens = cells, max_new_tokens
        self.eval_ids = np.arange(maze.HELDOUT_SEED, maze.HELDOUT_SEED + num_eval)
        self.grids = {int(s): g for s, g in zip(self.eval_ids, maze.heldout_mazes(num_eval, cells), strict=True)}
        self.eval_grids = dict(self.grids)

    def train_prompts(self, step: int, batch: int):
        ids = np.array([maze.train_maze_seed(step, i, batch) for i in range(batch)])
        self.grids = {**self.eval_grids, **{int(s): maze.generate_maze(self.cells, int(s)) for s in ids}}
        return ids, [maze.encode_prompt(self.grids[int(s)]) for s in ids]

    def eval_prompts(self):
        return self.eval_ids, [maze.encode_prompt(self.eval_grids[int(s)]) for s in self.eval_ids]

    def reward(self, prompt_id: int, response: list[int]) -> float:
        return maze.reward(self.grids[prompt_id], response)

    def eval_extras(self, ids, rollouts) -> dict:
        """Diversity: distinct well-formed answers per held-out maze (the shortcut trap collapses it)."""
        index = rollouts.prompt_index.numpy()
        answers = [rollouts.tokens[r][rollouts.mask[r].bool()].tolist() for r in range(len(index))]
        per_maze = [
            maze.distinct_answers([a for a, i in zip(answers, index, strict=True) if i == j]) for j in range(len(ids))
        ]
        return {"eval/distinct_answers": float(np.mean(per_maze))}


def validate(cfg):
    """Every cross-field check, before any work starts."""
    method = get_method(cfg.method.name)
    validate_method(cfg, method, repeated_prompts=False)
    maze.cells_for_grid(cfg.task.grid_size)
    if cfg.model.path is None and cfg.model.name not in PRESETS:
        raise ValueError(f"unknown model.name {cfg.model.name!r}; choose from {sorted(PRESETS)} or set model.path")
    if cfg.model.path is not None and not Path(cfg.model.path).expanduser().exists():
        raise FileNotFoundError(f"model.path {cfg.model.path} does not exist")
    if cfg.engine not in ("hf", "vllm"):
        raise ValueError(f"engine must be hf or vllm, got {cfg.engine!r}")
    if cfg.eval.samples < max(cfg.eval.ks):
        raise ValueError(f"eval.samples={cfg.eval.samples} is below the largest eval.ks {max(cfg.eval.ks)}")
    return method


def make_engine(cfg, model, path: Path):
    if cfg.engine == "vllm":
        return VLLMEngine(str(path), maze.DONE_ID, maze.PAD_ID, cfg.temperature, cfg.seed)
    return HFEngine(model, maze.DONE_ID, maze.PAD_ID, cfg.temperature)


def ensure_base(cfg, root: Path, device: str) -> Path:
    """The shared base model: trained (and evaluated) once, reused by every RL run of the same settings."""
    config = {**base_config(cfg), "experiment": "maze-base", "eval": OmegaConf.to_container(cfg.eval)}
    path = root / f"base_seed-{cfg.seed}"
    if finished_summary(path, config) is not None:
        return path
    run_dir = RunDir(path, config)
    torch.manual_seed(cfg.seed)
    loss = train_base(cfg, path, device)
    model = build_model(cfg.model.name, str(path)).to(device)
    metrics, record = evaluate(
        cfg,
        MazeTask(maze.cells_for_grid(cfg.task.grid_size), cfg.eval.num_mazes, cfg.max_new_tokens),
        HFEngine(model, maze.DONE_ID, maze.PAD_ID, cfg.temperature),
        torch.Generator().manual_seed(cfg.seed),
    )
    fixed, rate = maze.best_fixed_answer_rate(
        list(MazeTask(maze.cells_for_grid(cfg.task.grid_size), cfg.eval.num_mazes, 0).eval_grids.values())
    )
    metrics.update({"train/sft_loss": loss, "eval/best_fixed_answer_rate": rate})
    run_dir.write_json(f"eval_step{cfg.sft.steps}.json", record)
    run_dir.log(cfg.sft.steps, metrics)
    run_dir.finish({"step": cfg.sft.steps, **metrics, "best_fixed_answer": fixed})
    return path


def run(cfg: DictConfig) -> dict:
    """Train one RL run from the shared base model (or resume it) and return the final evaluation."""
    method = validate(cfg)
    threads = set_torch_threads(cfg.threads)
    device = "cuda" if cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available()) else "cpu"
    root = Path(cfg.run.root) / f"{cfg.experiment}-{cfg.scale_name}"
    config = OmegaConf.to_container(cfg, resolve=True)
    out_dir = root / (cfg.run.name or f"{cfg.method.name}-{cfg.method.aggregation}_n0-{cfg.n0}_seed-{cfg.seed}")
    summary = finished_summary(out_dir, config)
    if summary is not None and cfg.run.if_finished == "skip":
        print(f"{out_dir} is finished with this config; skipping (run.if_finished=skip)")
        return summary
    base = ensure_base(cfg, root, device)
    run_dir = RunDir(out_dir, config, cfg.wandb)
    torch.manual_seed(cfg.seed)
    model = build_model(cfg.model.name, str(base)).to(device)
    task = MazeTask(maze.cells_for_grid(cfg.task.grid_size), cfg.eval.num_mazes, cfg.max_new_tokens)
    engine = make_engine(cfg, model, base)
    final = train(cfg, method, task, model, engine, run_dir, device)
    run_dir.finish({"step": cfg.train.steps, "threads": threads, **final})
    return final


@hydra.main(version_base=None, config_path="../../configs", config_name="maze")
def main(cfg: DictConfig) -> None:
    run(cfg)


if __name__ == "__main__":
    main()
