"""The memory planner (sera.plan): its arithmetic on a small architecture by hand, the paper configs' plans (the
finding that none fits an 80 GB GPU as shipped), and the refusal a GPU run makes before any work."""

import subprocess
import sys

import pytest
from hydra import compose, initialize_config_dir

from sera import plan as planner

CONFIGS = str(planner.__file__).rsplit("/sera/", 1)[0] + "/configs"


def config(study, *overrides):
    with initialize_config_dir(config_dir=CONFIGS, version_base=None):
        return compose(config_name=study, overrides=list(overrides))


def test_the_arithmetic_by_hand():
    arch = planner.Arch(params=1e9, layers=10, hidden=1000, vocab=50000)
    p = planner.plan(arch, rollouts=64, micro_batch=4, prompt_tokens=100, response_tokens=900, gpus=2, gpu_gb=80,
                     sharded=False, autocast="bfloat16", vllm_share=0.25)  # fmt: skip
    assert (p.weights, p.gradients, p.optimizer) == (4.0, 4.0, 8.0)  # 1e9 x 4, 4, 8 bytes
    assert p.activations == pytest.approx(10 * 4 * 1000 * 1000 * 34 / 1e9)  # layers x tokens x hidden x 34 bytes
    # (micro, T, V): the bf16 forward's logits, then the loss's float32 copy and its log-softmax
    assert p.logits == pytest.approx(4 * 900 * 50000 * (2 + 4 + 4) / 1e9)
    assert p.vllm == 20.0 and p.total == pytest.approx(16 + 1.36 + 1.8 + 20) and p.fits
    flops = 6 * 1e9 * 64 * 1000 + 2 * 1e9 * 64 * 900
    assert p.step_seconds == pytest.approx(flops / (2 * planner.ASSUMED_TFLOPS * 1e12))
    sharded = planner.plan(arch, rollouts=64, micro_batch=4, prompt_tokens=100, response_tokens=900, gpus=2,
                           gpu_gb=80, sharded=True, autocast=None, vllm_share=0.0)  # fmt: skip
    assert sharded.weights == 2.0 and sharded.activations == pytest.approx(2 * p.activations)  # float32: twice
    assert sharded.logits == pytest.approx(4 * 900 * 50000 * (4 + 4) / 1e9)  # a float32 forward: no copy
    chunked = planner.plan(arch, rollouts=64, micro_batch=4, prompt_tokens=100, response_tokens=900, gpus=2,
                           gpu_gb=80, sharded=False, autocast="bfloat16", vllm_share=0.0, chunk=100)  # fmt: skip
    assert chunked.logits == pytest.approx(4 * 50000 * (900 * 2 + 100 * 8) / 1e9)  # train.logprob_chunk=100


@pytest.mark.parametrize("scale", ["paper", "paper_qwen25math", "paper_qwen3"])
def test_no_paper_config_fits_an_80_gb_gpu_as_shipped_and_the_run_refuses(scale):
    cfg = config("math", f"scale=math/{scale}")
    p = planner.plan_of(cfg, gpus=8, gpu_gb=80)
    assert not p.fits and p.logits > 80  # the (N, T, V) logits of one micro-batch alone
    with pytest.raises(ValueError, match="needs about .* GB a GPU and the GPU has 80 GB.*micro_batch_rollouts"):
        planner.check_fits(cfg, 8, 80)


def test_a_sharded_mixed_precision_plan_with_small_micro_batches_fits():
    cfg = config("math", "scale=math/paper_qwen25math", "train.micro_batch_rollouts=1", "model.dtype=bfloat16",
                 "train.parallel=fsdp2")  # fmt: skip
    p = planner.plan_of(cfg, gpus=8, gpu_gb=80)
    assert p.fits and p.weights == pytest.approx(1.54e9 * 4 / 8 / 1e9)
    planner.check_fits(cfg, 8, 80)  # no refusal


def test_the_cpu_models_have_nothing_to_plan_and_the_command_says_whether_it_fits():
    assert planner.plan_of(config("maze"), gpus=1, gpu_gb=80) is None
    done = subprocess.run([sys.executable, "-m", "sera.plan", "math", "scale=math/paper_qwen3", "--gpus", "8"],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 1 and "does NOT fit" in done.stdout and "qwen3-4b-base" in done.stdout


def test_a_gpu_refuses_an_rl_run_that_cannot_fit_but_evaluates_its_base(monkeypatch):
    """resolve_device on a (pretended) 80 GB GPU: the paper config's RL run is refused before any work; its base-only
    run (the base model's evaluation, which `make reproduce-math SCALE=paper` runs on one GPU) is not planned."""
    import torch

    from sera.lm_study import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: type("P", (), {"total_memory": 80e9})())
    with pytest.raises(ValueError, match="needs about .* GB a GPU and the GPU has 80 GB"):
        resolve_device(config("math", "scale=math/paper"))
    assert resolve_device(config("math", "scale=math/paper", "run.base_only=true")) == "cuda"


