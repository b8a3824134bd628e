"""One policy-gradient loop for language-model policies, shared by the maze and math studies (DESIGN.md 1-4, 6).

Each step: sample B prompts; estimate p_hat (pilots reused inside the budget, or history); allocate (uniform, SERA's
waterline, or DARS-HW's extra rollouts); generate; reward; advantages with multiplicity weights; token-mean or seqnorm
loss over the rollouts with a nonzero advantage; optimizer step; weight sync. Periodic Pass@K evaluation with many
samples per held-out prompt, checkpoints, and resume. A non-finite loss skips the step and is logged.

A task provides: eos_id, pad_id, max_new_tokens, train_prompts(step, batch) -> (ids (B,), prompts),
eval_prompts() -> (ids, prompts), reward(prompt_id, response_ids) -> float, and optionally eval_extras(ids, rollouts).
"""

from __future__ import annotations

import sys
import time
from types import SimpleNamespace

import numpy as np
import torch
from tqdm import tqdm

from sera.advantages import ADVANTAGES, multiplicity_weights
from sera.allocation import dars_hw_extra, scale_factor, uniform, waterline
from sera.estimation import HistoricalEstimator, pilot_p_hat
from sera.losses import pg_loss
from sera.methods import Method, advantage_kwargs, allocation_bounds
from sera.passk import pass_at_k
from sera.rollout import Rollouts, concat_rollouts, response_logprobs


def validate_method(cfg, method: Method, repeated_prompts: bool) -> None:
    """Cross-field checks of the method settings for the LM loop, before any work starts."""
    mc = cfg.method
    if method.advantage is None:
        raise ValueError(f"{method.name} has no rollouts; the language-model studies need an RL method")
    if mc.estimator not in ("none", "pilot", "history"):
        raise ValueError(f"method.estimator={mc.estimator!r}: the LM loop supports none | pilot | history")
    if method.allocator == "waterline" and mc.estimator == "none":
        raise ValueError("sera needs a p_hat estimator: method.estimator=pilot|history")
    if mc.estimator == "history" and not repeated_prompts:
        raise ValueError("method.estimator=history needs repeated prompts; this task draws fresh ones (use pilot)")
    if mc.estimator == "pilot" and mc.pilot_m < 1:
        raise ValueError("method.estimator=pilot needs method.pilot_m >= 1")
    if method.allocator in ("dars_hw", "uniform") and mc.estimator != "none":
        raise ValueError(f"{method.name} allocates without p_hat: set method.estimator=none")
    if method.advantage == "pkpo" and cfg.n0 < mc.pkpo_k:
        raise ValueError(f"pkpo needs n0 >= method.pkpo_k ({cfg.n0} < {mc.pkpo_k})")
    if mc.aggregation not in ("token-mean", "seqnorm", "seq-mean-token-mean"):
        raise ValueError(f"unknown method.aggregation {mc.aggregation!r}")
    n_min, n_max, _ = allocation_bounds(cfg)
    if mc.estimator == "pilot" and n_min < mc.pilot_m:
        raise ValueError(f"alloc.n_min={n_min} is below method.pilot_m={mc.pilot_m}: pilots are part of every group")
    if n_min < 2 or not n_min <= cfg.n0 <= n_max:
        raise ValueError(
            f"infeasible budget: {cfg.train.batch_size} x n0={cfg.n0} rollouts with {n_min} <= n_i <= {n_max} "
            "(need 2 <= n_min <= n0 <= n_max; pilots count toward the budget)"
        )


