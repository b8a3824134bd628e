"""Classification as a policy: the paper's ImageNet study, where every gradient is exact (docs/design.md section 5).

The classifier's softmax is the policy; a rollout is a label sampled from it, rewarded 1 if it is the true label.
p = softmax[y*] is exact, the CE gradient is the exact likelihood gradient, and Pass@K = 1 - (1 - p)^K in closed form.

Run (one run; its directory is named from the config, and the same command resumes an interrupted run):
    python -m experiments.imagenet.train method=sera n0=16                 # gauss1000 on the CPU, the authors' rule
    python -m experiments.imagenet.train method=sera_pilot method.estimator=history method.pilot_m=0
    python -m experiments.imagenet.train scale=imagenet/smoke method=maxrl  # seconds
    torchrun --nproc_per_node=8 -m experiments.imagenet.train scale=imagenet/paper data.root=/data/imagenet method=sera
The grid of the paper's Table 2 is `make reproduce-imagenet`; the pilot-size ablation (Table 3) `make ablate-pilot`.
"""

from __future__ import annotations

import atexit
import datetime
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import hydra
import numpy as np
import torch
import torch.nn.functional as F
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from experiments.imagenet.data import (
    BatchStream,
    build_digits1000,
    build_gauss1000,
    check_imagenet_root,
    image_folder_batches,
    image_folder_val_batches,
    imagenet_datasets,
    in_memory_batches,
    in_memory_val_batches,
)
from experiments.imagenet.model import build_model
from experiments.imagenet.policy import (
    STUDY,
    ImagePrompts,
    abandonment_error,
    gradient_alignment,
    policy_loss,
    rollout_loss,
    sequential_rollouts,
    step_metrics,
)
from sera import identity
from sera.allocation import scale_factor
from sera.collect import generation_metrics, sequential_state
from sera.config import check_group_choices, check_optim, check_run_settings, name_failures
from sera.distributed import PROCESS_GROUP_TIMEOUT_S, all_gather, unwrapped, world_info
from sera.driver import NO_CUDA
from sera.estimation import HistoricalEstimator
from sera.methods import MethodSettings
from sera.runlog import (
    VAL_P_FILE,
    RunDir,
    SkipGuard,
    alloc_snapshot_file,
    check_finite_eval,
    drop_restored,
    finished_summary,
)
from sera.threads import set_torch_threads

# ---------------------------------------------------------------------------------------------------------------
# Configuration checks: every cross-field rule, before any work starts.
# ---------------------------------------------------------------------------------------------------------------


def validate(cfg) -> MethodSettings:
    """Fail with a clear message on a malformed or infeasible config, before any work. Returns the method settings."""
    settings = MethodSettings.from_config(cfg, STUDY)
    check_run_settings(cfg)
    if cfg.run.get("base_only", False):
        raise ValueError("run.base_only=true trains the LM studies' shared base model; the classifier has none")
    if cfg.run.if_finished == "extend":  # its schedule and epochs are set by the run's length
        raise ValueError("run.if_finished=extend is for the LM studies (maze, math); use error or skip here")
    if cfg.train.batch_size < 1 or cfg.train.warm_start_steps < 0:
        raise ValueError("train.batch_size must be >= 1 and train.warm_start_steps >= 0")
    if cfg.train.epochs is None and cfg.train.steps < 1:
        raise ValueError(f"train.steps must be >= 1, got {cfg.train.steps}")
    if cfg.train.epochs is not None and cfg.train.epochs < 1:
        raise ValueError(f"train.epochs must be >= 1 or null, got {cfg.train.epochs}")
    if cfg.train.epochs is None and cfg.train.steps <= cfg.train.warm_start_steps and settings.is_rl:
        raise ValueError(f"train.steps={cfg.train.steps} leaves no RL steps after {cfg.train.warm_start_steps} CE")
    if cfg.eval.grad_cos_every < 1:
        raise ValueError(f"eval.grad_cos_every must be >= 1, got {cfg.eval.grad_cos_every}")
    if cfg.eval.at_start and (cfg.train.warm_start_steps < 1 or not settings.is_rl):
        raise ValueError("eval.at_start evaluates the model after the CE warm start: it needs an RL method and "
                         "train.warm_start_steps >= 1")  # fmt: skip
    if cfg.data.name == "imagenet":
        check_imagenet_root(cfg.data.root)
    elif cfg.data.name not in ("digits1000", "gauss1000"):
        raise ValueError(f"unknown data.name {cfg.data.name!r}; choose digits1000, gauss1000 or imagenet")
    if cfg.model.get("zero_head", False) and cfg.model.name != "mlp":
        raise ValueError("model.zero_head is for the MLP (the ResNet-50 keeps torchvision's initialisation)")
    if cfg.optim.name not in ("adam", "sgd") or cfg.optim.schedule not in ("constant", "cosine", "warmup_cosine"):
        raise ValueError("optim.name must be adam|sgd and optim.schedule constant|cosine|warmup_cosine")
    check_optim(cfg.optim)
    epochs = cfg.optim.get("warmup_epochs")
    if epochs is not None and (not isinstance(epochs, int | float) or epochs < 0 or cfg.optim.warmup_steps):
        raise ValueError(f"optim.warmup_epochs={epochs!r} must be >= 0, with optim.warmup_steps=0 (one warm-up length)")
    return settings


