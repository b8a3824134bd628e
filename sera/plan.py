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

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer + self.activations + self.logits + self.vllm

    @property
    def fits(self) -> bool:
        return self.total <= self.gpu_gb

    def rows(self) -> list[tuple[str, str]]:
        parts = [("weights (float32 master)", self.weights), ("gradients (float32)", self.gradients),
                 ("AdamW state (2 x float32)", self.optimizer), ("activations (one micro-batch)", self.activations),
                 ("logits (one micro-batch, with the loss's log-softmax)", self.logits),
                 ("vLLM (its gpu_memory_utilization share)", self.vllm)]  # fmt: skip
        out = [(name, f"{gb:.1f} GB") for name, gb in parts]
        out += [("total", f"{self.total:.1f} GB of {self.gpu_gb:.0f} GB: {'fits' if self.fits else 'does NOT fit'}")]
        out += [("compute a step (estimate)", f"{self.step_seconds:.0f} s at {ASSUMED_TFLOPS:.0f} TFLOP/s a GPU")]
        return out


def plan(arch: Arch, *, rollouts: int, micro_batch: int, prompt_tokens: int, response_tokens: int, gpus: int,
         gpu_gb: float, sharded: bool, autocast: str | None, vllm_share: float,
         chunk: int | None = None) -> Plan:  # fmt: skip
    """The per-GPU memory of one training rank and the compute of one step.

    rollouts: a step's rollouts (B n0); micro_batch: rollouts in one forward/backward (the step's whole share when
    0); prompt and response tokens at their limits (the loss keeps the width of the longest response); sharded:
    FSDP2 or ZeRO-3 (weights, gradients and optimizer state divided by the GPUs), else a full replica a GPU;
    autocast: "bfloat16" for mixed precision, None for float32; vllm_share: the fraction of the GPU vLLM reserves;
    chunk: train.logprob_chunk (None: the loss's log-softmax over the whole width at once).
    """
    if gpus < 1 or rollouts < 1 or gpu_gb <= 0:
        raise ValueError(f"need gpus >= 1, rollouts >= 1 and gpu_gb > 0; got {gpus}, {rollouts}, {gpu_gb}")
    share = 1 / gpus if sharded else 1.0
    per_rank = -(-rollouts // gpus)
    micro = min(micro_batch or per_rank, per_rank)
    tokens = micro * (prompt_tokens + response_tokens)
    activations = arch.layers * tokens * arch.hidden * ACTIVATION_BYTES["bfloat16" if autocast else "float32"] / GB
    # the forward's logits (bf16 under autocast, else float32), then the loss's float32 copy and log-softmax: of the
    # whole width, or of `chunk` positions at a time (train.logprob_chunk; a float32 forward needs no copy)
    forward = 2 if autocast else 4
    width = response_tokens if chunk is None else min(chunk, response_tokens)
    loss_copies = (4 if autocast else 0) + 4
    logits = micro * arch.vocab * (response_tokens * forward + width * loss_copies) / GB
    trained = rollouts * (prompt_tokens + response_tokens)
    flops = 6 * arch.params * trained + 2 * arch.params * rollouts * response_tokens  # train, then generate
    return Plan(
        weights=arch.params * 4 * share / GB,
        gradients=arch.params * 4 * share / GB,
        optimizer=arch.params * 8 * share / GB,
        activations=activations,
        logits=logits,
        vllm=vllm_share * gpu_gb,
        gpu_gb=gpu_gb,
        step_seconds=flops / (gpus * ASSUMED_TFLOPS * 1e12),
    )


def plan_of(cfg, gpus: int, gpu_gb: float, prompt_tokens: int = 512) -> Plan | None:
    """The plan of a composed LM config (None for a model without an entry in ARCHS: the CPU studies' tiny ones)."""
    model = cfg.get("model", {})
    arch = ARCHS.get(model.get("name"))
    if arch is None:
        return None
    train = cfg.train
    return plan(
        arch,
        rollouts=int(train.batch_size) * int(cfg.n0),
        micro_batch=int(train.micro_batch_rollouts or 0),
        prompt_tokens=prompt_tokens,
        response_tokens=int(cfg.max_new_tokens),
        gpus=gpus,
        gpu_gb=gpu_gb,
        sharded=train.get("parallel", "ddp") == "fsdp2",
        autocast="bfloat16" if model.get("dtype") == "bfloat16" else None,
        vllm_share=float(cfg.vllm.gpu_memory_utilization) if cfg.get("engine") == "vllm" else 0.0,
        chunk=train.get("logprob_chunk"),
    )


def check_fits(cfg, gpus: int, gpu_gb: float) -> None:
    """Refuse, before any work, a run whose plan does not fit the GPU; say what to lower."""
    p = plan_of(cfg, gpus, gpu_gb)
    if p is not None and not p.fits:
        detail = "; ".join(f"{name}: {value}" for name, value in p.rows())
        raise ValueError(
            f"this run needs about {p.total:.0f} GB a GPU and the GPU has {gpu_gb:.0f} GB ({detail}). Lower "
            "train.micro_batch_rollouts, set model.dtype=bfloat16, shard with train.parallel=fsdp2, or train through "
            "SERA inside TRL (docs/paper-scale.md)"
        )


def main(argv: list[str] | None = None) -> None:
    from pathlib import Path

    from hydra import compose, initialize_config_dir

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("study", choices=["maze", "math"])
    parser.add_argument("overrides", nargs="*", help="config overrides, e.g. scale=math/paper_qwen3")
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--gpu-gb", type=float, default=80.0)
    args = parser.parse_args(argv)
    configs = Path(__file__).resolve().parents[1] / "configs"
    with initialize_config_dir(config_dir=str(configs), version_base=None):
        cfg = compose(config_name=args.study, overrides=args.overrides)
    p = plan_of(cfg, args.gpus, args.gpu_gb)
    if p is None:
        print(f"no architecture entry for model.name={cfg.model.name}: a CPU model, nothing to plan")
        return
    rollouts = cfg.train.batch_size * cfg.n0
    micro = cfg.train.micro_batch_rollouts or "a whole share"
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
