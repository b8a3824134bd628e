"""Classification as a policy, the RL step: labels sampled from the softmax are the rollouts (docs/design.md section 5).

`draw_rollouts` runs the shared collection step (sera.collect) with the compiled label sampler; `rollout_loss` turns a
batch's log-softmax into the step's policy-gradient loss (advantages, SERA's multiplicity weights). The sequential
allocators (DS, DPS, SARA) draw images as the step goes: `ImagePrompts` is their prompt stream and
`sequential_rollouts` their collection step, after which `policy_loss` gives the loss on the images trained on.
`step_metrics` and `gradient_alignment` measure the allocation and the gradient against the exact p and the CE
gradient, which this study alone has; `abandonment_error` scores the groups a sequential allocator dropped. The
training loop is experiments/imagenet/train.py.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch
import torch.nn.functional as F

from experiments.imagenet.sampling import RowSampler
from sera.advantages import expected_scale
from sera.allocation import scale_factor
from sera.collect import advantages_and_weights, collect, collection_metrics
from sera.distributed import all_gather, world_info
from sera.losses import pg_loss
from sera.methods import MethodSettings, Study
from sera.sequential import mixed_probability

STUDY = Study(
    "classification",
    estimators=("none", "pilot", "history", "oracle"),
    exact_likelihood=True,
    repeated_prompts=True,
    sequential=True,
)
ORACLE_CLIP = 1e-9  # the oracle's p_hat is exact p, kept strictly inside (0, 1)
# the authors' rule takes the exact p as their code does: clipped to [smallest normal double, largest below 1]
AUTHORS_CLIP = (float(np.finfo(np.float64).tiny), float(np.nextafter(1.0, 0.0)))


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

    lo, hi = AUTHORS_CLIP if settings.method.allocator == "active" else (ORACLE_CLIP, 1 - ORACLE_CLIP)
    p_hat_source = {
        "history": lambda: history.estimate(idx.numpy()) if history.has_data else None,
        "oracle": lambda: np.clip(p_exact, lo, hi),
    }.get(settings.estimator)
    out = collect(settings, probs.shape[0], draw, p_hat_source)
    labels = out.payloads[0] if out.order is None else np.concatenate(out.payloads)[out.order]
    return out.rows, labels, out


def rollout_loss(settings: MethodSettings, logp, logp_true, idx, y, history, generator):
    """One RL step's loss with a batch allocator: p_hat, allocation, rollouts, rewards, advantages, weights
    (docs/design.md sections 1-3).

    logp (B, C) log-softmax with grad; logp_true (B,) log p. Returns (loss, the step's rollout data for logging).
    Under DistributedDataParallel the step is the whole batch of every rank: each rank gathers every rank's softmax,
    draws every image's rollouts with the generator all ranks share (the same allocation on every rank, the one a
    single process makes), and takes the loss on its own images' rollouts with the step's normaliser shared out, so
    that DDP's average of the ranks' gradients is the single-process gradient (for a model without BatchNorm, whose
    batch statistics are each rank's own).
    """
    rank, world = world_info()
    probs, p_exact = logp.detach().exp(), logp_true.detach().exp().double().cpu().numpy()
    labels_true, ids, own = y.cpu().numpy(), idx.numpy(), None
    if world > 1:
        parts = all_gather((probs.cpu(), p_exact, ids, labels_true))
        start = sum(len(part[1]) for part in parts[:rank])
        own = slice(start, start + len(p_exact))
        probs = torch.cat([part[0] for part in parts])
        p_exact, ids, labels_true = (np.concatenate([part[i] for part in parts]) for i in (1, 2, 3))
    rows, labels, out = draw_rollouts(settings, probs, p_exact, torch.from_numpy(ids), labels_true, history, generator)
    if own is None and out.prompts.size < logp.shape[0]:  # the authors' rule left some images out: the loss is on
        keep = torch.from_numpy(out.prompts).to(logp.device)  # the others
        return policy_loss(settings, logp[keep], rows, labels, out, p_exact[out.prompts], ids[out.prompts], history)
    return policy_loss(settings, logp, rows, labels, out, p_exact[out.prompts], ids[out.prompts], history, own)


def policy_loss(settings: MethodSettings, logp, rows, labels, out, p_exact, idx, history, own: slice | None = None):
    """The policy-gradient loss of the collected rollouts: advantages, SERA's multiplicity weights, aggregation.

    logp (C, classes) log-softmax with grad of the images trained on, in the order of out.prompts; rows (N,) and
    labels (N,) the grouped rollouts; p_exact (C,) and idx (C,) numpy. Records the outcomes in the history.
    own: under DistributedDataParallel, this rank's images among the step's (logp is then theirs alone, every image
    of the rank's batch, and out is the whole step's, the same on every rank): the loss is on their rollouts, with
    the step's normaliser divided by the ranks, and the history records the whole step once.
    """
    classes = logp.shape[1]
    counts, rewards = out.counts, out.rewards  # (C,), (N,)
    adv, weights = advantages_and_weights(settings, out)  # SERA: weights n0 / n_i, every prompt keeps its weight
    normaliser, step_weights = None, weights
    if own is not None:
        images = out.prompts[rows]  # each rollout's image in the step's batch
        mine = (images >= own.start) & (images < own.stop)
        normaliser = len(rows) / world_info()[1]
        rows, labels, adv, weights = images[mine] - own.start, labels[mine], adv[mine], weights[mine]
        history.update(idx, out.successes, counts)
    else:
        update_history(history, idx, out.successes, counts)
    # (N, 1): a classifier rollout is one token. index_select on the flat view: its backward is one index_add
    device = logp.device
    lp = logp.reshape(-1).index_select(0, torch.from_numpy(rows * classes + labels).to(device))[:, None]
    loss = pg_loss(
        lp,
        torch.ones_like(lp),
        torch.as_tensor(adv, device=device),
        torch.as_tensor(weights, device=device),
        settings.aggregation,
        num_rollouts=normaliser,
        num_tokens=normaliser,
    )
    return loss, SimpleNamespace(
        rewards=rewards, counts=counts, p_exact=p_exact, p_hat=out.p_hat, tau=out.tau, weights=step_weights,
        generated=out.rollouts_generated, collected=out, own=own,
    )  # fmt: skip


# ---------------------------------------------------------------------------------------------------------------
# The sequential allocators: images drawn as the step goes, each new one forwarded once without grad.
# ---------------------------------------------------------------------------------------------------------------
class ImagePrompts:
    """A step's images for the sequential allocators (sera.collect's prompt stream: take, size, ids).

    take(k) pulls k more images from the training stream (BatchStream, a batch at a time); an image's softmax is
    computed, without grad, the first time rollouts are drawn for it, so DPS's unselected candidates cost no forward.
    Images pulled from the stream but not taken are dropped at the end of the step, so the stream's position stays
    the checkpointed state. An image is in a step at most once. With batch norm in train mode the probe forwards
    would see other batches than the gradient's forward; the CPU default's MLP has none.
    """

    def __init__(self, stream, model, device):
        self.stream, self.model, self.device = stream, model, device
        self.ids = np.zeros(0, dtype=np.int64)
        self.x, self.y = [], np.zeros(0, dtype=np.int64)
        self.probs: list[torch.Tensor | None] = []
        self._pending = None  # the rest of the last batch pulled: (idx, x, y)
        self._pulled = 0  # images pulled from the stream this step

    def size(self) -> int:
        return self.ids.size

    def take(self, k: int) -> np.ndarray:
        """Add up to k more images, never one already in this step (a step that runs into the next epoch skips the
        images it has); fewer once a whole epoch's worth has been pulled this step. Returns their step indices."""
        start = self.size()
        while k > 0 and self._pulled < self.stream.num:
            if self._pending is None or len(self._pending[0]) == 0:
                self._pending = self.stream.next_batch()
                self._pulled += len(self._pending[0])
            idx, x, y = self._pending
            n = min(k, len(idx))
            fresh = np.flatnonzero(~np.isin(idx[:n].numpy(), self.ids))
            self.ids = np.concatenate([self.ids, idx[:n].numpy()[fresh]])
            self.x += [x[i] for i in fresh]
            self.y = np.concatenate([self.y, y[:n].numpy()[fresh]])
            self.probs += [None] * fresh.size
            self._pending = (idx[n:], x[n:], y[n:])
            k -= fresh.size
        return np.arange(start, self.size())

    def images(self, rows) -> torch.Tensor:
        return torch.stack([self.x[i] for i in rows]).to(self.device)

    @torch.no_grad()
    def probs_for(self, rows: np.ndarray) -> torch.Tensor:
        """(len(rows), classes) softmax of these images, forwarding (once, in one batch) those not yet seen."""
        if len(rows) == 0:
            return torch.zeros(0, 0)
        missing = [int(i) for i in rows if self.probs[i] is None]
        if missing:
            p = F.softmax(self.model(self.images(missing)).float(), dim=-1).cpu()
            for i, row in zip(missing, p, strict=True):
                self.probs[i] = row
        return torch.stack([self.probs[i] for i in rows])

    def p_true(self, rows) -> np.ndarray:
        """(len(rows),) float64 exact p = softmax[y*] of these images."""
        rows = np.asarray(rows, dtype=np.int64)
        return self.probs_for(rows).double().numpy()[np.arange(rows.size), self.y[rows]]


