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

from experiments.math.model import EOS_ID, build_from_scratch, build_tokenizer
from experiments.math.prompts import render
from sera.sft import sft_train


def sft_examples(problems: list[dict], template: str, tokenizer) -> dict:
    """Pre-tokenized SFT data: prompt + solution + end token, labels -100 on the prompt."""
    input_ids, labels = [], []
    for p in problems:
        prompt = tokenizer(render(template, p["question"], tokenizer), add_special_tokens=False).input_ids
        answer = tokenizer(p["solution"], add_special_tokens=False).input_ids + [EOS_ID]
        input_ids.append(prompt + answer)
        labels.append([-100] * len(prompt) + answer)
    return {"input_ids": input_ids, "labels": labels}


def train_base(cfg, problems: list[dict], out_dir: Path, device: str) -> float:
    """Train the from-scratch model cfg.model.name for sft.steps steps on `problems` (the first sft.steps x
    sft.batch_size; fewer are seen in epochs) into out_dir."""
    tokenizer = build_tokenizer()
    model = build_from_scratch(cfg.model.name)
    examples = sft_examples(problems[: cfg.sft.steps * cfg.sft.batch_size], cfg.template, tokenizer)
    return sft_train(model, tokenizer, examples, out_dir, cfg.sft, cfg.seed, device, cfg.progress)