def run_name(cfg, settings: MethodSettings, default: dict | None = None) -> str:
    """Directory name from the config (sera.identity.run_name): method (+ p_hat variant), n0, every other setting that
    differs from `default` (None: the scale's and method's, from Hydra), seed; run.name when set. Never a timestamp."""
    if cfg.run.name:
        return cfg.run.name
    stem = settings.method.folder_name + settings.variant() + (f"_n0-{settings.n0}" if settings.is_rl else "")
    default = default if default is not None else identity.hydra_default()
    return identity.run_name(stem, cfg.seed, OmegaConf.to_container(cfg, resolve=True), default)


def rng_states(sample_gen: torch.Generator) -> list:
    """Every rank's (sampling generator, torch) RNG states, so a resumed multi-process run continues each stream."""
    return all_gather((sample_gen.get_state(), torch.get_rng_state()))


# ---------------------------------------------------------------------------------------------------------------
# Gradients and evaluation.
# ---------------------------------------------------------------------------------------------------------------
@torch.no_grad()
def evaluate(model, val_batches, ks, device) -> tuple[dict, np.ndarray]:
    """Closed-form Pass@K = mean over images of 1 - (1 - p)^K, p = softmax[y*]. Returns metrics and p (N_val,)."""
    model.eval()
    p = torch.cat(
        [
            F.softmax(model(x.to(device)).double(), -1).gather(1, y.to(device)[:, None])[:, 0].cpu()
            for x, y in val_batches()
        ]
    ).numpy()
    model.train()
    metrics = {f"eval/pass@{k}": float(scale_factor(p, k, delta=0).mean()) for k in ks}
    return metrics, p


def warmup_steps(optim, steps_per_epoch: int) -> int:
    """The linear warm-up's length in steps: optim.warmup_epochs of the training set where set (the authors'
    ImageNet recipe: 2 epochs), else optim.warmup_steps."""
    epochs = optim.get("warmup_epochs")
    return optim.warmup_steps if epochs is None else round(epochs * steps_per_epoch)


def lr_at(cfg, step: int, phase_start: int, phase_end: int, warmup: int | None = None) -> float:
    """The learning rate of `step` in the phase [phase_start, phase_end), t = step - phase_start, W = the warm-up
    (`warmup` steps; None: optim.warmup_steps), T = the phase's length, by optim.schedule:
    constant: lr min(1, (t+1)/W); cosine: that times 0.5 (1 + cos(pi t/T)), a decay from the phase's start;
    warmup_cosine (the authors' ImageNet recipe): lr t/W for t < W, then 0.5 lr (1 + cos(pi (t-W)/(T-W))), a
    decay that starts where the warm-up ends."""
    t, length = step - phase_start, max(1, phase_end - phase_start)
    w = cfg.optim.warmup_steps if warmup is None else warmup
    if cfg.optim.schedule == "warmup_cosine":
        # the authors' lr_lambda (ChenZihao0121/SERA,
        # verl/cifar10_experiments/sampling_based_rl_objective_experiments.py): a LambdaLR whose step counts optimizer
        # steps from 0; the 1e-6 it adds to T - W is left out
        if t < w:
            return cfg.optim.lr * t / w
        return cfg.optim.lr * 0.5 * (1 + math.cos(math.pi * (t - w) / max(1, length - w)))
    factor = min(1.0, (t + 1) / max(1, w))
    if cfg.optim.schedule == "cosine":
        factor *= 0.5 * (1 + math.cos(math.pi * t / length))
    return cfg.optim.lr * factor


