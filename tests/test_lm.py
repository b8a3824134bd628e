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

from sera.collect import collect
from sera.config import check_optim
from sera.lm_loop import LoopSettings, StepPrompts, evaluate, score, train
from sera.methods import MethodSettings, Study
from sera.rollout import HFEngine, concat_rollouts, response_logprobs
from sera.runlog import NonFiniteError, RunDir, read_jsonl

EOS, PAD = 9, 0


def tiny_model(seed=0, **overrides):
    """A random 2-layer Llama of vocabulary 10 (overrides: other LlamaConfig fields)."""
    torch.manual_seed(seed)
    settings = dict(
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
    return LlamaForCausalLM(LlamaConfig(**{**settings, **overrides}))


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


def test_engine_stops_at_any_of_several_end_tokens():
    """Two end tokens (Qwen's <|im_end|> and <|endoftext|>): each response stops right after the first of either, and
    score() counts either as an end (not truncated)."""
    two = HFEngine(tiny_model(), [EOS, 4], PAD).generate(PROMPTS, [20, 20, 20], 8, torch.Generator().manual_seed(2))
    stopped_at_4 = 0
    for r in range(60):
        length = int(two.mask[r].sum())
        response = two.tokens[r, :length].tolist()
        ends = [i for i, t in enumerate(response) if t in (EOS, 4)]
        assert ends == [] and length == 8 or ends == [length - 1]  # nothing after the first end token
        stopped_at_4 += response[-1] == 4
    assert stopped_at_4 > 0

    class Task(ToyTask):
        eos_id = [EOS, 4]

        def rewards(self, ids, responses, truncated):
            return np.asarray(truncated, dtype=np.float64)

    truncated = score(Task(), np.arange(3), two)
    ended = [bool(two.tokens[r, int(two.mask[r].sum()) - 1] in (EOS, 4)) for r in range(60)]
    assert truncated.tolist() == [float(not e) for e in ended]


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
    """The example of a task: reward 1 iff the first response token is 3 (a random tiny model does this ~1/10 of the
    time). A pool of 16 training prompts that recur (so the historical p_hat and DPS work), taken in a rotating order
    (a step can draw up to all 16: DS, SARA), and two named evaluation sets."""

    eos_id, pad_id, num_prompts = EOS, PAD, 16

    def train_prompts(self, step, batch, start=0):
        ids = (step + np.arange(start, min(start + batch, self.num_prompts))) % self.num_prompts
        return ids, [[1, 2 + int(i) % 7, 3 + int(i) // 7] for i in ids]

    def eval_sets(self):
        return {"pair": (np.arange(2), [[1, 2], [1, 3]]), "single": (np.array([7]), [[1, 4, 5]])}

    def rewards(self, ids, responses, truncated):
        return np.array([float(len(r) > 0 and r[0] == 3) for r in responses])


def loop_cfg(method="sera_pilot", estimator="pilot", m=2, aggregation="token-mean", steps=4, micro=None):
    return OmegaConf.create(
        {
            "seed": 0,
            "n0": 8,
            "max_new_tokens": 4,
            "progress": False,
            "temperature": 1.0,
            "top_p": 1.0,
            "method": {
                "name": method,
                "naming": 2,
                "estimator": estimator,
                "pilot_m": m,
                "p_lo": 1 / 16,
                "p_hi": 15 / 16,
                "multiplicity_correction": None,
                "keep_cv_on_zero": False,
                "pkpo_k": 4,
                "aggregation": aggregation,
            },
            "alloc": {"n_min": None, "n_max": None, "delta": None},
            "optim": {
                "lr": 1e-2, "weight_decay": 0.0, "betas": [0.9, 0.95], "eps": 1e-8, "warmup_steps": 1, "grad_clip": 1.0
            },
            "train": {"batch_size": 4, "steps": steps, "micro_batch_rollouts": micro},
            "eval": {
                "every": 2, "samples": 8, "ks": [1, 2, 8], "max_rollouts_per_call": 64, "temperature": None,
                "top_p": 1.0,
            },
            "run": {"checkpoint_every": 2, "max_skipped_steps": 3},
        }
    )  # fmt: skip


def settings(cfg):
    return MethodSettings.from_config(cfg, Study("toy")), LoopSettings.from_config(cfg)


def run_toy(cfg, path, model=None, task=None):
    """Train the toy task (or `task`) into run directory `path`; returns (final metrics, records without time/
    keys)."""
    model = model or tiny_model()
    ms, ls = settings(cfg)
    with RunDir(path, {"method": cfg.method.name}) as run_dir:
        final = train(ms, ls, task or ToyTask(), model, HFEngine(model, EOS, PAD), run_dir)
        records = read_jsonl(run_dir.metrics_file)
    return final, [{k: v for k, v in r.items() if not k.startswith("time/")} for r in records]


@pytest.mark.parametrize(
    "method, estimator, m, aggregation",
    [
        ("sera_pilot", "pilot", 2, "token-mean"),
        ("sera_pilot", "history", 0, "seqnorm"),
        ("maxrl", "none", 0, "seqnorm"),
        ("grpo", "none", 0, "token-mean"),
        ("pkpo", "none", 0, "token-mean"),
        ("dars_hw", "none", 0, "token-mean"),
    ],
)
def test_lm_loop_trains_and_logs(tmp_path, method, estimator, m, aggregation):
    cfg = loop_cfg(method, estimator, m, aggregation)
    model = tiny_model()
    before = [p.detach().clone() for p in model.parameters()]
    final, records = run_toy(cfg, tmp_path / "run", model)
    assert [r["step"] for r in records] == [0, 1, 2, 3]
    assert 0 <= final["eval/pair/pass@1"] <= final["eval/pair/pass@8"] <= 1 and "eval/single/pass@8" in final
    assert any(r["train/live_rollouts"] > 0 for r in records)
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    if method == "dars_hw":
        assert all(r["alloc/rollouts"] == r["alloc/generated"] >= r["alloc/budget"] for r in records)  # reported
    else:
        assert all(r["alloc/rollouts"] == r["alloc/generated"] == r["alloc/budget"] == 32 for r in records)
    for name, size in [("pair", 2), ("single", 1)]:  # every named evaluation set has its own per-question record
        record = json.loads((tmp_path / "run" / f"eval_step4_{name}.json").read_text())
        assert record["n"] == 8 and len(record["correct"]) == size


def test_a_method_trains_with_its_own_learning_rate_where_the_config_gives_one(tmp_path):
    """optim.lr_by_method gives a method its own rate (the maze CPU default: GRPO 1e-4, the rest 3e-4); the others
    keep optim.lr; the rate used is logged each step. Unknown method names and bad rates are refused."""
    for method, expected in [("grpo", 1e-3), ("maxrl", 1e-2)]:
        cfg = loop_cfg(method, "none", 0, steps=2)
        cfg.optim.lr_by_method = {"grpo": 1e-3}
        assert settings(cfg)[1].lr == expected
        _, records = run_toy(cfg, tmp_path / method)
        assert [r["train/lr"] for r in records] == [expected, expected]  # warmup_steps=1: the full rate from step 0
    for bad, message in [({"grpoo": 1e-3}, "unknown methods"), ({"grpo": -1.0}, "lr_by_method.grpo"), ([1], "mapping")]:
        cfg = loop_cfg("grpo", "none", 0)
        cfg.optim.lr_by_method = bad
        with pytest.raises(ValueError, match=message):
            check_optim(cfg.optim)


def draw_for(task, engine, prompts, ids, gen, max_new_tokens=4):
    def draw(counts):
        rollouts = engine.generate(prompts, counts, max_new_tokens, gen)
        return rollouts, score(task, ids, rollouts)

    return draw


@pytest.mark.parametrize("method", ["ds", "dps", "sara", "sara+dps", "sara+sera"])
def test_sequential_methods_train_and_account(tmp_path, method):
    """DS, DPS, SARA and combinations through the LM loop: prompts drawn from the task's stream, every rollout
    generated counted (dropped groups included), only committed groups trained, n0 rollouts each (SARA+SERA: the
    waterline's counts, with the multiplicity correction)."""
    cfg = loop_cfg(method, "none", 0, steps=4)
    _, records = run_toy(cfg, tmp_path / "run")
    trained = [r for r in records if "alloc/rollouts" in r]
    assert trained, "no step trained"
    for r in records:
        assert r["alloc/generated"] >= r.get("alloc/rollouts", 0)
        assert r["alloc/prompts_drawn"] >= r.get("alloc/groups_committed", 0)
    for r in trained:
        if method != "sara+sera":
            assert r["alloc/n_min"] == r["alloc/n_max"] == 8
        if method == "ds":
            assert r["alloc/effective_groups"] == r["alloc/groups_committed"]  # only mixed groups are kept
        if method in ("sara", "sara+dps"):  # SARA's fitted prior may commit a group before it is mixed (E_j >= tau_hi)
            assert r["alloc/effective_groups"] <= r["alloc/groups_committed"]
    state = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=False)
    if method in ("dps", "sara+dps"):
        assert state["sequential"]["predictor"] is not None  # DPS's per-prompt dynamics are part of the run's state
    if method.startswith("sara"):
        assert state["sequential"]["prior"]["window"].size > 0  # so is SARA's population prior (its probes)


class PoolTask(ToyTask):
    """ToyTask with its training set as an evaluation set (what the maze and math tasks give for train.log_coverage)."""

    def train_pool_set(self):
        ids = np.arange(self.num_prompts)
        return ids, [[1, 2 + int(i) % 7, 3 + int(i) // 7] for i in ids]


def test_log_coverage_counts_prompts_trained_and_evaluates_the_training_set_at_the_end(tmp_path):
    """train.log_coverage: every evaluation logs the distinct prompts trained so far (never more than the pool, never
    fewer than a step's batch), and the last one also evaluates the training set, with its own per-question record."""
    cfg = loop_cfg("maxrl", "none", 0, steps=4)
    cfg.train.log_coverage = True
    ms, ls = settings(cfg)
    model = tiny_model()
    with RunDir(tmp_path / "run", {"method": "maxrl"}) as run_dir:
        train(ms, ls, PoolTask(), model, HFEngine(model, EOS, PAD), run_dir)
        records = read_jsonl(run_dir.metrics_file)
    evaluated = [r for r in records if "eval/pair/pass@1" in r]
    assert [r["step"] for r in evaluated] == [1, 3]
    assert 4 <= evaluated[0]["train/distinct_prompts"] <= evaluated[1]["train/distinct_prompts"] <= 16
    assert "eval/train_pool/pass@1" not in evaluated[0] and 0 <= evaluated[1]["eval/train_pool/pass@1"] <= 1
    record = json.loads((tmp_path / "run" / "eval_step4_train_pool.json").read_text())
    assert len(record["correct"]) == 16


def test_step_prompts_never_repeat_a_prompt_within_a_step():
    """A task whose stream runs into its next epoch mid-step (here: ids 0..5 then 0..5 again) repeats prompts; the
    step's stream skips them, keeps asking past them, and stops when the task has nothing more."""

    class Epochs(ToyTask):
        def train_prompts(self, step, batch, start=0):
            ids = np.arange(start, min(start + batch, 12)) % 6
            return ids, [[1, int(i)] for i in ids]

    stream = StepPrompts(Epochs(), 0)
    assert stream.take(4).tolist() == [0, 1, 2, 3]
    assert stream.take(4).tolist() == [4, 5]  # 0..3 again are skipped; the task runs out at position 12
    assert stream.ids.tolist() == [0, 1, 2, 3, 4, 5] and stream.tokens[5] == [1, 5]
    assert stream.take(3).size == 0


def test_collect_reuses_pilots_inside_the_budget():
    """The LM path: pilots are the first m rollouts of each group, their rewards are the ones that set p_hat and
    they enter the step's rewards; the budget (pilots included) is spent exactly, each rollout scored once."""
    ms, _ = settings(loop_cfg())
    task, model = ToyTask(), tiny_model()
    ids, prompts = task.train_prompts(0, 4)
    calls = []
    draw = draw_for(task, HFEngine(model, EOS, PAD), prompts, ids, torch.Generator().manual_seed(0))
    out = collect(ms, 4, lambda counts: calls.append(counts.copy()) or draw(counts))
    pilots = draw_for(task, HFEngine(model, EOS, PAD), prompts, ids, torch.Generator().manual_seed(0))(np.full(4, 2))
    assert calls[0].tolist() == [2, 2, 2, 2] and sum(c.sum() for c in calls) == out.rollouts_generated == 32
    assert out.counts.sum() == 32 and out.counts.min() >= 2 and 0 < out.tau < 1
    first = np.cumsum(out.counts) - out.counts
    np.testing.assert_array_equal(out.rewards[first[:, None] + np.arange(2)].ravel(), pilots[1])  # pilots first
    np.testing.assert_allclose(out.p_hat, np.clip(pilots[1].reshape(4, 2).mean(1), 1 / 16, 15 / 16))
    merged = concat_rollouts(out.payloads, PAD)
    torch.testing.assert_close(merged.tokens[first[:, None] + np.arange(2)].reshape(8, -1), pilots[0].tokens)
    np.testing.assert_array_equal(score(task, ids, merged), out.rewards)  # rewards line up with the rollouts


def test_micro_batched_gradient_equals_full_batch(tmp_path):
    """Micro-batches of 3 rollouts accumulate to the gradient of one full-batch step, for both aggregations."""
    from sera.lm_loop import rl_step

    for aggregation in ("token-mean", "seqnorm"):
        grads = []
        for micro in (None, 3):
            ms, ls = settings(loop_cfg("maxrl", "none", 0, aggregation, micro=micro))
            model = tiny_model()
            opt = torch.optim.SGD(model.parameters(), lr=0.0)
            engine = HFEngine(model, EOS, PAD)
            metrics = rl_step(ms, ls, ToyTask(), model, engine, opt, None, torch.Generator().manual_seed(3), 0)
            assert metrics["train/live_rollouts"] > 3  # more than one micro-batch
            grads.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]))
        torch.testing.assert_close(grads[0], grads[1], atol=1e-6, rtol=1e-5)


def test_shared_prompt_logprobs_give_the_steps_gradient(tmp_path):
    """train.logprobs=shared-prompt: the same step (rollouts, rewards) and, up to float rounding, the same gradient as
    the repeated cache, in one batch and in micro-batches, for both aggregations."""
    from sera.lm_loop import rl_step

    for aggregation, micro in [("token-mean", None), ("seqnorm", 5)]:
        steps = []
        for path in ("repeated-cache", "shared-prompt"):
            cfg = loop_cfg("sera_pilot", "pilot", 2, aggregation, micro=micro)
            cfg.train.logprobs = path
            ms, ls = settings(cfg)
            model = tiny_model()
            opt = torch.optim.SGD(model.parameters(), lr=0.0)
            engine = HFEngine(model, EOS, PAD)
            metrics = rl_step(ms, ls, ToyTask(), model, engine, opt, None, torch.Generator().manual_seed(5), 0)
            steps.append((metrics, torch.cat([p.grad.reshape(-1) for p in model.parameters()])))
        (before, grad), (after, shared) = steps
        assert before["alloc/n_min"] != before["alloc/n_max"] and before["train/live_rollouts"] > 5
        for key in ("alloc/n_min", "alloc/n_max", "train/reward", "train/live_rollouts", "train/response_tokens"):
            assert before[key] == after[key], key
        assert grad.abs().max() > 0
        torch.testing.assert_close(shared, grad, atol=1e-6, rtol=1e-5)


def mixed_precision_step(model) -> tuple[list[torch.Tensor], float]:
    """One RL step of the toy task with model.dtype=bfloat16 and AdamW at a paper learning rate (1e-6): the weights
    before it, and the share of the weights with a gradient that it moved (tests/gpu runs it on a CUDA model)."""
    from sera.lm_loop import rl_step

    cfg = loop_cfg("maxrl", "none", 0)
    cfg.model = {"dtype": "bfloat16"}
    ms, ls = settings(cfg)
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.0)
    rl_step(ms, ls, ToyTask(), model, HFEngine(model, EOS, PAD), opt, None, torch.Generator().manual_seed(3), 0)
    moved = [(~torch.eq(a, p.detach()))[p.grad != 0] for a, p in zip(before, model.parameters(), strict=True)]
    return before, float(torch.cat(moved).float().mean())


