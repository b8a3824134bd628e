"""The policy-gradient loss shared by all three studies (docs/design.md section 6).

Given per-token log-probs of the sampled rollouts, a response mask, per-rollout advantages A and per-rollout
weights w (SERA's n0 / n_i, or 1), returns the scalar loss whose gradient is minus the estimated policy gradient.
A classifier rollout is one token, so there every aggregation reduces to the mean over rollouts.
"""

from __future__ import annotations

import torch

from sera.methods import AGGREGATIONS  # the one list (sera.methods, no torch there)


def pg_loss(
    logprobs: torch.Tensor,
    mask: torch.Tensor,
    advantages: torch.Tensor,
    weights: torch.Tensor | None = None,
    aggregation: str = "token-mean",
    max_len: int | None = None,
    num_rollouts: int | None = None,
    num_tokens: float | None = None,
) -> torch.Tensor:
    """Policy-gradient loss -sum(w A log pi) / normaliser.

    Shapes: logprobs (N, T), mask (N, T) (1 on response tokens, including the end token), advantages (N,),
    weights (N,) or None. Aggregations:
      token-mean: sum over all response tokens of all rollouts of w A log pi(token), divided by the token count.
      seqnorm: each rollout's whole sequence log-prob times w A, divided by max_len (default T), averaged over
        rollouts (the suite's definition; the paper's is unpublished).
      seq-mean-token-mean: each rollout's per-token mean log-prob times w A, averaged over rollouts.
    When only some of the step's rollouts are passed (those with a nonzero advantage: the rest add nothing but
    still count), num_rollouts and num_tokens give the step's totals for the normalisers.
    """
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"unknown loss aggregation {aggregation!r}; choose from {AGGREGATIONS}")
    if logprobs.shape != mask.shape or advantages.shape != logprobs.shape[:1]:
        raise ValueError(
            f"shape mismatch: logprobs {tuple(logprobs.shape)}, mask {tuple(mask.shape)}, "
            f"advantages {tuple(advantages.shape)}"
        )
    mask = mask.to(logprobs.dtype)
    coef = advantages.to(logprobs.dtype)
    if weights is not None:
        coef = coef * weights.to(logprobs.dtype)
    seq_logp = (logprobs * mask).sum(dim=1)  # (N,)
    rollouts = num_rollouts or logprobs.shape[0]
    if aggregation == "token-mean":
        return -(coef * seq_logp).sum() / (num_tokens or mask.sum().clamp_min(1.0))
    if aggregation == "seqnorm":
        return -(coef * seq_logp).sum() / rollouts / (max_len or logprobs.shape[1])
    return -(coef * seq_logp / mask.sum(dim=1).clamp_min(1.0)).sum() / rollouts