def make_optimizer(cfg, params):
    if cfg.optim.name == "sgd":
        return torch.optim.SGD(
            params, lr=cfg.optim.lr, momentum=cfg.optim.momentum, weight_decay=cfg.optim.weight_decay
        )
    return torch.optim.Adam(params, lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay)


# ---------------------------------------------------------------------------------------------------------------
# The training run.
# ---------------------------------------------------------------------------------------------------------------
def setup_distributed(cfg):
    """(rank, world, device). torchrun sets WORLD_SIZE; each rank then takes B / world images of each step, whose
    allocation is over all of them (policy.rollout_loss)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    use_cuda = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(NO_CUDA)
    # one process group a launch, kept for every run of a --multirun sweep and ended at exit: a group started again in
    # the same launch waits forever in torchrun's rendezvous
    if world > 1 and not torch.distributed.is_initialized():
        timeout = datetime.timedelta(seconds=PROCESS_GROUP_TIMEOUT_S)  # ranks > 0 wait while rank 0 evaluates
        torch.distributed.init_process_group("nccl" if use_cuda else "gloo", timeout=timeout)
        atexit.register(torch.distributed.destroy_process_group)
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if use_cuda:
        torch.cuda.set_device(local)
    return rank, world, torch.device(f"cuda:{local}" if use_cuda else "cpu")


def build_task(cfg, rank: int, world: int):
    """(train BatchStream, val batches callable, in_features, num_classes). Each of the world ranks takes
    batch_size / world prompts a step, so the step's batch and rollout budget match a single-process run."""
    b = cfg.train.batch_size // world
    if cfg.data.name in ("digits1000", "gauss1000"):
        build = build_digits1000 if cfg.data.name == "digits1000" else build_gauss1000
        train, val = build(cfg.data.num_train, cfg.data.num_val, cfg.data.split_seed)
        stream = BatchStream(len(train), b, cfg.seed, in_memory_batches(train), rank, world)
        return stream, lambda: in_memory_val_batches(val), train.x.shape[1], 1000
    train, val = imagenet_datasets(cfg.data.root)
    stream = BatchStream(len(train), b, cfg.seed, image_folder_batches(train, cfg.data.workers, cfg.seed), rank, world)
    return stream, lambda: image_folder_val_batches(val, b, cfg.data.workers), None, len(train.classes)


def run(cfg: DictConfig) -> dict:
    """Train one run to completion (or resume it) and return the final evaluation."""
    settings = validate(cfg)
    rank, world, device = setup_distributed(cfg)
    if cfg.train.batch_size % world:
        raise ValueError(f"train.batch_size={cfg.train.batch_size} must be divisible by the {world} processes")
    if world > 1 and settings.sampler.stream:
        raise ValueError(f"{settings.method.name} runs in one process: its images are drawn as the step goes")
    threads = set_torch_threads(cfg.threads)
    config = OmegaConf.to_container(cfg, resolve=True)
    out_dir = Path(cfg.run.root) / f"{cfg.experiment}-{cfg.scale_name}" / run_name(cfg, settings)
    if cfg.run.get("rerun_archived", False):  # a reproduce target: a copy of the archive reproduces nothing
        if rank == 0:
            drop_restored(out_dir)
        if world > 1:
            torch.distributed.barrier()
    summary = finished_summary(out_dir, config)
    if summary is not None and cfg.run.if_finished == "skip":
        print(f"{out_dir} is finished with this config; skipping (run.if_finished=skip)")
        return summary
    run_dir = RunDir(out_dir, config, cfg.wandb) if rank == 0 else None
    try:
        return train(cfg, settings, rank, world, device, threads, run_dir)
    finally:
        if run_dir is not None:
            run_dir.close()


