"""The shared language-model machinery: rollout engine, response log-probs, the policy-gradient loop on a toy task,
and maze smoke runs through the real entry point."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from transformers import LlamaConfig, LlamaForCausalLM

from sera.lm_loop import collect, evaluate, train
from sera.methods import get_method
from sera.rollout import HFEngine, concat_rollouts, response_logprobs
from sera.runlog import RunDir, read_jsonl

EOS, PAD = 9, 0


def tiny_model(seed=0):
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=10,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=True,
        eos_token_id=EOS,
        pad_token_id=PAD,
        bos_token_id=1,
    )
    return LlamaForCausalLM(config)


PROMPTS = [[1, 2, 3], [1, 4], [1, 5, 6, 7, 2]]  # different lengths: left padding is exercised


def test_engine_respects_counts_and_masks():
    engine = HFEngine(tiny_model(), EOS, PAD)
    out = engine.generate(PROMPTS, [3, 0, 5], 6, torch.Generator().manual_seed(0))
    assert out.counts.tolist() == [3, 0, 5]
    assert out.prompt_index.tolist() == [0, 0, 0, 2, 2, 2, 2, 2]
    for r in range(8):
        length = int(out.mask[r].sum())
        assert out.mask[r, :length].all() and not out.mask[r, length:].any()  # one contiguous response
        ended = (out.tokens[r, :length] == EOS).nonzero()
        assert ended.numel() == 0 or int(ended[0]) == length - 1  # the mask stops right after the end token
        assert (out.tokens[r, length:] == PAD).all()
        assert (out.logprobs[r, length:] == 0).all() and (out.logprobs[r, :length] < 0).all()


def test_logprobs_match_a_plain_forward_pass():
    model = tiny_model()
    out = HFEngine(model, EOS, PAD).generate(PROMPTS, [2, 2, 2], 6, torch.Generator().manual_seed(1))
    cached = response_logprobs(model, PROMPTS, out, PAD)
    torch.testing.assert_close(cached * out.mask, out.logprobs * out.mask, atol=1e-5, rtol=0)
    for r in range(6):  # and against one un-cached forward over prompt + response
        prompt = PROMPTS[int(out.prompt_index[r])]
        response = out.tokens[r][out.mask[r].bool()]
        ids = torch.tensor([prompt + response.tolist()])
        logp = torch.log_softmax(model(ids).logits[0], -1)[len(prompt) - 1 : -1].gather(1, response[:, None])[:, 0]
        torch.testing.assert_close(cached[r, : len(response)], logp, atol=1e-5, rtol=0)


def test_concat_rollouts_groups_pilots_first():
    engine = HFEngine(tiny_model(), EOS, PAD)
    gen = torch.Generator().manual_seed(2)
    a = engine.generate(PROMPTS, [1, 1, 1], 3, gen)
    b = engine.generate(PROMPTS, [2, 0, 1], 5, gen)
    merged = concat_rollouts([a, b], PAD)
    assert merged.prompt_index.tolist() == [0, 0, 0, 1, 2, 2]
    torch.testing.assert_close(merged.tokens[0, :3], a.tokens[0])  # pilot first within its group
    assert merged.tokens.shape[1] == 5


class ToyTask:
    """Reward 1 iff the first response token is 3 (a random tiny model does this ~1/10 of the time)."""

    eos_id, pad_id, num_prompts = EOS, PAD, 4

    def train_prompts(self, step, batch):
        ids = np.arange(batch) % self.num_prompts
        return ids, [[1, 2 + int(i)] for i in ids]

    def eval_prompts(self):
        return np.arange(2), [[1, 2], [1, 3]]

    def reward(self, prompt_id, response):
        return float(len(response) > 0 and response[0] == 3)


def loop_cfg(tmp_path, method="sera", estimator="pilot", m=2, aggregation="token-mean", steps=4):
    return OmegaConf.create(
        {
            "seed": 0,
            "n0": 8,
            "max_new_tokens": 4,
            "progress": False,
            "temperature": 1.0,
            "method": {
                "name": method,
                "estimator": estimator,
                "pilot_m": m,
                "p_lo": 1 / 16,
                "p_hi": 15 / 16,
                "multiplicity_correction": method == "sera",
                "keep_cv_on_zero": False,
                "pkpo_k": 4,
                "aggregation": aggregation,
            },
            "alloc": {"n_min": None, "n_max": None, "delta": None},
            "optim": {"lr": 1e-2, "weight_decay": 0.0, "warmup_steps": 1, "grad_clip": 1.0},
            "train": {"batch_size": 4, "steps": steps},
            "eval": {"every": 2, "samples": 8, "ks": [1, 2, 8], "max_rollouts_per_call": 64},
            "run": {"checkpoint_every": 2},
        }
    )


@pytest.mark.parametrize(
    "method, estimator, m, aggregation",
    [
        ("sera", "pilot", 2, "token-mean"),
        ("sera", "history", 0, "seqnorm"),
        ("maxrl", "none", 0, "seqnorm"),
        ("grpo", "none", 0, "token-mean"),
        ("pkpo", "none", 0, "token-mean"),
        ("dars_hw", "none", 0, "token-mean"),
    ],
)
def test_lm_loop_trains_and_logs(tmp_path, method, estimator, m, aggregation):
    cfg = loop_cfg(tmp_path, method, estimator, m, aggregation)
    model = tiny_model()
    before = [p.detach().clone() for p in model.parameters()]
    run_dir = RunDir(tmp_path / "run", {"method": method})
    final = train(cfg, get_method(method), ToyTask(), model, HFEngine(model, EOS, PAD), run_dir, "cpu")
    records = read_jsonl(run_dir.metrics_file)
    assert [r["step"] for r in records] == [0, 1, 2, 3]
    assert 0 <= final["eval/pass@1"] <= final["eval/pass@8"] <= 1
    assert any(r["train/live_rollouts"] > 0 for r in records)
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    if method == "dars_hw":
        assert all(r["alloc/rollouts"] >= r["alloc/budget"] for r in records)  # it adds rollouts: reported
    else:
        assert all(r["alloc/rollouts"] == r["alloc/budget"] == 32 for r in records)
    record = json.loads((run_dir.path / "eval_step4.json").read_text())
    assert record["n"] == 8 and len(record["correct"]) == 2


def test_collect_reuses_pilots_inside_the_budget():
    cfg = loop_cfg(None)
    model = tiny_model()
    task, gen = ToyTask(), torch.Generator().manual_seed(0)
    ids, prompts = task.train_prompts(0, 4)
    rollouts, info = collect(cfg, get_method("sera"), task, HFEngine(model, EOS, PAD), ids, prompts, None, gen)
    assert rollouts.counts.tolist() == info.counts.tolist() and info.counts.sum() == 32
    assert info.counts.min() >= 2 and info.p_hat is not None and 0 < info.tau < 1


def test_nonfinite_loss_skips_the_step(tmp_path, monkeypatch):
    import sera.lm_loop as loop

    monkeypatch.setattr(loop, "pg_loss", lambda *a, **k: torch.tensor(float("nan"), requires_grad=True))
    model = tiny_model()
    before = [p.detach().clone() for p in model.parameters()]
    cfg = loop_cfg(tmp_path, "grpo", "none", 0, steps=2)
    run_dir = RunDir(tmp_path / "run", {})
    train(cfg, get_method("grpo"), ToyTask(), model, HFEngine(model, EOS, PAD), run_dir, "cpu")
    records = read_jsonl(run_dir.metrics_file)
    assert any(r.get("train/skipped_nonfinite") for r in records)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_evaluate_counts_correct_per_question():
    cfg = loop_cfg(None)
    task = ToyTask()
    metrics, record = evaluate(cfg, task, HFEngine(tiny_model(), EOS, PAD), torch.Generator().manual_seed(0))
    assert record["ids"] == [0, 1] and all(0 <= c <= 8 for c in record["correct"])
    assert metrics["eval/pass@8"] == pytest.approx(np.mean([c > 0 for c in record["correct"]]))


def test_vllm_engine_where_vllm_imports(tmp_path):
    """Only where vLLM imports (GPU machines): per-request counts, masks, and log-probs against the HF model."""
    pytest.importorskip("vllm")
    if not torch.cuda.is_available():
        pytest.skip("vLLM needs a GPU")
    from sera.rollout import VLLMEngine

    model = tiny_model()
    model.save_pretrained(tmp_path / "tiny")
    engine = VLLMEngine(str(tmp_path / "tiny"), EOS, PAD)
    out = engine.generate(PROMPTS, [3, 0, 5], 6, torch.Generator().manual_seed(0))
    assert out.counts.tolist() == [3, 0, 5]
    recomputed = response_logprobs(model, PROMPTS, out, PAD)
    torch.testing.assert_close(recomputed * out.mask, out.logprobs * out.mask, atol=2e-2, rtol=0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.5)
    engine.sync_weights(model)  # after a sync, vLLM samples from the updated weights
    out = engine.generate(PROMPTS, [2, 2, 2], 6, torch.Generator().manual_seed(0))
    torch.testing.assert_close(
        response_logprobs(model, PROMPTS, out, PAD) * out.mask, out.logprobs * out.mask, atol=2e-2, rtol=0
    )


@pytest.mark.slow
def test_maze_smoke_through_the_real_entry_point(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline"}
    cmd = [
        sys.executable,
        "-m",
        "experiments.maze.train",
        "--multirun",
        "scale=maze/smoke",
        "method=sera,maxrl",
        "method.pilot_m=2",
        "method.aggregation=token-mean,seqnorm",
        f"run.root={tmp_path}",
        "threads=1",
    ]
    subprocess.run(cmd, env=env, check=True, capture_output=True)
    others = [*cmd[:4], "scale=maze/smoke", "method=grpo,dars_hw,pkpo", "method.pkpo_k=4", *cmd[-2:]]
    subprocess.run(others, env=env, check=True, capture_output=True)  # every registry method once
    root = tmp_path / "maze-smoke"
    assert sorted(p.name for p in root.iterdir()) == [
        "base_seed-0",
        "dars_hw-token-mean_n0-8_seed-0",
        "grpo-token-mean_n0-8_seed-0",
        "maxrl-seqnorm_n0-8_seed-0",
        "maxrl-token-mean_n0-8_seed-0",
        "pkpo-token-mean_n0-8_seed-0",
        "sera-seqnorm_n0-8_seed-0",
        "sera-token-mean_n0-8_seed-0",
    ]
    assert (root / "base_seed-0" / "model.safetensors").exists() and (root / "base_seed-0" / "DONE").exists()
    base = read_jsonl(root / "base_seed-0" / "metrics.jsonl")[-1]
    assert "eval/pass@1" in base and "eval/best_fixed_answer_rate" in base
    for run in [p for p in root.glob("*_seed-0") if not p.name.startswith("base")]:
        records = read_jsonl(run / "metrics.jsonl")
        assert [r["step"] for r in records] == [0, 1, 2, 3] and (run / "DONE").exists()
        assert "eval/distinct_answers" in records[-1]


def test_maze_bad_input(tmp_path):
    from hydra import compose, initialize_config_dir

    from experiments.maze.train import validate

    configs = os.path.join(os.path.dirname(__file__), "..", "configs")
    with initialize_config_dir(config_dir=os.path.abspath(configs), version_base=None):
        for overrides, match in [
            (["method=sera"], None),
            (["method=sera", "method.estimator=history", "method.pilot_m=0"], "repeated prompts"),
            (["method=direct_ce"], "no rollouts"),
            (["task.grid_size=12"], "odd"),
            (["model.path=/nonexistent"], "does not exist"),
            (["method=maxrl", "method.aggregation=sum"], "aggregation"),
            (["method=dars_hw", "method.estimator=pilot", "method.pilot_m=4"], "without p_hat"),
            (["method=sera", "alloc.n_min=4"], "below method.pilot_m"),
            (["scale=maze/smoke", "method=sera", "method.pilot_m=16"], "infeasible budget"),
        ]:
            cfg = compose("maze", overrides=overrides)
            if match is None:
                assert validate(cfg).name == "sera"
            else:
                with pytest.raises((ValueError, FileNotFoundError), match=match):
                    validate(cfg)


def test_lm_loop_resumes_to_identical_metrics(tmp_path, monkeypatch):
    cfg = loop_cfg(tmp_path, "sera", "pilot", 2, steps=4)

    def run(root):
        model = tiny_model()
        run_dir = RunDir(root, {"method": "sera"})
        train(cfg, get_method("sera"), ToyTask(), model, HFEngine(model, EOS, PAD), run_dir, "cpu")
        return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in read_jsonl(run_dir.metrics_file)]

    reference = run(tmp_path / "a")
    original = RunDir.log

    def crash_at_step_3(self, step, metrics):
        if step == 3:
            raise KeyboardInterrupt("simulated kill")
        original(self, step, metrics)

    monkeypatch.setattr(RunDir, "log", crash_at_step_3)
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path / "b")
    monkeypatch.setattr(RunDir, "log", original)
    assert run(tmp_path / "b") == reference  # resumed from the checkpoint written after step 1
