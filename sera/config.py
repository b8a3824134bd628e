"""Checks of the config groups every entry point shares (seed, threads, device, run, eval, optimizer).

Each study's `validate(cfg)` calls these before any work starts, so a bad value is a clear message, never a
traceback from deep inside a run, and never a half-created run directory.
"""

from __future__ import annotations

import functools
import math
import sys

DEVICES = ("auto", "cpu", "cuda")


def check_run_settings(cfg) -> None:
    """seed, threads, device, run.*, eval.every and eval.ks; ValueError naming the key and the allowed values."""
    if not isinstance(cfg.seed, int) or cfg.seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {cfg.seed!r}")
    if cfg.threads != "auto" and (not isinstance(cfg.threads, int) or cfg.threads < 1):
        raise ValueError(f"threads must be 'auto' or a positive integer, got {cfg.threads!r}")
    if cfg.device not in DEVICES:
        raise ValueError(f"unknown device {cfg.device!r}; choose from {DEVICES}")
    if not isinstance(cfg.run.checkpoint_every, int) or cfg.run.checkpoint_every < 1:
        raise ValueError(f"run.checkpoint_every must be a positive integer, got {cfg.run.checkpoint_every!r}")
    if cfg.run.if_finished not in ("error", "skip", "extend"):
        raise ValueError(f"run.if_finished must be error, skip or extend, got {cfg.run.if_finished!r}")
    if not isinstance(cfg.run.get("base_only", False), bool):
        raise ValueError(f"run.base_only must be true or false, got {cfg.run.get('base_only')!r}")
    if not isinstance(cfg.run.max_skipped_steps, int) or cfg.run.max_skipped_steps < 1:
        raise ValueError(f"run.max_skipped_steps must be a positive integer, got {cfg.run.max_skipped_steps!r}")
    if not isinstance(cfg.eval.every, int) or cfg.eval.every < 1:
        raise ValueError(f"eval.every must be a positive integer, got {cfg.eval.every!r}")
    ks = list(cfg.eval.ks)
    if not ks or any(not isinstance(k, int) or k < 1 for k in ks):
        raise ValueError(f"eval.ks must be a non-empty list of positive integers, got {ks}")


def check_optim(optim) -> None:
    """A finite, positive learning rate (also each method's own, optim.lr_by_method) and non-negative weight decay."""
    from sera.methods import METHODS

    for name, lr in [("optim.lr", optim.lr), *[(f"optim.lr_by_method.{k}", v) for k, v in lr_by_method(optim).items()]]:
        if not isinstance(lr, int | float) or not math.isfinite(lr) or lr <= 0:
            raise ValueError(f"{name} must be a finite positive number, got {lr!r}")
    if unknown := sorted(set(lr_by_method(optim)) - set(METHODS)):
        raise ValueError(f"optim.lr_by_method names unknown methods {unknown}; known: {sorted(METHODS)}")


def lr_by_method(optim) -> dict:
    """{method name: learning rate} for the methods a study gives a rate of their own (optim.lr_by_method; {} when
    unset). The maze CPU default needs it: GRPO collapses at the rate MaxRL and SERA train well with."""
    by_method = optim.get("lr_by_method") or {}
    if not hasattr(by_method, "items"):
        raise ValueError(f"optim.lr_by_method must be a mapping of method name to learning rate, got {by_method!r}")
    return dict(by_method.items())


def method_lr(optim, method: str) -> float:
    """The learning rate a run of `method` trains with: its own in optim.lr_by_method, else optim.lr."""
    return float(lr_by_method(optim).get(method, optim.lr))
    if not math.isfinite(optim.weight_decay) or optim.weight_decay < 0:
        raise ValueError(f"optim.weight_decay must be finite and >= 0, got {optim.weight_decay!r}")


def check_group_choices(config_dir, argv: list[str], groups=("method", "scale")) -> None:
    """Exit with a message listing the valid choices when a command-line `group=choice` (comma-separated in a
    sweep) names no config file; Hydra alone says only 'Could not find'. Call before Hydra's main."""
    from pathlib import Path

    root = Path(config_dir)
    for arg in argv:
        group, _, value = arg.partition("=")
        if group not in groups or not value:
            continue
        valid = sorted(str(p.relative_to(root / group).with_suffix("")) for p in (root / group).rglob("*.yaml"))
        valid = [v for v in valid if v != "common" and not Path(v).name.startswith("_")]  # bases, not choices
        for choice in value.split(","):
            if choice not in valid:
                raise SystemExit(f"unknown {group}={choice}; choose from: {', '.join(valid)}")


def name_failures(task):
    """Wrap a Hydra task so that a run which raises is named on stderr ("run failed: <its overrides>") before its
    error goes on: a parallel sweep (JOBS=N, LAUNCHER=slurm) lets its other runs finish and raises only the first
    error, so this line is how each failed run is found. Rerunning the sweep resumes it."""

    @functools.wraps(task)
    def named(cfg):
        try:
            return task(cfg)
        except Exception:
            from hydra.core.hydra_config import HydraConfig

            overrides = " ".join(HydraConfig.get().overrides.task) if HydraConfig.initialized() else "(no Hydra)"
            print(f"run failed: {overrides}", file=sys.stderr, flush=True)
            raise

    return named


VLLM_DTYPES = (None, "auto", "float32", "bfloat16", "float16")


def vllm_options(cfg) -> dict:
    """The `vllm` group as VLLMEngine keyword arguments, checked (the LM studies call it in validate, and again to
    build the engine): tensor_parallel_size >= 1, a known dtype, 0 < gpu_memory_utilization <= 1."""
    v = cfg.vllm
    if not isinstance(v.tensor_parallel_size, int) or v.tensor_parallel_size < 1:
        raise ValueError(f"vllm.tensor_parallel_size must be a positive integer, got {v.tensor_parallel_size!r}")
    if v.dtype not in VLLM_DTYPES:
        raise ValueError(f"unknown vllm.dtype {v.dtype!r}; choose from {VLLM_DTYPES}")
    if not 0 < v.gpu_memory_utilization <= 1:
        raise ValueError(f"vllm.gpu_memory_utilization must lie in (0, 1], got {v.gpu_memory_utilization!r}")
    return {
        "tensor_parallel_size": v.tensor_parallel_size,
        "dtype": v.dtype,
        "gpu_memory_utilization": float(v.gpu_memory_utilization),
    }


def check_parallel(cfg) -> None:
    """train.parallel=fsdp2 shards the policy across the ranks, so every forward is a collective that all ranks must
    join in step: sampling with the policy itself (engine=hf, whose responses end at different lengths on each rank)
    would hang. FSDP2 therefore samples with vLLM, which holds its own copy of the weights."""
    parallel = cfg.train.get("parallel", "ddp")
    if parallel == "fsdp2" and cfg.engine != "vllm":
        raise ValueError("train.parallel=fsdp2 needs engine=vllm: the sharded policy cannot sample rank by rank")