def sequential_rollouts(settings: MethodSettings, prompts: ImagePrompts, batch: int, generator, state=None):
    """The step's rollouts by a sequential allocator: images taken from `prompts` as the allocator asks, labels drawn
    from their softmax; `state` is what the allocator carries across steps (sera.collect.sequential_state). Returns
    (labels (N,) grouped like out.rewards, Collected); out.prompts index `prompts`."""

    def draw(counts):  # only the images with rollouts in this call are sampled (and forwarded, if new)
        use = np.flatnonzero(counts)
        local, labels = RowSampler(prompts.probs_for(use)).sample(counts[use], generator)
        return labels, (labels == prompts.y[use[local]]).astype(np.float64)

    out = collect(settings, batch, draw, stream=prompts, state=state)
    labels = np.concatenate(out.payloads) if out.payloads else np.zeros(0, dtype=np.int64)
    return (labels if out.order is None else labels[out.order]), out


def abandonment_error(out, p_true, n: int) -> dict:
    """How likely a dropped group was to end mixed had it been completed to n rollouts, with p exact: for each group
    the allocator abandoned (SARA's rule; DS's all-equal filter, always 0 as its groups are complete),
    P(mixed | its rollouts so far) (sera.sequential.mixed_probability), averaged. p_true(step indices) gives their
    exact p (ImagePrompts.p_true). Empty when nothing was abandoned."""
    if out.abandoned is None or out.abandoned[0].size == 0:
        return {}
    ids, s, f = out.abandoned
    err = mixed_probability(p_true(ids), s, f, n)
    return {"alloc/abandon_error_mean": float(err.mean()), "alloc/abandon_error_max": float(err.max())}


