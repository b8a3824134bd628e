"""One policy-gradient loop for language-model policies, shared by the maze and math studies (docs/design.md 1-4, 6).

Each step (`rl_step`): the task gives B prompts; the shared collection step (sera.collect) estimates p_hat, allocates
the budget and draws the rollouts, which the task scores in one batch per draw; advantages with SERA's multiplicity
weights; the token-mean or seqnorm loss over the rollouts with a nonzero advantage, in micro-batches whose gradients
accumulate to the full-batch gradient; optimizer step; weight sync. `train` adds periodic Pass@K evaluation on the
task's named evaluation sets (one per-question record each), checkpoints, resume, and stops (no DONE) on repeated
non-finite steps or a non-finite evaluation. `run_rl` is the prologue and epilogue every LM entry point shares.

Data parallel (under torchrun, after torch.distributed.init_process_group): every rank sees the step's B prompts and
computes the same allocation (the budget and SERA's waterline are global: each draw's rewards are all-gathered), but
generates, scores and trains only its share of the prompts (prompt i on rank i mod world); the loss uses the step's
global normalisers and the gradients are summed across ranks, so a step equals the one-process step on the same
rollouts. Evaluation questions are sharded the same way. Rank 0 holds the run directory.

A study plugs in with a `Task` (below) and a short entry point built from sera/lm_study.py; tests/test_lm_study.py
builds a toy study that way.
"""

from __future__ import annotations

import contextlib
import sys
import time
from dataclasses import dataclass, fields
from typing import Protocol

import numpy as np
import torch
from omegaconf import OmegaConf
from tqdm import tqdm

from sera.allocation import scale_factor
from sera.collect import advantages_and_weights, collect, collection_metrics, generation_metrics, sequential_state
from sera.config import method_lr
from sera.distributed import (
    all_gather,
    full_state,
    gather_grouped,
    is_sharded,
    load_full_state,
    rank_seed,
    shard,
    shard_model,
    sum_over_ranks,
    world_info,
)
from sera.estimation import BetaHistory, HistoricalEstimator, epoch_of_step
from sera.losses import pg_loss
from sera.methods import MethodSettings
from sera.passk import pass_at_k
from sera.rollout import (
    LOGPROB_PATHS,
    Rollouts,
    concat_rollouts,
    end_token_ids,
    response_logprobs,
    shared_prompt_logprobs,
    static_decode_unsupported,
)
from sera.runlog import (
    TRAIN_POOL_SET,
    RunDir,
    SkipGuard,
    check_finite_eval,
    drop_restored,
    eval_record_file,
    extend_run,
    finished_summary,
    record_base,
)
from sera.sink import SinkMonitor


class Task(Protocol):
    """What a language-model study provides to the loop.

    Prompts are token-id lists; a prompt id identifies a question (ints, stable across runs: the per-question
    records and the historical p_hat are keyed by it). `eval_extras(name, ids, rollouts) -> {key: (Q,) values}` is
    optional: per-question extras of an evaluation set (e.g. the maze's distinct answers), averaged into
    `eval/<name>/<key>`; so is `train_pool_set() -> (ids, token lists)`, a finite training set as an evaluation set
    (evaluated at the end with train.log_coverage, as eval/train_pool/...).
    """

    eos_id: int | list[int]  # the token (or tokens) that end a response
    pad_id: int
    num_prompts: int | None  # size of a finite training set (ids in [0, num_prompts)); None: fresh prompts each step

    def train_prompts(self, step: int, batch: int, start: int = 0) -> tuple[np.ndarray, list[list[int]]]:
        """Prompts start .. start + batch - 1 of step `step`'s prompt stream: (ids, token lists), fewer when a finite
        pool runs out. Deterministic in (step, start), so a resumed run draws the same prompts. The batch allocators
        take the first B; DS, DPS and SARA take more as they go."""

    def eval_sets(self) -> dict[str, tuple[np.ndarray, list[list[int]]]]:
        """Named evaluation sets: {name: (ids (Q,), token lists)}."""

    def rewards(self, ids: np.ndarray, responses: list[list[int]], truncated: np.ndarray) -> np.ndarray:
        """Binary rewards (N,) of N responses (token lists up to and including the end token) to prompts ids (N,);
        truncated (N,) marks responses cut at the length limit. One call scores a whole draw."""


PARALLEL = ("ddp", "fsdp2")


NEVER_SOLVED = ("keep", "leave_out", "cap")


