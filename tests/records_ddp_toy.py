"""The TRL route's evaluation records in two processes (torchrun, gloo), for tests/test_trl.py.

    torchrun --standalone --nproc_per_node 2 -m tests.records_ddp_toy OUT.json

The process group is set up as the launch scripts set it up (SERAGRPOConfig with SUITE_TRL_SETTINGS, TRL's own
initialisation), then RecordsCallback evaluates a four-question set at step 2 with an engine that draws one number a
question from the generator it is given (as HFEngine draws its noise, and VLLMEngine its base seed). OUT.json (rank 0):
the process group's timeout in seconds, each rank's (question, draw) pairs, and the record rank 0 wrote.
"""

from __future__ import annotations

import contextlib
import json
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import experiments  # noqa: F401  (examples.trl_math imports it: its numeric pin must come before torch)

# isort: split
import numpy as np
import torch

import sera.trl
from examples.trl_math import SUITE_TRL_SETTINGS
from sera.distributed import all_gather, world_info
from sera.rollout import Rollouts

QUESTIONS, SEED, STEP = 4, 11, 2


class DrawingEngine:
    """One sample a question, whose only randomness is one draw from the generator; records (prompt, draw)."""

    def __init__(self):
        self.draws: list[tuple[int, float]] = []

    def generate(self, prompts, counts, max_new_tokens, generator, temperature=None, top_p=1.0) -> Rollouts:
        for prompt, count in zip(prompts, counts, strict=True):
            for _ in range(int(count)):
                self.draws.append((prompt[0], float(torch.rand((), generator=generator))))
        n = int(np.sum(counts))
        index = torch.repeat_interleave(torch.arange(len(prompts)), torch.as_tensor(counts))
        return Rollouts(index, torch.ones((n, 1), dtype=torch.long), torch.ones((n, 1), dtype=torch.long),
                        torch.zeros((n, 1)))  # fmt: skip


class ToyTask:
    eos_id, pad_id = 1, 0

    def eval_sets(self) -> dict:
        return {"toy": (list(range(QUESTIONS)), [[q] for q in range(QUESTIONS)])}

    def rewards(self, ids, responses, truncated) -> np.ndarray:
        return np.zeros(len(ids))


def main(out: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        args = sera.trl.SERAGRPOConfig(output_dir=tmp, report_to=[], bf16=False, **SUITE_TRL_SETTINGS)
        args.device  # noqa: B018  (sets up the process group, as the trainer would, with TrainingArguments' timeout)
        assert world_info()[1] == 2
        group = torch.distributed.distributed_c10d._get_default_group()
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # NCCL's group on GPUs, gloo's here
        timeout = group._get_backend(device).options._timeout.total_seconds()
        engine = DrawingEngine()
        sera.trl.policy_engine = lambda trainer, model, task: contextlib.nullcontext(engine)
        callback = sera.trl.RecordsCallback(tmp, ToyTask(), every=STEP, samples=1, ks=[1], max_new_tokens=1, seed=SEED,
                                            max_rollouts_per_call=1)  # fmt: skip
        state = SimpleNamespace(global_step=STEP, max_steps=STEP, is_world_process_zero=world_info()[0] == 0,
                                log_history=[])  # fmt: skip
        callback.on_step_end(SimpleNamespace(deepspeed=None, fsdp=None), state, None, model=None)
        draws = all_gather(engine.draws)
        if world_info()[0] == 0:
            record = json.loads(next(Path(tmp).glob("*.json")).read_text())
            Path(out).write_text(json.dumps({"timeout_s": timeout, "draws": draws, "record": record}))
    torch.distributed.barrier()


def check(r: dict) -> None:
    """OUT.json's checks (tests/test_trl.py, tests/gpu): a day's timeout; questions i mod 2 on rank i mod 2; rank 0
    draws what one process seeded with seed + step draws, rank 1 other numbers; the record holds every question."""
    assert r["timeout_s"] == 24 * 3600
    (rank0, rank1) = [[draw for _, draw in pairs] for pairs in r["draws"]]
    assert [q for q, _ in r["draws"][0]] == [0, 2] and [q for q, _ in r["draws"][1]] == [1, 3]
    one_process = torch.Generator().manual_seed(SEED + STEP)
    assert rank0 == [float(torch.rand((), generator=one_process)) for _ in range(2)]
    assert len(set(rank0) | set(rank1)) == 4
    assert r["record"] == {"ids": [0, 1, 2, 3], "n": 1, "correct": [0, 0, 0, 0]}


if __name__ == "__main__":
    main(sys.argv[1])
