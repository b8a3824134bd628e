"""The LM loop's step gradient against a per-rollout computation written out here from docs/design.md sections 1, 2
and 6.

SERA with pilots on the toy task, with a scripted engine whose rollouts give the four prompts different pilot
outcomes (so different p_hat and counts n_i), mixed and unmixed groups, and responses of different lengths, all
shorter than the length limit. The step's gradient (sera.lm_loop.rl_step, micro-batched) must equal the gradient of

    J = sum_i sum_j w_i A_ij log pi(y_ij | x_i) / Z,   w_i = n0 / n_i,   A_ij = (r_ij - mean_i) / mean_i (0 if K_i = 0)

with Z = the response tokens of all the step's rollouts (token-mean) or R * max_new_tokens (seqnorm), log pi from
one plain forward pass per rollout at the loss temperature. Dropping the multiplicity weights or changing either
normaliser (e.g. counting only the live rollouts' tokens) changes the gradient.
"""

import numpy as np
import pytest
import torch

from sera.lm_loop import LoopSettings, rl_step
from sera.methods import MethodSettings, Study
from sera.rollout import Rollouts
from tests.test_lm import EOS, PAD, ToyTask, loop_cfg, tiny_model

N0, PILOTS, MAX_NEW = 8, 2, 6  # responses are at most 5 tokens: the seqnorm constant is not the batch's width
# first-token successes by prompt (ToyTask's reward: first response token == 3), for the j-th rollout of the step
SUCCESS = {
    0: lambda j: True,  # both pilots succeed: p_hat = 15/16, n_min rollouts, an all-success group (A = 0)
    1: lambda j: j in (0, 3),  # one pilot of two: p_hat = 1/2
    2: lambda j: j % 3 == 2,  # no pilot succeeds: p_hat = 1/16, the most rollouts
    3: lambda j: j in (1, 2, 6),
}


class ScriptedEngine:
    """Rollout j of prompt i (counted over the step's calls): first token 3 iff SUCCESS[i](j), then a tail of 0-3
    tokens depending on (i, j), then the end token; padded to the call's longest response. Records every rollout."""

    def __init__(self, prompts):
        self.index = {tuple(p): i for i, p in enumerate(prompts)}
        self.drawn: dict[int, list[list[int]]] = {i: [] for i in range(len(prompts))}

    def sync_weights(self, model):
        pass

    def generate(self, prompts, counts, max_new_tokens, generator, temperature=None, top_p=1.0):
        rows, responses = [], []
        for row, (prompt, count) in enumerate(zip(prompts, counts, strict=True)):
            i = self.index[tuple(prompt)]
            for _ in range(int(count)):
                j = len(self.drawn[i])
                tail = [1 + (i + 2 * j + k) % 8 for k in range((i + j) % 4)]
                response = [3 if SUCCESS[i](j) else 5] + tail + [EOS]
                self.drawn[i].append(response)
                rows.append(row)
                responses.append(response)
        width = max(len(response) for response in responses)
        tokens = torch.full((len(rows), width), PAD, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for r, response in enumerate(responses):
            tokens[r, : len(response)], mask[r, : len(response)] = torch.tensor(response), 1
        return Rollouts(torch.tensor(rows, dtype=torch.long), tokens, mask, torch.zeros(tokens.shape))


def sequence_logprob(model, prompt, response, temperature):
    """log pi(response | prompt) at the temperature: one un-cached forward over prompt + response."""
    logits = model(torch.tensor([prompt + response])).logits[0, len(prompt) - 1 : -1]
    logp = torch.log_softmax(logits / temperature, dim=-1)
    return logp.gather(1, torch.tensor(response)[:, None]).sum()


@pytest.mark.parametrize("aggregation", ["token-mean", "seqnorm"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_step_gradient_is_the_weighted_per_rollout_sum(aggregation, temperature):
    cfg = loop_cfg("sera_pilot", "pilot", PILOTS, aggregation, micro=5)
    cfg.optim.grad_clip = 1e9  # the comparison is of the raw gradient
    cfg.temperature = temperature
    cfg.max_new_tokens = MAX_NEW
    ms, ls = MethodSettings.from_config(cfg, Study("toy")), LoopSettings.from_config(cfg)
    task, model = ToyTask(), tiny_model()
    _, prompts = task.train_prompts(0, 4)
    engine = ScriptedEngine(prompts)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    metrics = rl_step(ms, ls, task, model, engine, optimizer, None, torch.Generator().manual_seed(0), 0)
    step_grad = torch.cat([p.grad.reshape(-1) for p in model.parameters()])

    groups = [engine.drawn[i] for i in range(4)]
    counts = np.array([len(g) for g in groups])
    rewards = [np.array([float(y[0] == 3) for y in g]) for g in groups]
    mixed = [0 < r.sum() < r.size for r in rewards]
    assert counts.sum() == 4 * N0 and len({counts[i] for i in range(4) if mixed[i]}) > 1  # the weights matter
    assert not all(mixed)  # some rollouts carry A = 0 but still count in the normalisers
    assert metrics["alloc/effective_rollouts"] == counts[mixed].sum()

    model.zero_grad()
    total_tokens = sum(len(y) for g in groups for y in g)
    objective = 0.0
    for i, (group, r) in enumerate(zip(groups, rewards, strict=True)):
        n, mean = counts[i], r.mean()
        w = N0 / n  # SERA: multiplicity correction
        for y, r_ij in zip(group, r, strict=True):
            a = (r_ij - mean) / mean if mean > 0 else 0.0
            objective = objective + w * a * sequence_logprob(model, prompts[i], y, temperature)
    z = total_tokens if aggregation == "token-mean" else counts.sum() * MAX_NEW
    (-objective / z).backward()
    expected = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    assert expected.norm() > 0
    torch.testing.assert_close(step_grad, expected, atol=1e-6, rtol=1e-4)