@dataclass(frozen=True)
class LoopSettings:
    """Every setting the LM loop reads, taken from the run config once (the library never sees the Hydra config)."""

    seed: int
    steps: int  # RL steps
    batch_size: int  # B prompts a step
    max_new_tokens: int  # response length limit
    temperature: float  # rollout sampling temperature (the loss log-probs use the same)
    top_p: float  # rollout nucleus sampling (1 = off)
    lr: float  # AdamW, linear warmup then constant
    weight_decay: float
    betas: tuple[float, float]
    eps: float
    warmup_steps: int
    grad_clip: float  # max gradient norm
    micro_batch_rollouts: int | None  # rollouts per forward/backward (None: all of a step's at once)
    logprobs: str  # the loss's log-probs: repeated-cache (response_logprobs) | shared-prompt (Llama models)
    parallel: str  # under torchrun: ddp (every rank a full replica) | fsdp2 (parameters sharded, fully_shard)
    eval_every: int
    eval_samples: int  # samples per evaluation question
    eval_ks: tuple[int, ...]
    eval_temperature: float
    eval_top_p: float
    eval_max_rollouts_per_call: int
    log_coverage: bool  # log train/distinct_prompts (prompts trained on so far) with each evaluation
    checkpoint_every: int
    max_skipped_steps: int  # consecutive non-finite steps before the run stops
    progress: bool
    autocast: str | None = None  # "bfloat16": the loss's forward in bf16 autocast over float32 (master) weights
    trim_responses: bool = False  # each micro-batch cut to its longest response (memory; same log-probs)
    logprob_chunk: int | None = None  # the loss's log-softmax this many positions at a time, recomputed in backward
    never_solved: str = "keep"  # the authors' rule: keep (theirs) | leave_out | cap never-solved prompts (PLAN_SINK.md)
    uniform_epochs: int = 1  # the authors' rule: epochs allocated uniformly before the Beta history is read (theirs 1)
    weight_cap: float | None = None  # SERA's weights n0 / n_i capped at this (the sink's negative control; theirs none)

    @classmethod
    def from_config(cls, cfg) -> LoopSettings:
        """Read and check the loop's keys; ValueError on a bad value."""
        o, t, e = cfg.optim, cfg.train, cfg.eval
        s = cls(
            seed=int(cfg.seed), steps=int(t.steps), batch_size=int(t.batch_size),
            max_new_tokens=int(cfg.max_new_tokens), temperature=float(cfg.temperature), top_p=float(cfg.top_p),
            lr=method_lr(o, cfg.method.name), weight_decay=float(o.weight_decay),
            betas=tuple(float(b) for b in o.betas), eps=float(o.eps), warmup_steps=int(o.warmup_steps),
            grad_clip=float(o.grad_clip),
            micro_batch_rollouts=None if t.micro_batch_rollouts is None else int(t.micro_batch_rollouts),
            logprobs=str(t.get("logprobs", "repeated-cache")), parallel=str(t.get("parallel", "ddp")),
            eval_every=int(e.every), eval_samples=int(e.samples), eval_ks=tuple(int(k) for k in e.ks),
            eval_temperature=float(e.temperature if e.temperature is not None else cfg.temperature),
            eval_top_p=float(e.top_p), eval_max_rollouts_per_call=int(e.max_rollouts_per_call),
            log_coverage=bool(t.get("log_coverage", False)),
            checkpoint_every=int(cfg.run.checkpoint_every), max_skipped_steps=int(cfg.run.max_skipped_steps),
            progress=bool(cfg.progress), autocast=mixed_precision(cfg),
            trim_responses=bool(t.get("trim_responses", False)),
            logprob_chunk=None if t.get("logprob_chunk") is None else int(t.logprob_chunk),
            never_solved=str(cfg.alloc.get("never_solved", "keep")),
            uniform_epochs=int(cfg.alloc.get("uniform_epochs", 1)),
            weight_cap=None if cfg.alloc.get("weight_cap") is None else float(cfg.alloc.weight_cap),
        )  # fmt: skip
        if s.never_solved not in NEVER_SOLVED or s.uniform_epochs < 1:
            raise ValueError(f"need alloc.never_solved in {NEVER_SOLVED} and alloc.uniform_epochs >= 1, got "
                             f"{s.never_solved!r} and {s.uniform_epochs}")  # fmt: skip
        if s.weight_cap is not None and not 1 <= s.weight_cap < float("inf"):  # below 1 would scale n0's weight 1
            raise ValueError(f"alloc.weight_cap must be a finite number >= 1 (or null), got {s.weight_cap}")
        for name in ("steps", "batch_size", "max_new_tokens", "eval_samples", "eval_max_rollouts_per_call"):
            if getattr(s, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(s, name)}")
        for name in ("temperature", "eval_temperature"):
            if not 0 < getattr(s, name) < float("inf"):
                raise ValueError(f"{name} must be a finite number > 0, got {getattr(s, name)}")
        if not (0 < s.top_p <= 1 and 0 < s.eval_top_p <= 1):
            raise ValueError(f"top_p and eval.top_p must lie in (0, 1], got {s.top_p}, {s.eval_top_p}")
        if s.parallel not in PARALLEL:
            raise ValueError(f"unknown train.parallel {s.parallel!r}; choose from {PARALLEL}")
        if s.logprobs not in LOGPROB_PATHS:
            raise ValueError(f"unknown train.logprobs {s.logprobs!r}; choose from {LOGPROB_PATHS}")
        if s.logprobs == "shared-prompt" and s.parallel == "fsdp2":
            raise ValueError(
                "train.logprobs=shared-prompt runs Llama's layers module by module, past FSDP2's per-block "
                "unsharding: use train.logprobs=repeated-cache with train.parallel=fsdp2"
            )
        if s.logprob_chunk is not None and s.logprob_chunk < 1:
            raise ValueError(f"train.logprob_chunk must be >= 1 or null, got {s.logprob_chunk}")
        if s.micro_batch_rollouts is not None and s.micro_batch_rollouts < 1:
            raise ValueError(f"train.micro_batch_rollouts must be >= 1 or null, got {s.micro_batch_rollouts}")
        if len(s.betas) != 2 or not all(0 <= b < 1 for b in s.betas) or not s.eps > 0 or not s.grad_clip > 0:
            raise ValueError(f"need optim.betas in [0, 1)^2, optim.eps > 0, optim.grad_clip > 0; got {o}")
        if s.eval_samples < max(s.eval_ks):
            raise ValueError(f"eval.samples={s.eval_samples} is below the largest eval.ks {max(s.eval_ks)}")
        return s


