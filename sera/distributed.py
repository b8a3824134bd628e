"""Rank helpers for data-parallel training under torchrun, shared by the classifier and the LM loop.

Every helper is a no-op or the identity outside torch.distributed (one process), so the single-process path runs the
same code. `all_gather` (any picklable object, rank order), `shard` (this rank's items, i mod world), `gather_grouped`
(per-rollout values of every rank's prompts, back in grouped order), `sum_over_ranks` (gradients and losses), and
FSDP2 (train.parallel=fsdp2): `shard_model`, `full_state` and `load_full_state` (checkpoints hold the gathered state),
`gathered_state` (the whole weights on every rank: vLLM's sync, TRL's records).
Checked on CPU processes over gloo (tests); only a GPU run can confirm NCCL and FSDP2's memory saving.
"""

from __future__ import annotations

import numpy as np
import torch

# How long a rank waits in a collective before torch aborts the job. Torch's default (30 minutes, 10 under NCCL) is
# shorter than ranks can drift apart in an evaluation of the paper's Qwen models, where each rank samples its share
# of the held-out questions (hours of generation at 512 samples a question) and then waits for the slowest in the
# gather; a rank that truly hangs is reported after this long instead.
PROCESS_GROUP_TIMEOUT_S = 24 * 3600
RANK_SEED_STRIDE = 7919  # a prime; rank r's generators start at seed + 7919 r


def rank_seed(seed: int) -> int:
    """This rank's seed for a generator that every rank makes from `seed`: seed + 7919 rank, the seed itself on rank
    0 and in one process, so the ranks sample different noise (distinct while the seeds given differ by < 7919)."""
    return seed + RANK_SEED_STRIDE * world_info()[0]


def world_info() -> tuple[int, int]:
    """(rank, world size); (0, 1) outside torch.distributed."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def all_gather(obj) -> list:
    """Every rank's `obj`, in rank order ([obj] outside torch.distributed)."""
    rank, world = world_info()
    if world == 1:
        return [obj]
    out = [None] * world
    torch.distributed.all_gather_object(out, obj)
    return out


def unwrapped(model):
    """The module inside a DistributedDataParallel wrapper (the model itself otherwise): what one rank alone may run
    forward, since the wrapper's forward can be a collective (it syncs buffers such as BatchNorm's)."""
    return model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model


def shard(num: int) -> np.ndarray:
    """This rank's items of 0..num-1: i with i mod world == rank (all of them in one process)."""
    rank, world = world_info()
    return np.arange(rank, num, world)


def gather_grouped(counts: np.ndarray, mine: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Assemble per-rollout values grouped by prompt (counts (B,)) from every rank's share: rank r holds the
    rollouts of prompts `mine` (its shard) in grouped order."""
    out = np.empty(int(counts.sum()))
    offsets = np.cumsum(counts) - counts
    for prompts, part in all_gather((mine, values)):
        positions = np.concatenate([offsets[i] + np.arange(counts[i]) for i in prompts] or [np.zeros(0, int)])
        out[positions.astype(np.int64)] = part
    return out


def sum_over_ranks(model, loss: float | None) -> float | None:
    """Sum the ranks' gradients and losses (each rank's loss already uses the global normalisers); None on every
    rank, gradients cleared, when any rank's loss was not finite. A sharded (FSDP2) model's gradients were summed
    by its reduce-scatter during backward; only the losses are summed here."""
    flags = all_gather(loss)
    if any(v is None for v in flags):
        model.zero_grad(set_to_none=True)
        return None
    if not is_sharded(model):
        for p in model.parameters():
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            torch.distributed.all_reduce(p.grad)
    return float(sum(flags))


# FSDP2 (train.parallel=fsdp2): parameters, gradients and optimizer state sharded across the ranks.
def is_sharded(model) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def shard_model(model) -> None:
    """fully_shard every transformer block (model.model.layers of HF causal LMs), then the root. Gradients are summed
    across ranks, not averaged (divide factor 1): each rank's loss already carries the step's global normalisers.

    Every forward and backward is then a collective: all ranks must run the same number of them, which
    backward_in_micro_batches ensures for training; sampling must not use the sharded model (engine=vllm, whose
    weights are synced from the gathered full state). Checked on CPU processes over gloo (tests); only a GPU run can
    confirm the memory saving and NCCL.
    """
    from torch.distributed.fsdp import FSDPModule, fully_shard

    for layer in getattr(getattr(model, "model", None), "layers", None) or []:
        fully_shard(layer)
    fully_shard(model)
    for module in model.modules():
        if isinstance(module, FSDPModule):  # a plain sum reduce-scatter (no pre-multiplied sum, which gloo lacks)
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)


def full_state(model, optimizer) -> tuple[dict, dict]:
    """(model, optimizer) state dicts to checkpoint. Sharded: gathered to full tensors on rank 0 (a collective: every
    rank calls it; other ranks get empty dicts)."""
    if not is_sharded(model):
        return model.state_dict(), optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    return get_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def gathered_state(model) -> dict:
    """The model's state dict with every FSDP2 DTensor gathered to a full tensor on this rank (a collective when
    sharded: every rank calls it); detached, and the plain state dict of an unsharded model."""
    return {k: getattr(v, "full_tensor", lambda v=v: v)().detach() for k, v in model.state_dict().items()}


def load_full_state(model, optimizer, model_state: dict, optimizer_state: dict) -> None:
    """Load what full_state saved (every rank holds the whole checkpoint)."""
    if not is_sharded(model):
        model.load_state_dict(model_state)
        optimizer.load_state_dict(optimizer_state)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    options = StateDictOptions(full_state_dict=True)
    set_state_dict(model, optimizer, model_state_dict=model_state, optim_state_dict=optimizer_state, options=options)
