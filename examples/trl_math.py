"""SERA (or MaxRL) through TRL on math problems: the launch script for several GPUs of README "SERA inside TRL".

    # CPU check (the test runs it): a random tiny model on generated chain sums, one step, seconds
    .venv/bin/python -m examples.trl_math --model tiny-math-smoke --template plain --train chain_sum --prompts 2 \
        --n0 8 --method sera_pilot --pilot-m 4 --max-completion-length 16 --steps 1 --cpu
    # 8 GPUs, DeepSpeed ZeRO-3 (TRL ships the accelerate config), transformers generation (not run here)
    CONFIGS="$(python -c 'import trl, os; print(os.path.dirname(trl.__file__))')/accelerate_configs"
    accelerate launch --config_file "$CONFIGS/zero3.yaml" --num_processes 8 -m examples.trl_math \
        --model Qwen/Qwen2.5-Math-1.5B --template qwen_math --train gsm8k --bf16

The problems come from the math study (`experiments/math/data.py`: a registry slug such as gsm8k kept locally, a
.jsonl/.parquet file, or a generated family such as chain_sum); the reward is its grading (math-verify on the last
\\boxed{}, 0 for a completion cut at the length limit). `--vllm server` generates on a `trl vllm-serve` process,
`--vllm colocate` inside each training process (on the CPU in .venv-vllm, `make install-vllm`: a from-scratch model is
saved under --output-dir first, since vLLM loads a model by its path). `--eval-problems N --eval-every K` evaluates
N held-out problems every K steps (mean reward of --n0 samples each, MaxRL's loss on TRL's uniform groups),
`--save-every K` checkpoints and `--resume` continues from the last checkpoint in --output-dir (SERA's historical
p_hat included), `--report-to wandb` logs there. Settings not given here are GRPOConfig's; the defaults below are the
MaxRL authors' Qwen settings where the SERA paper is silent (docs/design.md section 5).
"""

from __future__ import annotations

import argparse
import os
import tempfile

from experiments.math.data import load_dataset_spec
from experiments.math.generated import FAMILIES, make_splits
from experiments.math.grading import score_batch
from experiments.math.model import FROM_SCRATCH, build_from_scratch, build_tokenizer
from experiments.math.prompts import TEMPLATES, render
from sera.trl import METHODS, SERAGRPOConfig, SERAGRPOTrainer, activation_checkpointing