class StepPrompts:
    """A step's prompts, taken from the task's stream as the sampler asks (sera.collect's prompt stream)."""

    def __init__(self, task: Task, step: int):
        self.task, self.step = task, step
        self.ids, self.tokens = np.zeros(0, dtype=np.int64), []
        self.cursor, self._seen = 0, set()  # position in the step's stream of prompts; the ids taken

    def size(self) -> int:
        return len(self.tokens)

    def take(self, k: int) -> np.ndarray:
        """Add up to k prompts, never one already in this step (a stream that runs into its next epoch repeats
        prompts; they are skipped); fewer once the stream is used up. Returns their step indices."""
        start = len(self.tokens)
        while len(self.tokens) - start < k:
            ids, tokens = self.task.train_prompts(self.step, k - (len(self.tokens) - start), self.cursor)
            if len(ids) == 0:
                break
            self.cursor += len(ids)
            fresh = []
            for i, prompt in zip(np.asarray(ids, dtype=np.int64), tokens, strict=True):
                if int(i) not in self._seen:
                    self._seen.add(int(i))
                    fresh.append(i)
                    self.tokens.append(prompt)
            self.ids = np.concatenate([self.ids, np.asarray(fresh, dtype=np.int64)])
        return np.arange(start, len(self.tokens))


def score(task: Task, ids: np.ndarray, rollouts: Rollouts) -> np.ndarray:
    """The task's rewards (N,) for every rollout, in one call: responses up to and including the end token."""
    mask = rollouts.mask.bool()
    responses = [row[m].tolist() for row, m in zip(rollouts.tokens, mask, strict=True)]
    ended = (torch.isin(rollouts.tokens, torch.as_tensor(end_token_ids(task.eos_id))) & mask).any(dim=1).numpy()
    return np.asarray(task.rewards(ids[rollouts.prompt_index.numpy()], responses, ~ended), dtype=np.float64)


class RankDraw:
    """The collection step's draw(counts) for one rank: generate this rank's share of the step's prompts (all of them
    in one process; a sequential step's prompts with a rollout in this call), score it in one call, and return every
    rank's rewards grouped by prompt (the allocation is global). Times the scoring."""

    def __init__(self, ls: LoopSettings, task: Task, engine, generator, stream: StepPrompts, sequential: bool):
        self.ls, self.task, self.engine, self.generator, self.stream = ls, task, engine, generator, stream
        self.sequential, self.world = sequential, world_info()[1]
        self.mine = shard(ls.batch_size)  # this rank's prompts (all of them in one process)
        self.reward_time = 0.0

    def __call__(self, counts: np.ndarray):
        ls, prompts = self.ls, self.stream.tokens
        if self.sequential:  # many of the step's prompts get no rollout in a call: leave them out of the prefill
            use = np.flatnonzero(counts)
        elif self.world == 1:
            use = None
        else:
            use = self.mine
        own = prompts if use is None else [prompts[i] for i in use]
        rollouts = self.engine.generate(
            own, counts if use is None else counts[use], ls.max_new_tokens, self.generator, ls.temperature, ls.top_p
        )
        if use is not None:
            rollouts.prompt_index = torch.as_tensor(use, dtype=torch.long)[rollouts.prompt_index]
        t = time.perf_counter()
        rewards = score(self.task, self.stream.ids, rollouts)
        self.reward_time += time.perf_counter() - t
        return rollouts, (rewards if self.world == 1 else gather_grouped(counts, self.mine, rewards))


