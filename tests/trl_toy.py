"""SERAGRPOTrainer on a toy task, one training step with its checks, for tests/test_trl.py (in process or torchrun).

    python -m tests.trl_toy OUT.json [sera|maxrl] [LOSS_TYPES] [--vllm]   one process (loss types comma-separated;
                                                                         --vllm: vLLM colocate, in .venv-vllm)
    torchrun --standalone --nproc_per_node 2 -m tests.trl_toy OUT.json sera dapo,dr_grpo   two processes, gloo

The task: a prompt of letters, reward 1 when the completion's first letter is one of the prompt's allowed letters (a
random 2-layer Llama hits them with probabilities from about 0.1 to 0.6). `one_step` trains one step and checks it from
what TRL handed its loss, independently of the trainer's bookkeeping: it decodes every row's prompt and completion,
scores them with the reward function, groups the rows by prompt, and compares TRL's advantages with
`sera.advantages.maxrl` x n0 / n_i on those groups, and the gradient of the step (after DDP's all-reduce) with the
gradient of the suite's loss `sera.losses.pg_loss` on the same completions (each process its rows, with the step's
global normalisers, gradients summed: the suite's own data-parallel loss).
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest
import torch
from transformers import TrainerCallback

from sera.advantages import maxrl, multiplicity_weights
from sera.compat import activation_checkpointing
from sera.losses import pg_loss
from sera.trl import LOSS_AGGREGATION, SERAGRPOConfig, SERAGRPOTrainer

LETTERS = "abcdefgh"
PAD, EOS = "<pad>", "<eos>"
VOCAB = [PAD, EOS, *LETTERS]
N0, PILOT_M, MAX_LEN = 8, 4, 4


def tokenizer():
    """One token a letter (WordLevel over single characters), specials skipped on decode."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.WordLevel({t: i for i, t in enumerate(VOCAB)}, unk_token=PAD))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token=PAD, eos_token=EOS)


