"""Supervised fine-tuning to a weak base model (TRL's SFTTrainer), shared by the maze and the math study.

Both studies train a small model from scratch on pre-tokenized (input_ids, labels) examples and stop early, so the
base model is weak: low Pass@1, much higher Pass@K at large K (the paper's regime).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from sera.compat import activation_checkpointing


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
        **activation_checkpointing(False),  # its name in the installed transformers
    )
    one_device(args)
    trainer = SFTTrainer(model=model, args=args, train_dataset=Dataset.from_dict(examples), processing_class=tokenizer)
    result = trainer.train()
    shutil.rmtree(out_dir / "trainer", ignore_errors=True)  # TRL's scratch folder; the checkpoint is saved below
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h][-3:]
    return float(np.mean(losses)) if losses else float(result.training_loss)


def one_device(args) -> None:
    """Keep the Trainer to one device: outside torchrun, transformers wraps the model in nn.DataParallel over every
    visible GPU and multiplies the batch by their count, which would give another base model on a multi-GPU host. Its
    device count is read once (args.device) and then capped at 1; only a multi-GPU host can confirm the effect."""
    _ = args.device  # transformers sets args._n_gpu while it resolves the device
    if getattr(args, "_n_gpu", 0) > 1:
        args._n_gpu = 1


def small_llama(preset: dict, vocab_size: int, bos_id: int, eos_id: int, pad_id: int, max_positions: int):
    """A freshly initialised Llama (SmolLM2's architecture) of a preset's sizes (hidden_size, intermediate_size,
    num_hidden_layers, num_attention_heads) over a small vocabulary, tied embeddings, full multi-head attention: the
    from-scratch models of the maze and math studies. Seed torch first for a reproducible start."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        num_key_value_heads=preset["num_attention_heads"],
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        **preset,
    )
    return LlamaForCausalLM(config)