def test_bfloat16_trains_float32_master_weights_with_the_loss_in_autocast():
    """model.dtype=bfloat16: the loss's forward runs in bf16 autocast, the gradient is within bf16 rounding of the
    float32 loss's, the weights stay float32, and an AdamW step at a paper learning rate (1e-6) moves every weight
    with a gradient (bf16 weights would keep almost all: their spacing near 0.02 is about 1e-4); float16 is refused."""
    from sera.lm_loop import rl_step

    grads = []
    for dtype in ("float32", "bfloat16"):
        cfg = loop_cfg("maxrl", "none", 0)
        cfg.model = {"dtype": dtype}
        ms, ls = settings(cfg)
        assert ls.autocast == (None if dtype == "float32" else "bfloat16")
        model = tiny_model()
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        rl_step(ms, ls, ToyTask(), model, HFEngine(model, EOS, PAD), opt, None, torch.Generator().manual_seed(3), 0)
        grads.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]))
    assert not torch.equal(grads[0], grads[1])  # the bf16 forward is another computation
    assert torch.nn.functional.cosine_similarity(grads[0], grads[1], dim=0) > 0.99

    model = tiny_model()
    before, moved = mixed_precision_step(model)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert moved > 0.99
    bf16 = [a.to(torch.bfloat16) for a in before]  # the same update on bf16 weights is lost to rounding
    kept = [torch.eq(b, (p.detach()).to(torch.bfloat16)) for b, p in zip(bf16, model.parameters(), strict=True)]
    assert torch.cat([k.reshape(-1) for k in kept]).float().mean() > 0.9

    cfg = loop_cfg("maxrl", "none", 0)
    cfg.model = {"dtype": "float16"}
    with pytest.raises(ValueError, match="no loss scaling"):
        settings(cfg)


