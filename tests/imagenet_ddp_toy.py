"""The classifier's real entry point (experiments.imagenet.train.run) with layout-independent rollouts, for
tests/test_imagenet.py.

    python -m tests.imagenet_ddp_toy RUN_ROOT [overrides...]                                   one process
    torchrun --standalone --nproc_per_node=2 -m tests.imagenet_ddp_toy RUN_ROOT [overrides...]  two (gloo)

With SERA_TEST_BATCHNORM=1 the MLP gets a BatchNorm1d after its first layer (ResNet-50's buffers, at toy size).
With SERA_TEST_NAN_AT=<rank>,<step> that rank's loss at that step is NaN (the other ranks' stay finite).

The label sampler's uniforms come from a generator keyed by (image id, the process's draw call, position in the
image's group) instead of the rank's own generator, so an image gets the same labels whether one process holds the
whole batch of B images or each of two ranks holds B / 2: with a uniform allocation both layouts must take the same
steps, and the trained models must agree.
"""

import os
import sys
from pathlib import Path

import numpy as np
from hydra import compose, initialize_config_dir

from experiments.imagenet import policy, train
from experiments.imagenet.sampling import RowSampler, _draw


class KeyedSampler(RowSampler):
    """RowSampler whose uniforms are keyed by image id (the ids of the current draw_rollouts call)."""

    ids: np.ndarray | None = None
    calls = 0

    def sample(self, counts, generator):
        counts = np.asarray(counts, dtype=np.int64)
        KeyedSampler.calls += 1  # every layout makes the same draw calls, one or two per RL step
        rows = np.repeat(np.arange(self.batch), counts)
        keys = zip(self.ids, counts, strict=True)
        u = [np.random.default_rng([int(i), KeyedSampler.calls]).random(int(c)) for i, c in keys]
        return rows, _draw(self.probs, counts, np.concatenate(u))


def keyed(draw_rollouts):
    def draw(settings, probs, p_exact, idx, y, history, generator):
        KeyedSampler.ids = idx.numpy()
        return draw_rollouts(settings, probs, p_exact, idx, y, history, generator)

    return draw


def nan_at(update, rank: int, step: int):
    """train.update with rank `rank`'s loss at `step` made NaN."""

    def update_(optimizer, loss, metrics, skips, at):
        if at == step and int(os.environ.get("RANK", "0")) == rank and loss is not None:
            loss = loss * float("nan")
        return update(optimizer, loss, metrics, skips, at)

    return update_


def with_batchnorm(build_model):
    def build(*args, **kwargs):
        model = build_model(*args, **kwargs)
        nn, first = train.torch.nn, model[0]  # torch through the entry point, which pins the kernels before it loads
        return nn.Sequential(first, nn.BatchNorm1d(first.out_features), *list(model)[1:])

    return build


if __name__ == "__main__":
    policy.RowSampler, policy.draw_rollouts = KeyedSampler, keyed(policy.draw_rollouts)
    if os.environ.get("SERA_TEST_BATCHNORM") == "1":
        train.build_model = with_batchnorm(train.build_model)
    if os.environ.get("SERA_TEST_NAN_AT"):
        rank, step = (int(v) for v in os.environ["SERA_TEST_NAN_AT"].split(","))
        train.update = nan_at(train.update, rank, step)
    root, overrides = sys.argv[1], sys.argv[2:]
    with initialize_config_dir(config_dir=str(Path(train.__file__).parents[2] / "configs"), version_base=None):
        cfg = compose("imagenet", overrides=[*overrides, f"run.root={root}"])
    train.run(cfg)