@dataclass
class RankShare:
    """This rank's part of a step's trained rollouts, grouped by prompt, and the step's global normalisers."""

    rollouts: Rollouts
    own: np.ndarray | slice  # this rank's rows of the grouped rollouts (all of them in one process)
    live: torch.Tensor  # rows of `rollouts` with a nonzero advantage x weight (the others add nothing)
    live_total: int  # live rollouts over all ranks
    tokens: float  # response tokens over all ranks (token-mean's normaliser)


def rank_share(out, mine: np.ndarray, adv: np.ndarray, weights: np.ndarray, pad_id: int) -> RankShare:
    """Assemble this rank's trained rollouts from the draws' payloads in grouped order; count live rollouts and
    response tokens over the ranks."""
    world = world_info()[1]
    if world > 1:  # this rank's own rollouts (the batch allocators train every drawn group), grouped by prompt
        rollouts = out.payloads[0] if len(out.payloads) == 1 else concat_rollouts(out.payloads, pad_id)
    else:
        rollouts = out.payloads[0] if out.order is None else concat_rollouts(out.payloads, pad_id, out.order)
    own = np.isin(out.prompts[out.rows], mine) if world > 1 else slice(None)
    live = torch.as_tensor(np.flatnonzero(adv[own] * weights[own] != 0))
    tokens = float(rollouts.mask.sum())
    if world > 1:
        tokens = float(sum(all_gather(tokens)))
    return RankShare(rollouts, own, live, int(sum(all_gather(int(live.numel())))), tokens)


def update(ms, ls, model, optimizer, engine, prompts, share: RankShare, adv, weights, pad_id, trained: int) -> dict:
    """Backward over the live rollouts in micro-batches, gradients summed over ranks, clip, optimizer step, weight
    sync. A non-finite loss or gradient skips the update (train/skipped_nonfinite). Returns its metrics."""
    device = next(model.parameters()).device
    metrics = {}
    loss = backward_in_micro_batches(
        ms, ls, model, prompts, share.rollouts, share.live, adv[share.own], weights[share.own], pad_id, device,
        (trained, share.tokens),
    )  # fmt: skip
    if world_info()[1] > 1:
        loss = sum_over_ranks(model, loss)
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), ls.grad_clip) if loss is not None else None
    if hasattr(grad_norm, "full_tensor"):  # FSDP2: a replicated DTensor
        grad_norm = grad_norm.full_tensor()
    if loss is not None and torch.isfinite(grad_norm):
        optimizer.step()
        metrics["train/grad_norm"] = float(grad_norm)
    else:  # never crash or corrupt the model on a bad step: skip it and say so
        metrics["train/skipped_nonfinite"] = 1
    if loss is not None:
        metrics["train/loss"] = loss
    engine.sync_weights(model)
    return metrics


def rl_step(
    ms: MethodSettings, ls: LoopSettings, task: Task, model, engine, optimizer, history, generator, step, state=None,
    sink: SinkMonitor | None = None,
):  # fmt: skip
    """One RL step: prompts -> collect (p_hat, allocation, rollouts, rewards) -> advantages and weights -> backward
    -> update.

    Returns the step's metrics; a non-finite loss or gradient skips the update (train/skipped_nonfinite), and so does
    a step with no group to train on (train/skipped_empty: DS or SARA at their caps). `sink` (a fixed pool read in
    epochs): the never-solved measures (sera.sink), watched from outside the method.
    """
    t0 = time.perf_counter()
    sequential = ms.sampler.stream
    if sequential and world_info()[1] > 1:
        raise ValueError(f"{ms.method.name} runs in one process: its prompts are drawn as the step goes")
    stream = StepPrompts(task, step)
    if not sequential:
        stream.take(ls.batch_size)
    draw = RankDraw(ls, task, engine, generator, stream, sequential)
    first = stream.ids[: ls.batch_size]
    p_hat_source = (
        (lambda: history.estimate(first) if history.has_data else None) if ms.estimator == "history" else None
    )
    epoch = epoch_of_step(step, ls.batch_size, task.num_prompts) if task.num_prompts else None
    sink_metrics = sink.start(epoch) if sink is not None else {}
    left_out = None
    if ms.estimator == "beta":  # the authors' history: a new epoch folds the last one in and freezes the estimates.
        # A step belongs to the epoch of its first prompt; where the set is not a multiple of B, the one step that
        # runs into the next epoch reads those prompts from the ending epoch's snapshot (docs/design.md section 3)
        history.advance_to(epoch)
        p_hat_source = beta_p_hat(history, first, ls.uniform_epochs)
        left_out = (lambda: (ls.never_solved, history.never_solved(first))) if ls.never_solved != "keep" else None
    out = collect(ms, ls.batch_size, draw, p_hat_source, stream, state, left_out)
    t_gen = time.perf_counter() - t0
    if out.counts.size == 0:  # nothing to train on: say so and move on
        metrics = {**generation_metrics(out), "alloc/budget": ms.budget(ls.batch_size)}
        return {**metrics, **sink_metrics, "train/skipped_empty": 1, "time/generate_s": t_gen,
                "time/step_s": time.perf_counter() - t0}  # fmt: skip
    adv, weights = advantages_and_weights(ms, out)
    if ls.weight_cap is not None:  # the sink's negative control (PLAN_SINK.md): the correction's weights capped
        weights = np.minimum(weights, ls.weight_cap)
    if history is not None:
        history.update(stream.ids[out.prompts], out.successes, out.counts)
    share = rank_share(out, draw.mine, adv, weights, task.pad_id)
    metrics = collection_metrics(ms, out, ls.batch_size) | sink_metrics
    if sink is not None:
        metrics |= sink.observe(stream.ids, out.prompts, out.counts, out.successes)
    metrics["train/live_rollouts"] = share.live_total
    metrics["train/response_tokens"] = (
        float(share.rollouts.mask.sum(1).float().mean()) if draw.world == 1 else share.tokens / len(out.rewards)
    )
    if out.p_hat is not None:
        metrics["alloc/c_min_phat"] = float(scale_factor(out.p_hat, out.counts, ms.delta).min())
    optimizer.zero_grad(set_to_none=True)
    if share.live_total:
        metrics |= update(ms, ls, model, optimizer, engine, stream.tokens, share, adv, weights, task.pad_id,
                          out.rollouts_trained)  # fmt: skip
    metrics["time/generate_s"] = t_gen
    metrics["time/reward_s"] = draw.reward_time
    metrics["time/step_s"] = time.perf_counter() - t0
    return metrics