def test_nonfinite_loss_skips_steps_then_stops(tmp_path, monkeypatch):
    import sera.lm_loop as loop

    monkeypatch.setattr(loop, "pg_loss", lambda *a, **k: torch.tensor(float("nan"), requires_grad=True))
    model = tiny_model()
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(NonFiniteError, match="3 consecutive steps"):
        run_toy(loop_cfg("grpo", "none", 0, steps=6), tmp_path / "run", model)
    records = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [r.get("train/skipped_nonfinite") for r in records] == [1, 1]  # the third raised before its record
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert not (tmp_path / "run" / "DONE").exists()


# --standalone: a free rendezvous port for each launch (a relaunch right after a failed run must not meet the old one's)
TORCHRUN = [os.path.join(os.path.dirname(sys.executable), "torchrun"), "--standalone", "--nproc_per_node=2"]
TORCHRUN += ["-m", "tests.lm_ddp_toy"]
# PYTHONFAULTHANDLER: a rank that aborts in C++ prints the Python line it was on (in the failure's captured stderr)
TOY_ENV = {**os.environ, "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "1"}
ROOT = os.path.dirname(os.path.dirname(__file__))


@pytest.mark.slow
@pytest.mark.parametrize("parallel", ["ddp", "fsdp2"])
def test_two_process_step_equals_one_process_step(tmp_path, parallel):
    """Data parallel LM loop (torchrun, gloo, two CPU processes): a global SERA allocation from all-gathered pilot
    rewards, each rank training its share with micro-batches, gradients summed - over full replicas (ddp) or sharded
    parameters (FSDP2, whose ranks run as many micro-batches): the same parameters as one process."""
    one, two = tmp_path / "one.pt", tmp_path / "two.pt"
    subprocess.run([sys.executable, "-m", "tests.lm_ddp_toy", "step", str(one)], env=TOY_ENV, cwd=ROOT, check=True)
    subprocess.run([*TORCHRUN, "step", str(two), parallel], env=TOY_ENV, cwd=ROOT, check=True, capture_output=True)
    a, b = torch.load(one), torch.load(two)
    for key in a["state"]:
        torch.testing.assert_close(a["state"][key], b["state"][key], atol=1e-6, rtol=1e-5)
    assert any(not torch.equal(a["state"][k], tiny_model().state_dict()[k]) for k in a["state"])  # it did train
    for ma, mb in zip(a["metrics"], b["metrics"], strict=True):
        for key in ("alloc/n_min", "alloc/n_max", "alloc/tau", "train/reward", "train/live_rollouts"):
            assert ma[key] == pytest.approx(mb[key]), key
        assert ma["train/loss"] == pytest.approx(mb["train/loss"], rel=1e-5)
        assert ma["train/grad_norm"] == pytest.approx(mb["train/grad_norm"], rel=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("parallel", ["ddp", "fsdp2"])
def test_two_process_run_resumes_to_identical_metrics(tmp_path, parallel):
    """torchrun, two processes: a run whose ranks all fail at step 3 resumes, with the same command, from the
    checkpoint after step 1 (each rank's generator restored; FSDP2's sharded model and optimizer gathered into it and
    loaded back) and logs exactly what an uninterrupted run logs."""

    def launch(path, *crash, check=True):
        cmd = [*TORCHRUN, "resume", str(path), parallel, *crash]
        return subprocess.run(cmd, env=TOY_ENV, cwd=ROOT, check=check, capture_output=True, text=True)

    def records(path):
        return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in read_jsonl(path / "metrics.jsonl")]

    launch(tmp_path / "reference")
    failed = launch(tmp_path / "run", "3", check=False)
    assert failed.returncode != 0 and "simulated failure at step 3" in failed.stderr, failed.stderr[-4000:]
    assert [r["step"] for r in records(tmp_path / "run")] == [0, 1, 2] and not (tmp_path / "run" / "DONE").exists()
    launch(tmp_path / "run")
    assert records(tmp_path / "run") == records(tmp_path / "reference")
    assert (tmp_path / "run" / "DONE").exists()


def test_nonfinite_evaluation_stops_without_done(tmp_path, monkeypatch):
    import sera.lm_loop as loop

    monkeypatch.setattr(loop, "evaluate", lambda *a: ({"eval/pair/pass@1": float("nan")}, {}))
    with pytest.raises(NonFiniteError, match="non-finite evaluation at step 2"):
        run_toy(loop_cfg("grpo", "none", 0, steps=4), tmp_path / "run")
    assert not (tmp_path / "run" / "DONE").exists()


def test_evaluate_counts_correct_per_question():
    _, ls = settings(loop_cfg())
    metrics, records = evaluate(ls, ToyTask(), HFEngine(tiny_model(), EOS, PAD), torch.Generator().manual_seed(0))
    assert records["pair"]["ids"] == [0, 1] and all(0 <= c <= 8 for c in records["pair"]["correct"])
    assert metrics["eval/pair/pass@8"] == pytest.approx(np.mean([c > 0 for c in records["pair"]["correct"]]))
    assert records["single"]["ids"] == [7]


def test_top_p_keeps_the_nucleus():
    from sera.rollout import nucleus

    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    torch.testing.assert_close(nucleus(probs, 0.7), torch.tensor([[0.625, 0.375, 0.0, 0.0]]))
    torch.testing.assert_close(nucleus(probs, 0.5), torch.tensor([[1.0, 0.0, 0.0, 0.0]]))
    torch.testing.assert_close(nucleus(probs, 1.0), probs)


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
        "method=sera_pilot",
        "method.pilot_m=2",
        "method.aggregation=token-mean,seqnorm",
        f"run.root={tmp_path}",
        "threads=1",
    ]
    subprocess.run(cmd, env=env, check=True, capture_output=True)
    others = [*cmd[:5], "method=maxrl", "method.aggregation=token-mean,seqnorm", *cmd[-2:]]
    subprocess.run(others, env=env, check=True, capture_output=True)
    others = [*cmd[:5], "method=grpo,dars_hw,pkpo", "method.pkpo_k=4", *cmd[-2:]]
    subprocess.run(others, env=env, check=True, capture_output=True)  # every registry method once
    root = tmp_path / "maze-smoke"
    assert sorted(p.name for p in root.iterdir()) == [
        "base_seed-0",
        "dars_hw-token-mean_n0-8_seed-0",
        "grpo-token-mean_n0-8_seed-0",
        "maxrl-seqnorm_n0-8_seed-0",
        "maxrl-token-mean_n0-8_seed-0",
        "pkpo-token-mean_n0-8_method.pkpo_k=4_seed-0",  # a setting off the default names the folder (PKPO's only)
        "sera-m2-seqnorm_n0-8_seed-0",
        "sera-m2-token-mean_n0-8_seed-0",
    ]
    assert (root / "base_seed-0" / "model.safetensors").exists() and (root / "base_seed-0" / "DONE").exists()
    base = read_jsonl(root / "base_seed-0" / "metrics.jsonl")[-1]
    assert "eval/heldout/pass@1" in base and "eval/heldout/best_fixed_answer_rate" in base
    for run in [p for p in root.glob("*_seed-0") if not p.name.startswith("base")]:
        records = read_jsonl(run / "metrics.jsonl")
        assert [r["step"] for r in records] == [0, 1, 2, 3] and (run / "DONE").exists()
        assert "eval/heldout/distinct_answers" in records[-1]


