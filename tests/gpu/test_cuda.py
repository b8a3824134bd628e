"""The suite's LM paths on a CUDA device, which the CPU suite cannot reach: the engine and the loss on the GPU against
the same code on the CPU (float32), a bf16 policy through a whole RL step, the maze and math entry points with
device=cuda (their SFT trains in bf16 autocast there), and SERA inside TRL's GRPOTrainer in bf16 on the GPU.
`make test-gpu`; CI has no GPU, so README says where these were last run."""

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from sera.lm_loop import rl_step
from sera.rollout import HFEngine, response_logprobs
from sera.runlog import read_jsonl
from tests import trl_toy
from tests.test_lm import EOS, PAD, PROMPTS, ToyTask, loop_cfg, mixed_precision_step, settings, tiny_model

CUDA = torch.device("cuda")


def on(device, model, dtype=torch.float32):
    return model.to(device=device, dtype=dtype)


@pytest.mark.parametrize("decode", ["static", "dynamic"])
def test_engine_on_the_gpu_draws_what_the_cpu_draws(decode):
    """Sampling draws from the CPU generator, so the GPU's rollouts are the CPU's (the probabilities differ by float
    rounding only); log-probs agree, and the loss's log-probs on the GPU match the sampling ones."""
    cpu, gpu = tiny_model(), on(CUDA, tiny_model())
    for seed in range(3):
        a = HFEngine(cpu, [EOS, 4], PAD, decode=decode).generate(
            PROMPTS, [5, 0, 7], 8, torch.Generator().manual_seed(seed)
        )
        b = HFEngine(gpu, [EOS, 4], PAD, decode=decode).generate(
            PROMPTS, [5, 0, 7], 8, torch.Generator().manual_seed(seed)
        )
        assert b.tokens.device.type == "cpu" and b.counts.tolist() == [5, 0, 7]  # rollouts come back on the CPU
        assert torch.equal(a.tokens, b.tokens.cpu()) and torch.equal(a.mask, b.mask.cpu())
        torch.testing.assert_close(a.logprobs, b.logprobs.cpu(), atol=1e-5, rtol=0)
        recomputed = response_logprobs(gpu, PROMPTS, b, PAD)
        assert recomputed.device.type == "cuda"
        torch.testing.assert_close(recomputed.cpu() * b.mask, b.logprobs * b.mask, atol=1e-5, rtol=0)


@pytest.mark.parametrize("aggregation", ["token-mean", "seqnorm"])
def test_sera_step_on_the_gpu_equals_the_cpu_step(aggregation):
    """One SERA step (pilots, waterline, the rest, micro-batched backward): the same counts, rewards and gradient."""
    out = []
    for device in ("cpu", "cuda"):
        ms, ls = settings(loop_cfg("sera_pilot", "pilot", 2, aggregation, micro=5))
        model = on(device, tiny_model())
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        metrics = rl_step(
            ms, ls, ToyTask(), model, HFEngine(model, EOS, PAD), opt, None, torch.Generator().manual_seed(5), 0
        )
        out.append((metrics, torch.cat([p.grad.reshape(-1).cpu() for p in model.parameters()])))
    (m_cpu, g_cpu), (m_gpu, g_gpu) = out
    assert m_cpu["alloc/n_min"] != m_cpu["alloc/n_max"]  # the waterline moved rollouts
    for key in ("alloc/n_min", "alloc/n_max", "alloc/generated", "train/reward", "train/live_rollouts"):
        assert m_cpu[key] == m_gpu[key], key
    assert g_cpu.abs().max() > 0
    torch.testing.assert_close(g_gpu, g_cpu, atol=1e-5, rtol=1e-4)


def test_a_bf16_policy_trains():
    """A bf16 policy on the GPU: the engine's log-probs are within bf16 rounding of a float32 forward pass, and a SERA
    step gives a finite loss and moves the weights."""
    model = on(CUDA, tiny_model(), torch.bfloat16)
    out = HFEngine(model, EOS, PAD).generate(PROMPTS, [4, 4, 4], 8, torch.Generator().manual_seed(0))
    exact = response_logprobs(tiny_model(), PROMPTS, out, PAD).detach()  # float32 on the CPU
    assert out.mask.sum() > 0
    torch.testing.assert_close(out.logprobs * out.mask, exact * out.mask, atol=5e-2, rtol=0)
    ms, ls = settings(loop_cfg("sera_pilot", "pilot", 2, "token-mean"))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    before = [p.detach().clone() for p in model.parameters()]
    metrics = rl_step(
        ms, ls, ToyTask(), model, HFEngine(model, EOS, PAD), opt, None, torch.Generator().manual_seed(1), 0
    )
    assert metrics["train/live_rollouts"] > 0 and np.isfinite(metrics["train/loss"])
    assert "train/skipped_nonfinite" not in metrics
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def entry_point(tmp_path, study, *overrides):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "WANDB_MODE": "offline"}
    cmd = [sys.executable, "-m", f"experiments.{study}.train", f"scale={study}/smoke", "device=cuda",
           "method=sera_pilot", "method.pilot_m=2", f"run.root={tmp_path}", "threads=1", *overrides]  # fmt: skip
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    runs = [p for p in tmp_path.rglob("DONE") if not p.parent.name.startswith("base")]
    assert len(runs) == 1
    records = read_jsonl(runs[0].parent / "metrics.jsonl")
    assert [r["step"] for r in records] == [0, 1, 2, 3]
    assert all(np.isfinite(r["train/loss"]) for r in records if "train/loss" in r)
    return records


