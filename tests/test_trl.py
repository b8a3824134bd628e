"""SERAGRPOTrainer (sera/trl.py): SERA and MaxRL inside TRL's GRPOTrainer, checked step by step on a toy task
(tests/trl_toy.py) in one process and in two (torchrun, gloo), plus the README example and the comparison script."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import trl
from trl import GRPOConfig, GRPOTrainer

from sera.advantages import maxrl
from sera.allocation import waterline
from sera.trl import HISTORY_FILE, SERAGRPOConfig, SERAGRPOTrainer
from tests import records_ddp_toy, trl_toy
from tests.trl_toy import check_step

ROOT = os.path.dirname(os.path.dirname(__file__))


@pytest.mark.parametrize("loss_type", ["dapo", "dr_grpo", "grpo", "cispo", "vespo", "sapo"])
def test_sera_step_equals_the_suites_loss(tmp_path, loss_type):
    """One process: pilots, the waterline, the remaining completions; the advantages are sera.advantages.maxrl x n0 /
    n_i on the groups the rows show, and the step's gradient is sera.losses.pg_loss's on the same completions (dapo,
    cispo, vespo: token-mean; dr_grpo: seqnorm; grpo, sapo: seq-mean-token-mean)."""
    overrides = {"epsilon_high": 5.0} if loss_type == "cispo" else {}
    check_step(trl_toy.one_step(tmp_path, "sera_pilot", loss_type, **overrides))


def test_maxrl_keeps_trls_layout(tmp_path):
    """method=maxrl is the uniform baseline from the same class: the same completions as GRPOTrainer with the same
    seed, n0 each, MaxRL's advantage on TRL's own groups, and the suite's gradient."""
    check_step(trl_toy.one_step(tmp_path / "check", "maxrl"), "maxrl")
    outputs = []
    for trainer_class, args in [
        (GRPOTrainer, GRPOConfig(**trl_toy.settings(tmp_path / "grpo"))),
        (SERAGRPOTrainer, trl_toy.config(tmp_path / "maxrl", method="maxrl")),
    ]:
        run = trainer_class(model=trl_toy.model(), reward_funcs=trl_toy.first_letter_allowed, args=args,
                            processing_class=trl_toy.tokenizer(), train_dataset=trl_toy.dataset())  # fmt: skip
        capture = trl_toy.Capture(run)
        run.train()
        outputs.append(capture.batches[0])
    (grpo, _), (sera, rows) = outputs
    for key in ("prompt_ids", "completion_ids", "completion_mask"):
        assert torch.equal(grpo[key], sera[key])
    completions = trl_toy.tokenizer().batch_decode(sera["completion_ids"], skip_special_tokens=True)
    rewards = trl_toy.first_letter_allowed(completions, [r["allowed"] for r in rows])
    expected = maxrl(rewards, np.full(len(rewards) // trl_toy.N0, trl_toy.N0))
    np.testing.assert_allclose(sera["advantages"].numpy(), expected, rtol=1e-6, atol=1e-7)
    assert not torch.allclose(grpo["advantages"], sera["advantages"])  # GRPO's own advantage is a different one


# --standalone: a free rendezvous port for each launch
TORCHRUN = [os.path.join(os.path.dirname(sys.executable), "torchrun"), "--standalone", "--nproc_per_node=2"]
ENV = {**os.environ, "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1"}


@pytest.mark.slow
def test_the_authors_rule_in_two_processes(tmp_path):
    """sera under torchrun, two CPU processes: the second step (epoch 1 of the Beta history) allocates by the
    active-set rule on the gathered outcomes, both processes alike, and passes SERA's step checks."""
    out = tmp_path / "two.json"
    cmd = [*TORCHRUN, "-m", "tests.trl_toy", str(out), "sera", "dapo"]
    done = subprocess.run(cmd, env=ENV, cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, f"torchrun failed:\n{done.stderr[-6000:]}"
    (r,) = json.loads(out.read_text())
    assert r["world"] == 2
    check_step(r, "sera")


@pytest.mark.parametrize(("method", "loss_type"), [("sera", "dapo"), ("sera_pilot", "dr_grpo"), ("maxrl", "grpo")])
def test_gradient_accumulation_gives_the_whole_steps_gradient(tmp_path, method, loss_type):
    """Four micro-batches a step (gradient_accumulation_steps=4, a quarter of the step's rows each: how the paper-scale
    launches fit a device, --micro-rows): the same B x n0 budget, groups and MaxRL x n0 / n_i advantages, and the
    accumulated gradient equals the suite's loss over the whole step."""
    r = trl_toy.one_step(tmp_path, method, loss_type, per_device_train_batch_size=trl_toy.N0,
                         gradient_accumulation_steps=4)  # fmt: skip
    check_step(r, method)


@pytest.mark.slow
def test_two_processes(tmp_path):
    """torchrun, two CPU processes over gloo: each holds B x n0 / 2 rows, groups span the processes; the counts sum
    to B x n0, every group holds one prompt, the advantages are MaxRL x n0 / n_i on the gathered rewards, and the
    gradient after DDP's all-reduce is the suite's loss over all rows (token-mean and seqnorm)."""
    out = tmp_path / "two.json"
    cmd = [*TORCHRUN, "-m", "tests.trl_toy", str(out), "sera_pilot", "dapo,dr_grpo"]
    done = subprocess.run(cmd, env=ENV, cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, f"torchrun failed:\n{done.stderr[-6000:]}"
    for r in json.loads(out.read_text()):
        assert r["world"] == 2
        check_step(r)


@pytest.mark.slow
def test_two_processes_evaluate_with_noise_of_their_own_and_a_day_to_wait(tmp_path):
    """torchrun, two CPU processes: the launch scripts' process group waits a day in a collective (TrainingArguments'
    default, 30 minutes, would abort a run whose ranks drift further apart in an evaluation), and each rank samples
    its questions with noise of its own: rank 0 draws what one process seeded with seed + step draws, rank 1 other
    numbers (with one seed on both, the j-th question of each rank would share its samples' noise)."""
    out = tmp_path / "records.json"
    done = subprocess.run([*TORCHRUN, "-m", "tests.records_ddp_toy", str(out)], env=ENV, cwd=ROOT, capture_output=True,
                          text=True)  # fmt: skip
    assert done.returncode == 0, f"torchrun failed:\n{done.stderr[-6000:]}"
    records_ddp_toy.check(json.loads(out.read_text()))


def test_a_colocated_vllm_engine_is_warned_about_its_seed(tmp_path):
    """TRL 1.16 seeds a colocated vLLM engine with the process index: the note names it and the run's seed; no vLLM,
    or vLLM's server mode, no note."""
    from sera.trl import vllm_seed_note

    def config(**kwargs):
        return SERAGRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to=[], seed=7, **kwargs)

    note = vllm_seed_note(config(use_vllm=True, vllm_mode="colocate"))
    assert "with its process index, not seed=7" in note and trl.__version__ in note
    assert vllm_seed_note(config()) is None and vllm_seed_note(config(use_vllm=True, vllm_mode="server")) is None


def test_history_estimator_across_steps_and_resume(tmp_path):
    """estimator=history: the first step has no estimate (uniform); the next step's p_hat is each prompt's clipped
    success rate of the step before, allocated by the waterline; the estimator's state is saved with each checkpoint
    and loaded on resume."""
    data = trl_toy.dataset(size=4)  # B = 4: every step sees the same four prompts
    args = trl_toy.config(tmp_path, estimator="history", max_steps=2, save_strategy="steps", save_steps=1)
    run = trl_toy.trainer(args, data)
    steps = trl_toy.recorded_steps(run)
    capture = trl_toy.Capture(run)
    run.train()
    first, second = steps
    assert first.p_hat is None and (first.counts == trl_toy.N0).all()
    groups = []  # (prompt id of each group, its success rate), from the rows TRL trained on
    for step, (_, rows) in zip(steps, capture.batches, strict=True):
        ids = {int(g): row["prompt_id"] for g, row in zip(step.group, rows, strict=True)}
        groups.append(
            ([ids[g] for g in range(step.counts.size)], np.bincount(step.group, weights=step.rewards) / step.counts)
        )
    (ids1, rate1), (ids2, _) = groups
    expected = np.clip([rate1[ids1.index(i)] for i in ids2], args.p_lo, args.p_hi)
    np.testing.assert_allclose(second.p_hat, expected)
    np.testing.assert_array_equal(second.counts, waterline(expected, 4 * trl_toy.N0, 2, 8 * trl_toy.N0))
    saved = np.load(tmp_path / "checkpoint-2" / HISTORY_FILE)
    np.testing.assert_array_equal(saved["last_rate"], run._history.last_rate)
    resumed = trl_toy.trainer(args, data)
    resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))
    np.testing.assert_array_equal(resumed._history.last_rate, run._history.last_rate)
    assert resumed._history.total_rollouts == run._history.total_rollouts == 2 * 4 * trl_toy.N0


def test_a_checkpoint_holds_the_history_before_the_older_ones_go(tmp_path, monkeypatch):
    """With save_total_limit=1 (the launch scripts') transformers ends a save by deleting the older checkpoints, so
    SERA's history must already be in the new one then: otherwise for a moment no checkpoint could be resumed."""
    import transformers.trainer

    seen = []
    rotate = transformers.trainer.rotate_checkpoints

    def rotate_and_look(output_dir, **kwargs):
        newest = max(Path(output_dir).glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
        seen.append((newest.name, (newest / HISTORY_FILE).exists()))
        return rotate(output_dir=output_dir, **kwargs)

    monkeypatch.setattr(transformers.trainer, "rotate_checkpoints", rotate_and_look)
    args = trl_toy.config(tmp_path, estimator="history", max_steps=2, save_strategy="steps", save_steps=1,
                          save_total_limit=1)  # fmt: skip
    trl_toy.trainer(args, trl_toy.dataset(size=4)).train()
    assert seen == [("checkpoint-1", True), ("checkpoint-2", True)]
    assert [c.name for c in tmp_path.glob("checkpoint-*")] == ["checkpoint-2"]


def test_evaluation_uses_maxrl_on_trls_groups(tmp_path):
    """evaluate(): TRL's uniform evaluation groups (num_generations_eval), MaxRL's advantage in the loss."""
    args = trl_toy.config(tmp_path, eval_strategy="no", per_device_eval_batch_size=16, num_generations_eval=4)
    run = trl_toy.trainer(args, eval_dataset=trl_toy.dataset(size=4, seed=1))
    capture = trl_toy.Capture(run)
    metrics = run.evaluate()
    (output, rows), = capture.batches  # fmt: skip
    completions = trl_toy.tokenizer().batch_decode(output["completion_ids"], skip_special_tokens=True)
    rewards = trl_toy.first_letter_allowed(completions, [r["allowed"] for r in rows])
    np.testing.assert_allclose(output["advantages"].numpy(), maxrl(rewards, np.full(4, 4)), rtol=1e-6, atol=1e-7)
    assert np.isfinite(metrics["eval_loss"]) and metrics["eval_reward"] == pytest.approx(np.mean(rewards))


def failing_reward(value):
    def reward(completions, **kwargs):
        return [value] * len(completions)

    return reward


@pytest.mark.parametrize("value, message", [(0.5, "binary reward"), (None, "got no reward")])
def test_a_non_binary_reward_stops_the_first_step(tmp_path, value, message):
    run = SERAGRPOTrainer(model=trl_toy.model(), reward_funcs=failing_reward(value), args=trl_toy.config(tmp_path),
                          processing_class=trl_toy.tokenizer(), train_dataset=trl_toy.dataset())  # fmt: skip
    with pytest.raises(ValueError, match=message):
        run.train()


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"loss_type": "bnpo"}, "token count of each micro-batch"),
        ({"loss_type": "luspo"}, "use dr_grpo"),
        ({"loss_type": "cispo"}, "epsilon_high >= 1"),
        ({"method": "grpo"}, "choose from"),
        ({"estimator": "oracle"}, "unavailable"),
        ({"pilot_m": 16}, "n_min"),  # pilots beyond n0: the budget cannot hold them
        ({"method": "maxrl", "pilot_m": 4}, "pilot"),  # the suite's own rules (sera.methods)
        ({"num_generations": 8, "pilot_m": 8}, "SERA cannot reallocate"),  # TRL's default n0 with SERA's 8 pilots
        ({"n_max": 8}, "SERA cannot reallocate"),  # no prompt may take more than n0: every one gets n0
        ({"scale_rewards": "group"}, "scale_rewards='group' is not honoured"),
        ({"method": "sera", "estimator": "pilot", "pilot_m": 4}, "authors' epoch-frozen Beta history"),
        ({"method": "sera", "active_threshold": 1.5}, "threshold must lie in"),
        ({"active_threshold": 0.1}, "authors' active-set rule"),  # the suite's rule has no active set
    ],
)
def test_bad_settings_fail_when_the_config_is_made(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        trl_toy.config(tmp_path, **overrides)


def unused_tool(x: int) -> int:
    """A tool.

    Args:
        x: a number
    """
    return x


@pytest.mark.parametrize(
    "config, kwargs, message",
    [
        ({}, {"tools": [unused_tool]}, "tools"),
        ({}, {"rollout_func": lambda prompts, trainer: {}}, "rollout_func"),
        ({}, {"reward_funcs": "some/reward-model"}, "reward model"),
        ({"multi_objective_aggregation": "normalize_then_sum"}, {}, "non-binary"),
        ({"beta": 0.04}, {}, "multiplicity correction"),
        ({"entropy_coef": 0.01}, {}, "multiplicity correction"),
        ({"estimator": "history", "prompt_id_column": "qid"}, {}, "'qid'"),
        ({"estimator": "history", "remove_unused_columns": True}, {}, "remove_unused_columns"),
        ({"method": "sera", "remove_unused_columns": False, "prompt_id_column": "qid"}, {}, "'qid'"),
        (
            {"method": "sera", "remove_unused_columns": False},
            {"train_dataset": trl_toy.dataset(size=2)},
            "epochs of B = 4 prompts",
        ),
    ],
)
def test_unsupported_setups_fail_before_the_model_loads(tmp_path, config, kwargs, message):
    """The model is a hub id that does not exist: the error must come first."""
    arguments = {"reward_funcs": trl_toy.first_letter_allowed, "train_dataset": trl_toy.dataset(), **kwargs}
    with pytest.raises(ValueError, match=message):
        SERAGRPOTrainer(model="no-such/model", args=trl_toy.config(tmp_path, **config), **arguments)


def test_other_refusals(tmp_path, monkeypatch):
    arguments = {"model": "no-such/model", "reward_funcs": trl_toy.first_letter_allowed,
                 "train_dataset": trl_toy.dataset()}  # fmt: skip
    with pytest.raises(TypeError, match="SERAGRPOConfig"):
        SERAGRPOTrainer(args=GRPOConfig(**trl_toy.settings(tmp_path)), **arguments)
    args = trl_toy.config(tmp_path)
    monkeypatch.setattr(SERAGRPOConfig, "world_size", property(lambda self: 3))  # B x m = 16 pilots on 3 processes
    with pytest.raises(ValueError, match="cannot be split evenly across 3 processes"):
        SERAGRPOTrainer(args=args, **arguments)
    monkeypatch.undo()
    monkeypatch.setattr(trl, "__version__", "1.17.0")
    with pytest.raises(RuntimeError, match="pin trl==1.16.0"):
        SERAGRPOTrainer(args=args, **arguments)


def readme_example() -> str:
    """The first python block of docs/trl.md, the page "SERA inside TRL"."""
    section = open(os.path.join(ROOT, "docs", "trl.md")).read()
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.mark.slow
def test_readme_example_runs_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace = {}
    exec(compile(readme_example(), "docs/trl.md", "exec"), namespace)  # noqa: S102 - the page's own example
    trainer = namespace["trainer"]
    assert trainer.state.global_step == 6 and trainer.last_step.counts.sum() == 5 * 8
    steps = trainer.state.log_history[:-1]  # the example shows SERA at work: mixed rewards, unequal counts, a gradient
    assert any(0 < log["reward"] < 1 for log in steps) and any(log["grad_norm"] > 0 for log in steps)
    assert any(log["alloc/n_max"] > log["alloc/n_min"] for log in steps)


@pytest.mark.slow
def test_comparison_script_runs(tmp_path, capsys):
    """examples/trl_vs_loop.py on the math smoke scale: the suite's loop and the TRL trainer from the same base model,
    both evaluated by the suite's evaluator."""
    from examples.trl_vs_loop import main

    main(["--scale", "smoke", "--steps", "2", "--trl-seeds", "0", "--samples", "8", "--root", str(tmp_path),
          "--estimators", "pilot,history"])  # fmt: skip
    out = capsys.readouterr().out
    assert "| suite loop, seed 0 |" in out and "| SERAGRPOTrainer, seed 0 |" in out
    # the historical p_hat needs no pilot round: one generation a step against the pilots' two
    assert "| SERAGRPOTrainer, seed 0, p_hat history minus SERAGRPOTrainer, seed 0 |" in out
    rounds = dict(re.findall(r"\| (SERAGRPOTrainer[^|]*) \| [0-9.]+ \| ([0-9.]+) \|", out))
    assert rounds == {"SERAGRPOTrainer, seed 0": "2.00", "SERAGRPOTrainer, seed 0, p_hat history": "1.00"}
    result = json.loads((tmp_path / "trl" / "seed-0" / "result.json").read_text())
    assert result["log"][-1]["step"] == 2 and any("alloc/budget" in entry for entry in result["log"])


@pytest.mark.slow
def test_launch_script_runs_on_the_cpu(tmp_path, capsys):
    """examples/trl_math.py, the script README launches on several GPUs, for one CPU step on generated chain sums."""
    from examples.trl_math import main

    common = ["--model", "tiny-math-smoke", "--template", "plain", "--train", "chain_sum", "--prompts", "2",
              "--n0", "8", "--method", "sera_pilot", "--pilot-m", "4", "--max-completion-length", "16", "--cpu",
              "--output-dir", str(tmp_path)]  # fmt: skip
    trainer = main([*common, "--steps", "1"])
    assert trainer.state.global_step == 1 and trainer.last_step.counts.sum() == 2 * 8
    assert "16 rows a device micro-batch: their logits take about" in capsys.readouterr().out  # 2 x 8 / (1 x 1)
    # held-out evaluation (4 problems x n0 = 32 rows: more than a generation batch), checkpoints, then a resume
    evaluated = [*common, "--eval-problems", "4", "--eval-every", "1", "--save-every", "1"]
    main([*evaluated, "--steps", "1"])
    trainer = main([*evaluated, "--steps", "2", "--resume"])
    assert trainer.state.global_step == 2 and [c.name for c in tmp_path.glob("checkpoint-*")] == ["checkpoint-2"]
    evaluations = [log for log in trainer.state.log_history if "eval_reward" in log]
    assert [log["step"] for log in evaluations] == [1, 2]  # step 1's evaluation was logged before the checkpoint


@pytest.mark.slow
def test_launch_script_writes_the_suites_per_question_records(tmp_path):
    """--records: the held-out problems sampled --record-samples times each at every --eval-every steps and the
    last, written in the suite's record format (ids, n, correct), with TRL's log holding the same Pass@1."""
    import json

    from examples.trl_math import main
    from sera.runlog import eval_record_file

    records = tmp_path / "records"
    trainer = main(["--model", "tiny-math-smoke", "--template", "plain", "--train", "chain_sum", "--prompts", "2",
                    "--n0", "8", "--method", "maxrl", "--max-completion-length", "16", "--cpu", "--steps", "2",
                    "--eval-problems", "4", "--eval-every", "1", "--records", str(records), "--record-samples", "8",
                    "--output-dir", str(tmp_path / "out")])  # fmt: skip
    for step in (1, 2):
        record = json.loads((records / eval_record_file(step, "heldout")).read_text())
        assert record["n"] == 8 and len(record["ids"]) == len(record["correct"]) == 4
        assert all(0 <= c <= 8 for c in record["correct"])
        (logged,) = [
            log for log in trainer.state.log_history if log.get("step") == step and "eval/heldout/pass@1" in log
        ]
        assert logged["eval/heldout/pass@1"] == pytest.approx(sum(record["correct"]) / 32)


@pytest.mark.parametrize("estimator, calls_per_step", [("history", 1), ("pilot", 2)])
def test_generation_rounds_per_step(tmp_path, monkeypatch, estimator, calls_per_step):
    """With the historical p_hat a step generates once (the allocation comes from the steps before); with pilots it
    generates twice (pilots, then the rest): twice the parameter gathers under ZeRO-3 and weight syncs with vLLM."""
    calls = []
    generate = GRPOTrainer._generate
    monkeypatch.setattr(
        GRPOTrainer, "_generate", lambda self, prompts: calls.append(len(prompts)) or generate(self, prompts)
    )
    data = trl_toy.dataset(size=4)
    args = trl_toy.config(tmp_path, estimator=estimator, max_steps=2)
    run = trl_toy.trainer(args, data)
    run.train()
    assert len(calls) == 2 * calls_per_step and sum(calls) == 2 * 4 * trl_toy.N0
    if estimator == "history":
        assert run.last_step.p_hat is not None  # the second step allocated from the first step's outcomes


def test_the_authors_rule_step_equals_the_suites_loss(tmp_path):
    """method=sera, one process: a dataset of B prompts makes each step an epoch, so the second step allocates
    from the first's outcomes by the active-set rule; its rows, advantages (MaxRL x n0 / n_i on the true groups) and
    gradient are checked as SERA's are."""
    check_step(trl_toy.one_step(tmp_path, "sera"), "sera")


def test_the_authors_rule_reads_the_beta_history_by_epoch_and_resumes(tmp_path):
    """Eight prompts, B = 4: steps 1-2 are epoch 0 (uniform, no estimate), steps 3-4 read the posterior means of epoch
    0's outcomes, (0.5 + successes) / (1 + rollouts), through the authors' rule; the history and the epoch count are
    saved with each checkpoint, and a run resumed from step 3 allocates step 4 from them. (Which prompts step 4 holds
    after a resume is TRL's sampler's business: it does not replay an epoch's shuffle, so they may differ.)"""
    from sera.allocation import active_waterline

    data = trl_toy.dataset(size=8)
    args = trl_toy.config(tmp_path, method="sera", max_steps=4, save_strategy="steps", save_steps=1,
                          remove_unused_columns=False)  # fmt: skip

    def train(resume=None):
        run = trl_toy.trainer(args, data)
        steps = trl_toy.recorded_steps(run)
        capture = trl_toy.Capture(run)
        run.train(resume_from_checkpoint=resume)
        return [(step, rows) for step, (_, rows) in zip(steps, capture.batches, strict=True)]

    steps = train()
    assert all((s.counts == trl_toy.N0).all() for s, _ in steps[:2])  # epoch 0: uniform
    successes, rollouts = np.zeros(8), np.zeros(8)
    for step, rows in steps[:2]:
        for reward, row in zip(step.rewards, rows, strict=True):
            successes[row["prompt_id"]] += reward
            rollouts[row["prompt_id"]] += 1
    assert (rollouts == trl_toy.N0).all()  # each prompt once in epoch 0

    def check_epoch_one(step, rows):
        ids = {int(g): row["prompt_id"] for g, row in zip(step.group, rows, strict=True)}
        assert len(ids) == np.count_nonzero(step.counts)
        groups = list(ids)
        expected = [(0.5 + successes[ids[g]]) / (1 + rollouts[ids[g]]) for g in groups]
        np.testing.assert_allclose(step.p_hat[groups], expected)
        np.testing.assert_array_equal(step.counts, active_waterline(step.p_hat, 4 * trl_toy.N0, 2, 4 * trl_toy.N0))

    for step, rows in steps[2:]:
        check_epoch_one(step, rows)
    assert any((s.counts != trl_toy.N0).any() for s, _ in steps[2:])
    saved = np.load(tmp_path / "checkpoint-3" / HISTORY_FILE)
    assert int(saved["generations"]) == 3 and int(saved["epoch"]) == 1
    (resumed,) = train(resume=str(tmp_path / "checkpoint-3"))
    check_epoch_one(*resumed)


def test_the_authors_rule_records_only_the_prompts_it_drew(tmp_path):
    """A prompt the active set leaves out gets no rollouts, and the Beta history adds each step's outcomes to the
    prompts that had them: after epoch 1 (steps 3-4, prompt 0 made hopeless from then on), each prompt's pending
    successes and failures are those of its rows in TRL's batches, and prompt 0 has none."""
    data = trl_toy.dataset(size=8)
    args = trl_toy.config(tmp_path, method="sera", max_steps=4, remove_unused_columns=False)
    run = trl_toy.trainer(args, data)
    steps, capture, history = trl_toy.recorded_steps(run), trl_toy.Capture(run), run._history
    estimate = history.estimate

    def hopeless_from_epoch_one(ids):
        p = estimate(ids)
        p[(np.asarray(ids) == 0) & (history.epoch >= 1)] = 1e-6  # P(a mixed group of 32) about 3e-5: left out
        return p

    history.estimate = hopeless_from_epoch_one
    run.train()
    successes, failures = np.zeros(8), np.zeros(8)
    for step, (_, rows) in zip(steps[2:], capture.batches[2:], strict=True):
        for reward, row in zip(step.rewards, rows, strict=True):
            successes[row["prompt_id"]] += reward
            failures[row["prompt_id"]] += 1 - reward
    assert [s.counts.size for s in steps[2:]] in ([3, 4], [4, 3])  # groups trained on: prompt 0 left out of its step
    assert successes[0] == failures[0] == 0
    np.testing.assert_array_equal(history.pending_successes, successes)
    np.testing.assert_array_equal(history.pending_failures, failures)


def test_extra_end_tokens_end_a_completion(tmp_path):
    """end_token_ids (what examples/trl_math.py passes for a config's model.eos_token, e.g. Qwen's <|im_end|>):
    generation stops at them and the completion mask ends at the first, as the suite's engines end a response."""
    trl_toy.check_end_token(
        trl_toy.completions_with_end_token(tmp_path / "end", end=True),
        trl_toy.completions_with_end_token(tmp_path / "plain", end=False),
    )


@pytest.mark.slow
def test_launch_script_takes_a_study_config(tmp_path):
    """--from-config: the math study's config (here its smoke scale) becomes the script's arguments (model, template,
    data, n0, B, learning rate, clip, response limit, steps, evaluation), later flags winning; one CPU step runs."""
    from examples.trl_math import from_config, main

    args = from_config(["scale=math/smoke", "method=sera_pilot", "seed=3"])
    assert args[args.index("--prompts") + 1] == "3" and args[args.index("--n0") + 1] == "16"
    assert args[args.index("--method") + 1] == "sera_pilot" and args[args.index("--seed") + 1] == "3"
    assert args[args.index("--train") + 1] == "chain_sum" and args[args.index("--loss-type") + 1] == "dapo"
    assert "--eos-tokens" not in args  # the tokenizer's end token, as the study's loop uses it
    qwen = from_config(["scale=math/paper_qwen3", "method=sera"])  # the config's end tokens, as its base run's
    assert qwen[qwen.index("--eos-tokens") + 1] == "<|im_end|>,<|endoftext|>"
    trainer = main(["--from-config", "scale=math/smoke", "method=maxrl", "--cpu", "--steps", "1",
                    "--output-dir", str(tmp_path), "--micro-rows", "16"])  # fmt: skip
    assert trainer.state.global_step == 1 and trainer.last_step.counts.sum() == 3 * 16
    assert (trainer.args.per_device_train_batch_size, trainer.args.gradient_accumulation_steps) == (16, 3)
    with pytest.raises(ValueError, match="48 rows a step do not split into micro-batches of 10 over 1 processes"):
        main(["--from-config", "scale=math/smoke", "method=maxrl", "--cpu", "--micro-rows", "10"])


def test_the_run_folder_route_evaluates_every_set_of_the_config(tmp_path, monkeypatch):
    """Tables 6 and 7 need BeyondAIME, AIME 2025, MATH-500 and OlympiadBench: a TRL run of the Qwen2.5-Math config
    written as the suite's run folder (--run-dir, what make reproduce-math SCALE=paper launches) records each of them,
    not the first alone, and generates the records' rollouts in calls as large as the config's."""
    import examples.trl_math as script
    from experiments.math.data import REGISTRY, local_path, write_jsonl

    sets = ["beyondaime", "aime2025", "math500", "olympiadbench"]
    for slug, count in [("simplerl-math35", 256), *[(name, 3) for name in sets]]:
        problems = [{"id": f"{slug}-{i}", "question": f"{i} + 1?", "answer": str(i + 1)} for i in range(count)]
        write_jsonl(problems, local_path(slug, REGISTRY[slug].split, tmp_path))
    overrides = ["scale=math/paper_qwen25math", "method=sera", f"data.dir={tmp_path}", f"run.root={tmp_path}"]
    cfg = script.compose(overrides)
    a = script.arguments([*script.from_config(overrides, cfg), "--run-dir", "auto"])
    assert a.record_max_rollouts == cfg.eval.max_rollouts_per_call == 65536
    monkeypatch.setattr(script, "suite_folder", lambda *args, **kwargs: None)  # no base run needed to read the sets
    _, _, train, evals = script.load(a, script.suite_run(overrides, a, cfg))
    assert list(evals) == sets and [len(v) for v in evals.values()] == [3, 3, 3, 3] and len(train) == 256


@pytest.mark.slow
def test_a_study_config_through_trl_is_a_run_folder_the_tables_read(tmp_path, capsys):
    """--from-config ... --run-dir auto (what `make reproduce-math SCALE=paper` launches): the TRL run starts from the
    study's base run and writes the suite's run folder beside it (config with trainer: trl, base.json, metrics,
    per-question records on the base's questions, DONE); the math tables read it as a TRL row; a finished run is
    skipped, an interrupted one resumes from TRL's checkpoint, and a TRL setting that is not the config's is refused."""
    import json

    import yaml

    from examples.trl_math import compose, main
    from experiments.math.train import run
    from paper_figures.math import main as tables
    from sera.runlog import BASE_FILE, DONE_FILE, METRICS_FILE, base_identity, eval_record_file

    study = ["scale=math/smoke", f"run.root={tmp_path}", "threads=1"]
    launch = ["--cpu"]
    with pytest.raises(FileNotFoundError, match="holds no finished base run; run it first"):
        main(["--from-config", *study, "method=maxrl", *launch, "--run-dir", "auto"])
    run(compose([*study, "method=maxrl", "run.base_only=true"]))
    root = tmp_path / "math-smoke" / "tiny-math-smoke"
    base = root / "base_seed-0"
    with pytest.raises(ValueError, match=r"would not run the config's method: \(config, TRL\) \{'n_max': \(64, 40\)"):
        main(["--from-config", *study, "method=sera", *launch, "--run-dir", "auto", "--n-max", "40"])
    for method, folder in [("maxrl", "maxrl-token-mean_n0-16_seed-0_trl"),
                           ("sera", "sera_authors-beta-token-mean_n0-16_seed-0_trl")]:  # fmt: skip
        trainer = main(["--from-config", *study, f"method={method}", *launch, "--run-dir", "auto"])
        path = root / folder
        assert trainer.state.global_step == 4 and (path / DONE_FILE).exists()
        assert [c.name for c in (path / "trainer").glob("checkpoint-*")] == ["checkpoint-4"]  # the last one kept
        assert trainer.args.vllm_importance_sampling_correction is False  # the suite's loss, with vLLM too
        assert not any("eval_reward" in log for log in trainer.state.log_history)  # the records evaluate, not TRL
        config = yaml.safe_load((path / "config.yaml").read_text())
        assert config["trainer"] == "trl" and config["method"]["name"] == method and config["trl"]["n0"] == 16
        assert json.loads((path / BASE_FILE).read_text()) == base_identity(base)
        base_record = json.loads((base / eval_record_file(3, "chain-sum")).read_text())
        for step in (2, 4):
            record = json.loads((path / eval_record_file(step, "chain-sum")).read_text())
            assert record["ids"] == base_record["ids"] and record["n"] == 8
        logged = [json.loads(line) for line in (path / METRICS_FILE).read_text().splitlines()]
        evaluations = [r for r in logged if "eval/chain-sum/pass@1" in r]
        assert [r["step"] for r in evaluations] == [2, 4]
        assert (
            json.loads((path / DONE_FILE).read_text())["eval/chain-sum/pass@8"]
            == evaluations[-1]["eval/chain-sum/pass@8"]
        )
    assert main(["--from-config", *study, "method=maxrl", *launch, "--run-dir", "auto"]) is None
    assert "holds this finished run: skipped" in capsys.readouterr().out
    tables(["--scale", "smoke", "--runs", str(tmp_path), "--out", str(tmp_path / "out")])
    table = (tmp_path / "out" / "math-smoke" / "table1.md").read_text()
    for label in ("MaxRL (token-mean, TRL)", "SERA (token-mean, TRL)"):
        assert f"| {label} | reproduced | 1 | 4 |" in table
    # an interrupted run (no DONE, a line logged after its last checkpoint) resumes from TRL's checkpoint-4
    path = root / "maxrl-token-mean_n0-16_seed-0_trl"
    (path / DONE_FILE).unlink()
    with (path / METRICS_FILE).open("a") as f:
        f.write(json.dumps({"step": 5, "loss": 0.0}) + "\n")
    trainer = main(["--from-config", *study, "method=maxrl", *launch, "--run-dir", "auto"])
    assert trainer.state.global_step == 4 and (path / DONE_FILE).exists()
    assert max(json.loads(line)["step"] for line in (path / METRICS_FILE).read_text().splitlines()) == 4


@pytest.mark.slow
def test_records_sample_a_whole_copy_of_an_fsdp2_sharded_policy(tmp_path):
    """sera.trl.policy_engine under FSDP2 (torchrun, gloo, two CPU processes): each rank evaluates its share of the
    questions with a whole copy of the sharded model built from the gathered state (the same weights), not with the
    sharded model, whose forward is a collective the other rank would not join; the records cover every question."""
    import json
    import subprocess

    from tests.test_lm import ROOT, TORCHRUN, TOY_ENV

    out = tmp_path / "records.json"
    subprocess.run([*TORCHRUN, "records", str(out), "fsdp2"], env=TOY_ENV, cwd=ROOT, check=True, timeout=300,
                   capture_output=True)  # fmt: skip
    result = json.loads(out.read_text())
    assert result["engine"] == "HFEngine" and result["copy"] and result["same"]
    assert result["records"]["pair"]["ids"] == [0, 1] and result["records"]["single"]["ids"] == [7]
    assert all(0 <= c <= 8 for c in result["records"]["pair"]["correct"]) and result["records"]["pair"]["n"] == 8


@pytest.mark.slow
def test_the_maze_through_trl_is_a_run_folder_the_tables_read(tmp_path):
    """examples/trl_maze.py (what the maze's paper scale launches), on the smoke scale with a pool of 6 mazes read in
    epochs: TRL's prompts are the study's token ids, the run starts from the study's base and writes the suite's run
    folder (config with trainer: trl, base.json, records of the held-out mazes, DONE), which the maze table reads as
    TRL rows; fresh mazes (no pool) and a missing base are refused before any work."""
    import json

    import yaml

    from examples.trl_maze import main
    from experiments.maze import task as maze
    from paper_figures.maze import main as tables
    from sera.runlog import BASE_FILE, DONE_FILE, base_identity, eval_record_file

    study = ["scale=maze/smoke", "task.pool_size=6", "task.pool_order=epoch", f"run.root={tmp_path}", "threads=1"]
    with pytest.raises(ValueError, match="needs a fixed pool"):
        main(["scale=maze/smoke", f"run.root={tmp_path}", "method=maxrl", "--cpu"])
    with pytest.raises(FileNotFoundError, match="holds no finished base run; run it first"):
        main([*study, "method=maxrl", "--cpu"])
    base_only = [sys.executable, "-m", "experiments.maze.train", *study, "method=maxrl", "run.base_only=true"]
    subprocess.run(base_only, check=True, capture_output=True, cwd=Path(__file__).parents[1])  # as make runs it
    (base,) = (tmp_path / "maze-smoke").glob("base_*")
    # a base restored from the archive holds its records, not its weights: refused, then trained again (and checked
    # against the archived records) by the base-only run with run.base_weights=true, as make's TRL target runs it
    from paper_figures.archive import restore, save

    save(tmp_path, tmp_path / "archive")
    shutil.rmtree(base)
    restore(tmp_path / "archive", tmp_path)
    with pytest.raises(FileNotFoundError, match="the archive's records of the base run, not its weights"):
        main([*study, "method=maxrl", "--cpu"])
    subprocess.run(
        [*base_only, "run.base_weights=true"], check=True, capture_output=True, cwd=Path(__file__).parents[1]
    )
    assert not (base / "ARCHIVED").exists() and (base / "config.json").exists()
    base_record = json.loads((base / eval_record_file(3, "heldout")).read_text())
    for method in ("maxrl", "sera"):
        trainer = main([*study, f"method={method}", "--cpu"])
        path = Path(trainer.args.output_dir).parent
        assert path.name.endswith("_seed-0_trl") and trainer.state.global_step == 4 and (path / DONE_FILE).exists()
        assert [c.name for c in (path / "trainer").glob("checkpoint-*")] == ["checkpoint-4"]  # the last one kept
        assert trainer.args.vllm_importance_sampling_correction is False  # the suite's loss, with vLLM too
        assert yaml.safe_load((path / "config.yaml").read_text())["trainer"] == "trl"
        assert json.loads((path / BASE_FILE).read_text()) == base_identity(base)
        record = json.loads((path / eval_record_file(4, "heldout")).read_text())
        assert record["ids"] == base_record["ids"] and record["n"] == 8
        first = trainer.train_dataset[0]
        grid = maze.MazeTask(maze.cells_for_grid(7), 3, 0, 6, "epoch", 3).train_grid(first["prompt_id"])
        assert trainer.processing_class(first["prompt"]).input_ids == maze.encode_prompt(grid)
    tables(["--scale", "smoke", "--runs", str(tmp_path), "--out", str(tmp_path / "out")])
    table = (tmp_path / "out" / "maze-smoke" / "table4.md").read_text()
    assert "| token-mean | MaxRL (TRL) | 1 | 4 |" in table and "| token-mean | SERA (TRL) | 1 | 4 |" in table
    # the finished runs restored from the archive beside their records-only base: skipped, not refused for the base
    save(tmp_path, tmp_path / "archive")
    shutil.rmtree(tmp_path / "maze-smoke")
    restore(tmp_path / "archive", tmp_path)
    assert (base / "ARCHIVED").exists() and main([*study, "method=maxrl", "--cpu"]) is None


@pytest.mark.parametrize("hopeless", [6, 2])
def test_the_trainer_logs_the_sink_and_warns_when_an_epoch_sinks(tmp_path, hopeless):
    """MaxRL on eight prompts (B = 4: two steps an epoch) of which `hopeless` can never be solved (no letter allowed)
    and the rest always are: from epoch 1 the monitor (sera.sink) logs the share of each step's rollouts on
    never-solved prompts, and at epoch 2's start the ended epoch's share; with 6 of 8 (75% of the uniform budget,
    more than half) the guard warns once, with 2 of 8 (25%) it stays quiet."""
    import warnings

    from datasets import Dataset

    from sera.sink import SinkWarning

    data = Dataset.from_dict({"prompt": ["abc", "bcd", "cde", "def", "efg", "fgh", "ghi", "hij"],
                              "allowed": [""] * hopeless + [trl_toy.LETTERS] * (8 - hopeless),
                              "prompt_id": list(range(8))})  # fmt: skip
    args = trl_toy.config(tmp_path, method="maxrl", max_steps=5, remove_unused_columns=False)
    run = trl_toy.trainer(args, data)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run.train()
    sinks = [w for w in caught if issubclass(w.category, SinkWarning)]
    logs = run.state.log_history
    shares = [x["alloc/unsolved_share"] for x in logs if "alloc/unsolved_share" in x]
    assert shares == [hopeless / 8] * 3  # steps 3-5 (epochs 1 and 2): uniform counts
    (ended,) = [x for x in logs if "sink/epoch_unsolved_share" in x]
    assert ended["sink/epoch_unsolved_share"] == hopeless / 8 and ended["pool/never_solved"] == hopeless / 8
    assert len(sinks) == (hopeless > 4) and ("sink/warned" in ended) == (hopeless > 4)
    if sinks:
        assert "epoch 1: 75% of the rollouts went to prompts never solved so far" in str(sinks[0].message)


def test_the_trl_routes_refuse_the_sink_interventions_they_do_not_apply(tmp_path):
    """alloc.never_solved, alloc.uniform_epochs and alloc.weight_cap are the suite's loop's (results/cpu/PLAN_SINK.md):
    the TRL routes refuse them before any work instead of recording a run under a setting they never applied."""
    from examples.trl_math import from_config
    from examples.trl_maze import main

    with pytest.raises(ValueError, match=r"alloc.weight_cap=2.0: the sink's interventions run in the suite's own"):
        from_config(["scale=math/smoke", "method=sera", "alloc.weight_cap=2"])
    pool = ["scale=maze/smoke", "task.pool_size=6", "task.pool_order=epoch", f"run.root={tmp_path}", "method=sera"]
    with pytest.raises(ValueError, match="alloc.never_solved=leave_out, alloc.uniform_epochs=3: the sink's"):
        main([*pool, "alloc.never_solved=leave_out", "alloc.uniform_epochs=3", "--cpu"])
    assert not any(tmp_path.iterdir())  # refused before any work