def test_maze_bad_input(tmp_path):
    from hydra import compose, initialize_config_dir

    from experiments.maze.train import validate

    configs = os.path.join(os.path.dirname(__file__), "..", "configs")
    with initialize_config_dir(config_dir=os.path.abspath(configs), version_base=None):
        for overrides, match in [
            (["method=sera_pilot"], None),
            (["method=sera_pilot", "method.estimator=history", "method.pilot_m=0"], "repeated prompts"),
            (["method=direct_ce"], "no rollouts"),
            (["task.grid_size=12"], "odd"),
            (["model.path=/nonexistent"], "does not exist"),
            (["method=maxrl", "method.aggregation=sum"], "aggregation"),
            (["method=dars_hw", "method.estimator=pilot", "method.pilot_m=4"], "without p_hat"),
            (["method=sera_pilot", "alloc.n_min=4"], "below method.pilot_m"),
            (["scale=maze/smoke", "method=sera_pilot", "method.pilot_m=16"], "infeasible budget"),
            (["temperature=0"], "temperature must be"),
            (["eval.temperature=-1"], "eval_temperature must be"),
            (["top_p=0"], "top_p"),
            (["train.batch_size=0"], "batch_size must be"),
            (["train.micro_batch_rollouts=0"], "micro_batch_rollouts"),
            (["train.logprobs=fast"], "unknown train.logprobs"),
            (["train.parallel=fsdp2", "engine=vllm", "train.logprobs=shared-prompt"], "past FSDP2"),
            (["eval.ks=[]"], "eval.ks"),
            (["eval.every=0"], "eval.every"),
            (["run.checkpoint_every=0"], "checkpoint_every"),
            (["threads=foo"], "threads"),
            (["seed=-1"], "seed"),
            (["method=common"], "not a method"),
            (["device=tpu"], "unknown device"),
            (["optim.lr=nan"], "optim.lr"),
            (["optim.lr=inf"], "optim.lr"),
            (["sft.steps=0"], "sft.steps"),
            (["method=sara"], "pool_size"),
            (["method=dps"], "pool_size"),
            (["method=sara", "task.pool_size=64", "method.sequential.k0=99"], "must be <= n0"),
            (["method=ds", "task.pool_size=64", "+method.sequential.bogus=1"], "bogus"),
            (["task.pool_size=0"], "pool_size"),
            (["vllm.tensor_parallel_size=0"], "tensor_parallel_size"),
            (["train.parallel=fsdp2"], "needs engine=vllm"),
            (["train.parallel=zero3"], "unknown train.parallel"),
            (["vllm.dtype=int8"], "vllm.dtype"),
            (["vllm.gpu_memory_utilization=1.5"], "gpu_memory_utilization"),
        ]:
            cfg = compose("maze", overrides=overrides)
            if match is None:
                assert validate(cfg)[0].method.name == "sera_pilot"
                assert validate(compose("maze", ["method=sara+dps", "task.pool_size=64"]))[0].method.label == "SARA+DPS"
            else:
                with pytest.raises((ValueError, FileNotFoundError), match=match):
                    validate(cfg)


