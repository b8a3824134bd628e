"""DS, DAPO's dynamic sampling (docs/design.md section 4): rounds of fresh prompts, keep the mixed groups, train on
the first B. Pure numpy.
"""

from __future__ import annotations

import numpy as np

from sera.sequential.common import Draw, NextPrompts, StepResult, _draw, _ints, _next

# ----------------------------------------------------------------------------------------------------------------------
# DS: DAPO dynamic sampling


def ds_step(
    n: int, batch_size: int, gen_batch: int, max_rounds: int, draw: Draw, next_prompts: NextPrompts
) -> StepResult:
    """One training step of DAPO dynamic sampling (verl recipe/dapo).

    Repeat { draw the next gen_batch prompts, n rollouts each, keep the groups whose rewards are not all equal } until
    batch_size groups are kept or max_rounds rounds have run (or the stream is exhausted); train on the first
    batch_size kept groups and discard the surplus. Every group is drawn once, so none is duplicated; at the cap the
    step trains on what was kept (possibly none: the caller skips the step) and reports the shortfall. Shapes: see
    StepResult; every committed count is n. docs/design.md section 4.
    """
    if n < 1 or batch_size < 1 or gen_batch < 1 or max_rounds < 1:
        raise ValueError(f"need n, batch_size, gen_batch, max_rounds >= 1, got {n, batch_size, gen_batch, max_rounds}")
    ids_parts, reward_parts = [], []
    rounds = prompts_drawn = kept = 0
    exhausted = False
    while kept < batch_size and rounds < max_rounds and not exhausted:
        ids = _next(next_prompts, gen_batch)
        exhausted = ids.size < gen_batch
        if ids.size == 0:
            break
        rounds += 1
        prompts_drawn += ids.size
        rewards = _draw(draw, ids, np.full(ids.size, n)).reshape(ids.size, n)
        k = rewards.sum(axis=1)
        kept += int(np.count_nonzero((k > 0) & (k < n)))
        ids_parts.append(ids)
        reward_parts.append(rewards)
    ids = _ints(ids_parts)
    rewards = np.concatenate(reward_parts) if reward_parts else np.zeros((0, n))  # (G, n), every group drawn
    k = rewards.sum(axis=1).astype(np.int64)
    mixed = np.flatnonzero((k > 0) & (k < n))
    trained, dropped = mixed[:batch_size], np.flatnonzero((k == 0) | (k == n))
    return StepResult(
        prompt_ids=ids[trained],
        counts=np.full(trained.size, n, dtype=np.int64),
        rewards=rewards[trained].reshape(-1),
        rollouts_generated=prompts_drawn * n,
        rollouts_trained=trained.size * n,
        groups_committed=trained.size,
        groups_abandoned=dropped.size,
        groups_discarded=mixed.size - trained.size,
        prompts_drawn=prompts_drawn,
        waves=rounds,
        hit_wave_cap=mixed.size < batch_size and rounds == max_rounds and not exhausted,
        shortfall=batch_size - trained.size,
        abandoned_ids=ids[dropped],
        abandoned_successes=k[dropped],
        abandoned_failures=n - k[dropped],
        drawn_ids=ids,
        drawn_successes=k,
        drawn_failures=n - k,
    )
