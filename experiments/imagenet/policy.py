"""Classification as a policy, the RL step: labels sampled from the softmax are the rollouts (DESIGN.md section 5).

`draw_rollouts` runs the shared collection step (sera.collect) with the compiled label sampler; `rollout_loss` turns a
batch's log-softmax into the step's policy-gradient loss (advantages, SERA's multiplicity weights); `step_metrics` and
`gradient_alignment` measure the allocation and the gradient against the exact p and the CE gradient, which this
study alone has. The training loop is experiments/imagenet/train.py.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch
import torch.nn.functional as F

from experiments.imagenet.sampling import RowSampler
from sera.advantages import ADVANTAGES, expected_scale, multiplicity_weights
from sera.allocation import scale_factor
from sera.collect import collect
from sera.losses import pg_loss
from sera.methods import ESTIMATORS, MethodSettings, Study

STUDY = Study("classification", estimators=ESTIMATORS, exact_likelihood=True, repeated_prompts=True, sequential=False)
ORACLE_CLIP = 1e-9  # the oracle's p_hat is exact p, kept strictly inside (0, 1)


# ---------------------------------------------------------------------------------------------------------------
# Rollouts: labels sampled from the softmax, with a different count for every image, in one flat pass.
# ---------------------------------------------------------------------------------------------------------------
def draw_rollouts(settings: MethodSettings, probs, p_exact, idx, y, history, generator):
    """p_hat, allocation, and the step's rollouts through the shared collection step (sera.collect).

    probs (B, C) torch; y (B,) numpy true labels. Returns (rows (N,), labels (N,), Collected), grouped by image with
    each image's pilots first.
    """
    sampler = RowSampler(probs)

    def draw(counts):  # a rollout is a label sampled from the image's softmax; reward 1 iff it is the true label
        rows, labels = sampler.sample(counts, generator)
        return labels, (labels == y[rows]).astype(np.float64)

    p_hat_source = {
        "history": lambda: history.estimate(idx.numpy()) if history.has_data else None,
        "oracle": lambda: np.clip(p_exact, ORACLE_CLIP, 1 - ORACLE_CLIP),
    }.get(settings.estimator)
    out = collect(settings, probs.shape[0], draw, p_hat_source)
    labels = out.payloads[0] if out.order is None else np.concatenate(out.payloads)[out.order]
    return out.rows, labels, out


def rollout_loss(settings: MethodSettings, logp, logp_true, idx, y, history, generator):
    """One RL step's loss: p_hat, allocation, rollouts, rewards, advantages, weights (DESIGN sections 1-3).

    logp (B, C) log-softmax with grad; logp_true (B,) log p. Returns (loss, the step's rollout data for logging).
    """
    batch, classes = logp.shape
    y_np = y.cpu().numpy()
    p_exact = logp_true.detach().exp().double().cpu().numpy()
    rows, labels, out = draw_rollouts(settings, logp.detach().exp(), p_exact, idx, y_np, history, generator)
    counts, rewards = out.counts, out.rewards  # (B,), (N,)
    adv = ADVANTAGES[settings.method.advantage](rewards, counts, **settings.adv_kwargs)
    # SERA: multiplicity correction - each rollout weighted by n0 / n_i, so every prompt keeps its uniform weight
    weights = multiplicity_weights(counts, settings.n0) if settings.multiplicity_correction else np.ones(rewards.size)
    # (N, 1): a classifier rollout is one token. index_select on the flat view: its backward is one index_add
    device = logp.device
    lp = logp.reshape(-1).index_select(0, torch.from_numpy(rows * classes + labels).to(device))[:, None]
    loss = pg_loss(
        lp,
        torch.ones_like(lp),
        torch.as_tensor(adv, device=device),
        torch.as_tensor(weights, device=device),
        settings.aggregation,
    )
    update_history(history, idx.numpy(), out.successes, counts)
    return loss, SimpleNamespace(
        rewards=rewards, counts=counts, p_exact=p_exact, p_hat=out.p_hat, tau=out.tau, weights=weights,
        generated=out.rollouts_generated,
    )  # fmt: skip


def update_history(history, idx, successes, counts) -> None:
    """Record the step's outcomes; under DDP every rank records every rank's prompts, so the historical p_hat of a
    prompt is its last rate wherever it was trained."""
    parts = [(idx, successes, counts)]
    if torch.distributed.is_initialized():
        parts = [None] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(parts, (idx, successes, counts))
    for part in parts:
        history.update(*part)


def flat_grad(loss: torch.Tensor, params: list[torch.Tensor]) -> torch.Tensor:
    grads = torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)
    return torch.cat(
        [(g if g is not None else torch.zeros_like(p)).reshape(-1) for g, p in zip(grads, params, strict=True)]
    )


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(F.cosine_similarity(a, b, dim=0))


def step_metrics(settings: MethodSettings, out, loss) -> dict:
    """Reward, allocation, scale factors at the exact p, and p_hat error against exact p (MAE, Pearson r)."""
    rewards, counts, p_exact, p_hat, tau = out.rewards, out.counts, out.p_exact, out.p_hat, out.tau
    c = scale_factor(p_exact, counts, settings.delta)
    m = {
        "train/reward": float(rewards.mean()),
        "train/loss": float(loss),
        "alloc/rollouts": int(counts.sum()),
        "alloc/budget": int(len(counts) * settings.n0),
        "alloc/n_min": int(counts.min()),
        "alloc/n_median": float(np.median(counts)),
        "alloc/n_max": int(counts.max()),
        "alloc/c_min": float(c.min()),
        "alloc/c_mean": float(c.mean()),
        "alloc/c_cv": float(c.std() / max(c.mean(), 1e-12)),
    }
    if tau is not None:
        m["alloc/tau"] = tau
    if p_hat is not None:
        m["phat/mae"] = float(np.abs(p_hat - p_exact).mean())
        # sufficient statistics, so tables can pool Pearson r over an epoch of batches (the paper's Table 3)
        m["phat/moments"] = [
            len(p_hat),
            *map(float, (p_hat.sum(), p_exact.sum(), (p_hat**2).sum(), (p_exact**2).sum(), (p_hat * p_exact).sum())),
        ]
        m["phat/pearson"] = float(np.corrcoef(p_hat, p_exact)[0, 1]) if p_hat.std() > 0 and p_exact.std() > 0 else None
    return m


def gradient_alignment(settings: MethodSettings, loss, ce_loss, logp_true, out, params) -> dict:
    """Cosine of the step's gradient, and of its expectation given the step's counts, to the CE (exact likelihood)
    gradient, same batch.

    grad/cos_expected_ce is E[g | n] = (1/N) sum_i w_i n_i kappa(p_i, n_i) grad log p_i, kappa from
    sera.advantages.expected_scale (c(p, n) for MaxRL): the counts n are held at this step's values. That is the
    expected gradient when the counts do not depend on the group's own rewards (uniform, history, oracle). With
    pilots they do (the pilots stay in the group), and the true expectation averages over pilot outcomes, which the
    global waterline couples across the whole batch (DESIGN.md section 2); the metric is therefore labelled
    "cos(E[g | n], CE)": conditional on the realised counts, without sampling noise.
    """
    counts, weights = out.counts, out.weights
    g_ce = flat_grad(ce_loss, params)
    g_step = flat_grad(loss, params)
    kappa = expected_scale(settings.method.advantage, out.p_exact, counts, **settings.adv_kwargs)
    w_prompt = torch.as_tensor(weights[np.cumsum(counts) - 1] * counts * kappa / counts.sum(), dtype=logp_true.dtype)
    g_expected = flat_grad(-(w_prompt.to(logp_true.device) * logp_true).sum(), params)
    return {
        "grad/cos_ce": cosine(g_step, g_ce),
        "grad/cos_expected_ce": cosine(g_expected, g_ce),
        "grad/norm_ratio": float(g_step.norm() / g_ce.norm().clamp_min(1e-30)),
    }