def test_vllm_settings_reach_the_engine(monkeypatch):
    """engine=vllm builds VLLMEngine with the config's tensor parallelism, dtype and memory share (the engine itself
    needs vLLM: tests/vllm)."""
    from hydra import compose, initialize_config_dir

    from sera import lm_study

    seen = {}
    monkeypatch.setattr(lm_study, "VLLMEngine", lambda *args, **kwargs: seen.update(kwargs))
    configs = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "configs"))
    with initialize_config_dir(config_dir=configs, version_base=None):
        cfg = compose("maze", ["engine=vllm", "vllm.tensor_parallel_size=4", "vllm.dtype=bfloat16"])
    lm_study.make_engine(cfg, None, "/models/base", 1, 0)
    assert seen == {"tensor_parallel_size": 4, "dtype": "bfloat16", "gpu_memory_utilization": 0.3}


@pytest.mark.parametrize("method, estimator, m", [("sera_pilot", "pilot", 2), ("sara+dps", "none", 0)])
def test_lm_loop_resumes_to_identical_metrics(tmp_path, monkeypatch, method, estimator, m):
    """A batch allocator and a sequential one (its DPS predictor is part of the checkpoint) resume exactly."""
    cfg = loop_cfg(method, estimator, m, steps=4)
    _, reference = run_toy(cfg, tmp_path / "a")
    resumed = killed_then_resumed(monkeypatch, 3, lambda: run_toy(cfg, tmp_path / "b"))
    assert resumed[1] == reference  # resumed from the checkpoint written after step 1