def beta_p_hat(history: BetaHistory, first, uniform_epochs: int):
    """The authors' rule's p_hat source: the frozen Beta means of the step's prompts, or NaN (a uniform allocation)
    in the first `uniform_epochs` epochs (theirs: 1, the cold start; more is the sink intervention
    alloc.uniform_epochs)."""
    if uniform_epochs <= 1:
        return lambda: history.estimate(first)
    return lambda: history.estimate(first) if history.epoch >= uniform_epochs else np.full(len(first), np.nan)


def loss_logprobs(ls: LoopSettings, model, prompts, rollouts: Rollouts, pad_id: int) -> torch.Tensor:
    """The rollouts' log-probs (N, T) for the loss, with gradients, by the path ls.logprobs names (equal up to float
    rounding; shared-prompt is the faster, in length buckets)."""
    with autocast(ls, next(model.parameters()).device):  # model.dtype=bfloat16: the forward in bf16 autocast
        if ls.logprobs == "shared-prompt":
            return shared_prompt_logprobs(model, prompts, rollouts, pad_id, ls.temperature, chunk=ls.logprob_chunk)
        return response_logprobs(model, prompts, rollouts, pad_id, ls.temperature, chunk=ls.logprob_chunk)


def autocast(ls: LoopSettings, device: torch.device):
    """The loss forward's precision context: bf16 autocast under model.dtype=bfloat16, else nothing."""
    if ls.autocast is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=getattr(torch, ls.autocast))


def mixed_precision(cfg) -> str | None:
    """The loss's autocast dtype from model.dtype: bfloat16 trains float32 master weights with the forward in bf16
    autocast; float16 (AdamW with no loss scaling: every weight non-finite after one step) is refused."""
    dtype = cfg.get("model", {}).get("dtype", "float32")
    if dtype == "float16":
        raise ValueError(
            "model.dtype=float16 would train float16 weights with AdamW and no loss scaling (every weight non-finite "
            "after one step): use model.dtype=bfloat16 (float32 master weights, the loss in bf16 autocast) or float32"
        )
    return "bfloat16" if dtype == "bfloat16" else None


def backward_in_micro_batches(
    ms, ls, model, prompts, rollouts, live, adv, weights, pad_id, device, totals
) -> float | None:
    """Backpropagate the step's loss over the live rollouts, ls.micro_batch_rollouts at a time.

    Every micro-batch's loss uses the step's normalisers, totals = (all rollouts, all response tokens) of the step,
    so the micro-batch losses sum to the full-batch loss and their gradients accumulate to its gradient. Returns the
    loss, or None (gradients cleared) when a micro-batch's loss is not finite.
    """
    total_rollouts, total_tokens = totals
    loss_sum, finite = 0.0, True
    chunks = list(torch.split(live, ls.micro_batch_rollouts or live.numel())) if live.numel() else []  # none: a
    lockstep = is_sharded(model)  # rank's share may have no live rollout while others do
    if lockstep:  # FSDP2: every rank runs as many forward/backward passes; the extra ones carry zero weight
        chunks += [None] * (max(all_gather(len(chunks))) - len(chunks))
    for chunk in chunks:
        if chunk is None:  # a zero-weight pass over this rank's first rollout: the collectives match, nothing is added
            sub = rollouts.select(torch.zeros(1, dtype=torch.long))
            (loss_logprobs(ls, model, prompts, sub, pad_id).sum() * 0.0).backward()
            continue
        sub = rollouts.select(chunk)
        if ls.trim_responses:
            sub = sub.trimmed()
        logp = loss_logprobs(ls, model, prompts, sub, pad_id)
        loss = pg_loss(
            logp,
            sub.mask.to(device),
            torch.as_tensor(adv[chunk.numpy()], device=device),  # a 1-element tensor would index as a scalar
            torch.as_tensor(weights[chunk.numpy()], device=device),
            ms.aggregation,
            max_len=ls.max_new_tokens,
            num_rollouts=total_rollouts,
            num_tokens=total_tokens,
        )
        if not torch.isfinite(loss):
            finite = False
            if not lockstep:
                break
        loss.backward()
        loss_sum += loss.item()
    if not finite:
        model.zero_grad(set_to_none=True)
        return None
    return loss_sum