def collect(cfg, method: Method, task, engine, ids, prompts, history, generator):
    """p_hat, allocation and the step's rollouts (grouped by prompt, pilots first). Returns (rollouts, info)."""
    mc, batch = cfg.method, len(prompts)
    n_min, n_max, delta = allocation_bounds(cfg)
    gen = engine.generate
    p_hat = tau = None
    parts = []
    if mc.estimator == "pilot":  # pilots are the first m rollouts of each group and count toward the budget
        pilots = gen(prompts, np.full(batch, mc.pilot_m), cfg.max_new_tokens, generator)
        parts.append(pilots)
        p_hat = pilot_p_hat(
            np.bincount(pilots.prompt_index.numpy(), rewards_of(task, ids, pilots), batch), mc.pilot_m, mc.p_lo, mc.p_hi
        )
    elif mc.estimator == "history":
        p_hat = history.estimate(ids)

    if method.allocator == "waterline":  # SERA: the same budget, scale factors (nearly) equalised
        counts, tau = waterline(p_hat, batch * cfg.n0, n_min, n_max, delta, return_tau=True)
    elif method.allocator == "dars_hw":  # DARS-HW: n0 each, then extra rollouts for low-accuracy prompts
        first = gen(prompts, uniform(batch, cfg.n0), cfg.max_new_tokens, generator)
        parts.append(first)
        accuracy = np.bincount(first.prompt_index.numpy(), rewards_of(task, ids, first), batch) / cfg.n0
        counts = cfg.n0 + dars_hw_extra(accuracy, cfg.n0, n_max)
    else:
        counts = uniform(batch, cfg.n0)
    drawn = sum((np.bincount(p.prompt_index.numpy(), minlength=batch) for p in parts), np.zeros(batch, np.int64))
    parts.append(gen(prompts, counts - drawn, cfg.max_new_tokens, generator))
    rollouts = concat_rollouts(parts, task.pad_id) if len(parts) > 1 else parts[0]
    return rollouts, SimpleNamespace(counts=counts, p_hat=p_hat, tau=tau, delta=delta)


def rewards_of(task, ids, rollouts: Rollouts) -> np.ndarray:
    """Binary reward of every rollout (N,)."""
    out = np.empty(rollouts.tokens.shape[0])
    for r in range(out.size):
        response = rollouts.tokens[r][rollouts.mask[r].bool()].tolist()
        out[r] = task.reward(int(ids[int(rollouts.prompt_index[r])]), response)
    return out


