"""The LM loop on the toy task under torchrun (gloo, CPU processes), for tests/test_lm.py.

    python -m tests.lm_ddp_toy step OUT [ddp|fsdp2]        two rl_steps; writes the final parameters and metrics
    python -m tests.lm_ddp_toy resume RUN_DIR [ddp|fsdp2] [CRASH_AT]   the whole loop (train) into a run directory,
                                                           every rank failing at step CRASH_AT when given
    python -m tests.lm_ddp_toy records OUT fsdp2           sera.trl.policy_engine over an FSDP2-sharded model: the
                                                           records' evaluation from a whole copy on each rank

`step` runs in one process or several: the engine samples from a generator keyed by (prompt, engine call, index
within the call), which every rank sees alike, so every layout draws the same rollouts and must take the same steps.
`resume` keys the samples by a draw from the rank's own generator instead (which the checkpoint restores), so a
resumed run continues exactly.
"""

import sys

import numpy as np
import torch

import sera.lm_loop as loop
from sera.distributed import full_state, shard_model, world_info
from sera.lm_loop import LoopSettings, rl_step, train
from sera.methods import MethodSettings, Study
from sera.rollout import Rollouts
from sera.runlog import RunDir
from tests.test_lm import EOS, PAD, ToyTask, loop_cfg, tiny_model


class KeyedEngine:
    """Samples a rollout's tokens from a generator seeded by its prompt, the call and its index: layout-independent."""

    def __init__(self, by_generator: bool = False):
        self.calls, self.by_generator = 0, by_generator

    def sync_weights(self, model):
        pass

    def generate(self, prompts, counts, max_new_tokens, generator, temperature=None, top_p=1.0):
        rows, tokens = [], []
        self.calls += 1  # every rank makes the same calls
        call = int(torch.randint(2**31, (1,), generator=generator)) if self.by_generator else self.calls
        for i, (prompt, count) in enumerate(zip(prompts, counts, strict=True)):
            for j in range(int(count)):
                key = (tuple(prompt), call, j)
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


def settings(parallel: str, steps: int = 2):
    cfg = loop_cfg("sera_pilot", "pilot", 2, micro=3, steps=steps)
    cfg.train.parallel = parallel
    return MethodSettings.from_config(cfg, Study("toy")), LoopSettings.from_config(cfg)


def step(out_path: str, parallel: str) -> None:
    ms, ls = settings(parallel)
    model = tiny_model()
    if parallel == "fsdp2" and world_info()[1] > 1:
        shard_model(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    engine, task = KeyedEngine(), ToyTask()
    metrics = [rl_step(ms, ls, task, model, engine, optimizer, None, torch.Generator(), s) for s in range(2)]
    state = full_state(model, optimizer)[0]  # a collective when sharded
    if world_info()[0] == 0:
        state = {k: v.detach().clone() for k, v in state.items()}
        torch.save({"state": state, "metrics": metrics}, out_path)


def resume(run_dir: str, parallel: str, crash_at: int | None) -> None:
    ms, ls = settings(parallel, steps=4)
    if crash_at is not None:  # every rank fails at the same step, as when the job is killed
        original = loop.rl_step

        def crashing(*args, **kwargs):
            if args[8] == crash_at:
                raise RuntimeError(f"simulated failure at step {crash_at}")
            return original(*args, **kwargs)

        loop.rl_step = crashing
    model, engine = tiny_model(), KeyedEngine(by_generator=True)
    if world_info()[0] == 0:
        with RunDir(run_dir, {"method": "sera_pilot", "parallel": parallel}) as directory:
            train(ms, ls, ToyTask(), model, engine, directory)
            directory.finish({})
    else:
        train(ms, ls, ToyTask(), model, engine, None)


def records(out_path: str) -> None:
    """TRL's records under FSDP2 (sera.trl.policy_engine): each rank samples its share of the questions from a whole
    copy of the sharded policy, so the ranks need not run in lockstep (a sharded forward is a collective)."""
    import json
    from pathlib import Path
    from types import SimpleNamespace

    from sera.trl import policy_engine

    _, ls = settings("fsdp2")
    model = tiny_model()
    reference = {k: v.detach().clone() for k, v in model.state_dict().items()}
    shard_model(model)
    trainer = SimpleNamespace(model_wrapped=model, accelerator=SimpleNamespace(unwrap_model=lambda m: m))
    task = ToyTask()
    with policy_engine(trainer, None, task) as engine:
        whole = engine.model
        same = all(torch.equal(whole.state_dict()[k], v) for k, v in reference.items())
        metrics, evaluated = loop.evaluate(ls, task, engine, torch.Generator().manual_seed(world_info()[0]))
    if world_info()[0] == 0:
        result = {"engine": type(engine).__name__, "copy": whole is not model, "same": same, "records": evaluated}
        Path(out_path).write_text(json.dumps(result))


if __name__ == "__main__":
    if "RANK" in __import__("os").environ:
        torch.distributed.init_process_group("gloo")
    mode, path, parallel = sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else "ddp"
    if mode == "step":
        step(path, parallel)
    elif mode == "records":
        records(path)
    else:
        resume(path, parallel, int(sys.argv[4]) if len(sys.argv) > 4 else None)
    if torch.distributed.is_initialized():  # no rank tears gloo down while another is still in a collective
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