def test_the_trl_route_plan_and_its_refusal_on_a_gpu(monkeypatch):
    """The TRL route (what the paper scales launch): activation checkpointing keeps a layer's input a layer and one
    layer's activations; 4 rows a micro-batch. Qwen3-4B's float32 state does not fit an 80 GB GPU beside vLLM under
    data parallelism, and does under ZeRO-3 (the Makefile's default for it); a GPU launch reads how accelerate set it
    up and refuses the first before the model loads."""
    import torch

    arch = planner.Arch(params=1e9, layers=10, hidden=1000, vocab=50000)
    p = planner.plan(arch, rollouts=64, micro_batch=4, prompt_tokens=100, response_tokens=900, gpus=2, gpu_gb=80,
                     sharded=False, autocast="bfloat16", vllm_share=0.0, checkpointing=True)  # fmt: skip
    assert p.activations == pytest.approx(4000 * 1000 * (10 * 2 + 34) / 1e9)  # tokens x hidden x (layers x 2 + 34)
    qwen3 = config("math", "scale=math/paper_qwen3")
    assert not planner.plan_trl(qwen3, 8, 80, 4, sharded=False).fits
    assert planner.plan_trl(qwen3, 8, 80, 4, sharded=True).fits
    assert planner.plan_trl(config("math", "scale=math/paper"), 8, 80, 4, sharded=False).fits
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: type("P", (), {"total_memory": 80e9})())
    with pytest.raises(ValueError, match="this TRL launch needs about 110 GB a GPU and the GPU has 80 GB"):
        planner.check_trl_fits(qwen3, 8, 4)
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_ZERO_STAGE", "3")
    planner.check_trl_fits(qwen3, 8, 4)  # no refusal


@pytest.mark.parametrize("scale", ["paper", "paper_qwen25math", "paper_qwen3"])
def test_the_paper_configs_train_in_bf16_over_float32_weights_and_are_priced_so(scale):
    """As the authors train: bf16 autocast over float32 master weights (TRL's --bf16 on a float32 model), priced at
    the bf16 throughput; the same config in float32 is priced at the float32 one, 300 / 40 = 7.5 times the hours."""
    from examples.trl_math import from_config

    cfg = config("math", f"scale=math/{scale}")
    assert cfg.model.dtype == "bfloat16" and "--bf16" in from_config([f"scale=math/{scale}", "method=sera"], cfg)
    bf16 = planner.plan_trl(cfg, 8, 80, 4, sharded=True)
    fp32 = planner.plan_trl(config("math", f"scale=math/{scale}", "model.dtype=float32"), 8, 80, 4, sharded=True)
    assert bf16.weights == fp32.weights == pytest.approx(planner.ARCHS[cfg.model.name].params * 4 / 8 / 1e9)
    assert (bf16.tflops, fp32.tflops) == (300.0, 40.0)
    assert fp32.step_seconds == pytest.approx(7.5 * bf16.step_seconds)


def test_the_trl_route_counts_the_fused_heads_tile_and_ddps_gradient_buckets():
    """TRL 1.16 scores completions through its fused LM head: one float32 tile of 4096 tokens x 32768 vocabulary
    entries at a time, never a micro-batch's logits; under data parallelism (accelerate's DDP) the gradients have a
    second float32 copy in DDP's buckets, which ZeRO-3 and FSDP2 do not keep."""
    cfg = config("math", "scale=math/paper_qwen25math")
    dp, sharded = (planner.plan_trl(cfg, 8, 80, 4, sharded=s) for s in (False, True))
    assert dp.logits == sharded.logits == pytest.approx(4096 * 32768 * 4 / 1e9)
    assert dp.buckets == pytest.approx(1.54e9 * 4 / 1e9) and sharded.buckets == 0.0
    assert planner.plan_trl(cfg, 1, 80, 4, sharded=False).buckets == 0.0  # one process: no DDP
    suite = planner.plan_of(cfg, gpus=8, gpu_gb=80)  # the suite's loop sums gradients itself and keeps the logits
    assert suite.buckets == 0.0 and suite.logits == pytest.approx(64 * 151936 * 3000 * (2 + 4 + 4) / 1e9)