def update_history(history, idx, successes, counts) -> None:
    """Record the step's outcomes; under DDP every rank records every rank's prompts, so the historical p_hat of a
    prompt is its last rate wherever it was trained."""
    for part in all_gather((idx, successes, counts)):
        history.update(*part)


def flat_grad(loss: torch.Tensor, params: list[torch.Tensor]) -> torch.Tensor:
    grads = torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)
    return torch.cat(
        [(g if g is not None else torch.zeros_like(p)).reshape(-1) for g, p in zip(grads, params, strict=True)]
    )


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(F.cosine_similarity(a, b, dim=0))


def step_metrics(settings: MethodSettings, out, loss, batch: int) -> dict:
    """Reward, allocation, scale factors at the exact p, and p_hat error against exact p (MAE, Pearson r).

    batch: B, the step's nominal prompts (a sequential allocator may train on fewer images and draw more)."""
    counts, p_exact, p_hat = out.counts, out.p_exact, out.p_hat
    c = scale_factor(p_exact, counts, settings.delta)
    m = {
        **collection_metrics(settings, out.collected, batch),
        "train/loss": float(loss),
        "alloc/n_median": float(np.median(counts)),
        "alloc/c_min": float(c.min()),
        "alloc/c_mean": float(c.mean()),
        "alloc/c_cv": float(c.std() / max(c.mean(), 1e-12)),
    }
    if not settings.sampler.stream:  # the step's images are a uniform draw of the training set
        # the expected share of groups of n0 with all-equal rewards: what DS and SARA can save on (docs/design.md,
        # section 4)
        m["alloc/saturated_share"] = float(np.mean(p_exact**settings.n0 + (1 - p_exact) ** settings.n0))
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
    global waterline couples across the whole batch (docs/design.md section 2); the metric is therefore labelled
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
