"""A maze RL step's time, part by part, and the HF engine's two decode paths side by side on the same work.

Run: python -m bench.bench_maze [--model runs/maze-cpu/base_seed-0] [--threads 1]. 32 held-out 11x11 mazes, budget
32 x 16 = 512 rollouts, up to 33 tokens each; the SERA counts come from the waterline on p_hat drawn from
Beta(0.5, 2) (clipped to [1/16, 15/16]). Prints, from one run:
- generation tokens/s of the earlier decode path (`decode="dynamic"`: transformers' DynamicCache) and the new one
  (`decode="static"`: SharedPromptDecoder), uniform and SERA counts, their ratio (issue 16's target: new / old >= 2
  on one thread), SERA / uniform (target >= 0.9), and how many of the 512 responses the two paths drew differently
  from the same generator (expected 0: same uniforms, logits equal up to float rounding);
- the step's split: generate, score (the task's batched reward), log-prob forward + backward of the MaxRL token-mean
  loss over the rollouts with a nonzero advantage and over all 512 (every group mixed, later in training), by both
  log-prob paths (train.logprobs: repeated-cache, the earlier one, and shared-prompt) and their ratio, and the AdamW
  update.
Without --model a randomly initialised maze-1m is used (`make bench` passes the base model when it exists).
"""

from __future__ import annotations

import argparse
import copy
import time

import numpy as np
import torch

from experiments.maze.model import build_model
from experiments.maze.task import DONE_ID, EVAL_SET, PAD_ID, MazeTask
from sera.advantages import maxrl
from sera.allocation import uniform, waterline
from sera.lm_loop import score
from sera.losses import pg_loss
from sera.rollout import HFEngine, response_logprobs, shared_prompt_logprobs
from sera.threads import set_torch_threads

MAX_NEW_TOKENS = 33


def throughput(engines: dict, prompts, counts, repeats: int = 3) -> dict:
    """{path: (generated tokens per second, seconds per call, the rollouts of seed 0)}, best of `repeats` calls; the
    paths take turns (a shared machine's load hits both alike) and call r of each draws from a generator seeded r."""
    best = {path: (0.0, float("inf"), None) for path in engines}
    for r in range(repeats):
        for path, engine in engines.items():
            start = time.perf_counter()
            out = engine.generate(prompts, counts, MAX_NEW_TOKENS, torch.Generator().manual_seed(r))
            elapsed = time.perf_counter() - start
            rate, seconds, first = best[path]
            best[path] = (max(rate, float(out.mask.sum()) / elapsed), min(seconds, elapsed), first or out)
    return best


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def step_split(model, task, ids, prompts, counts) -> dict:
    """Seconds of each part of one MaxRL token-mean step on these counts with the new decode path (the loop's own
    functions), on a copy of the model: every call draws the same rollouts."""
    model = copy.deepcopy(model)
    engine = HFEngine(model, DONE_ID, PAD_ID, decode="static")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    times = {}
    start = time.perf_counter()
    rollouts = engine.generate(prompts, counts, MAX_NEW_TOKENS, torch.Generator().manual_seed(0))
    times["generate"] = time.perf_counter() - start
    rewards = None

    def reward():
        nonlocal rewards
        rewards = score(task, ids, rollouts)

    times["score"] = timed(reward)
    adv = maxrl(rewards, counts)
    tokens = float(rollouts.mask.sum())

    def backward(rows: torch.Tensor, advantages: np.ndarray, path: str = "repeated-cache"):
        optimizer.zero_grad(set_to_none=True)
        sub = rollouts.select(rows)
        if path == "shared-prompt":
            logp = shared_prompt_logprobs(model, prompts, sub, PAD_ID)
        else:
            logp = response_logprobs(model, prompts, sub, PAD_ID)
        adv_t = torch.as_tensor(advantages, dtype=torch.float32)
        loss = pg_loss(logp, sub.mask, adv_t, aggregation="token-mean", num_rollouts=len(rewards), num_tokens=tokens)
        loss.backward()

    live = torch.as_tensor(np.flatnonzero(adv))
    times["live"] = live.numel()
    every = torch.arange(len(rewards))
    live_adv, ones = adv[live.numpy()], np.ones(len(rewards))  # every group mixed: all 512 trained
    for path in ("repeated-cache", "shared-prompt"):  # the repeated cache: the earlier path, the committed runs'
        times[f"live {path}"] = timed(lambda p=path: backward(live, live_adv, p)) if live.numel() else 0.0
        times[f"all {path}"] = timed(lambda p=path: backward(every, ones, p))
    times["optimizer"] = timed(optimizer.step)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="a saved maze checkpoint (e.g. runs/maze-cpu/base_seed-0)")
    parser.add_argument("--threads", default="1", help="torch threads: an int, or auto (the idle cores)")
    args = parser.parse_args()
    threads = set_torch_threads(args.threads if args.threads == "auto" else int(args.threads))
    torch.manual_seed(0)
    model = build_model("maze-1m", args.model)
    task = MazeTask(5, 32)
    ids, prompts = task.eval_sets()[EVAL_SET]
    p_hat = np.clip(np.random.default_rng(0).beta(0.5, 2.0, 32), 1 / 16, 15 / 16)
    allocations = {"uniform (16 each)": uniform(32, 16), "SERA (waterline)": waterline(p_hat, 32 * 16, 2, 128)}
    engines = {path: HFEngine(model, DONE_ID, PAD_ID, decode=path) for path in ("dynamic", "static")}
    print(f"maze rollouts, 32 mazes x budget 512, {threads} thread(s), model={args.model or 'random maze-1m'}:")
    print("  counts             | old: DynamicCache    | new: SharedPromptDecoder | new / old | drawn differently")
    rates = {}
    for label, counts in allocations.items():
        (old, old_s, old_out), (new, new_s, new_out) = throughput(engines, prompts, counts).values()
        differ = int((old_out.tokens != new_out.tokens).any(dim=1).sum())
        rates[label] = new
        print(
            f"  {label:18} | {old:7.0f} tok/s {old_s:5.2f} s | {new:7.0f} tok/s {new_s:5.2f} s     | "
            f"{new / old:8.2f}x | {differ} of {len(new_out.prompt_index)}"
        )
    uni, sera = rates.values()
    counts = allocations["SERA (waterline)"]
    print(f"  SERA / uniform (new path): {sera / uni:.2f} (target >= 0.9); n_i {counts.min()}..{counts.max()}")
    splits = [step_split(model, task, ids, prompts, counts) for _ in range(2)]
    split = {key: min(run[key] for run in splits) for key in splits[0]}  # best of two: a shared machine's load
    total = split["generate"] + split["score"] + split["live shared-prompt"] + split["optimizer"]
    print(f"  one MaxRL token-mean step on the SERA counts (new decode path, shared-prompt log-probs), {total:.2f} s:")
    print(f"    generate                              {split['generate']:6.2f} s")
    print(f"    score (batched reward)                {split['score']:6.3f} s")
    print("    log-prob forward + backward          repeated-cache | shared-prompt | ratio")
    for rows in ("live", "all"):
        old, new = split[f"{rows} repeated-cache"], split[f"{rows} shared-prompt"]
        label = f"{split['live']:3d} live" if rows == "live" else "all 512 (every group mixed)"
        print(f"      {label:32} {old:6.2f} s       | {new:6.2f} s      | {old / max(new, 1e-9):5.2f}x")
    print(f"    AdamW update                          {split['optimizer']:6.3f} s")


if __name__ == "__main__":
    main()
