"""The from-scratch math base model: a short supervised stage (TRL's SFTTrainer) on generated problems, stopped early so
it is weak (low Pass@1, much higher Pass@K at large K: the regime of the paper's SmolLM2 base, 6.8% / 84%).

The examples are the prompt ("<question>\\nAnswer: ") followed by the worked solution and the end token, with the
loss on the solution only; they are drawn from the training split after the RL problems, so SFT never sees an RL
training question or a held-out one. The base model is trained once per (model, SFT settings, data, seed) and
shared by every RL run; its directory is also the "Base" run of the tables (train.py).

The training itself is sera.sft.sft_train, shared with the maze.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from experiments.math.model import EOS_ID, build_from_scratch, build_tokenizer
from experiments.math.prompts import render
from sera.sft import sft_train

NOISE_SEED = 7_777  # offset of the demonstrations' noise generator from the run's seed


def sft_examples(problems: list[dict], template: str, tokenizer) -> dict:
    """Pre-tokenized SFT data: prompt + solution + end token, labels -100 on the prompt."""
    input_ids, labels = [], []
    for p in problems:
        prompt = tokenizer(render(template, p["question"], tokenizer), add_special_tokens=False).input_ids
        answer = tokenizer(p["solution"], add_special_tokens=False).input_ids + [EOS_ID]
        input_ids.append(prompt + answer)
        labels.append([-100] * len(prompt) + answer)
    return {"input_ids": input_ids, "labels": labels}


def noisy_answers(problems: list[dict], p: float, width: int, seed: int) -> list[dict]:
    """The demonstrations with each answer-only solution ("\\boxed{N}") made wrong with probability p: N moved by an
    offset drawn uniformly from +-1..width. A model trained on them learns where the answer lies but spreads its mass
    around it: low Pass@1 with the answer well inside its support, the regime of a pretrained model that RL sharpens.
    Fixed per problem (seeded), so every epoch sees the same demonstrations."""
    rng = np.random.default_rng(seed)
    wrong, offsets = rng.random(len(problems)) < p, rng.integers(1, width + 1, len(problems))
    signs = rng.choice([-1, 1], len(problems))
    out = []
    for problem, w, offset, sign in zip(problems, wrong, offsets, signs, strict=True):
        if w:
            problem = {**problem, "solution": f"\\boxed{{{int(problem['answer']) + int(sign * offset)}}}"}
        out.append(problem)
    return out


def train_base(cfg, problems: list[dict], out_dir: Path, device: str) -> float:
    """Train the from-scratch model cfg.model.name for sft.steps steps on `problems` (the first sft.steps x
    sft.batch_size; fewer are seen in epochs; answers made wrong with probability sft.noise_p) into out_dir."""
    tokenizer = build_tokenizer()
    model = build_from_scratch(cfg.model.name)
    problems = problems[: cfg.sft.steps * cfg.sft.batch_size]
    if cfg.sft.get("noise_p", 0.0) > 0:
        problems = noisy_answers(problems, cfg.sft.noise_p, cfg.sft.noise_width, cfg.seed + NOISE_SEED)
    examples = sft_examples(problems, cfg.template, tokenizer)
    return sft_train(model, tokenizer, examples, out_dir, cfg.sft, cfg.seed, device, cfg.progress)