def killed_then_resumed(monkeypatch, step: int, run):
    """run() killed as it logs `step` (KeyboardInterrupt, before that step's record), then run() again to the end;
    returns what the second call returns."""
    original = RunDir.log

    def crash(self, at, metrics):
        if at == step:
            raise KeyboardInterrupt("simulated kill")
        original(self, at, metrics)

    monkeypatch.setattr(RunDir, "log", crash)
    with pytest.raises(KeyboardInterrupt):
        run()
    monkeypatch.setattr(RunDir, "log", original)
    return run()


class EpochToyTask(ToyTask):
    """ToyTask's 16 prompts read in epochs (steps 0-3 with B = 4 are epoch 0, in a fixed order), as the math task and
    the maze's pool_order=epoch read theirs: what the authors' Beta history needs."""

    epoch_order = True

    def train_prompts(self, step, batch, start=0):
        ids = (step * 4 + np.arange(start, min(start + batch, self.num_prompts))) % self.num_prompts
        return ids, [[1, 2 + int(i) % 7, 3 + int(i) // 7] for i in ids]


def test_the_authors_rule_is_uniform_for_an_epoch_then_reads_the_beta_history_and_resumes(tmp_path, monkeypatch):
    cfg = loop_cfg("sera", None, 0, steps=8)
    assert settings(cfg)[0].estimator == "beta"  # the language models' default: no exact p
    _, reference = run_toy(cfg, tmp_path / "a", task=EpochToyTask())
    assert all(r["alloc/rollouts"] == r["alloc/budget"] == 32 for r in reference)
    assert all("alloc/active" not in r and r["alloc/n_min"] == r["alloc/n_max"] == 8 for r in reference[:4])
    assert all(1 <= r["alloc/active"] <= 4 for r in reference[4:])  # epoch 1: every prompt has an estimate
    resumed = killed_then_resumed(monkeypatch, 6, lambda: run_toy(cfg, tmp_path / "b", task=EpochToyTask()))
    assert resumed[1] == reference  # the history's state in the checkpoint


class RaggedEpochToyTask(ToyTask):
    """14 prompts read in epochs of a fixed order with B = 4: step 3 reads positions 12-15, the last two of epoch 0
    and the first two of epoch 1, as tiny-math's 5,500 problems do at B = 32."""

    epoch_order, num_prompts = True, 14

    def train_prompts(self, step, batch, start=0):
        ids = (step * 4 + np.arange(start, start + batch)) % self.num_prompts
        return ids, [[1, 2 + int(i) % 7, 3 + int(i) // 7] for i in ids]


def test_the_beta_history_reads_a_set_that_is_not_a_multiple_of_the_batch_by_the_epoch_of_each_steps_first_prompt(
    tmp_path,
):
    _, records = run_toy(loop_cfg("sera", None, 0, steps=6), tmp_path / "a", task=RaggedEpochToyTask())
    # steps 0-3 start in epoch 0, whose snapshot is empty: uniform, the step that runs into epoch 1 included
    assert all("alloc/active" not in r and r["alloc/n_min"] == r["alloc/n_max"] == 8 for r in records[:4])
    # step 4 starts epoch 1 (position 16 // 14 = 1): all 14 prompts were seen in steps 0-3, so it allocates
    assert all(1 <= r["alloc/active"] <= 4 and r["alloc/rollouts"] == 32 for r in records[4:])


class HalfSolvedEpochToyTask(EpochToyTask):
    """EpochToyTask where an even prompt always succeeds and an odd one never does, whatever the response: every
    batch of 4 holds two of each, and from epoch 1 on the two odd ones are the never-solved prompts."""

    def rewards(self, ids, responses, truncated):
        return (np.asarray(ids) % 2 == 0).astype(np.float64)


def test_the_authors_rule_logs_where_its_rollouts_go_by_whether_a_prompt_was_ever_solved(tmp_path):
    """Exploratory analysis E2's values. From epoch 1 an even prompt's Beta mean is 8.5 / 9 or more, so its factor
    1 - (1 - p)^n is above 0.99 at n_min = 2, where an odd prompt's (mean 0.5 / 9 or less) stays below 0.6 even at 14:
    the even ones sit at n_min and the two odd ones share the rest of the 32, 14 each, 28 / 32 of the step."""
    _, records = run_toy(loop_cfg("sera", None, 0, steps=12), tmp_path / "a", task=HalfSolvedEpochToyTask())
    assert not any("alloc/unsolved_share" in r for r in records[:4])  # epoch 0 is uniform: no history read
    for r in records[4:]:
        assert r["alloc/active"] == 4 and (r["alloc/n_min"], r["alloc/n_max"]) == (2, 14)
        assert r["alloc/unsolved_share"] == 28 / 32 and r["alloc/unsolved_active"] == 2
        assert r["alloc/solved_n_median"] == 2.0


def test_the_sink_interventions_change_where_the_authors_rule_puts_its_rollouts(tmp_path):
    """The plan's interventions on HalfSolvedEpochToyTask (results/cpu/PLAN_SINK.md). leave_out: from epoch 1 the two
    never-solved prompts get none, the two solved ones share the 32 (budget 32 <= 2 x n_max = 64). uniform_epochs=3:
    epochs 0-2 are uniform (no active set), the history is read from epoch 3 on (the Beta means of 0.5 / 9 and
    8.5 / 9 that epoch 1 would have read are in the monitor's bins at epoch 2's start)."""
    cfg = loop_cfg("sera", None, 0, steps=8)
    cfg.alloc.never_solved = "leave_out"
    _, records = run_toy(cfg, tmp_path / "a", task=HalfSolvedEpochToyTask())
    for r in records[4:]:
        assert r["alloc/active"] == 2 and r["alloc/unsolved_share"] == 0.0 and r["alloc/unsolved_active"] == 0
        assert (r["alloc/n_min"], r["alloc/n_max"]) == (16, 16)
    cfg = loop_cfg("sera", None, 0, steps=16)
    cfg.alloc.uniform_epochs = 3
    _, records = run_toy(cfg, tmp_path / "b", task=HalfSolvedEpochToyTask())
    assert all("alloc/active" not in r and r["alloc/n_min"] == r["alloc/n_max"] == 8 for r in records[:12])
    assert all("alloc/active" in r for r in records[12:])  # epoch 3 reads three epochs of evidence
    assert all(r["alloc/unsolved_share"] == 0.5 for r in records[4:12])  # uniform: half the rollouts on odd prompts


def test_the_cap_keeps_never_solved_prompts_at_n0(tmp_path):
    """alloc.never_solved=cap on HalfSolvedEpochToyTask: from epoch 1 the two never-solved prompts get n0 = 8 each
    (the rule gives them 14) and the two solved ones share the other 16."""
    cfg = loop_cfg("sera", None, 0, steps=8)
    cfg.alloc.never_solved = "cap"
    _, records = run_toy(cfg, tmp_path / "a", task=HalfSolvedEpochToyTask())
    for r in records[4:]:
        assert r["alloc/unsolved_share"] == 16 / 32 and r["alloc/unsolved_active"] == 2
        assert r["alloc/solved_n_median"] == 8.0


def test_the_weight_cap_caps_seras_weights_and_leaves_the_allocation_as_it_was(tmp_path, monkeypatch):
    """alloc.weight_cap=2 (the sink's negative control) on HalfSolvedEpochToyTask: from epoch 1 the solved prompts sit
    at n_min = 2, whose weight n0 / n_i = 4 is capped at 2, while the never-solved ones at 14 keep 8 / 14; the counts
    are the authors' rule's, step for step."""
    from sera import lm_loop

    seen, counts = [], []
    original = lm_loop.rank_share
    watch = lambda *a, **k: seen.append(a[3].copy()) or counts.append(a[0].counts) or original(*a, **k)  # noqa: E731
    monkeypatch.setattr(lm_loop, "rank_share", watch)
    cfg = loop_cfg("sera", None, 0, steps=8)
    run_toy(cfg, tmp_path / "a", task=HalfSolvedEpochToyTask())
    uncapped, plain_counts, seen[:], counts[:] = list(seen), list(counts), [], []
    cfg.alloc.weight_cap = 2
    run_toy(cfg, tmp_path / "b", task=HalfSolvedEpochToyTask())
    assert [c.tolist() for c in counts] == [c.tolist() for c in plain_counts]  # every prompt's count, step for step
    assert plain_counts[-1].tolist() == [2, 14, 2, 14]
    assert sorted(set(np.round(uncapped[-1], 6))) == [round(8 / 14, 6), 4.0]
    assert sorted(set(np.round(seen[-1], 6))) == [round(8 / 14, 6), 2.0]
    assert all(w.max() <= 2 for w in seen) and all(w.max() == 1 for w in seen[:4])  # epoch 0: uniform, weights 1


def test_the_sink_interventions_are_refused_for_a_method_without_the_beta_history(tmp_path):
    cfg = loop_cfg("maxrl", "none", 0, steps=2)
    cfg.alloc.never_solved = "leave_out"
    with pytest.raises(ValueError, match="alloc.never_solved and alloc.uniform_epochs"):
        run_toy(cfg, tmp_path / "a", task=EpochToyTask())
    cfg.alloc.never_solved = "drop"
    with pytest.raises(ValueError, match="alloc.never_solved in"):
        settings(cfg)
    cfg = loop_cfg("maxrl", "none", 0, steps=2)
    cfg.alloc.weight_cap = 2
    with pytest.raises(ValueError, match="alloc.weight_cap caps SERA's weights"):
        run_toy(cfg, tmp_path / "b", task=EpochToyTask())
    cfg.alloc.weight_cap = 0.5  # below 1 would scale the uniform epoch's weights too
    with pytest.raises(ValueError, match="alloc.weight_cap must be a finite number >= 1"):
        settings(cfg)


def test_maxrl_on_a_pool_logs_the_sink_measures_without_changing_its_records(tmp_path, monkeypatch):
    """The monitor watches from outside: a MaxRL run on a pool read in epochs has the same records as with the
    monitor switched off (its keys aside), and logs the never-solved share from epoch 1 and each epoch's end."""
    from sera import lm_loop

    cfg = loop_cfg("maxrl", "none", 0, steps=12)
    _, watched = run_toy(cfg, tmp_path / "a", task=HalfSolvedEpochToyTask())
    original = lm_loop.make_history
    monkeypatch.setattr(lm_loop, "make_history", lambda *args: (original(*args)[0], None))  # no monitor
    _, plain = run_toy(cfg, tmp_path / "b", task=HalfSolvedEpochToyTask())
    added = ("alloc/unsolved_share", "alloc/unsolved_active", "alloc/solved_n_median", "pool/", "sink/")
    assert [{k: v for k, v in r.items() if not k.startswith(added)} for r in watched] == plain
    assert all(r["alloc/unsolved_share"] == 0.5 for r in watched[4:])  # uniform counts, half on odd prompts
    assert watched[4]["pool/success"] == 0.5 and watched[4]["pool/never_solved"] == 0.5
    assert watched[8]["pool/success_phat_0.05-0.2"] == 0.0 and watched[8]["pool/success_phat_0.8-1"] == 1.0
    assert watched[8]["sink/epoch_unsolved_share"] == 0.5 and "sink/warned" not in watched[8]


def test_the_beta_history_refuses_prompts_not_read_in_epochs(tmp_path):
    with pytest.raises(ValueError, match="read in epochs"):
        run_toy(loop_cfg("sera", None, 0, steps=2), tmp_path / "a")


@pytest.mark.parametrize("study", ["maze", "math"])
def test_the_studies_refuse_a_multi_process_launch_naming_the_trl_path(study):
    """Under torchrun every worker would run the whole study on its own: refused before any work."""
    env = {**os.environ, "WORLD_SIZE": "2", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-m", f"experiments.{study}.train", f"scale={study}/smoke"], env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode != 0
    assert "runs in one process" in done.stderr and "SERAGRPOTrainer" in done.stderr


def test_a_run_releases_its_engine_when_it_ends_or_fails(tmp_path, monkeypatch):
    """A sweep's jobs share one process: each RL run closes its engine (vLLM's engine process and GPU share) when it
    finishes and when it fails, so the next job does not start beside it."""
    from sera import lm_loop

    class ClosingEngine(HFEngine):
        closed = 0

        def close(self):
            ClosingEngine.closed += 1

    cfg = loop_cfg("maxrl", "none", 0, steps=2)
    cfg.run.if_finished, cfg.wandb = "error", {"enabled": False}
    ms, ls = settings(cfg)

    def prepare():
        model = tiny_model()
        return model, ToyTask(), ClosingEngine(model, EOS, PAD)

    lm_loop.run_rl(cfg, ms, ls, tmp_path / "done", prepare, 1)
    assert ClosingEngine.closed == 1 and (tmp_path / "done" / "DONE").exists()

    def broken(*args, **kwargs):
        raise RuntimeError("a step failed")

    monkeypatch.setattr(lm_loop, "train", broken)
    with pytest.raises(RuntimeError, match="a step failed"):
        lm_loop.run_rl(cfg, ms, ls, tmp_path / "failed", prepare, 1)
    assert ClosingEngine.closed == 2


def test_trimmed_micro_batches_give_the_same_step(tmp_path):
    """train.trim_responses cuts each micro-batch to its longest response: the same log-probs on the response tokens,
    so the same loss and gradient (equal bit for bit on this model), in less memory."""
    from sera.lm_loop import rl_step

    grads = []
    for trim in (False, True):
        cfg = loop_cfg("sera_pilot", "pilot", 2, "seqnorm", micro=3)
        cfg.train.trim_responses = trim
        ms, ls = settings(cfg)
        assert ls.trim_responses is trim
        model = tiny_model()
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        metrics = rl_step(
            ms, ls, ToyTask(), model, HFEngine(model, EOS, PAD), opt, None, torch.Generator().manual_seed(5), 0
        )
        grads.append((metrics["train/loss"], torch.cat([p.grad.reshape(-1) for p in model.parameters()])))
    assert grads[0][0] == grads[1][0] and torch.equal(grads[0][1], grads[1][1])
    short = HFEngine(tiny_model(), EOS, PAD).generate(PROMPTS, [2, 2, 2], 12, torch.Generator().manual_seed(1))
    cut = short.trimmed()
    assert cut.tokens.shape[1] == int(short.mask.sum(1).max()) and torch.equal(cut.mask.sum(1), short.mask.sum(1))


@pytest.mark.parametrize("path", ["repeated-cache", "shared-prompt"])
def test_chunked_logprobs_give_the_same_values_and_gradients(path):
    """train.logprob_chunk: the loss's log-softmax a few positions at a time, each recomputed in backward, gives the
    log-probs and the gradient of the whole (N, T, V) at once, bit for bit."""
    from sera.rollout import shared_prompt_logprobs

    rollouts = HFEngine(tiny_model(), EOS, PAD).generate(PROMPTS, [3, 2, 4], 9, torch.Generator().manual_seed(1))
    results = []
    for chunk in (None, 2):
        model = tiny_model()
        fn = response_logprobs if path == "repeated-cache" else shared_prompt_logprobs
        logp = fn(model, PROMPTS, rollouts, PAD, 0.8, chunk=chunk)
        (logp * rollouts.mask).sum().backward()
        results.append((logp.detach(), torch.cat([p.grad.reshape(-1) for p in model.parameters()])))
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])
    cfg = loop_cfg()
    cfg.train.logprob_chunk = 0
    with pytest.raises(ValueError, match="logprob_chunk"):
        settings(cfg)