def model(seed: int = 0, hidden: int = 32):
    """A random 2-layer Llama with 2 heads over the toy vocabulary (hidden 32; vLLM's CPU attention needs a head
    dimension of at least 32, so tests/vllm takes hidden 128)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(VOCAB), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32, tie_word_embeddings=True,
        eos_token_id=1, pad_token_id=0,
    )  # fmt: skip
    return LlamaForCausalLM(config)


VLLM_HIDDEN = 128  # head dimension 64, which vLLM's CPU attention has a kernel for


def saved_model(folder) -> str:
    """The vLLM-sized toy model and its tokenizer saved in `folder` (vLLM loads a model by its path)."""
    model(hidden=VLLM_HIDDEN).save_pretrained(folder)
    tokenizer().save_pretrained(folder)
    return str(folder)


def dataset(size: int = 16, seed: int = 0):
    """Prompts of 3-5 letters, each with 1-5 allowed first letters and an integer id."""
    from datasets import Dataset

    rng = np.random.default_rng(seed)
    prompts = ["".join(rng.choice(list(LETTERS), rng.integers(3, 6))) for _ in range(size)]
    allowed = ["".join(rng.choice(list(LETTERS), rng.integers(1, 6), replace=False)) for _ in range(size)]
    return Dataset.from_dict({"prompt": prompts, "allowed": allowed, "prompt_id": list(range(size))})


def first_letter_allowed(completions, allowed, **kwargs):
    """The toy reward: 1 when the completion starts with an allowed letter."""
    return [float(len(c) > 0 and c[0] in a) for c, a in zip(completions, allowed, strict=True)]


def settings(out_dir, world: int = 1, prompts: int = 4) -> dict:
    """GRPOConfig settings: one optimizer step per generation of `prompts` x N0 rows, no clipping (the gradient is
    compared), float32 without checkpointing (the CPU)."""
    return dict(
        output_dir=str(out_dir), num_generations=N0, per_device_train_batch_size=prompts * N0 // world,
        max_completion_length=MAX_LEN, max_steps=1, learning_rate=1e-2, max_grad_norm=0.0, use_cpu=True, report_to=[],
        save_strategy="no", logging_steps=1, bf16=False, seed=0, disable_tqdm=True, dataloader_num_workers=0,
        temperature=1.0, **activation_checkpointing(False),
    )  # fmt: skip


def config(out_dir, world: int = 1, prompts: int = 4, **overrides) -> SERAGRPOConfig:
    """SERAGRPOConfig on these settings, the suite's first rule (sera_pilot) unless told otherwise; with pilots it
    takes PILOT_M of them."""
    overrides = {"method": "sera_pilot", **overrides}
    pilots = overrides["method"] == "sera_pilot" and overrides.get("estimator", "pilot") == "pilot"
    return SERAGRPOConfig(**settings(out_dir, world, prompts) | ({"pilot_m": PILOT_M} if pilots else {}) | overrides)


def trainer(args, train_dataset=None, model_path: str | None = None, **kwargs) -> SERAGRPOTrainer:
    """The toy trainer: the in-memory toy model, or the one saved at model_path (vLLM loads it from there)."""
    return SERAGRPOTrainer(
        model=model_path or model(), reward_funcs=first_letter_allowed, args=args, processing_class=tokenizer(),
        train_dataset=train_dataset if train_dataset is not None else dataset(), **kwargs,
    )  # fmt: skip


def recorded_steps(trainer: SERAGRPOTrainer) -> list:
    """The trainer's `last_step` after each training step, appended as the steps end."""
    steps = []

    class Record(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            steps.append(trainer.last_step)

    trainer.add_callback(Record())
    return steps


class Capture(TrainerCallback):
    """What TRL's loss saw (the generation's output and relabelled rows) and the gradient before the optimizer."""

    def __init__(self, trainer: SERAGRPOTrainer):
        self.batches, self.grads, self.params = [], None, None
        original = trainer._generate_and_score_completions

        def recorded(inputs):
            output = original(inputs)
            self.batches.append((output, [dict(x) for x in inputs]))
            return output

        trainer._generate_and_score_completions = recorded

        self.trainer = trainer

    def on_step_begin(self, args, state, control, model=None, **kwargs):
        engine = self.trainer.model_wrapped
        if self.trainer.is_deepspeed_enabled and not hasattr(engine, "captured_step"):
            # accelerate runs DeepSpeed's backward and step in one call, so the callback before the optimizer comes
            # too late: read the gradients (partitioned under ZeRO, gathered here) just before the engine's step
            from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_grad

            step = engine.captured_step = engine.step

            def captured(*a, **k):
                named = list(model.named_parameters())
                self.grads = [safe_get_full_grad(p).detach().clone() for _, p in named]
                self.params = {name: safe_get_full_fp32_param(p).detach().clone() for name, p in named}
                return step(*a, **k)

            engine.step = captured

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        if self.trainer.is_deepspeed_enabled:
            return
        self.grads = [p.grad.detach().clone() for p in model.parameters()]
        self.params = {name: p.detach().clone() for name, p in model.named_parameters()}  # a tied weight once


def gather(obj) -> list:
    if not torch.distributed.is_initialized():
        return [obj]
    out = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(out, obj)
    return out


def suite_gradient(config, state, output, coefficients, aggregation, totals) -> list[torch.Tensor]:
    """The gradient of sera.losses.pg_loss on this process's rows with the step's global normalisers, summed over the
    processes: log-probabilities of the completion tokens from a plain forward pass over prompt + completion, by a fresh
    copy of the model at the step's weights."""
    device = output["prompt_ids"].device  # the trainer's (a GPU where tests/gpu runs it)
    from transformers import LlamaForCausalLM

    net = LlamaForCausalLM(config).to(device)
    missing, unexpected = net.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}  # the output embedding is tied to the input one
    ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
    attention = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
    width = output["completion_ids"].shape[1]
    logits = net(input_ids=ids, attention_mask=attention).logits[:, -width - 1 : -1].float()
    logp = torch.log_softmax(logits, dim=-1).gather(2, output["completion_ids"][..., None])[..., 0]
    advantages, weights = coefficients
    loss = pg_loss(
        logp, output["completion_mask"], torch.as_tensor(advantages, device=device),
        torch.as_tensor(weights, device=device), aggregation,
        max_len=MAX_LEN, num_rollouts=totals[0], num_tokens=totals[1],
    )  # fmt: skip
    net.zero_grad()
    loss.backward()
    grads = [p.grad.detach().clone() for p in net.parameters()]
    if torch.distributed.is_initialized():
        for g in grads:
            torch.distributed.all_reduce(g)
    return grads


def train_toy(out_dir, world: int, method: str, loss_type: str, vllm: bool, overrides: dict):
    """(the trainer, its Capture) after one_step's training: one step, or two for method=sera (see one_step)."""
    path = None
    if vllm:
        path = saved_model(os.path.join(out_dir, "toy-model"))
        # TRL's truncated importance sampling multiplies each token's loss by the trainer's probability over vLLM's
        # (0.996-1.005 here, vLLM's CPU kernels computing in their own precision): TRL's correction on top of the
        # suite's loss, off so that the gradient is compared with the suite's alone
        overrides = {"use_vllm": True, "vllm_mode": "colocate", "vllm_importance_sampling_correction": False,
                     **overrides}  # fmt: skip
    authors = method == "sera"
    if authors:
        overrides = {"max_steps": 2, "remove_unused_columns": False, **overrides}
    args = config(out_dir, world, method=method, loss_type=loss_type, **overrides)
    run = trainer(args, dataset(size=4) if authors else None, model_path=path)
    capture = Capture(run)
    run.add_callback(capture)
    run.train()
    return run, capture


