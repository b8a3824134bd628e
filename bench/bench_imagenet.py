"""Cost of an RL step versus a Direct CE step in the classification study. Run: python -m bench.bench_imagenet.

One step = forward, (labels sampled, allocation, advantages for RL), backward and optimizer step on the same batch
and model (digits1000, MLP 192-256-256-1000, B = 256, n0 = 128). Prints each method's time per step and its ratio to
Direct CE (target: at most 1.10 - sampling labels should cost next to nothing), from one run.
"""

from __future__ import annotations

import os
import time

import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_dir

from experiments.imagenet import train
from experiments.imagenet.data import build_digits1000
from experiments.imagenet.model import build_model
from sera.estimation import HistoricalEstimator
from sera.methods import allocation_bounds, get_method
from sera.threads import set_torch_threads

REPEATS = 60


def time_steps(step_fn) -> float:
    for _ in range(5):  # warm-up
        step_fn()
    start = time.perf_counter()
    for _ in range(REPEATS):
        step_fn()
    return (time.perf_counter() - start) / REPEATS


def main() -> None:
    threads = set_torch_threads("auto")
    data, _ = build_digits1000(2048, 16, split_seed=0)
    idx = torch.arange(256)
    x, y = data.x[idx], data.y[idx]
    config_dir = os.path.join(os.path.dirname(__file__), "..", "configs")
    results = {}
    for name in ["direct_ce", "maxrl", "sera"]:
        with initialize_config_dir(config_dir=os.path.abspath(config_dir), version_base=None):
            cfg = compose("imagenet", overrides=[f"method={name}", "n0=128"])
        method = train.validate(cfg)
        torch.manual_seed(0)
        model = build_model("mlp", 192, 1000, [256, 256])
        opt = torch.optim.Adam(model.parameters(), lr=1e-4)
        history, gen = HistoricalEstimator(len(data)), torch.Generator().manual_seed(0)
        alloc = allocation_bounds(cfg)

        def step(method=method, model=model, opt=opt, history=history, gen=gen, cfg=cfg, alloc=alloc):
            logp = F.log_softmax(model(x), -1)
            logp_true = logp.gather(1, y[:, None])[:, 0]
            if method.advantage is None:
                loss = -logp_true.mean()
            else:
                loss, _ = train.rollout_loss(cfg, method, logp, logp_true, idx, y, history, gen, alloc, {})
            opt.zero_grad()
            loss.backward()
            opt.step()

        results[name] = time_steps(step)
    print(f"classification study, one step at B=256, n0=128 ({threads} thread(s)), mean of {REPEATS}:")
    for name, seconds in results.items():
        ratio = seconds / results["direct_ce"]
        print(f"  {get_method(name).label:10s} {seconds * 1e3:7.2f} ms   ratio to Direct CE {ratio:.2f}")
    print("  (target: RL / Direct CE <= 1.10)")


if __name__ == "__main__":
    main()