@dataclass
class Training:
    """What a run carries from step to step and through its checkpoints."""

    model: torch.nn.Module
    params: list
    optimizer: torch.optim.Optimizer
    stream: BatchStream  # the training images, in seeded epochs
    history: HistoricalEstimator  # each image's last success rate (the historical p_hat)
    seq_state: object | None  # the sequential allocators' state (DPS's predictor, SARA's prior), else None
    sample_gen: torch.Generator  # draws the rollouts (labels)

    def checkpoint(self, step: int, rng: list) -> dict:
        return {
            "step": step,
            "model": unwrapped(self.model).state_dict(),  # the same keys with or without DDP's wrapper
            "optimizer": self.optimizer.state_dict(),
            "stream": self.stream.state_dict(),
            "history": self.history.state_dict(),
            "sequential": self.seq_state.state_dict() if self.seq_state is not None else None,
            "rng": rng,
        }

    def restore(self, state: dict, cfg, rl_phase: bool, rank: int) -> int:
        """Load a checkpoint (an RL-phase one into a fresh RL optimizer); returns the step to resume at. A checkpoint
        written by another number of processes is refused: each rank's RNG streams and image shares are its own."""
        written, world = len(state["rng"]), world_info()[1]
        if written != world:
            raise ValueError(f"this run's checkpoint was written by {written} process(es) and is resumed by {world}: "
                             f"resume it as it was launched (torchrun --nproc_per_node={written}, or one process "
                             "for 1)")  # fmt: skip
        unwrapped(self.model).load_state_dict(state["model"])
        if rl_phase:
            self.optimizer = make_optimizer(cfg, self.params)
        self.optimizer.load_state_dict(state["optimizer"])
        self.stream.load_state_dict(state["stream"])
        self.history.load_state_dict(state["history"])
        if self.seq_state is not None:
            self.seq_state.load_state_dict(state.get("sequential") or state["predictor"])  # "predictor": older runs
        gen_state, torch_state = state["rng"][rank]
        self.sample_gen.set_state(gen_state)
        torch.set_rng_state(torch_state)
        return state["step"]


def setup(cfg, settings: MethodSettings, rank: int, world: int, device) -> tuple[Training, object]:
    """A fresh run's Training (data, model DDP-wrapped under torchrun, optimizer, p_hat history, sampling generator)
    and its validation batches."""
    torch.manual_seed(cfg.seed + rank)
    stream, val_batches, in_features, num_classes = build_task(cfg, rank, world)
    model = build_model(
        cfg.model.name, in_features, num_classes, list(cfg.model.hidden), cfg.model.get("zero_head", False)
    )
    model = model.to(device)
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None
        )
    params = [p for p in model.parameters() if p.requires_grad]
    history = HistoricalEstimator(stream.num, settings.p_lo, settings.p_hi)
    seq_state = sequential_state(settings, stream.num)  # DPS's predictor, SARA's prior: carried across steps
    # one label stream on every rank: under DDP each rank draws the whole step's rollouts (policy.rollout_loss), so
    # the allocation and the rollouts are the single process's; the sequential allocators run in one process
    sample_gen = torch.Generator().manual_seed(cfg.seed * 7919)
    return Training(model, params, make_optimizer(cfg, params), stream, history, seq_state, sample_gen), val_batches


def next_images(settings: MethodSettings, tr: Training, batch_size: int, device, sequential: bool):
    """The step's images (idx, x, y) and, for a sequential allocator, its rollouts (labels, Collected) and accounting:
    the allocator takes images as it goes, and the loss is on the groups it trains (x is None when there are none)."""
    if not sequential:
        idx, x, y = tr.stream.next_batch()
        return idx, x, y, None, {}
    prompts = ImagePrompts(tr.stream, tr.model, device)
    labels, collected = sequential_rollouts(settings, prompts, batch_size, tr.sample_gen, tr.seq_state)
    chosen = collected.prompts
    idx, y = torch.from_numpy(prompts.ids[chosen]), torch.from_numpy(prompts.y[chosen])
    x = prompts.images(chosen) if chosen.size else None
    return idx, x, y, (labels, collected), abandonment_error(collected, prompts.p_true, settings.n0)