def arguments(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="hub id or local directory; or tiny-math / tiny-math-smoke (random)")
    p.add_argument("--template", default="chat", choices=sorted(TEMPLATES), help="the prompt (experiments/math)")
    p.add_argument("--train", default="gsm8k", help="registry slug, .jsonl/.parquet file, or generated family")
    p.add_argument("--num-train", type=int, default=1024, help="problems of a generated family")
    p.add_argument("--method", default="sera", choices=METHODS)
    p.add_argument(
        "--estimator",
        default=None,
        choices=["beta", "pilot", "history"],
        help="p_hat: beta (sera, the default) | pilot (sera_pilot's default) | history (sera_pilot)",
    )
    p.add_argument("--pilot-m", type=int, default=None, help="sera_pilot: pilots per prompt (default 8 with pilot)")
    p.add_argument("--n0", type=int, default=16, help="num_generations: rollouts per prompt on average")
    p.add_argument("--prompts", type=int, default=256, help="B prompts a step, over all processes")
    p.add_argument("--grad-accum", type=int, default=1, help="micro-batches a step on each process")
    p.add_argument("--loss-type", default="dapo", help="dapo (token-mean) | dr_grpo (seqnorm) | sera.trl's others")
    p.add_argument("--lr", type=float, default=1e-6)
    p.add_argument("--grad-clip", type=float, default=0.3)
    p.add_argument("--max-completion-length", type=int, default=4096)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--vllm", default="none", choices=["none", "server", "colocate"])
    p.add_argument("--bf16", action="store_true")
    p.add_argument("--cpu", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output-dir", default=os.path.join(tempfile.gettempdir(), "sera-trl-math"))
    p.add_argument("--report-to", default="none", help="none, or TRL's integrations, comma-separated (e.g. wandb)")
    p.add_argument("--eval", default=None, help="held-out problems: registry slug or file (default: the --train "
                   "family's held-out pool, for a generated family)")  # fmt: skip
    p.add_argument("--eval-problems", type=int, default=0, help="held-out problems evaluated (0: no evaluation)")
    p.add_argument("--eval-every", type=int, default=100, help="steps between evaluations")
    p.add_argument("--save-every", type=int, default=None, help="steps between checkpoints (default: no checkpoints)")
    p.add_argument(
        "--records",
        default=None,
        help="write the suite's per-question records of the held-out problems "
        "here (eval_step<N>_heldout.json) every --eval-every steps and at the end",
    )
    p.add_argument("--record-samples", type=int, default=64, help="samples a held-out question for the records")
    p.add_argument("--resume", action="store_true", help="continue from the last checkpoint in --output-dir")
    return p.parse_args(argv)


def load(a) -> tuple:
    """(model or hub id or path, tokenizer or None, training problems, held-out problems)."""
    if a.train in FAMILIES:
        problems, heldout = make_splits(a.train, a.num_train, a.eval_problems if a.eval is None else 0, a.seed)
    else:
        problems, heldout = load_dataset_spec(a.train), []  # FileNotFoundError naming file and hub dataset if missing
    if a.eval is not None:
        heldout = load_dataset_spec(a.eval)[: a.eval_problems]
    elif a.eval_problems and a.train not in FAMILIES:
        raise ValueError("--eval-problems needs --eval (held-out problems) unless --train is a generated family")
    if a.model in FROM_SCRATCH:
        model, tokenizer = build_from_scratch(a.model), build_tokenizer()
        if a.vllm != "none":  # vLLM loads the model by its path
            path = os.path.join(a.output_dir, "initial-model")
            model.save_pretrained(path)
            tokenizer.save_pretrained(path)
            model = path
        return model, tokenizer, problems, heldout
    return a.model, None, problems, heldout


def from_config(overrides: list[str]) -> list[str]:
    """This script's arguments for a math study config (`configs/math.yaml` with Hydra overrides, e.g.
    scale=math/paper_qwen25math method=sera seed=0): the model, template, data, n0, B, the learning rate, gradient
    clip, response limit, temperature, steps and evaluation the config sets, so that `make reproduce-math SCALE=paper`
    runs the recipe through TRL. Settings TRL keeps its own way (the optimizer's betas, warm-up) are GRPOConfig's."""
    from pathlib import Path

    from hydra import compose, initialize_config_dir

    from experiments.math.model import PRETRAINED

    configs = Path(__file__).resolve().parents[1] / "configs"
    with initialize_config_dir(config_dir=str(configs), version_base=None):
        cfg = compose(config_name="math", overrides=overrides)
    model, data = cfg.model, cfg.data
    name = model.path or (PRETRAINED[model.name].hub if model.name in PRETRAINED else model.name)
    args = ["--model", str(name), "--template", cfg.template, "--method", cfg.method.name, "--n0", str(cfg.n0),
            "--prompts", str(cfg.train.batch_size), "--lr", str(cfg.optim.lr), "--grad-clip", str(cfg.optim.grad_clip),
            "--max-completion-length", str(cfg.max_new_tokens), "--temperature", str(cfg.temperature),
            "--steps", str(cfg.train.steps), "--seed", str(cfg.seed), "--eval-every", str(cfg.eval.every),
            "--loss-type", {"token-mean": "dapo", "seqnorm": "dr_grpo"}[cfg.method.aggregation]]  # fmt: skip
    if data.family is not None:
        args += ["--train", data.family, "--num-train", str(data.num_train), "--eval-problems", str(data.num_heldout)]
    else:
        (eval_set, *others) = list(data.eval.values())
        if others:
            print(f"evaluating the first evaluation set only ({eval_set}); TRL takes one held-out set")
        args += ["--train", str(data.train), "--eval", str(eval_set)]
        args += ["--eval-problems", str(data.eval_limit or 500)]
    if cfg.get("engine") == "vllm":
        args += ["--vllm", "colocate"]
    if model.dtype == "bfloat16":
        args += ["--bf16"]
    return args


def main(argv=None) -> SERAGRPOTrainer:
    from datasets import Dataset

    argv = list(argv) if argv is not None else None
    if argv is not None and "--from-config" in argv:  # the rest: config overrides, then this script's own flags
        at = argv.index("--from-config")
        rest = argv[at + 1 :]
        own = next((i for i, x in enumerate(rest) if x.startswith("--")), len(rest))
        argv = argv[:at] + from_config(rest[:own]) + rest[own:]
    a = arguments(argv)
    processes = int(os.environ.get("WORLD_SIZE", 1))
    rows, rest = divmod(a.prompts * a.n0, processes * a.grad_accum)
    if rest:
        raise ValueError(f"B x n0 = {a.prompts} x {a.n0} rows must split evenly over {processes} x {a.grad_accum}")
    model, tokenizer, problems, heldout = load(a)
    if tokenizer is None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model)
    logits_gb = rows * a.max_completion_length * len(tokenizer) * (2 if a.bf16 else 4) / 1e9
    print(
        f"{rows} rows a device micro-batch: their logits take about {logits_gb:.1f} GB (B x n0 = "
        f"{a.prompts} x {a.n0} over {processes} processes x {a.grad_accum} micro-batches)"
    )

    def dataset(rows: list[dict]):
        return Dataset.from_dict(
            {
                "prompt": [render(a.template, p["question"], tokenizer) for p in rows],
                "answer": [p["answer"] for p in rows],
                "prompt_id": [p["id"] for p in rows],
            }
        )

    def math_verify(completions, answer, completion_ids, **kwargs):
        cut = [len(ids) >= a.max_completion_length and ids[-1] != tokenizer.eos_token_id for ids in completion_ids]
        return score_batch(completions, answer, cut).tolist()

    args = SERAGRPOConfig(
        output_dir=a.output_dir, method=a.method, estimator=a.estimator, pilot_m=a.pilot_m, num_generations=a.n0,
        per_device_train_batch_size=rows, gradient_accumulation_steps=a.grad_accum, loss_type=a.loss_type,
        learning_rate=a.lr, lr_scheduler_type="constant", weight_decay=0.01, max_grad_norm=a.grad_clip,
        max_completion_length=a.max_completion_length, temperature=a.temperature, max_steps=a.steps, beta=0.0,
        use_vllm=a.vllm != "none", vllm_mode=a.vllm if a.vllm != "none" else "colocate", bf16=a.bf16,
        use_cpu=a.cpu, seed=a.seed, report_to=[] if a.report_to == "none" else a.report_to.split(","),
        logging_steps=1, remove_unused_columns=False, **activation_checkpointing(not a.cpu), **evaluation(a, heldout),
        save_strategy="steps" if a.save_every else "no", save_steps=a.save_every or 500,
    )  # fmt: skip
    callbacks = []
    if a.records:
        if not heldout:
            raise ValueError("--records needs held-out problems: --eval-problems (and --eval for a registry set)")
        from experiments.math.task import MathTask
        from sera.trl import RecordsCallback

        eos = tokenizer.eos_token_id
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
        task = MathTask(tokenizer, a.template, (problems, {"heldout": heldout}, []), a.prompts, a.seed, eos, pad)
        ks = [k for k in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512) if k <= a.record_samples]
        callbacks.append(RecordsCallback(a.records, task, every=a.eval_every, samples=a.record_samples, ks=ks,
                                         max_new_tokens=a.max_completion_length, temperature=a.temperature,
                                         seed=a.seed))  # fmt: skip
    trainer = SERAGRPOTrainer(
        model=model, reward_funcs=math_verify, args=args, train_dataset=dataset(problems),
        eval_dataset=dataset(heldout) if heldout else None, processing_class=tokenizer, callbacks=callbacks,
    )  # fmt: skip
    trainer.train(resume_from_checkpoint=True if a.resume else None)
    return trainer


def evaluation(a, heldout: list) -> dict:
    """GRPOConfig's evaluation settings: every --eval-every steps on the held-out problems, --n0 samples each."""
    if not heldout:
        return {}
    rows, rest = divmod(len(heldout) * a.n0, int(os.environ.get("WORLD_SIZE", 1)))
    if rest:
        raise ValueError(f"{len(heldout)} held-out problems x {a.n0} samples must split evenly over the processes")
    return dict(eval_strategy="steps", eval_steps=a.eval_every, per_device_eval_batch_size=rows,
                num_generations_eval=a.n0)  # fmt: skip


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
