"""Rollout throughput of the HF engine: a SERA allocation versus a uniform one at the same budget, and padding waste.

Run: python -m bench.bench_maze [--model runs/maze-cpu/base_seed-0]. 32 held-out 11x11 mazes, budget 32 x 16 =
512 rollouts; the SERA counts come from the waterline on p_hat drawn from Beta(0.5, 2) (clipped to [1/16, 15/16]).
Prints tokens/s for each and their ratio (target: SERA / uniform >= 0.9), the share of padded slots in the
returned batch, and the cost of scoring a step's rollouts (the task's batched reward, sera.lm_loop.score) against
generating them. Without --model a randomly initialised maze-1m is used.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from experiments.maze.model import build_model
from experiments.maze.task import DONE_ID, EVAL_SET, PAD_ID, MazeTask
from sera.allocation import uniform, waterline
from sera.lm_loop import score
from sera.rollout import HFEngine
from sera.threads import set_torch_threads


def throughput(engine, prompts, counts, repeats: int = 2):
    """(generated tokens per second, share of padded slots in the (N, T) output, seconds per call, the rollouts)."""
    best, waste, seconds = 0.0, 0.0, float("inf")
    for r in range(repeats):
        start = time.perf_counter()
        out = engine.generate(prompts, counts, 33, torch.Generator().manual_seed(r))
        elapsed = time.perf_counter() - start
        best, seconds = max(best, float(out.mask.sum()) / elapsed), min(seconds, elapsed)
        waste = 1 - float(out.mask.float().mean())
    return best, waste, seconds, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="a saved maze checkpoint (e.g. runs/maze-cpu/base_seed-0)")
    args = parser.parse_args()
    threads = set_torch_threads("auto")
    torch.manual_seed(0)
    model = build_model("maze-1m", args.model)
    engine = HFEngine(model, DONE_ID, PAD_ID)
    task = MazeTask(5, 32)
    ids, prompts = task.eval_sets()[EVAL_SET]
    p_hat = np.clip(np.random.default_rng(0).beta(0.5, 2.0, 32), 1 / 16, 15 / 16)
    sera_counts = waterline(p_hat, 32 * 16, 2, 128)
    uni_tps, uni_waste, _, _ = throughput(engine, prompts, uniform(32, 16))
    sera_tps, sera_waste, gen_s, rollouts = throughput(engine, prompts, sera_counts)
    reward_s = min(timed(lambda: score(task, ids, rollouts)) for _ in range(3))
    print(f"maze rollouts, 32 mazes x budget 512, {threads} thread(s), model={args.model or 'random maze-1m'}:")
    print(f"  uniform (16 each):        {uni_tps:8.0f} tokens/s, padded slots {100 * uni_waste:.1f}%")
    print(
        f"  SERA (n_i {sera_counts.min()}..{sera_counts.max()}):       {sera_tps:8.0f} tokens/s, "
        f"padded slots {100 * sera_waste:.1f}%"
    )
    print(
        f"  ratio SERA / uniform: {sera_tps / uni_tps:.2f} (target >= 0.9); finished rows leave the batch as they "
        "end, so padded slots cost memory in the returned tensor, not decode compute"
    )
    print(
        f"  reward scoring of the step's {len(rollouts.prompt_index)} rollouts (one batched call): "
        f"{1e3 * reward_s:.1f} ms, {reward_s / gen_s:.3f} of generating them"
    )


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


if __name__ == "__main__":
    main()