def evaluate(cfg, task, engine, generator) -> tuple[dict, dict]:
    """Pass@K on the held-out prompts from cfg.eval.samples samples each (unbiased estimator), in chunks.

    Returns (metrics, per-question record {ids, n, correct}) - the record is what paper_figures bootstraps over.
    """
    ids, prompts = task.eval_prompts()
    correct = np.zeros(len(prompts), dtype=np.int64)
    extras = []
    per_call = max(1, cfg.eval.max_rollouts_per_call // cfg.eval.samples)
    for start in range(0, len(prompts), per_call):
        chunk = slice(start, start + per_call)
        chunk_prompts = prompts[chunk]
        rollouts = engine.generate(
            chunk_prompts, np.full(len(chunk_prompts), cfg.eval.samples), cfg.max_new_tokens, generator
        )
        rewards = rewards_of(task, ids[chunk], rollouts)
        correct[chunk] = np.bincount(rollouts.prompt_index.numpy(), rewards, len(chunk_prompts)).astype(np.int64)
        if hasattr(task, "eval_extras"):
            extras.append(task.eval_extras(ids[chunk], rollouts))
    ks = [k for k in cfg.eval.ks if k <= cfg.eval.samples]
    passk = pass_at_k(cfg.eval.samples, correct, ks).mean(axis=0)
    metrics = {f"eval/pass@{k}": float(v) for k, v in zip(ks, passk, strict=True)}
    if extras:
        for key in extras[0]:
            metrics[key] = float(np.mean([e[key] for e in extras]))
    return metrics, {"ids": [int(i) for i in ids], "n": int(cfg.eval.samples), "correct": correct.tolist()}


def train(cfg, method: Method, task, model, engine, run_dir, device) -> dict:
    """Run (or resume) the RL loop to cfg.train.steps; returns the final evaluation metrics."""
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay, betas=(0.9, 0.95)
    )
    generator = torch.Generator().manual_seed(cfg.seed)
    history = HistoricalEstimator(task.num_prompts, cfg.method.p_lo, cfg.method.p_hi) if task.num_prompts else None
    adv_kwargs = advantage_kwargs(method, cfg.method)
    start = 0
    state = run_dir.load_checkpoint()
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        generator.set_state(state["generator"])
        if history is not None:
            history.load_state_dict(state["history"])
        start = state["step"]
        engine.sync_weights(model)
    run_dir.rewind(start - 1)  # drop records of work lost with an interruption (all of them without a checkpoint)
    final = {}
    bar = tqdm(
        range(start, cfg.train.steps),
        initial=start,
        total=cfg.train.steps,
        disable=not cfg.progress,
        desc=run_dir.path.name,
        unit="step",
        mininterval=0.1 if sys.stderr.isatty() else 5.0,
    )
    for step in bar:
        t0 = time.perf_counter()
        for group in optimizer.param_groups:
            group["lr"] = cfg.optim.lr * min(1.0, (step + 1) / max(1, cfg.optim.warmup_steps))
        ids, prompts = task.train_prompts(step, cfg.train.batch_size)
        rollouts, info = collect(cfg, method, task, engine, ids, prompts, history, generator)
        t_gen = time.perf_counter() - t0
        counts = info.counts
        rewards = rewards_of(task, ids, rollouts)  # (N,)
        adv = ADVANTAGES[method.advantage](rewards, counts, **adv_kwargs)
        correct = cfg.method.multiplicity_correction
        # SERA: multiplicity correction - every rollout of prompt i weighted by n0 / n_i
        weights = multiplicity_weights(counts, cfg.n0) if correct else np.ones(rewards.size)
        if history is not None:
            history.update(ids, np.bincount(rollouts.prompt_index.numpy(), rewards, len(counts)), counts)
        live = torch.as_tensor(np.flatnonzero(adv * weights != 0))  # zero-advantage rollouts add nothing
        metrics = {
            "train/reward": float(rewards.mean()),
            "alloc/rollouts": int(counts.sum()),
            "alloc/budget": int(len(counts) * cfg.n0),
            "alloc/n_min": int(counts.min()),
            "alloc/n_max": int(counts.max()),
            "train/live_rollouts": int(live.numel()),
            "train/response_tokens": float(rollouts.mask.sum(1).float().mean()),
        }
        if info.tau is not None:
            metrics["alloc/tau"] = info.tau
        if info.p_hat is not None:
            metrics["alloc/c_min_phat"] = float(scale_factor(info.p_hat, counts, info.delta).min())
        optimizer.zero_grad(set_to_none=True)
        if live.numel():
            sub = rollouts.select(live)
            logp = response_logprobs(model, prompts, sub, task.pad_id, cfg.temperature)
            loss = pg_loss(
                logp,
                sub.mask.to(device),
                torch.as_tensor(adv[live], device=device),
                torch.as_tensor(weights[live], device=device),
                cfg.method.aggregation,
                max_len=cfg.max_new_tokens,
                num_rollouts=rewards.size,
                num_tokens=float(rollouts.mask.sum()),
            )
            if torch.isfinite(loss):
                loss.backward()
                grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip)
                if torch.isfinite(grad_norm):
                    optimizer.step()
                    metrics["train/grad_norm"] = float(grad_norm)
                else:
                    metrics["train/skipped_nonfinite"] = 1
                metrics["train/loss"] = loss.item()
            else:  # never crash or corrupt the model on a bad step: skip it and say so
                metrics["train/skipped_nonfinite"] = 1
            engine.sync_weights(model)
        metrics["time/generate_s"] = t_gen
        metrics["time/step_s"] = time.perf_counter() - t0
        is_last = step == cfg.train.steps - 1
        if (step + 1) % cfg.eval.every == 0 or is_last:
            final, record = evaluate(cfg, task, engine, generator)
            metrics.update(final)
            run_dir.write_json(f"eval_step{step + 1}.json", record)
            bar.set_postfix(pass1=f"{final.get('eval/pass@1', float('nan')):.3f}")
        run_dir.log(step, metrics)
        if (step + 1) % cfg.run.checkpoint_every == 0 and not is_last:
            run_dir.save_checkpoint(
                {
                    "step": step + 1,
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "generator": generator.get_state(),
                    "history": history.state_dict() if history is not None else None,
                }
            )
    return final
