"""Names that differ between the transformers versions the suite runs on: 5.24 in `.venv` (the CPU studies and
tests), 5.17 where vLLM 0.31 pins it (`.venv-vllm`, and `.venv-gpu` on GPU machines).

`make test-vllm` runs the decoding and log-prob tests under 5.17 as well (tests/test_rollout_decode.py).
"""

from __future__ import annotations

import inspect
from dataclasses import fields


def activation_checkpointing(on: bool) -> dict:
    """TrainingArguments' activation-checkpointing switch (TRL's configs turn it on by default) under its name in the
    installed transformers: `activation_checkpointing` from 5.20, `gradient_checkpointing` before."""
    from transformers import TrainingArguments

    names = {f.name for f in fields(TrainingArguments)}
    return {"activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing": on}


def cache_keyword(model) -> str:
    """The keyword a model's forward takes its KV cache by, which is also the output's attribute that returns it:
    `cache` from transformers 5.20, `past_key_values` before. (5.17 swallows an unknown `cache=` keyword without a
    word and runs without the cache, so the name must be right, not merely accepted.)"""
    forward = getattr(model, "module", model).forward  # a DistributedDataParallel wrapper's module
    return "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"
