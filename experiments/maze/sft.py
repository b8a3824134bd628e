"""The maze base model: a short supervised stage (TRL's SFTTrainer) on shortest paths, stopped early so it is weak.

The paper's base model solves 1.27% of held-out mazes at Pass@1; docs/history/calibration.md found ~240 steps of batch
32 gives a similar weak model on the CPU. It is trained once per (model, SFT settings, scale) and shared by every RL
run; its directory is also a run directory (config.yaml, metrics.jsonl with the base model's evaluation, DONE), which is
the "Base model" row of Table 4.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from experiments.maze.model import build_model, build_tokenizer
from experiments.maze.task import cells_for_grid, encode_answer, encode_prompt, generate_maze, solve
from sera.sft import sft_train

SFT_SEED_OFFSET = 5_000_000  # SFT mazes: seeds disjoint from held-out (10_000+) and RL (1_000_000+) mazes


def sft_examples(num: int, cells: int, seed: int) -> dict:
    """Pre-tokenized SFT data: prompt + shortest path + DONE, with the loss on the answer only (labels -100)."""
    input_ids, labels = [], []
    for i in range(num):
        grid = generate_maze(cells, SFT_SEED_OFFSET + seed * 1_000_000 + i)
        prompt, answer = encode_prompt(grid), encode_answer(solve(grid))
        input_ids.append(prompt + answer)
        labels.append([-100] * len(prompt) + answer)
    return {"input_ids": input_ids, "labels": labels}


def base_config(cfg) -> dict:
    """The settings the base model depends on (a different one is refused, never silently reused)."""
    return OmegaConf.to_container(OmegaConf.masked_copy(cfg, ["model", "sft", "task", "seed"]), resolve=True)


def train_base(cfg, out_dir: Path, device: str) -> float:
    """Supervised fine-tuning from scratch (sera.sft); saves an HF checkpoint (model + tokenizer) into out_dir.

    Returns the final training loss (mean of the last logged values).
    """
    model = build_model(cfg.model.name, cfg.model.path)
    examples = sft_examples(cfg.sft.steps * cfg.sft.batch_size, cells_for_grid(cfg.task.grid_size), cfg.seed)
    return sft_train(model, build_tokenizer(), examples, out_dir, cfg.sft, cfg.seed, device, cfg.progress)