def evaluate(ls: LoopSettings, task: Task, engine, generator) -> tuple[dict, dict]:
    """Pass@K on every named evaluation set from ls.eval_samples samples a question (unbiased estimator), in chunks.

    Returns (metrics {eval/<set>/pass@k, eval/<set>/<extra>}, {set: per-question record {ids, n, correct}}) - the
    records are what paper_figures bootstraps over.
    """
    metrics, records = {}, {}
    ks = [k for k in ls.eval_ks if k <= ls.eval_samples]
    per_call = max(1, ls.eval_max_rollouts_per_call // ls.eval_samples)
    _, world = world_info()
    for name, (all_ids, all_prompts) in task.eval_sets().items():
        mine = shard(len(all_prompts))  # this rank's questions (all of them in one process)
        ids, prompts = np.asarray(all_ids)[mine], [all_prompts[i] for i in mine]
        correct = np.zeros(len(prompts), dtype=np.int64)
        extras: dict[str, list] = {}
        for start in range(0, len(prompts), per_call):
            chunk = slice(start, start + per_call)
            chunk_prompts = prompts[chunk]
            rollouts = engine.generate(
                chunk_prompts,
                np.full(len(chunk_prompts), ls.eval_samples),
                ls.max_new_tokens,
                generator,
                ls.eval_temperature,
                ls.eval_top_p,
            )
            rewards = score(task, ids[chunk], rollouts)
            correct[chunk] = np.bincount(rollouts.prompt_index.numpy(), rewards, len(chunk_prompts)).astype(np.int64)
            if hasattr(task, "eval_extras"):
                for key, values in task.eval_extras(name, ids[chunk], rollouts).items():
                    extras.setdefault(key, []).append(np.asarray(values, dtype=np.float64))
        extras = {key: np.concatenate(v) for key, v in extras.items()}
        if world > 1:  # every rank's questions, back in the set's order
            parts = all_gather((mine, correct, extras))
            order = np.argsort(np.concatenate([m for m, _, _ in parts]))
            correct = np.concatenate([c for _, c, _ in parts])[order]
            extras = {key: np.concatenate([e[key] for _, _, e in parts])[order] for key in extras}
            ids = np.asarray(all_ids)
        passk = pass_at_k(ls.eval_samples, correct, ks).mean(axis=0)
        metrics.update({f"eval/{name}/pass@{k}": float(v) for k, v in zip(ks, passk, strict=True)})
        metrics.update({f"eval/{name}/{key}": float(v.mean()) for key, v in extras.items()})
        records[name] = {"ids": [int(i) for i in ids], "n": ls.eval_samples, "correct": correct.tolist()}
    return metrics, records


def evaluate_into(run_dir: RunDir | None, step: int, ls: LoopSettings, task: Task, engine, generator) -> dict:
    """Evaluate, write each set's per-question record for `step` (rank 0), and check the numbers are finite."""
    metrics, records = evaluate(ls, task, engine, generator)
    for name, record in records.items():
        if run_dir is not None:
            run_dir.write_json(eval_record_file(step, name), record)
    check_finite_eval(metrics, step)
    return metrics


TRAIN_POOL_SEED = 104729  # offset of its evaluation generator's seed from the training generator's


class TrainPool:
    """A task seen through its training set: one evaluation set, TRAIN_POOL_SET = task.train_pool_set() (ids, token
    lists), scored by the task. With train.log_coverage the last step also evaluates it: Pass@1 on the prompts
    trained on against the held-out sets is what overfitting a small pool (DPS picking the same prompts) shows."""

    def __init__(self, task: Task):
        self.task, self.eos_id, self.pad_id = task, task.eos_id, task.pad_id

    def eval_sets(self) -> dict:
        return {TRAIN_POOL_SET: self.task.train_pool_set()}

    def rewards(self, ids, responses, truncated) -> np.ndarray:
        return self.task.rewards(ids, responses, truncated)


def coverage(ls: LoopSettings, history) -> dict:
    """train/distinct_prompts: prompts trained on so far (those the history has a rate for), when train.log_coverage
    (the sequential grid: how many prompts DPS's selection returns to)."""
    if not ls.log_coverage or not isinstance(history, HistoricalEstimator):
        return {}
    return {"train/distinct_prompts": int(np.count_nonzero(~np.isnan(history.last_rate)))}


def check_sink_settings(ms: MethodSettings, ls: LoopSettings) -> None:
    """The sink's interventions (alloc.never_solved, alloc.uniform_epochs, alloc.weight_cap; results/cpu/PLAN_SINK.md)
    only on a method that has what they change: the authors' Beta history, SERA's weights. ValueError otherwise."""
    if ms.estimator != "beta" and (ls.never_solved != "keep" or ls.uniform_epochs != 1):
        raise ValueError(
            f"alloc.never_solved and alloc.uniform_epochs change the authors' rule's Beta history (method=sera on a "
            f"pool read in epochs); {ms.method.name} with method.estimator={ms.estimator} has none"
        )
    if ls.weight_cap is not None and not ms.multiplicity_correction:
        raise ValueError(f"alloc.weight_cap caps SERA's weights n0 / n_i; {ms.method.name} has none (all ones)")


def refuse_sink_settings(ls: LoopSettings, route: str) -> None:
    """The sink's interventions are the suite's loop's: a route without them (TRL) refuses them rather than train
    and record a run under a setting it did not apply."""
    defaults = {f.name: f.default for f in fields(LoopSettings)}
    given = [f"alloc.{name}={getattr(ls, name)}" for name in ("never_solved", "uniform_epochs", "weight_cap")
             if getattr(ls, name) != defaults[name]]  # fmt: skip
    if given:
        raise ValueError(
            f"{', '.join(given)}: the sink's interventions run in the suite's own loop only (experiments.maze.train, "
            f"results/cpu/PLAN_SINK.md); {route} does not apply them"
        )


def make_history(ms: MethodSettings, ls: LoopSettings, task: Task):
    """The run's prompt history (the Beta history for the authors' rule, else the success-rate history on a fixed
    set, else None) and its sink monitor (a fixed set read in epochs, any method; else None)."""
    epochs = bool(task.num_prompts) and getattr(task, "epoch_order", False)
    check_sink_settings(ms, ls)
    if ms.estimator == "beta" and not epochs:
        raise ValueError(
            f"the Beta history needs a fixed training set read in epochs ({task.num_prompts or 'no'} fixed "
            "prompts; the maze: task.pool_size and task.pool_order=epoch), so that each prompt recurs an epoch"
        )
    if ms.estimator == "beta":
        history = BetaHistory(task.num_prompts)
    else:
        history = HistoricalEstimator(task.num_prompts, ms.p_lo, ms.p_hi) if task.num_prompts else None
    return history, SinkMonitor(task.num_prompts) if epochs else None


def train(ms: MethodSettings, ls: LoopSettings, task: Task, model, engine, run_dir: RunDir | None) -> dict:
    """Run (or resume) the RL loop to ls.steps; returns the final evaluation metrics. run_dir is None on ranks > 0."""
    rank, world = world_info()
    if ls.parallel == "fsdp2" and world > 1 and not is_sharded(model):
        shard_model(model)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=ls.lr, weight_decay=ls.weight_decay, betas=ls.betas, eps=ls.eps
    )
    generator = torch.Generator().manual_seed(rank_seed(ls.seed))  # rank 0 (and one process): the seed itself
    history, sink = make_history(ms, ls, task)
    seq_state = sequential_state(ms, task.num_prompts)  # DPS's predictor, SARA's prior: carried across steps
    skips = SkipGuard(ls.max_skipped_steps)
    start = 0
    state = run_dir.load_checkpoint() if run_dir is not None else None
    if world > 1:
        box = [state]
        torch.distributed.broadcast_object_list(box, src=0)
        state = box[0]
    if state is not None:
        generators = state["generator"] if isinstance(state["generator"], list) else [state["generator"]]
        if len(generators) != world:
            raise RuntimeError(f"the checkpoint was written by {len(generators)} processes; resume it with as many")
        load_full_state(model, optimizer, state["model"], state["optimizer"])
        generator.set_state(generators[rank])
        if history is not None:
            history.load_state_dict(state["history"])
        if sink is not None and state.get("sink") is not None:  # checkpoints from before it: measures start afresh
            sink.load_state_dict(state["sink"])
        if seq_state is not None:
            seq_state.load_state_dict(state.get("sequential") or state["predictor"])  # "predictor": older checkpoints
        start = state["step"]
        engine.sync_weights(model)
    if run_dir is not None:
        run_dir.rewind(start - 1)  # drop records of work lost with an interruption (all without a checkpoint)
    final = {}
    bar = tqdm(
        range(start, ls.steps),
        initial=start,
        total=ls.steps,
        disable=not ls.progress or run_dir is None,
        desc=run_dir.path.name if run_dir is not None else "",
        unit="step",
        mininterval=0.1 if sys.stderr.isatty() else 5.0,
    )
    for step in bar:
        for group in optimizer.param_groups:
            group["lr"] = ls.lr * min(1.0, (step + 1) / max(1, ls.warmup_steps))
        metrics = rl_step(ms, ls, task, model, engine, optimizer, history, generator, step, seq_state, sink)
        metrics["train/lr"] = optimizer.param_groups[0]["lr"]  # the method's own rate (optim.lr_by_method), warmed up
        skips.record(bool(metrics.get("train/skipped_nonfinite")), step)
        is_last = step == ls.steps - 1
        if (step + 1) % ls.eval_every == 0 or is_last:
            final = evaluate_into(run_dir, step + 1, ls, task, engine, generator)
            metrics.update(final | coverage(ls, history))
            if is_last and ls.log_coverage and task.num_prompts and hasattr(task, "train_pool_set"):  # own generator
                pool = torch.Generator().manual_seed(rank_seed(ls.seed + TRAIN_POOL_SEED))
                metrics.update(evaluate_into(run_dir, step + 1, ls, TrainPool(task), engine, pool))
            bar.set_postfix({k.rsplit("/", 2)[-2] + "@1": f"{v:.3f}" for k, v in final.items() if k.endswith("pass@1")})
        checkpoint_due = (step + 1) % ls.checkpoint_every == 0 and not is_last
        generators = all_gather(generator.get_state()) if checkpoint_due and world > 1 else [generator.get_state()]
        model_state, optimizer_state = full_state(model, optimizer) if checkpoint_due else (None, None)  # collective
        if run_dir is None:
            continue
        run_dir.log(step, metrics)
        if checkpoint_due:
            run_dir.save_checkpoint(
                {
                    "step": step + 1,
                    "model": model_state,
                    "optimizer": optimizer_state,
                    "generator": generators[0] if world == 1 else generators,
                    "history": history.state_dict() if history is not None else None,
                    "sequential": seq_state.state_dict() if seq_state is not None else None,
                    "sink": sink.state_dict() if sink is not None else None,
                }
            )
    return final


