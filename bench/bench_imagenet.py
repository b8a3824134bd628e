"""Cost of an RL step versus a Direct CE step in the classification study. Run: python -m bench.bench_imagenet.

One step = forward, (p_hat, allocation, labels sampled, advantages for RL), backward and optimizer step on the same
batch and model, n0 = 128. Two models: the CPU default (digits1000, MLP 192-256-256-1000, B = 256: 32,768 rollouts
a step on a network whose CE step takes a few ms) and the paper's ResNet-50 (224 x 224 inputs, B = 16 on the CPU,
few repeats), each timed round-robin. Prints each method's time per step and its ratio to Direct CE (target: at
most 1.10 - sampling labels should cost next to nothing), and for the MLP the share of the step spent drawing the
rollouts, from one run.
"""

from __future__ import annotations

import os
import time

import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_dir

from experiments.imagenet import policy
from experiments.imagenet.data import build_digits1000
from experiments.imagenet.model import build_model
from sera.estimation import HistoricalEstimator
from sera.methods import MethodSettings, get_method
from sera.threads import set_torch_threads

METHODS = ["direct_ce", "maxrl", "sera_pilot", "sera"]
CONFIGS = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "configs"))


def mean_seconds(fns: dict, repeats: int, warmup: int) -> dict:
    """Mean seconds per call of each function, timed round-robin so slow drifts of the machine hit all alike."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    total = dict.fromkeys(fns, 0.0)
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            total[name] += time.perf_counter() - start
    return {name: t / repeats for name, t in total.items()}


def spec_for(name: str) -> MethodSettings:
    with initialize_config_dir(config_dir=CONFIGS, version_base=None):
        cfg = compose("imagenet", overrides=[f"method={name}", "n0=128"])
    return MethodSettings.from_config(cfg, policy.STUDY)


def bench_model(make_model, x, y, repeats: int, warmup: int) -> dict:
    """Seconds per step of each method on (x, y), and of draw_rollouts alone ("<method>/draw") for the RL ones."""
    idx = torch.arange(len(y))
    fns = {}
    for name in METHODS:
        spec = spec_for(name)
        torch.manual_seed(0)
        model = make_model()
        opt = torch.optim.Adam(model.parameters(), lr=1e-4)
        history, gen = HistoricalEstimator(len(y)), torch.Generator().manual_seed(0)

        def step(spec=spec, model=model, opt=opt, history=history, gen=gen):
            logp = F.log_softmax(model(x), -1)
            logp_true = logp.gather(1, y[:, None])[:, 0]
            if spec.method.advantage is None:
                loss = -logp_true.mean()
            else:
                loss, _ = policy.rollout_loss(spec, logp, logp_true, idx, y, history, gen)
            opt.zero_grad()
            loss.backward()
            opt.step()

        fns[name] = step
        if spec.method.advantage is not None:
            with torch.no_grad():
                logp = F.log_softmax(model(x), -1)
            probs, p = logp.exp(), logp.gather(1, y[:, None])[:, 0].exp().double().numpy()

            def draw(spec=spec, probs=probs, p=p, history=history, gen=gen):
                policy.draw_rollouts(spec, probs, p, idx, y.numpy(), history, gen)

            fns[name + "/draw"] = draw
    return mean_seconds(fns, repeats, warmup)


def report(title: str, results: dict, draws: bool) -> None:
    print(title)
    base = results["direct_ce"]
    for name in METHODS:
        label = get_method(name).label
        print(f"  {label:10s} {results[name] * 1e3:9.2f} ms   ratio to Direct CE {results[name] / base:.2f}")
    if draws:
        for name in METHODS[1:]:
            share = results[name + "/draw"] / base
            print(
                f"  {get_method(name).label} draw_rollouts alone (p_hat, allocation, labels): "
                f"{results[name + '/draw'] * 1e3:.2f} ms = {share:.2f} of a Direct CE step"
            )


def main() -> None:
    threads = set_torch_threads("auto")
    data, _ = build_digits1000(2048, 16, split_seed=0)
    x, y = data.x[:256], data.y[:256]
    mlp = bench_model(lambda: build_model("mlp", 192, 1000, [256, 256]), x, y, repeats=60, warmup=5)
    print(f"classification study, one step at n0=128 ({threads} thread(s)); target: RL / Direct CE <= 1.10")
    report("digits1000 MLP, B=256 (the CPU default), mean of 60:", mlp, draws=True)
    gen = torch.Generator().manual_seed(0)
    images, labels = torch.randn(16, 3, 224, 224, generator=gen), torch.randint(0, 1000, (16,), generator=gen)
    resnet = bench_model(lambda: build_model("resnet50", None, 1000, []), images, labels, repeats=4, warmup=1)
    report("ResNet-50 (the paper's model), 224x224, B=16, mean of 4:", resnet, draws=False)


if __name__ == "__main__":
    main()
