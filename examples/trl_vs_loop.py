"""SERA through TRL (`sera.trl.SERAGRPOTrainer`) against the suite's own LM loop, on the math CPU task.

    .venv/bin/python -m examples.trl_vs_loop                  # the comparison README quotes (one thread)
    .venv/bin/python -m examples.trl_vs_loop --scale smoke --steps 2 --trl-seeds 0   # seconds: the test's version
    .venv/bin/python -m examples.trl_vs_loop --trl-seeds 0 --estimators pilot,history   # pilots or the history

Both start from the same tiny-math base model (the suite's SFT on generated two-term chain sums, trained once into
the run root) and train SERA with the same settings, read from the math study's config: B problems x n0 rollouts a
step, 8 pilots inside the budget, the waterline, MaxRL's advantage with the n0 / n_i weight, token-mean loss (TRL's
`dapo`), AdamW with the same learning rate, betas, warmup and gradient clipping, temperature 1. The suite's loop runs
through its entry point (`experiments.math.train`, which also trains the base model); the TRL runs train from that
base checkpoint on the same training problems with the same reward (math-verify). Every model is then evaluated by
the suite's evaluator on the same held-out problems. What cannot be the same: the random streams (TRL shuffles the
prompts with its RepeatSampler and samples with `model.generate`; the loop draws its own epoch order and samples
with its KV-cache engine), and TRL's warmup starts one step lower (lr x k / warmup for k = 0, 1, ...). So TRL runs
with two seeds from the same base model: their difference is the yardstick for the TRL-minus-loop difference.
Prints Pass@K of each model and the differences with a question-paired 95% bootstrap interval.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from pathlib import Path

import numpy as np
import torch
from hydra import compose, initialize_config_dir

from experiments.math.grading import score_batch
from experiments.math.model import EOS_ID, PAD_ID, build_tokenizer
from experiments.math.prompts import render
from experiments.math.task import MathTask
from experiments.math.train import STUDY, load_problems, run
from sera.lm_loop import LoopSettings, evaluate
from sera.methods import MethodSettings
from sera.passk import pass_at_k
from sera.rollout import HFEngine
from sera.runlog import eval_record_file
from sera.stats import paired_bootstrap_ci
from sera.threads import set_torch_threads

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
LOSS_TYPE = {"token-mean": "dapo", "seqnorm": "dr_grpo"}  # the suite's aggregation -> TRL's loss type (sera.trl)


def math_config(scale: str, root: Path, steps: int | None, seed: int, extra: list[str]):
    """The math study's config for one SERA run of the suite's loop (evaluated once, at the end)."""
    overrides = [f"scale=math/{scale}", "method=sera_pilot", f"seed={seed}", f"run.root={root}", "threads=1",
                 "run.if_finished=skip", "progress=false", *extra]  # fmt: skip
    if steps is not None:
        overrides.append(f"train.steps={steps}")
    with initialize_config_dir(config_dir=str(CONFIGS), version_base=None):
        cfg = compose(config_name="math", overrides=overrides)
    cfg.eval.every = int(cfg.train.steps)
    return cfg


def base_dir(cfg) -> Path:
    return Path(cfg.run.root) / f"{cfg.experiment}-{cfg.scale_name}" / cfg.model.name / f"base_seed-{cfg.seed}"


@contextlib.contextmanager
def counting_generations():
    """Count GRPOTrainer._generate calls (one generation round each: SERA's pilots, the rest, or both at once)."""
    from trl import GRPOTrainer

    calls, generate = [], GRPOTrainer._generate

    def counted(self, prompts):
        calls.append(len(prompts))
        return generate(self, prompts)

    GRPOTrainer._generate = counted
    try:
        yield calls
    finally:
        GRPOTrainer._generate = generate


def trl_run(cfg, base: Path, out_dir: Path, estimator: str = "pilot") -> dict:
    """SERAGRPOTrainer from the base checkpoint `base` with the run config's settings and p_hat from pilots or from
    each problem's last success rate (`estimator=history`: no pilot round); its held-out record."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM

    from sera.trl import SERAGRPOConfig, SERAGRPOTrainer

    settings = MethodSettings.from_config(cfg, STUDY)
    loop = LoopSettings.from_config(cfg)
    tokenizer = build_tokenizer()
    problems = load_problems(cfg)
    train = problems[0]
    dataset = Dataset.from_dict(
        {
            "prompt": [render(cfg.template, p["question"], tokenizer) for p in train],
            "answer": [p["answer"] for p in train],
            "prompt_id": [p["id"] for p in train],
        }
    )
    pilots = {"pilot_m": settings.pilot_m} if estimator == "pilot" else {"pilot_m": 0, "estimator": "history"}

    def math_verify(completions, answer, completion_ids, **kwargs):
        """The suite's reward: math-verify of the last \\boxed{}; a completion cut at the length limit scores 0."""
        return score_batch(completions, answer, [EOS_ID not in ids for ids in completion_ids]).tolist()

    torch.manual_seed(cfg.seed)
    model = AutoModelForCausalLM.from_pretrained(base)
    args = SERAGRPOConfig(
        output_dir=str(out_dir / "trainer"), method="sera_pilot", **pilots, n_max=settings.n_max,
        num_generations=cfg.n0, per_device_train_batch_size=loop.batch_size * cfg.n0,
        loss_type=LOSS_TYPE[settings.aggregation], max_completion_length=loop.max_new_tokens,
        temperature=loop.temperature, top_p=loop.top_p, max_steps=loop.steps, learning_rate=loop.lr,
        adam_beta1=loop.betas[0], adam_beta2=loop.betas[1], adam_epsilon=loop.eps, weight_decay=loop.weight_decay,
        warmup_steps=loop.warmup_steps, lr_scheduler_type="constant_with_warmup", max_grad_norm=loop.grad_clip,
        seed=cfg.seed, use_cpu=True, bf16=False, activation_checkpointing=False, report_to=[], save_strategy="no",
        logging_steps=max(1, loop.steps // 10), disable_tqdm=True, dataloader_num_workers=0,
    )  # fmt: skip
    trainer = SERAGRPOTrainer(
        model=model, reward_funcs=math_verify, args=args, train_dataset=dataset, processing_class=tokenizer
    )
    started = time.perf_counter()
    with counting_generations() as calls:
        trainer.train()
    train_s = time.perf_counter() - started
    task = MathTask(tokenizer, cfg.template, problems, loop.batch_size, cfg.seed, EOS_ID, PAD_ID)
    engine = HFEngine(trainer.model, EOS_ID, PAD_ID, loop.temperature)
    metrics, records = evaluate(loop, task, engine, torch.Generator().manual_seed(cfg.seed))
    result = {"metrics": metrics, "records": records, "train_s": train_s, "log": trainer.state.log_history,
              "estimator": estimator, "generation_calls": len(calls), "steps": loop.steps}  # fmt: skip
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "result.json").write_text(json.dumps(result, default=float) + "\n")
    return result


def loop_record(cfg, final: dict) -> dict:
    """The suite run's held-out record at its last step (what run() wrote)."""
    method = MethodSettings.from_config(cfg, STUDY)
    name = f"{method.method.folder_name}-{method.aggregation}_n0-{cfg.n0}_seed-{cfg.seed}"
    path = Path(cfg.run.root) / f"{cfg.experiment}-{cfg.scale_name}" / cfg.model.name / name
    (record_name,) = [key.split("/")[1] for key in final if key.endswith("/pass@1")]
    return json.loads((path / eval_record_file(int(cfg.train.steps), record_name)).read_text())


def per_question(record: dict, ks) -> np.ndarray:
    """(Q, K) Pass@k of each held-out question."""
    return pass_at_k(record["n"], np.asarray(record["correct"]), ks)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--scale",
        default="cpu_earlier",
        help="configs/scale/math/<scale>.yaml: cpu_earlier (what README quotes) | cpu | smoke",
    )
    parser.add_argument("--steps", type=int, default=100, help="RL steps (null: the scale's)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the base model and of the suite's loop")
    parser.add_argument("--trl-seeds", default="0,1", help="seeds of the TRL runs, from the same base model")
    parser.add_argument("--estimators", default="pilot", help="SERA's p_hat in the TRL runs: pilot, history or both "
                        "(pilot,history: one generation round a step against two)")  # fmt: skip
    parser.add_argument("--samples", type=int, default=64, help="evaluation samples a held-out problem")
    parser.add_argument("--root", default="runs/trl-vs-loop", help="where the base model and the runs go")
    parser.add_argument("override", nargs="*", help="more math config overrides, e.g. train.batch_size=16")
    a = parser.parse_args(argv)
    set_torch_threads(1)
    root = Path(a.root)
    cfg = math_config(a.scale, root, a.steps, a.seed, [f"eval.samples={a.samples}", *a.override])
    cfg.eval.ks = [k for k in cfg.eval.ks if k <= a.samples]
    ks = list(cfg.eval.ks)
    started = time.perf_counter()
    final = run(cfg)  # the base model (trained once) and the suite's SERA run, evaluated at the end
    loop_s = time.perf_counter() - started
    rows = {f"suite loop, seed {a.seed}": per_question(loop_record(cfg, final), ks)}
    base = base_dir(cfg)
    costs, trl_names = {}, {}  # trl_names: (estimator, seed) -> the run's row name
    for estimator in a.estimators.split(","):
        for seed in [int(s) for s in a.trl_seeds.split(",")]:
            cfg.seed = seed  # the TRL run's own seed (prompt order, sampling); its base model is the loop's
            folder = f"seed-{seed}" if estimator == "pilot" else f"{estimator}_seed-{seed}"
            result = trl_run(cfg, base, root / "trl" / folder, estimator)
            name = f"SERAGRPOTrainer, seed {seed}" + ("" if estimator == "pilot" else f", p_hat {estimator}")
            trl_names[estimator, seed] = name
            rows[name] = per_question(next(iter(result["records"].values())), ks)
            costs[name] = (result["train_s"] / result["steps"], result["generation_calls"] / result["steps"])
    summary = json.loads((base / "DONE").read_text())
    print(f"\nSERA, {cfg.train.batch_size} problems x n0 = {cfg.n0}, {cfg.train.steps} steps, held-out Pass@k in %:")
    print("| model | " + " | ".join(f"Pass@{k}" for k in ks) + " |")
    print("|---" * (len(ks) + 1) + "|")
    base_row = [next(v for key, v in summary.items() if key.endswith(f"/pass@{k}")) for k in ks]
    print("| base model | " + " | ".join(f"{100 * v:.2f}" for v in base_row) + " |")
    for name, scores in rows.items():
        print(f"| {name} | " + " | ".join(f"{100 * v:.2f}" for v in scores.mean(axis=0)) + " |")
    loop_name = next(iter(rows))
    pairs = [(trl, loop_name) for trl in trl_names.values()]  # each TRL run minus the loop
    pilot_runs = [name for (estimator, _), name in trl_names.items() if estimator == "pilot"]
    pairs += [(pilot_runs[1], pilot_runs[0])] if len(pilot_runs) > 1 else []  # TRL's seed-to-seed spread
    pairs += [
        (name, trl_names["pilot", seed])
        for (estimator, seed), name in trl_names.items()
        if estimator != "pilot" and ("pilot", seed) in trl_names
    ]  # another p_hat minus the pilots, seed by seed
    print("\nDifferences, pp [question-paired 95% bootstrap over the held-out problems]:")
    print("| difference | " + " | ".join(f"Pass@{k}" for k in ks) + " |")
    print("|---" * (len(ks) + 1) + "|")
    for a_name, b_name in pairs:
        ci = paired_bootstrap_ci(rows[a_name], rows[b_name])
        cells = [f"{100 * d:+.2f} [{100 * lo:+.2f}, {100 * hi:+.2f}]" for d, lo, hi in zip(*ci, strict=True)]
        print(f"| {a_name} minus {b_name} | " + " | ".join(cells) + " |")
    print(f"\nWall time: the suite's loop {loop_s:.0f} s (with its evaluation, and the base model if new)")
    print("| TRL run | training s a step | generation rounds a step |\n|---|---|---|")
    for name, (seconds, rounds) in costs.items():
        print(f"| {name} | {seconds:.2f} | {rounds:.2f} |")


if __name__ == "__main__":
    main()