@pytest.mark.parametrize("study", ["maze", "math"])
def test_entry_point_on_the_gpu(tmp_path, study):
    """The real entry point with device=cuda: the base model's SFT (bf16 autocast on a GPU), RL steps, evaluation."""
    records = entry_point(tmp_path, study)
    assert any(k.startswith("eval/") and k.endswith("/pass@1") for k in records[-1])


@pytest.mark.parametrize("method", ["sera_pilot", "maxrl"])
def test_trl_step_on_the_gpu_in_bf16(tmp_path, method):
    """SERAGRPOTrainer on the GPU with bf16=True: the budget, one prompt per group and MaxRL x n0 / n_i hold exactly
    (they come from the rewards); the gradient equals the suite's float32 loss up to bf16 autocast's rounding."""
    r = trl_toy.one_step(tmp_path, method, "dapo", use_cpu=False, bf16=True)
    assert r["device"] == "cuda"
    assert r["counts_sum"] == r["rows"] == r["budget"] and r["counts_by_prompt"] == r["trainer_counts"]
    assert r["rows_match_prompts"] and r["one_prompt_per_group"] and r["groups_distinct"] and r["rewards_match"]
    assert r["nonuniform"] == (method == "sera_pilot")
    assert r["advantage_scale"] > 0 and r["advantage_error"] <= 1e-6 * r["advantage_scale"]
    assert r["grad_scale"] > 0 and r["grad_error"] <= 3e-2 * r["grad_scale"]


# accelerate configs for two GPUs: DeepSpeed ZeRO-2 and ZeRO-3, and FSDP2 (accelerate runs neither on CPU processes:
# docs/trl.md "DeepSpeed and FSDP")
SHARDED = {
    "zero2": "distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 2\n  zero3_init_flag: false\n",
    "zero3": "distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 3\n  zero3_init_flag: false\n",
    "fsdp2": "distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 2\n"
    "  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n  fsdp_state_dict_type: FULL_STATE_DICT\n",
}
HOLDS = {"zero2": ["Parameter"], "zero3": ["Parameter-zero3"], "fsdp2": ["DTensor"]}  # tests/trl_toy "sharded"


