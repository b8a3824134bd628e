"""The maze policy: SmolLM2's (Llama) architecture trained from scratch on the 13-token maze vocabulary.

`maze-3m` is the paper's size (4 layers, hidden 256, ~3.2M parameters); `maze-1m` (hidden 128, ~1M) is the CPU
default. `model.path` loads any local HF causal-LM checkpoint instead (e.g. the saved base model, or SmolLM2-360M on
a GPU machine, whose embeddings are then resized to the maze vocabulary).
"""

from __future__ import annotations

import torch
from transformers import PreTrainedTokenizerFast

from experiments.maze.task import BOS_ID, DONE_ID, PAD_ID, VOCAB
from sera.sft import small_llama

PRESETS = {
    "maze-1m": {"hidden_size": 128, "intermediate_size": 512, "num_hidden_layers": 4, "num_attention_heads": 4},
    "maze-3m": {"hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 4, "num_attention_heads": 4},
    "maze-tiny": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2},
}


def build_tokenizer() -> PreTrainedTokenizerFast:
    """A word-level tokenizer over the maze vocabulary (tokens separated by spaces), for TRL and saved checkpoints."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    core = Tokenizer(models.WordLevel({t: i for i, t in enumerate(VOCAB)}, unk_token=VOCAB[PAD_ID]))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token=VOCAB[PAD_ID], bos_token=VOCAB[BOS_ID], eos_token=VOCAB[DONE_ID]
    )


def build_model(name: str, path: str | None = None, max_positions: int = 512) -> torch.nn.Module:
    """A from-scratch preset, or a local checkpoint at `path` (embeddings resized to the maze vocabulary)."""
    if path:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(path)
        if model.get_input_embeddings().num_embeddings != len(VOCAB):
            model.resize_token_embeddings(len(VOCAB))
        return model
    if name not in PRESETS:
        raise ValueError(f"unknown model.name {name!r}; choose from {sorted(PRESETS)} or set model.path")
    return small_llama(PRESETS[name], len(VOCAB), BOS_ID, DONE_ID, PAD_ID, max_positions)
