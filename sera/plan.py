"""Memory and time planned before a language-model run, not discovered by it: per-GPU memory of the policy's weights,
gradients, AdamW state, the loss's activations and logits, and vLLM's share, and an estimated time per step, for a
config and a GPU count. Arithmetic only (no torch): every figure is an estimate from the architecture's sizes, and
the assumptions are named where they are made.

    python -m sera.plan math scale=math/paper_qwen3 --gpus 8 --gpu-gb 80    (make plan SCALE=paper MODEL=...)

A run on a GPU checks its plan before any work (`check_fits`) and refuses one that cannot fit.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

GB = 1e9


@dataclass(frozen=True)
class Arch:
    """The sizes of a decoder-only model that memory depends on (from each model's published config.json)."""

    params: float  # parameters, embeddings included (tied or not, as the checkpoint stores them)
    layers: int
    hidden: int
    vocab: int


ARCHS = {  # the paper's models: SmolLM2-360M-Instruct, Qwen2.5-Math-1.5B, Qwen3-4B-Base
    "smollm2-360m-instruct": Arch(params=362e6, layers=32, hidden=960, vocab=49152),
    "qwen2.5-math-1.5b": Arch(params=1.54e9, layers=28, hidden=1536, vocab=151936),
    "qwen3-4b-base": Arch(params=4.02e9, layers=36, hidden=2560, vocab=151936),
}
# bytes of activations kept for backward per token, layer and hidden unit without recomputation: about 34 in half
# precision for a transformer block (Korthikanti et al., 2022, attention scores left out: SDPA kernels do not keep
# them), twice that in float32
ACTIVATION_BYTES = {"bfloat16": 34, "float32": 68}
ASSUMED_TFLOPS = 300.0  # sustained bf16 throughput a GPU is assumed to reach in training (an assumption, not measured)
# the same in float32 without TF32 (CUDA cores, not tensor cores: an H100's fp32 peak is 67 TFLOP/s, its dense bf16
# one 990), an assumption too; a float32 run is priced at it, about 7.5 times slower
ASSUMED_FP32_TFLOPS = 40.0
# TRL's fused LM head (trl.trainer.utils.add_fused_lm_head, which GRPOTrainer 1.16 adds): the log-probs come from
# float32 tiles of (4096 tokens, 32768 vocabulary entries) of the logits, recomputed in backward, never the whole
# (N, T, V) logits (trl/kernels/chunked_logprob.py: TOKEN_CHUNK_SIZE; trl/trainer/utils.py: _CHUNKED_LOGPROB_CHUNK_SIZE)
TRL_HEAD_TILE = (4096, 32768)


@dataclass(frozen=True)
class Plan:
    """Per-GPU memory in GB, the total and whether it fits, and the estimated seconds of compute a step."""

    weights: float
    gradients: float
    optimizer: float
    activations: float
    logits: float
    vllm: float
    gpu_gb: float
    step_seconds: float
    tflops: float = ASSUMED_TFLOPS  # the throughput step_seconds assumes (the model's training precision)
    buckets: float = 0.0  # DistributedDataParallel's gradient buckets: a second float32 copy of the gradients

    @property
    def total(self) -> float:
        return (self.weights + self.gradients + self.buckets + self.optimizer + self.activations + self.logits
                + self.vllm)  # fmt: skip

    @property
    def fits(self) -> bool:
        return self.total <= self.gpu_gb

    def rows(self) -> list[tuple[str, str]]:
        parts = [("weights (float32 master)", self.weights), ("gradients (float32)", self.gradients),
                 ("DDP gradient buckets (float32)", self.buckets), ("AdamW state (2 x float32)", self.optimizer),
                 ("activations (one micro-batch)", self.activations),
                 ("logits (a micro-batch's, or TRL's fused-head tile)", self.logits),
                 ("vLLM (its gpu_memory_utilization share)", self.vllm)]  # fmt: skip
        out = [(name, f"{gb:.1f} GB") for name, gb in parts]
        out += [("total", f"{self.total:.1f} GB of {self.gpu_gb:.0f} GB: {'fits' if self.fits else 'does NOT fit'}")]
        out += [("compute a step (estimate)", f"{self.step_seconds:.0f} s at {self.tflops:.0f} TFLOP/s a GPU")]
        return out


def plan(arch: Arch, *, rollouts: int, micro_batch: int, prompt_tokens: int, response_tokens: int, gpus: int,
         gpu_gb: float, sharded: bool, autocast: str | None, vllm_share: float,
         chunk: int | None = None, checkpointing: bool = False, fused_head: bool = False,
         ddp_buckets: bool = False) -> Plan:  # fmt: skip
    """The per-GPU memory of one training rank and the compute of one step.

    rollouts: a step's rollouts (B n0); micro_batch: rollouts in one forward/backward (the step's whole share when
    0); prompt and response tokens at their limits (the loss keeps the width of the longest response); sharded:
    FSDP2 or ZeRO-3 (weights, gradients and optimizer state divided by the GPUs), else a full replica a GPU;
    autocast: "bfloat16" for mixed precision, None for float32; vllm_share: the fraction of the GPU vLLM reserves;
    chunk: train.logprob_chunk (None: the loss's log-softmax over the whole width at once); checkpointing:
    activation checkpointing (each layer's input kept, one layer's activations recomputed at a time in backward);
    fused_head: the log-probs from TRL's fused LM head (one float32 tile of TRL_HEAD_TILE, not the logits);
    ddp_buckets: DistributedDataParallel's gradient buckets, a float32 copy of the gradients (more than one GPU).
    The step's compute is priced at ASSUMED_TFLOPS a GPU under autocast, at ASSUMED_FP32_TFLOPS in float32 (its
    generation too, which vLLM runs in the checkpoint's dtype: an upper bound there).
    """
    if gpus < 1 or rollouts < 1 or gpu_gb <= 0:
        raise ValueError(f"need gpus >= 1, rollouts >= 1 and gpu_gb > 0; got {gpus}, {rollouts}, {gpu_gb}")
    share = 1 / gpus if sharded else 1.0
    per_rank = -(-rollouts // gpus)
    micro = min(micro_batch or per_rank, per_rank)
    tokens = micro * (prompt_tokens + response_tokens)
    kept = ACTIVATION_BYTES["bfloat16" if autocast else "float32"]
    if checkpointing:  # a layer's input a layer (2 or 4 bytes a unit), and one layer's activations at a time
        activations = tokens * arch.hidden * (arch.layers * (2 if autocast else 4) + kept) / GB
    else:
        activations = arch.layers * tokens * arch.hidden * kept / GB
    # the forward's logits (bf16 under autocast, else float32), then the loss's float32 copy and log-softmax: of the
    # whole width, or of `chunk` positions at a time (train.logprob_chunk; a float32 forward needs no copy)
    forward = 2 if autocast else 4
    width = response_tokens if chunk is None else min(chunk, response_tokens)
    loss_copies = (4 if autocast else 0) + 4
    logits = micro * arch.vocab * (response_tokens * forward + width * loss_copies) / GB
    if fused_head:
        logits = min(micro * response_tokens, TRL_HEAD_TILE[0]) * min(arch.vocab, TRL_HEAD_TILE[1]) * 4 / GB
    trained = rollouts * (prompt_tokens + response_tokens)
    flops = 6 * arch.params * trained + 2 * arch.params * rollouts * response_tokens  # train, then generate
    tflops = ASSUMED_TFLOPS if autocast else ASSUMED_FP32_TFLOPS
    return Plan(
        weights=arch.params * 4 * share / GB,
        gradients=arch.params * 4 * share / GB,
        buckets=arch.params * 4 / GB if ddp_buckets and gpus > 1 and not sharded else 0.0,
        optimizer=arch.params * 8 * share / GB,
        activations=activations,
        logits=logits,
        vllm=vllm_share * gpu_gb,
        gpu_gb=gpu_gb,
        step_seconds=flops / (gpus * tflops * 1e12),
        tflops=tflops,
    )


def plan_of(cfg, gpus: int, gpu_gb: float, prompt_tokens: int = 512, **route) -> Plan | None:
    """The plan of a composed LM config (None for a model without an entry in ARCHS: the CPU studies' tiny ones).
    `route` replaces what the config says about how the suite's loop trains (micro_batch, sharded, vllm_share, chunk,
    checkpointing): another trainer's settings, as plan_trl passes them."""
    model = cfg.get("model", {})
    arch = ARCHS.get(model.get("name"))
    if arch is None:
        return None
    train = cfg.train
    suite = dict(
        micro_batch=int(train.micro_batch_rollouts or 0),
        sharded=train.get("parallel", "ddp") == "fsdp2",
        vllm_share=float(cfg.vllm.gpu_memory_utilization) if cfg.get("engine") == "vllm" else 0.0,
        chunk=train.get("logprob_chunk"),
    )
    return plan(
        arch,
        rollouts=int(train.batch_size) * int(cfg.n0),
        prompt_tokens=prompt_tokens,
        response_tokens=int(cfg.max_new_tokens),
        gpus=gpus,
        gpu_gb=gpu_gb,
        autocast="bfloat16" if model.get("dtype") == "bfloat16" else None,
        **{**suite, **route},
    )


TRL_VLLM_SHARE = 0.3  # GRPOConfig's vllm_gpu_memory_utilization, which the TRL scripts leave at its default


def plan_trl(cfg, gpus: int, gpu_gb: float, micro_rows: int, sharded: bool, prompt_tokens: int = 512) -> Plan | None:
    """The plan of a config run through SERA inside TRL (examples/trl_math.py, examples/trl_maze.py: what the paper
    scales launch): `micro_rows` rows a device micro-batch (--micro-rows), activation checkpointing (TRL's default
    on GPUs), TRL's fused LM head, ZeRO-3 or FSDP2 when `sharded` (else accelerate's DDP, with its gradient
    buckets), float32 weights with bf16 autocast when model.dtype=bfloat16, and vLLM colocate's share (TRL's
    default 0.3) where the config generates with vLLM. None for a CPU model."""
    vllm_share = TRL_VLLM_SHARE if cfg.get("engine") == "vllm" else 0.0
    return plan_of(cfg, gpus, gpu_gb, prompt_tokens, micro_batch=micro_rows, sharded=sharded, vllm_share=vllm_share,
                   chunk=None, checkpointing=True, fused_head=True, ddp_buckets=True)  # fmt: skip


def launched_sharded() -> bool:
    """Whether `accelerate launch` set up ZeRO-3 or FSDP for this process (its environment says so)."""
    import os

    zero3 = (
        os.environ.get("ACCELERATE_USE_DEEPSPEED") == "true"
        and os.environ.get("ACCELERATE_DEEPSPEED_ZERO_STAGE") == "3"
    )
    return zero3 or os.environ.get("ACCELERATE_USE_FSDP") == "true"


def check_trl_fits(cfg, gpus: int, micro_rows: int) -> None:
    """On a GPU, refuse a TRL launch whose plan (plan_trl, sharded as accelerate set it up) does not fit the device,
    before the model loads; on the CPU, nothing."""
    import torch

    if not torch.cuda.is_available():
        return
    gpu_gb = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory / GB
    refuse_unless_fits(
        plan_trl(cfg, gpus, gpu_gb, micro_rows, launched_sharded()), "this TRL launch", gpu_gb,
        "--micro-rows, set model.dtype=bfloat16, or shard with ACCELERATE_CONFIG=configs/accelerate/zero3.yaml",
    )  # fmt: skip


def refuse_unless_fits(p: Plan | None, what: str, gpu_gb: float, lower: str) -> None:
    """Raise, saying each part of the plan and what to lower, when a plan does not fit the GPU (None: no plan)."""
    if p is not None and not p.fits:
        detail = "; ".join(f"{name}: {value}" for name, value in p.rows())
        raise ValueError(
            f"{what} needs about {p.total:.0f} GB a GPU and the GPU has {gpu_gb:.0f} GB ({detail}). Lower {lower}"
        )


def check_fits(cfg, gpus: int, gpu_gb: float) -> None:
    """Refuse, before any work, a run whose plan does not fit the GPU; say what to lower."""
    refuse_unless_fits(
        plan_of(cfg, gpus, gpu_gb), "this run", gpu_gb, "train.micro_batch_rollouts, set model.dtype=bfloat16, shard "
        "with train.parallel=fsdp2, or train through SERA inside TRL (docs/paper-scale.md)",
    )  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    from pathlib import Path

    from hydra import compose, initialize_config_dir

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("study", choices=["maze", "math"])
    parser.add_argument("overrides", nargs="*", help="config overrides, e.g. scale=math/paper_qwen3")
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--gpu-gb", type=float, default=80.0)
    parser.add_argument("--trl", action="store_true", help="the TRL route (what the paper scales launch)")
    parser.add_argument("--micro-rows", type=int, default=4, help="--trl: rows of a device micro-batch")
    parser.add_argument("--sharded", action="store_true", help="--trl: ZeRO-3 or FSDP2 (else data parallel)")
    args = parser.parse_args(argv)
    configs = Path(__file__).resolve().parents[1] / "configs"
    with initialize_config_dir(config_dir=str(configs), version_base=None):
        cfg = compose(config_name=args.study, overrides=args.overrides)
    if args.trl:
        p = plan_trl(cfg, args.gpus, args.gpu_gb, args.micro_rows, args.sharded)
    else:
        p = plan_of(cfg, args.gpus, args.gpu_gb)
    if p is None:
        print(f"no architecture entry for model.name={cfg.model.name}: a CPU model, nothing to plan")
        return
    rollouts = cfg.train.batch_size * cfg.n0
    micro = args.micro_rows if args.trl else cfg.train.micro_batch_rollouts or "a whole share"
    route = (f"through TRL ({'ZeRO-3/FSDP2' if args.sharded else 'data parallel'}, activation checkpointing)"
             if args.trl else "the suite's loop")  # fmt: skip
    print(f"{route}:")
    print(f"{cfg.model.name}: {rollouts} rollouts a step of up to {cfg.max_new_tokens} tokens, micro-batches of "
          f"{micro}, {args.gpus} GPU(s) of {args.gpu_gb:.0f} GB")  # fmt: skip
    for name, value in p.rows():
        print(f"  {name:54s} {value}")
    hours = p.step_seconds * cfg.train.steps / 3600
    label = f"the run, {cfg.train.steps} steps (compute only)"
    print(f"  {label:54s} {hours:.1f} h")
    if not p.fits:
        sys.exit(1)


if __name__ == "__main__":
    main()