def run_rl(cfg, ms: MethodSettings, ls: LoopSettings, out_dir, prepare, threads: int, base=None) -> dict:
    """The prologue and epilogue of every LM study's RL run, called after validation: skip (or refuse) a finished
    run, build (model, task, engine) with prepare() (which may train a base model first), hold the run directory's
    lock while training, write DONE; with run.if_finished=extend, first let a shorter run continue to train.steps
    (runlog.extend_run). `base`: the base model's run folder, recorded in the run's (runlog.record_base) so that the
    tables pair only runs that started from the same model. Returns the final evaluation (or the finished run's
    summary)."""
    config = OmegaConf.to_container(cfg, resolve=True)
    if cfg.run.if_finished == "extend":
        if world_info()[1] > 1:
            raise ValueError("run.if_finished=extend runs in one process; extend the run without torchrun")
        if extend_run(out_dir, config):
            print(f"{out_dir}: extending to {ls.steps} steps from its last checkpoint (run.if_finished=extend)")
    if cfg.run.get("rerun_archived", False):  # a reproduce target: a copy of the archive reproduces nothing
        drop_restored(out_dir)
    summary = finished_summary(out_dir, config)
    if summary is not None and cfg.run.if_finished in ("skip", "extend"):
        print(f"{out_dir} is finished with this config; skipping (run.if_finished={cfg.run.if_finished})")
        return summary
    model, task, engine = prepare()
    try:
        reason = static_decode_unsupported(model) if ls.logprobs == "shared-prompt" else None
        if reason is not None:  # before the first step
            raise ValueError(f"train.logprobs=shared-prompt cannot run this model: {reason}")
        if world_info()[0] != 0:  # data parallel: rank 0 holds the run directory
            return train(ms, ls, task, model, engine, None)
        with RunDir(out_dir, config, cfg.wandb) as run_dir:
            if base is not None:
                record_base(run_dir.path, base)
            final = train(ms, ls, task, model, engine, run_dir)
            run_dir.finish({"step": ls.steps, "threads": threads, **final})
        return final
    finally:  # a sweep runs its jobs in one process: the next one must find the GPU free
        release(engine)


def release(engine) -> None:
    """Free what an engine holds once its run is over, finished or failed: vLLM's engine process and its share of the
    GPU (engine.close()), then the CUDA cache. A sweep's jobs share one process, so without this the next job would
    start beside the last one's vLLM."""
    close = getattr(engine, "close", None)
    if close is not None:
        close()
    if torch.cuda.is_available():
        import gc

        gc.collect()
        torch.cuda.empty_cache()