def step_loss(cfg, settings: MethodSettings, tr: Training, idx, x, y, drawn, rl_step: bool, cos_due: bool, device):
    """Forward, the exact-likelihood (CE) loss, and in the RL phase the policy-gradient loss of the step's rollouts
    with its metrics and, when cos_due, the gradient's alignment to CE. Returns (loss, rollout data or None,
    metrics); loss is None when a sequential allocator left nothing to train on."""
    if x is None:  # DS or SARA at their caps on an all-saturated stream: say so and move on
        return None, None, {**generation_metrics(drawn[1]), "train/skipped_empty": 1}
    x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
    logp = F.log_softmax(tr.model(x).float(), dim=-1)  # (B, C)
    logp_true = logp.gather(1, y[:, None])[:, 0]  # (B,) log p
    ce_loss = -logp_true.mean()  # exact likelihood objective: Direct CE
    metrics = {"train/ce": ce_loss.item(), "train/p_mean": logp_true.detach().exp().mean().item()}
    if not rl_step:
        return ce_loss, None, metrics
    if drawn is not None:  # the sequential allocator's rollouts, drawn with the images
        labels, collected = drawn
        p_exact = logp_true.detach().exp().double().cpu().numpy()
        loss, out = policy_loss(settings, logp, collected.rows, labels, collected, p_exact, idx.numpy(), tr.history)
    else:
        loss, out = rollout_loss(settings, logp, logp_true, idx, y, tr.history, tr.sample_gen)
    # under DDP each rank's loss is its share of the step's: their mean is the single process's loss
    loss_value = loss.item() if out.own is None else float(np.mean(all_gather(loss.item())))
    metrics.update(step_metrics(settings, out, loss_value, cfg.train.batch_size))
    if cos_due and out.own is None:  # under DDP each rank holds a share of the step's gradient: not measured
        kept = out.collected.prompts  # every image but those the authors' rule left out
        if drawn is None and kept.size < logp_true.shape[0]:
            logp_true = logp_true[torch.from_numpy(kept).to(logp_true.device)]
        metrics.update(gradient_alignment(settings, loss, ce_loss, logp_true, out, tr.params))
    return loss, out, metrics


def update(optimizer, loss, metrics: dict, skips: SkipGuard, step: int) -> None:
    """One optimizer step on a finite loss; a non-finite one is skipped and said (train/skipped_nonfinite). Under
    torchrun every rank skips when any rank's loss is not finite: backward is a collective (DDP's gradient all-reduce),
    so a rank that skipped alone would leave the others waiting in it."""
    optimizer.zero_grad(set_to_none=True)
    finite = loss is not None and all(all_gather(bool(torch.isfinite(loss))))
    if finite:
        loss.backward()
        optimizer.step()
    elif loss is not None:
        metrics["train/skipped_nonfinite"] = 1
    skips.record(loss is not None and not finite, step)


