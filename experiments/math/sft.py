"""The from-scratch math base model: a short supervised stage (TRL's SFTTrainer) on generated problems, stopped early so
it is weak (low Pass@1, much higher Pass@K at large K: the regime of the paper's SmolLM2 base, 6.8% / 84%).

The examples are the prompt ("<question>\\nAnswer: ") followed by the worked solution and the end token, with the
loss on the solution only; they are drawn from the training split after the RL problems, so SFT never sees an RL
training question or a held-out one. The base model is trained once per (model, SFT settings, data, seed) and
shared by every RL run; its directory is also the "Base" run of the tables (train.py).

`sft_train` is generic (any causal LM on pre-tokenized (input_ids, labels) examples); the maze has the same few lines
(experiments/maze/sft.py) - a candidate for sera/.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from experiments.math.model import EOS_ID, build_from_scratch, build_tokenizer
from experiments.math.prompts import render


def sft_examples(problems: list[dict], template: str, tokenizer) -> dict:
    """Pre-tokenized SFT data: prompt + solution + end token, labels -100 on the prompt."""
    input_ids, labels = [], []
    for p in problems:
        prompt = tokenizer(render(template, p["question"], tokenizer), add_special_tokens=False).input_ids
        answer = tokenizer(p["solution"], add_special_tokens=False).input_ids + [EOS_ID]
        input_ids.append(prompt + answer)
        labels.append([-100] * len(prompt) + answer)
    return {"input_ids": input_ids, "labels": labels}


def sft_train(model, tokenizer, examples: dict, out_dir: Path, sft, seed: int, device: str, progress: bool) -> float:
    """Supervised fine-tuning of `model` on pre-tokenized examples, one shuffled pass (sft.steps x sft.batch_size);
    saves the model and tokenizer into out_dir. Returns the final training loss (mean of the last logged values)."""
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    args = SFTConfig(
        output_dir=str(out_dir / "trainer"),
        max_steps=sft.steps,
        per_device_train_batch_size=sft.batch_size,
        learning_rate=sft.lr,
        lr_scheduler_type="constant_with_warmup",
        warmup_steps=sft.warmup_steps,
        weight_decay=0.0,
        logging_steps=max(1, sft.steps // 10),
        save_strategy="no",
        report_to=[],
        seed=seed,
        use_cpu=device == "cpu",
        dataloader_num_workers=0,
        max_length=None,
        disable_tqdm=not progress,
        # TRL's defaults are bf16 autocast and gradient checkpointing: on a CPU without bf16 matrix units that made
        # the tiny model's step 2.2 s instead of about 0.2 s; float32 and no checkpointing (it is small) instead.
        bf16=device != "cpu",
        activation_checkpointing=False,
    )
    trainer = SFTTrainer(model=model, args=args, train_dataset=Dataset.from_dict(examples), processing_class=tokenizer)
    result = trainer.train()
    shutil.rmtree(out_dir / "trainer", ignore_errors=True)  # TRL's scratch folder; the checkpoint is saved below
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h][-3:]
    return float(np.mean(losses)) if losses else float(result.training_loss)


def train_base(cfg, problems: list[dict], out_dir: Path, device: str) -> float:
    """Train the from-scratch model cfg.model.name on `problems` (at least sft.steps x sft.batch_size) into out_dir."""
    tokenizer = build_tokenizer()
    model = build_from_scratch(cfg.model.name)
    examples = sft_examples(problems[: cfg.sft.steps * cfg.sft.batch_size], cfg.template, tokenizer)
    return sft_train(model, tokenizer, examples, out_dir, cfg.sft, cfg.seed, device, cfg.progress)
