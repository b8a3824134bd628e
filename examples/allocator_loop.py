"""SERA's allocator inside a training loop that is not the suite's: numpy only, no torch (docs/allocator.md).

A stand-in policy (one success probability a prompt, nudged by each step's weighted advantages) takes the place of
your model, generator and optimizer. The five calls numbered 1-5 are what a trainer makes each step with the
authors' rule (`method=sera`): estimate p_hat from the Beta history, allocate the budget B * n0, weight the groups,
compute MaxRL's advantages, and update the history. It prints each step's rollouts per prompt and the
policy's mean success probability over the training set.

Run: python examples/allocator_loop.py
"""

from __future__ import annotations

import numpy as np

from sera.advantages import ADVANTAGES
from sera.allocation import active_waterline, active_weights, uniform
from sera.estimation import BetaHistory, epoch_of_step

NUM_PROMPTS, B, N0 = 24, 8, 16  # prompts in the training set, prompts a step, mean rollouts a prompt (budget B * N0)
STEPS = 9  # three epochs of three steps
LR = 0.5  # the stand-in policy's step size


def prompts_of(step: int) -> np.ndarray:
    """The step's prompt ids (B,): the training set read in epochs, a fresh order each epoch (your data loader)."""
    order = np.random.default_rng(epoch_of_step(step, B, NUM_PROMPTS)).permutation(NUM_PROMPTS)
    start = step * B % NUM_PROMPTS
    return order[start : start + B]


def generate_and_score(rng: np.random.Generator, p: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Your generator and reward: counts[i] 0/1 rewards of prompt i, grouped by prompt (sum(counts),)."""
    return (rng.random(counts.sum()) < np.repeat(p, counts)).astype(np.float64)


def main() -> None:
    rng = np.random.default_rng(0)
    policy = rng.beta(0.4, 1.2, NUM_PROMPTS)  # the stand-in policy: each prompt's success probability
    history = BetaHistory(NUM_PROMPTS)  # the authors' estimator: Beta posterior means, frozen for an epoch
    for step in range(STEPS):
        ids = prompts_of(step)
        # 1. estimate: the batch's p_hat (B,), NaN for a prompt not seen in an earlier epoch
        history.advance_to(epoch_of_step(step, B, NUM_PROMPTS))
        p_hat = history.estimate(ids)
        # 2. allocate: counts (B,) summing to B * N0; uniform while a prompt has no estimate (the first epoch)
        if BetaHistory.needs_uniform(p_hat):
            counts = uniform(B, N0)
        else:
            counts = active_waterline(p_hat, B * N0, n_min=2, n_max=4 * N0)
        active = counts > 0  # prompts outside the active set get no rollouts
        rewards = generate_and_score(rng, policy[ids[active]], counts[active])  # (R,), grouped by prompt
        # 3. weights: SERA's multiplicity correction n0 / n_i, one a rollout (R,)
        weights = np.repeat(active_weights(counts, N0)[active], counts[active])
        # 4. advantages: MaxRL's r / mean(r) - 1 within each group (R,)
        advantages = ADVANTAGES["maxrl"](rewards, counts[active])
        # your optimizer step would minimise -sum(weights * advantages * log pi(y)) / (B * N0); the stand-in moves
        # each prompt's probability by its group's share of that sum
        starts = np.cumsum(counts[active]) - counts[active]
        push = np.add.reduceat(weights * advantages * rewards, starts) / (B * N0)
        policy[ids[active]] = np.clip(policy[ids[active]] + LR * push, 0.0, 0.999)
        # 5. update the history: successes and rollouts of each prompt trained on (read from the next epoch on)
        history.update(ids[active], np.add.reduceat(rewards, starts), counts[active])
        print(f"step {step}: rollouts {counts}, policy mean p {policy.mean():.3f}")


if __name__ == "__main__":
    main()