def train(cfg, settings: MethodSettings, rank: int, world: int, device, threads: int, run_dir) -> dict:
    """The training loop of one run (rank 0 holds the run directory): images -> rollouts -> loss -> update ->
    evaluation and checkpoint. Returns the final evaluation."""
    tr, val_batches = setup(cfg, settings, rank, world, device)
    total_steps = cfg.train.epochs * tr.stream.steps_per_epoch if cfg.train.epochs else cfg.train.steps
    rl = settings.is_rl
    warm = cfg.train.warm_start_steps if rl else 0  # Direct CE is one CE phase; the warm start is its prefix
    sequential = rl and settings.sampler.stream  # DS, DPS, SARA: images drawn as the step goes
    skips = SkipGuard(cfg.run.max_skipped_steps)

    start = 0
    state = run_dir.load_checkpoint() if run_dir is not None else None
    if world > 1:
        box = [state]
        torch.distributed.broadcast_object_list(box, src=0)
        state = box[0]
    if state is not None:
        start = tr.restore(state, cfg, rl and state["step"] >= warm, rank)
    if run_dir is not None:
        run_dir.rewind(start - 1)  # drop records of work lost with an interruption (all of them without a checkpoint)

    bar = tqdm(
        range(start, total_steps),
        initial=start,
        total=total_steps,
        disable=not cfg.progress or rank != 0,
        desc=run_dir.path.name if run_dir is not None else f"rank {rank}",
        unit="step",
        mininterval=0.1 if sys.stderr.isatty() else 5.0,
    )
    final = {}
    for step in bar:
        t0 = time.perf_counter()
        if rl and step == warm:  # RL phase: a fresh optimizer with its own warmup (CE-phase Adam moments mismatch)
            tr.optimizer = make_optimizer(cfg, tr.params)
        phase = (0, warm) if step < warm else (warm, total_steps)
        for group in tr.optimizer.param_groups:
            group["lr"] = lr_at(cfg, step, *phase, warmup=warmup_steps(cfg.optim, tr.stream.steps_per_epoch))
        rl_step = rl and step >= warm
        idx, x, y, drawn, metrics = next_images(settings, tr, cfg.train.batch_size, device, sequential and rl_step)
        cos_due = (step - warm) % cfg.eval.grad_cos_every == 0
        loss, out, loss_metrics = step_loss(cfg, settings, tr, idx, x, y, drawn, rl_step, cos_due, device)
        metrics |= loss_metrics
        update(tr.optimizer, loss, metrics, skips, step)
        metrics["time/step_s"] = time.perf_counter() - t0
        metrics["train/lr"] = tr.optimizer.param_groups[0]["lr"]
        metrics["time/threads"] = threads

        is_last = step == total_steps - 1
        at_start = cfg.eval.at_start and rl and step + 1 == warm  # the model RL starts from (closed form: no RNG)
        if rank == 0 and ((step + 1) % cfg.eval.every == 0 or is_last or at_start):
            # the unwrapped module: a DDP forward syncs BatchNorm buffers, a collective the other ranks never join
            final, p_val = evaluate(unwrapped(tr.model), val_batches, cfg.eval.ks, device)
            check_finite_eval(final, step + 1)
            metrics.update(final)
            if cfg.train.log_coverage:  # distinct images trained on in the RL phase so far
                metrics["train/distinct_prompts"] = int(np.count_nonzero(~np.isnan(tr.history.last_rate)))
            metrics["train/steps_per_epoch"] = tr.stream.steps_per_epoch  # Table 3 averages over the last epoch
            bar.set_postfix(pass1=f"{final['eval/pass@1']:.3f}")
            if rl_step and loss is not None:  # the allocation picture: this step's p_hat, exact p and n_i per image
                np.savez(
                    run_dir.path / alloc_snapshot_file(step + 1),
                    p_exact=out.p_exact,
                    counts=out.counts,
                    p_hat=out.p_hat if out.p_hat is not None else np.full(len(out.counts), np.nan),
                )
        checkpoint_due = (step + 1) % cfg.run.checkpoint_every == 0 and not is_last
        rng = rng_states(tr.sample_gen) if checkpoint_due else None  # collective: every rank takes part
        if run_dir is not None:
            run_dir.log(step, metrics)
            if checkpoint_due:
                run_dir.save_checkpoint(tr.checkpoint(step + 1, rng))
    if run_dir is not None:
        np.save(run_dir.path / VAL_P_FILE, p_val)
        run_dir.finish({"step": total_steps, **final})
    return final


CONFIGS = Path(__file__).resolve().parents[2] / "configs"


@hydra.main(version_base=None, config_path="../../configs", config_name="imagenet")
@name_failures
def main(cfg: DictConfig) -> None:
    run(cfg)


if __name__ == "__main__":
    check_group_choices(CONFIGS, sys.argv[1:])
    main()