def one_step(out_dir, method: str = "sera_pilot", loss_type: str = "dapo", vllm: bool = False, **overrides) -> dict:
    """Train one step and return its checks (the same on every process). vllm: generate with vLLM in colocate mode
    (the vLLM-sized toy model, saved under out_dir). method=sera trains two steps on a dataset of B prompts,
    so that each step is an epoch of its Beta history, and checks the second: the first epoch is uniform."""
    world = int(os.environ.get("WORLD_SIZE", 1))  # torchrun's processes
    run, capture = train_toy(out_dir, world, method, loss_type, vllm, overrides)
    output, rows = capture.batches[-1]  # the step checked: the last
    tok = run.processing_class
    prompts = [tok.decode(p[m.bool()]) for p, m in zip(output["prompt_ids"], output["prompt_mask"], strict=True)]
    completions = tok.batch_decode(output["completion_ids"], skip_special_tokens=True)
    rewards = first_letter_allowed(completions, [r["allowed"] for r in rows])
    local = {
        "prompt": prompts,
        "row_prompt": [r["prompt"] for r in rows],
        "reward": rewards,
        "advantage": output["advantages"].tolist(),
        "length": output["completion_mask"].sum(1).tolist(),
    }
    parts = gather(local)
    every = {key: [v for part in parts for v in part[key]] for key in local}  # TRL's row order, process 0 first
    step = run.last_step
    holds = {type(p).__name__ + ("-zero3" if hasattr(p, "ds_id") else "") for p in run.model.parameters()}
    trained = np.flatnonzero(step.counts)  # the trainer's groups with rows (the authors' rule leaves some out)
    # the groups as TRL's rows show them: the rows of each prompt
    names, group = np.unique(every["prompt"], return_inverse=True)
    counts = np.bincount(group)
    order = np.argsort(group, kind="stable")
    advantages = np.empty(group.size)
    weights = np.empty(group.size)
    advantages[order] = maxrl(np.asarray(every["reward"])[order], counts)
    weights[order] = multiplicity_weights(counts, N0) if method != "maxrl" else np.ones(group.size)
    start = sum(len(part["prompt"]) for part in parts[: run.accelerator.process_index])
    mine = slice(start, start + len(prompts))  # this process's rows
    tokens = float(sum(gather(float(output["completion_mask"].sum()))))
    suite = suite_gradient(run.model.config, capture.params, output, (advantages[mine], weights[mine]),
                           LOSS_AGGREGATION[loss_type], (group.size, tokens))  # fmt: skip
    grad_error = max(float((a - b).abs().max()) for a, b in zip(capture.grads, suite, strict=True))
    grad_scale = max(float(b.abs().max()) for b in suite)
    return {
        "device": output["completion_ids"].device.type,
        "world": world,
        # how the trained model's parameters are held: FSDP2 shards them as DTensors, DeepSpeed ZeRO-3 partitions them
        "sharded": sorted(holds),
        "rows": int(group.size),
        "budget": step.counts.size * N0,  # B x n0
        "counts_sum": int(step.counts.sum()),
        "counts_by_prompt": sorted(counts.tolist()),
        "trainer_counts": sorted(step.counts[trained].tolist()),
        "left_out": int(step.counts.size - trained.size),
        "rows_match_prompts": every["prompt"] == every["row_prompt"],  # relabelled rows hold their completion's prompt
        # every trainer group holds one prompt, and every prompt one group
        "one_prompt_per_group": all(len(set(np.asarray(every["prompt"])[step.group == g])) == 1 for g in trained),
        "groups_distinct": len({every["prompt"][int(np.flatnonzero(step.group == g)[0])] for g in trained})
        == trained.size,  # fmt: skip
        "rewards_match": np.array_equal(np.asarray(every["reward"]), step.rewards),
        "advantage_error": float(np.max(np.abs(np.asarray(every["advantage"]) - advantages * weights))),
        "advantage_scale": float(np.max(np.abs(advantages * weights))),
        "nonuniform": bool(np.any(counts != N0)),
        # TRL's group statistic on the true groups: the share of rows whose group's rewards are all equal
        "frac_zero_std": float(np.mean([len(set(np.asarray(every["reward"])[group == g])) == 1 for g in group])),
        "mean_length": float(np.mean(every["length"])),
        # the reward as a uniform run logs it (mean over prompts of each prompt's rate) and the mean over rows
        "prompt_mean_reward": float(
            np.mean([np.asarray(every["reward"])[group == g].mean() for g in range(counts.size)])
        ),
        "row_mean_reward": float(np.mean(every["reward"])),
        "grad_error": grad_error,
        "grad_scale": grad_scale,
        "logs": {
            k: v for k, v in run.state.log_history[len(capture.batches) - 1].items() if isinstance(v, int | float)
        },
    }


