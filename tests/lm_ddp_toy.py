"""Two LM-loop steps on the toy task, in one process or under torchrun (gloo): writes the final parameters.

Run by tests/test_lm.py::test_two_process_step_equals_one_process_step. The engine samples from a generator keyed by
(prompt, engine call, index within the call), which every rank sees alike, so both layouts draw the same rollouts and
must take the same steps.
"""

import sys

import numpy as np
import torch

from sera.lm_loop import LoopSettings, rl_step, world_info
from sera.methods import MethodSettings, Study
from sera.rollout import Rollouts
from tests.test_lm import EOS, PAD, ToyTask, loop_cfg, tiny_model


class KeyedEngine:
    """Samples a rollout's tokens from a generator seeded by its prompt, the call and its index: layout-independent."""

    def __init__(self):
        self.calls = 0

    def sync_weights(self, model):
        pass

    def generate(self, prompts, counts, max_new_tokens, generator, temperature=None, top_p=1.0):
        rows, tokens = [], []
        self.calls += 1  # every rank makes the same calls
        for i, (prompt, count) in enumerate(zip(prompts, counts, strict=True)):
            for j in range(int(count)):
                key = (tuple(prompt), self.calls, j)
                rng = np.random.default_rng(abs(hash(key)) % 2**32)
                length = int(rng.integers(1, max_new_tokens + 1))
                toks = list(rng.integers(1, 9, length - 1)) + [EOS]
                rows.append(i)
                tokens.append(toks)
        tok = torch.full((len(rows), max_new_tokens), PAD, dtype=torch.long)
        mask = torch.zeros((len(rows), max_new_tokens), dtype=torch.long)
        for r, t in enumerate(tokens):
            tok[r, : len(t)], mask[r, : len(t)] = torch.tensor(t), 1
        return Rollouts(torch.tensor(rows, dtype=torch.long), tok, mask, torch.zeros(tok.shape))


def main(out_path: str) -> None:
    if "RANK" in __import__("os").environ:
        torch.distributed.init_process_group("gloo")
    cfg = loop_cfg("sera", "pilot", 2, micro=3)
    ms, ls = MethodSettings.from_config(cfg, Study("toy")), LoopSettings.from_config(cfg)
    model = tiny_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    engine, task = KeyedEngine(), ToyTask()
    metrics = [rl_step(ms, ls, task, model, engine, optimizer, None, torch.Generator(), step) for step in range(2)]
    if world_info()[0] == 0:
        state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        torch.save({"state": state, "metrics": metrics}, out_path)
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