def two_gpu_launch(tmp_path, setup: str) -> list[str]:
    """`accelerate launch` over two GPUs with one of SHARDED's configs (skipped with fewer GPUs or no DeepSpeed)."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    if setup.startswith("zero"):
        pytest.importorskip("deepspeed")
    config = tmp_path / f"{setup}.yaml"
    config.write_text(SHARDED[setup] + "mixed_precision: 'no'\nnum_machines: 1\nnum_processes: 2\n")
    return [os.path.join(os.path.dirname(sys.executable), "accelerate"), "launch", "--config_file", str(config)]


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))


@pytest.mark.parametrize("setup", sorted(SHARDED))
def test_trl_step_sharded_over_two_gpus(tmp_path, setup):
    """SERAGRPOTrainer under `accelerate launch` on two GPUs with ZeRO-2, ZeRO-3 (parameters partitioned) and FSDP2
    (DTensor parameters): the step's counts, advantages and gradient (gathered) as in one process."""
    launch = two_gpu_launch(tmp_path, setup)
    out = tmp_path / "step.json"
    done = subprocess.run([*launch, "-m", "tests.trl_toy", str(out), "sera_pilot", "dapo", "--accelerate"], cwd=ROOT,
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr[-6000:]
    import json

    (r,) = json.loads(out.read_text())
    assert r["world"] == 2 and r["sharded"] == HOLDS[setup]
    trl_toy.check_step(r)


@pytest.mark.parametrize("setup", ["zero3", "fsdp2"])
def test_the_records_of_a_sharded_run_over_two_gpus(tmp_path, setup):
    """examples/trl_math.py --records under ZeRO-3 and FSDP2 on two GPUs (sera.trl.policy_engine: the parameters
    gathered, or the policy copied whole): every step's record covers every held-out question."""
    import json

    launch = two_gpu_launch(tmp_path, setup)
    records = tmp_path / "records"
    done = subprocess.run([*launch, "-m", "examples.trl_math", "--model", "tiny-math", "--template", "plain",
                           "--train", "chain_sum", "--prompts", "2", "--n0", "8", "--method", "sera",
                           "--max-completion-length", "16", "--steps", "2", "--eval-problems", "4", "--eval-every", "1",
                           "--records", str(records), "--record-samples", "8", "--output-dir", str(tmp_path / "out")],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-6000:]
    for step in (1, 2):
        record = json.loads((records / f"eval_step{step}_heldout.json").read_text())
        assert record["n"] == 8 and len(record["ids"]) == len(record["correct"]) == 4


@pytest.mark.parametrize("method", ["sera", "sera_pilot"])
def test_trl_step_with_vllm_colocate_in_bf16(tmp_path, method):
    """SERAGRPOTrainer generating with vLLM in colocate mode on one GPU, in bf16 (the paper-scale route): the step's
    counts, groups and MaxRL x n0 / n_i exact; the gradient within bf16 rounding. Needs vLLM's CUDA build
    (`make install-gpu`, then this file in .venv-gpu)."""
    pytest.importorskip("vllm")
    r = trl_toy.one_step(tmp_path, method, "dapo", vllm=True, use_cpu=False, bf16=True)
    assert r["device"] == "cuda"
    assert r["counts_sum"] == r["rows"] == r["budget"] and r["counts_by_prompt"] == r["trainer_counts"]
    assert r["rows_match_prompts"] and r["one_prompt_per_group"] and r["rewards_match"]
    assert r["advantage_scale"] > 0 and r["advantage_error"] <= 1e-6 * r["advantage_scale"]
    assert r["grad_scale"] > 0 and r["grad_error"] <= 3e-2 * r["grad_scale"]


def test_a_mixed_precision_step_at_a_paper_learning_rate_moves_the_weights():
    """model.dtype=bfloat16 on the GPU: float32 master weights, the loss in bf16 autocast, and one AdamW step at the
    Qwen recipes' lr (1e-6) moves every weight with a gradient (bf16 weights would keep almost all of them)."""
    model = on(CUDA, tiny_model())
    _, moved = mixed_precision_step(model)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert moved > 0.99


@pytest.mark.parametrize("method", ["maxrl", "sera"])
def test_the_classifier_over_two_gpus(tmp_path, method):
    """The classifier under torchrun on two GPUs (NCCL) with a BatchNorm layer: rank 0 evaluates alone on the
    unwrapped module mid-run and at the end, and the step's allocation is over the whole batch, as on the CPU over
    gloo (tests/test_imagenet.py)."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    overrides = ["scale=imagenet/smoke", f"method={method}", "device=cuda", "threads=1", "data.num_train=32"]
    overrides += ["train.steps=8", "train.warm_start_steps=4", "eval.every=4"]
    torchrun = [os.path.join(os.path.dirname(sys.executable), "torchrun"), "--standalone", "--nproc_per_node=2"]
    env = {**os.environ, "SERA_TEST_BATCHNORM": "1", "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline"}
    done = subprocess.run([*torchrun, "-m", "tests.imagenet_ddp_toy", str(tmp_path), *overrides], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-6000:]
    (run,) = (tmp_path / "imagenet-smoke").iterdir()
    records = read_jsonl(run / "metrics.jsonl")
    assert (run / "DONE").exists() and sum("eval/pass@1" in r for r in records) == 2
    assert all(r["alloc/budget"] == 16 * 16 for r in records if "alloc/budget" in r)  # B = 16: the whole step's


def test_the_imagenet_paper_sweep_is_data_parallel_over_the_gpus(tmp_path):
    """A sweep under one torchrun launch (NCCL), as docs/paper-scale.md shows for one run on several GPUs: two runs,
    each over both GPUs, finish on one process group; launched again, both are skipped."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    torchrun = [os.path.join(os.path.dirname(sys.executable), "torchrun"), "--standalone", "--nproc_per_node=2"]
    cmd = [*torchrun, "-m", "experiments.imagenet.train", "--multirun", "run.if_finished=skip", "threads=1",
           "scale=imagenet/smoke", "device=cuda", "method=direct_ce,sera", "n0=16", f"run.root={tmp_path}"]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline"}
    for _ in range(2):
        done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-6000:]
    assert done.stdout.count("skipping (run.if_finished=skip)") == 4
    assert len(list((tmp_path / "imagenet-smoke").glob("*/DONE"))) == 2


def test_the_trl_records_over_two_gpus_wait_a_day_and_sample_their_own_noise(tmp_path):
    """The TRL route's process group as the launch scripts set it up, under NCCL: a 24-hour timeout, each rank's
    questions sampled with its own noise (tests/records_ddp_toy.py, as over gloo in tests/test_trl.py)."""
    import json

    from tests import records_ddp_toy

    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    torchrun = [os.path.join(os.path.dirname(sys.executable), "torchrun"), "--standalone", "--nproc_per_node=2"]
    out = tmp_path / "records.json"
    done = subprocess.run([*torchrun, "-m", "tests.records_ddp_toy", str(out)], cwd=ROOT, capture_output=True,
                          text=True, timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"})  # fmt: skip
    assert done.returncode == 0, done.stderr[-6000:]
    records_ddp_toy.check(json.loads(out.read_text()))


def test_the_driver_suits_torchs_cuda_build():
    """sera.driver --torch, which make test-gpu runs first: the NVIDIA driver runs this torch's CUDA build."""
    done = subprocess.run([sys.executable, "-m", "sera.driver", "--torch"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