def completions_with_end_token(out_dir, end: bool, vllm: bool = False) -> list[list[int]]:
    """The completions of one MaxRL step as TRL's loss sees them (the tokens its completion mask keeps), with the
    letter "a" also ending a completion (end_token_ids) or not; vLLM colocate generates them when `vllm`."""
    extra = dict(use_vllm=True, vllm_mode="colocate") if vllm else {}
    args = config(out_dir, method="maxrl", end_token_ids=[VOCAB.index("a")] if end else None, **extra)
    run = trainer(args, model_path=saved_model(out_dir / "toy-model") if vllm else None)
    capture = Capture(run)
    run.train()
    output, _ = capture.batches[0]
    return [ids[m.bool()].tolist() for ids, m in zip(output["completion_ids"], output["completion_mask"], strict=True)]


def check_end_token(ended: list[list[int]], unended: list[list[int]]) -> None:
    """With "a" an end token, a completion holds it only as its last token, and some end there; without, some hold it
    before their end (so the check can fail)."""
    a = VOCAB.index("a")
    assert all(a not in ids[:-1] for ids in ended)
    assert any(ids[-1] == a for ids in ended if ids)
    assert any(a in ids[:-1] for ids in unended)


def check_step(r: dict, method: str = "sera_pilot") -> None:
    """A step's checks (tests/trl_toy.one_step): the budget, one prompt per group, MaxRL x n0 / n_i, the gradient."""
    assert r["counts_sum"] == r["rows"] == r["budget"]  # B x n0 completions, as TRL counts them
    assert r["counts_by_prompt"] == r["trainer_counts"]  # the groups TRL's rows show are the trainer's
    assert r["rows_match_prompts"] and r["one_prompt_per_group"] and r["groups_distinct"] and r["rewards_match"]
    assert r["nonuniform"] == (method != "maxrl")  # the toy step's waterline moves rollouts; MaxRL keeps n0 each
    assert r["advantage_scale"] > 0 and r["advantage_error"] <= 1e-6 * r["advantage_scale"]
    assert r["grad_scale"] > 0 and r["grad_error"] <= 1e-5 * r["grad_scale"]
    logs = r["logs"]
    assert logs["alloc/budget"] == logs["alloc/rollouts"] == logs["alloc/generated"] == r["budget"]
    assert (logs["alloc/n_min"], logs["alloc/n_max"]) == (min(r["counts_by_prompt"]), max(r["counts_by_prompt"]))
    assert logs["frac_reward_zero_std"] == pytest.approx(r["frac_zero_std"])  # on the true groups
    assert logs["completions/mean_length"] == pytest.approx(r["mean_length"])  # over both draws of the step
    assert ("alloc/p_hat_mean" in logs) == (method != "maxrl")
    assert ("alloc/tau" in logs) == (method == "sera_pilot")
    # `reward` means what it means in a uniform run; the mean over SERA's allocated rows has a name of its own
    assert logs["reward"] == pytest.approx(r["prompt_mean_reward"])
    assert logs["reward_allocated"] == pytest.approx(r["row_mean_reward"])
    assert logs["rewards/first_letter_allowed/mean"] == pytest.approx(r["prompt_mean_reward"])


def main(argv: list[str]) -> None:
    """OUT.json [method] [loss types, comma-separated]: one step each, the checks of every step into OUT.json."""
    import tempfile

    vllm, launched = "--vllm" in argv, "--accelerate" in argv
    argv = [a for a in argv if a not in ("--vllm", "--accelerate")]
    out, method, loss_types = argv[0], *(argv[1:] + ["sera_pilot", "dapo"][len(argv) - 1 :])
    torch.set_num_threads(1)
    results = []
    for loss_type in loss_types.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            # under `accelerate launch` with DeepSpeed or FSDP: use_cpu=True would make accelerate drop them for DDP
            results.append(one_step(tmp, method, loss_type, vllm=vllm, **({"use_cpu": False} if launched else {})))
    if not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0:
        with open(out, "w") as f:
            json.dump(results, f)


if __name__ == "__main__":
    main(sys.argv[1:])
