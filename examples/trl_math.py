"""SERA (or MaxRL) through TRL on math problems: the launch script for several GPUs of README "SERA inside TRL".

    # CPU check (the test runs it): a random tiny model on generated chain sums, one step, seconds
    .venv/bin/python -m examples.trl_math --model tiny-math-smoke --template plain --train chain_sum --prompts 2 \
        --n0 8 --method sera_pilot --pilot-m 4 --max-completion-length 16 --steps 1 --cpu
    # 8 GPUs, a study config (what make reproduce-math SCALE=paper launches; not run here): the recipe's settings,
    # 4 rows a device micro-batch, written as the suite's run folder that the tables read
    accelerate launch --config_file configs/accelerate/zero3.yaml --num_processes 8 -m examples.trl_math \
        --from-config scale=math/paper_qwen3 method=sera seed=0 --micro-rows 4 --run-dir auto

The problems come from the math study (`experiments/math/data.py`: a registry slug such as gsm8k kept locally, a
.jsonl/.parquet file, or a generated family such as chain_sum); the reward is its grading (math-verify on the last
\\boxed{}, 0 for a completion cut at the length limit). `--vllm server` generates on a `trl vllm-serve` process,
`--vllm colocate` inside each training process (on the CPU in .venv-vllm, `make install-vllm`: a from-scratch model is
saved under --output-dir first, since vLLM loads a model by its path). `--eval-problems N --eval-every K` evaluates
N held-out problems every K steps (mean reward of --n0 samples each, MaxRL's loss on TRL's uniform groups),
`--save-every K` checkpoints (the last one kept) and `--resume` continues from it in --output-dir (SERA's historical
p_hat included), `--report-to wandb` logs there. `--from-config OVERRIDES` takes a study config's settings
(`from_config`); with `--run-dir auto` the run starts from the study's base run and is written as the suite's run
folder beside it (`suite_folder`, sera.trl.RunFolderCallback), evaluated by the per-question records only. Settings
not given here are GRPOConfig's; the defaults below are the MaxRL authors' Qwen settings where the SERA paper is
silent (docs/design.md section 5).
"""

from __future__ import annotations

import argparse
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from experiments.math.data import load_dataset_spec
from experiments.math.generated import FAMILIES, make_splits
from experiments.math.grading import score_batch
from experiments.math.model import FROM_SCRATCH, build_from_scratch, build_tokenizer
from experiments.math.prompts import TEMPLATES, render
from sera.compat import activation_checkpointing
from sera.distributed import PROCESS_GROUP_TIMEOUT_S
from sera.trl import METHODS, SERAGRPOConfig, SERAGRPOTrainer

# TRL settings both launch scripts give SERAGRPOConfig: the suite's loss on vLLM's samples, as its own loop computes
# it (TRL's default multiplies each completion's loss by an importance-sampling factor), the last checkpoint only
# (TRL keeps every one by default), and the process group's timeout (TrainingArguments' default, 30 minutes, would
# abort a run whose ranks drift further apart in the records' evaluation: sera.distributed.PROCESS_GROUP_TIMEOUT_S)
SUITE_TRL_SETTINGS = dict(
    vllm_importance_sampling_correction=False, save_total_limit=1, ddp_timeout=PROCESS_GROUP_TIMEOUT_S
)


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
    p.add_argument("--n-min", type=int, default=None, help="fewest rollouts of a prompt (SERAGRPOConfig's default)")
    p.add_argument("--n-max", type=int, default=None, help="most rollouts of a prompt (SERAGRPOConfig's default)")
    p.add_argument("--active-threshold", type=float, default=None, help="sera: the active set's threshold")
    p.add_argument("--n0", type=int, default=16, help="num_generations: rollouts per prompt on average")
    p.add_argument("--prompts", type=int, default=256, help="B prompts a step, over all processes")
    p.add_argument("--grad-accum", type=int, default=1, help="micro-batches a step on each process")
    p.add_argument("--micro-rows", type=int, default=None, help="rows of a device micro-batch: sets --grad-accum to "
                   "B x n0 / (processes x N)")  # fmt: skip
    p.add_argument("--loss-type", default="dapo", help="dapo (token-mean) | dr_grpo (seqnorm) | sera.trl's others")
    p.add_argument("--lr", type=float, default=1e-6)
    p.add_argument("--grad-clip", type=float, default=0.3)
    p.add_argument("--max-completion-length", type=int, default=4096)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--vllm", default="none", choices=["none", "server", "colocate"])
    p.add_argument("--bf16", action="store_true")
    p.add_argument(
        "--eos-tokens",
        default=None,
        help="tokens that end a completion, comma-separated (default: the "
        "model's and the tokenizer's; e.g. <|im_end|>,<|endoftext|> for a Qwen base model with qwen_math)",
    )
    p.add_argument("--cpu", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output-dir", default=None, help="TRL's checkpoints (default: <run folder>/trainer with "
                   "--run-dir, else a temporary folder)")  # fmt: skip
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
    p.add_argument("--record-ks", default=None, help="the K of the records' Pass@K, comma-separated (default: the "
                   "powers of 2 up to --record-samples)")  # fmt: skip
    p.add_argument("--eval-name", default="heldout", help="the held-out set's name in the records' file names")
    p.add_argument("--eval-temperature", type=float, default=None, help="the records' sampling (default --temperature)")
    p.add_argument("--eval-top-p", type=float, default=1.0, help="the records' nucleus sampling (1: off)")
    p.add_argument("--record-max-rollouts", type=int, default=1024, help="the records' rollouts a generation call "
                   "(eval.max_rollouts_per_call; at 512 samples the default gives vLLM 2 questions)")  # fmt: skip
    p.add_argument(
        "--run-dir",
        default=None,
        help="with --from-config: write the run as the suite's run folder here (config.yaml, metrics.jsonl, "
        "base.json, per-question records, DONE), the folder the tables read; 'auto' = the one the study would use "
        "(runs/<study>-<scale>/<model>/<run name>_trl); a finished run there is skipped",
    )
    p.add_argument("--resume", action="store_true", help="continue from the last checkpoint in --output-dir")
    return p.parse_args(argv)


def load(a, suite=None) -> tuple:
    """(model or hub id or path, tokenizer or None, training problems, {evaluation set: held-out problems}). `suite`:
    a SuiteRun, whose problems (the study's own, every evaluation set of its config, so records pair with the base
    run's by question id) and base model are used; without one, the one set --eval (or the family's pool) names."""
    if suite is not None:
        problems, heldout = suite.problems, []
    elif a.train in FAMILIES:
        problems, heldout = make_splits(a.train, a.num_train, a.eval_problems if a.eval is None else 0, a.seed)
    else:
        problems, heldout = load_dataset_spec(a.train), []  # FileNotFoundError naming file and hub dataset if missing
    if suite is None and a.eval is not None:
        heldout = load_dataset_spec(a.eval)[: a.eval_problems]
    elif suite is None and a.eval_problems and a.train not in FAMILIES:
        raise ValueError("--eval-problems needs --eval (held-out problems) unless --train is a generated family")
    evals = suite.evals if suite is not None else ({a.eval_name: heldout} if heldout else {})
    if a.model in FROM_SCRATCH:
        if suite is not None:  # RL starts from the study's SFT base model, saved in its folder
            from transformers import AutoModelForCausalLM

            model, tokenizer = AutoModelForCausalLM.from_pretrained(suite.folder.base), build_tokenizer()
            return (str(suite.folder.base) if a.vllm != "none" else model), tokenizer, problems, evals
        model, tokenizer = build_from_scratch(a.model), build_tokenizer()
        if a.vllm != "none":  # vLLM loads the model by its path
            path = os.path.join(a.output_dir, "initial-model")
            model.save_pretrained(path)
            tokenizer.save_pretrained(path)
            model = path
        return model, tokenizer, problems, evals
    return a.model, None, problems, evals


def compose(overrides: list[str], study: str = "math"):
    """A study's config (`configs/<study>.yaml`) with Hydra overrides."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    configs = Path(__file__).resolve().parents[1] / "configs"
    with initialize_config_dir(config_dir=str(configs), version_base=None):
        return hydra_compose(config_name=study, overrides=list(overrides))


def study_default(overrides: list[str], study: str = "math") -> dict:
    """The config a study's run names compare with: its scale and method, no other override (sera.identity)."""
    from omegaconf import OmegaConf

    chosen = [o for o in overrides if o.split("=")[0] in ("scale", "method")]
    return OmegaConf.to_container(compose(chosen, study), resolve=True)


def recorded_config(cfg, a: argparse.Namespace) -> dict:
    """What a TRL run of a study config records: the study's config, trainer: trl, and this script's arguments (not
    where it writes)."""
    from omegaconf import OmegaConf

    unrecorded = {"output_dir", "records", "resume", "run_dir", "report_to"}
    script = {k: v for k, v in sorted(vars(a).items()) if k not in unrecorded}
    return {**OmegaConf.to_container(cfg, resolve=True), "trainer": "trl", "trl": script}


def require_base(base: Path, command: str, weights: bool) -> None:
    """Refuse, before any work, a base run that is not finished or, where the run starts from its weights (`weights`),
    one restored from the archive with its records only."""
    from sera.runlog import ARCHIVED_FILE, DONE_FILE

    if not (base / DONE_FILE).exists():
        raise FileNotFoundError(f"{base} holds no finished base run; run it first: {command}")
    if weights and (base / ARCHIVED_FILE).exists():
        raise FileNotFoundError(f"{base} holds the archive's records of the base run, not its weights; train it again "
                                f"(checked against the records): {command} run.base_weights=true")  # fmt: skip


def from_config(overrides: list[str], cfg=None) -> list[str]:
    """This script's arguments for a math study config (`configs/math.yaml` with Hydra overrides, e.g.
    scale=math/paper_qwen25math method=sera seed=0): the model, template, data, n0, B, the method's allocation
    settings, the learning rate, gradient clip, response limit, temperature, steps and evaluation (the records' samples,
    K, temperature and top-p) the config sets, so that `make reproduce-math SCALE=paper` runs the recipe through TRL.
    Settings TRL keeps its own way (the optimizer's betas, warm-up) are GRPOConfig's."""
    from experiments.math.model import PRETRAINED
    from experiments.math.train import family_set_name, validate
    from sera.lm_loop import refuse_sink_settings

    cfg = compose(overrides) if cfg is None else cfg
    settings, loop = validate(cfg)
    refuse_sink_settings(loop, "the TRL route")
    model, data = cfg.model, cfg.data
    name = model.path or (PRETRAINED[model.name].hub if model.name in PRETRAINED else model.name)
    args = ["--model", str(name), "--template", cfg.template, "--method", cfg.method.name, "--n0", str(cfg.n0),
            "--prompts", str(cfg.train.batch_size), "--lr", str(cfg.optim.lr), "--grad-clip", str(cfg.optim.grad_clip),
            "--max-completion-length", str(cfg.max_new_tokens), "--temperature", str(cfg.temperature),
            "--steps", str(cfg.train.steps), "--seed", str(cfg.seed), "--eval-every", str(cfg.eval.every),
            "--save-every", str(cfg.run.checkpoint_every),
            "--loss-type", {"token-mean": "dapo", "seqnorm": "dr_grpo"}[cfg.method.aggregation],
            "--record-samples", str(loop.eval_samples), "--record-ks", ",".join(str(k) for k in loop.eval_ks),
            "--eval-temperature", str(loop.eval_temperature), "--eval-top-p", str(loop.eval_top_p),
            "--record-max-rollouts", str(loop.eval_max_rollouts_per_call)]  # fmt: skip
    if settings.sampler.unequal_counts:  # the allocation's settings as the study resolves them
        args += ["--estimator", settings.estimator, "--n-min", str(settings.n_min), "--n-max", str(settings.n_max)]
        if settings.estimator == "pilot":
            args += ["--pilot-m", str(settings.pilot_m)]
        if settings.threshold is not None:
            args += ["--active-threshold", str(settings.threshold)]
    if data.family is not None:
        args += ["--train", data.family, "--num-train", str(data.num_train), "--eval-problems", str(data.num_heldout)]
        args += ["--eval-name", family_set_name(data.family)]
    else:
        eval_name = next(iter(data.eval))  # --run-dir evaluates every set of the config (SuiteRun); else this one
        args += ["--train", str(data.train), "--eval", str(data.eval[eval_name]), "--eval-name", str(eval_name)]
        args += ["--eval-problems", str(data.eval_limit or 500)]
    if cfg.get("engine") == "vllm":
        args += ["--vllm", "colocate"]
    if model.dtype == "bfloat16":
        args += ["--bf16"]
    if model.eos_token is not None:  # a response ends at the first of these, in the base run as in this one
        ends = [model.eos_token] if isinstance(model.eos_token, str) else list(model.eos_token)
        args += ["--eos-tokens", ",".join(ends)]
    return args


@dataclass
class SuiteFolder:
    """Where and as what a TRL run of a study config is written (RunFolderCallback): its folder, the config it
    records, the base model run it starts from, TRL's checkpoints, and whether the folder holds the finished run."""

    path: Path
    config: dict
    base: Path
    output_dir: str
    finished: bool

    @property
    def resume(self) -> bool:
        """An interrupted run resumes from TRL's last checkpoint."""
        return any(Path(self.output_dir).glob("checkpoint-*"))


def suite_folder(cfg, overrides: list[str], a: argparse.Namespace, study: str, root: Path, base_config,
                 settings, weights: bool) -> SuiteFolder:  # fmt: skip
    """The suite's run folder of a study config run through TRL (this script and examples/trl_maze.py): under the
    study's `root` beside the base run it starts from (`base_config`: the study's base run config), named as the
    study's own loop would name the run plus `_trl` (--run-dir auto); the config it records is the study's, with
    trainer: trl and the script's arguments. The base run must be finished (make runs it first), and hold its weights
    where the run starts from them (`weights`)."""
    from sera.lm_study import base_path, run_name
    from sera.runlog import finished_summary

    default = study_default(overrides, study)
    base = base_path(root, cfg, base_config, default)
    path = root / f"{run_name(cfg, settings, default)}_trl" if a.run_dir == "auto" else Path(a.run_dir)
    config = recorded_config(cfg, a)
    output_dir = a.output_dir or str(path / "trainer")
    finished = finished_summary(path, config) is not None
    if not finished:  # a finished run (restored from the archive beside a records-only base, say) is only skipped
        require_base(base, f"python -m experiments.{study}.train run.base_only=true {' '.join(overrides)}", weights)
    return SuiteFolder(path, config, base, output_dir, finished)


@dataclass
class SuiteRun:
    """A math study config run through TRL: its run folder, the study's method settings and its own problems: the
    training set and every evaluation set of the config (the paper's tables need each)."""

    folder: SuiteFolder
    settings: object
    problems: list[dict]
    evals: dict[str, list[dict]]


def suite_run(overrides: list[str], a: argparse.Namespace, cfg) -> SuiteRun:
    """The math study's run folder (runs/math-<scale>/<model>/<run>_trl, `suite_folder`) and problems."""
    from experiments.math.train import base_config, from_scratch, load_problems, validate
    from sera.lm_study import study_root

    settings, _ = validate(cfg)
    root = study_root(cfg, cfg.model.name)
    folder = suite_folder(cfg, overrides, a, "math", root, base_config, settings, weights=from_scratch(cfg))
    train, evals, _ = load_problems(cfg)
    return SuiteRun(folder, settings, train, evals)


def split_arguments(argv: list[str] | None) -> tuple[list[str] | None, object, list[str] | None]:
    """(config overrides, the composed config, this script's arguments): with --from-config, the overrides that
    follow it (up to the first flag) become the config's arguments (`from_config`); without, (None, None, argv)."""
    argv = list(argv) if argv is not None else None
    if argv is None or "--from-config" not in argv:
        return None, None, argv
    at = argv.index("--from-config")
    rest = argv[at + 1 :]
    own = next((i for i, x in enumerate(rest) if x.startswith("--")), len(rest))
    overrides = rest[:own]
    cfg = compose(overrides)  # once: the script's arguments, the memory plan and the run folder all read it
    return overrides, cfg, argv[:at] + from_config(overrides, cfg) + rest[own:]


def device_rows(step_rows: int, a: argparse.Namespace, cfg=None) -> tuple[int, int]:
    """(processes, rows of a device micro-batch) of this launch (both TRL scripts): a.grad_accum set (from
    --micro-rows where given), the step's B x n0 rows split evenly over processes x micro-batches, and on a GPU the
    launch's memory plan checked against a study config `cfg` (sera.plan) before the model loads."""
    processes = int(os.environ.get("WORLD_SIZE", 1))
    a.grad_accum = grad_accum(step_rows, processes, a.micro_rows, a.grad_accum)
    rows, rest = divmod(step_rows, processes * a.grad_accum)
    if rest:
        raise ValueError(f"B x n0 = {step_rows} rows must split evenly over {processes} x {a.grad_accum}")
    if cfg is not None and not a.cpu:
        from sera.plan import check_trl_fits

        check_trl_fits(cfg, processes, rows)
    return processes, rows


def records_callbacks(a: argparse.Namespace, suite: SuiteRun | None, tokenizer, problems, evals, ends) -> list:
    """The callbacks of a run: its suite run folder (RunFolderCallback) with --run-dir, and the per-question records
    of every held-out set in `evals` ({name: problems}) with --records."""
    callbacks, folder = [], None
    if suite is not None:
        from sera.trl import RunFolderCallback

        folder = RunFolderCallback(suite.folder.path, suite.folder.config, suite.folder.base)
        callbacks.append(folder)
    if a.records:
        if not evals:
            raise ValueError("--records needs held-out problems: --eval-problems (and --eval for a registry set)")
        from experiments.math.task import MathTask
        from sera.trl import RecordsCallback

        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else ends[0]
        task = MathTask(tokenizer, a.template, (problems, evals, []), a.prompts, a.seed, ends, pad)
        ks = [int(k) for k in a.record_ks.split(",")] if a.record_ks else [2**i for i in range(12)]
        ks = [k for k in ks if k <= a.record_samples]
        temperature = a.eval_temperature if a.eval_temperature is not None else a.temperature
        callbacks.append(RecordsCallback(a.records, task, every=a.eval_every, samples=a.record_samples, ks=ks,
                                         max_new_tokens=a.max_completion_length, temperature=temperature,
                                         top_p=a.eval_top_p, seed=a.seed, max_rollouts_per_call=a.record_max_rollouts,
                                         folder=folder))  # fmt: skip
    return callbacks


def main(argv=None) -> SERAGRPOTrainer:
    from datasets import Dataset

    overrides, cfg, argv = split_arguments(argv)
    a = arguments(argv)
    processes, rows = device_rows(a.prompts * a.n0, a, cfg)
    suite = None
    if a.run_dir is not None:
        if overrides is None:
            raise ValueError("--run-dir writes the run as a study config's: it needs --from-config")
        suite = suite_run(overrides, a, cfg)
        if suite.folder.finished:
            print(f"{suite.folder.path} holds this finished run: skipped")
            return None
        a.records, a.output_dir = str(suite.folder.path), suite.folder.output_dir
        a.resume = a.resume or suite.folder.resume
    a.output_dir = a.output_dir or os.path.join(tempfile.gettempdir(), "sera-trl-math")
    model, tokenizer, problems, evals = load(a, suite)
    if suite is None and overrides is not None and len(cfg.data.get("eval") or {}) > 1:
        print(f"evaluating {a.eval_name} only of the config's sets {list(cfg.data.eval)}: --run-dir evaluates each")
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

    ends = [tokenizer.eos_token_id]  # a response ends at the first of these (--eos-tokens: the config's)
    if a.eos_tokens:
        from experiments.math.train import end_tokens

        ends = end_tokens(a.eos_tokens.split(","), tokenizer, a.model)

    def math_verify(completions, answer, completion_ids, **kwargs):
        cut = [len(ids) >= a.max_completion_length and ids[-1] not in ends for ids in completion_ids]
        return score_batch(completions, answer, cut).tolist()

    # TRL's own evaluation (mean reward of n0 samples, and a loss over the whole held-out batch at once, whose logits
    # alone would not fit at paper scale); a run written as the suite's evaluates by its records instead
    trl_eval = next(iter(evals.values()), []) if suite is None else []
    args = SERAGRPOConfig(
        output_dir=a.output_dir, method=a.method, estimator=a.estimator, pilot_m=a.pilot_m, num_generations=a.n0,
        n_min=a.n_min, n_max=a.n_max, active_threshold=a.active_threshold,
        per_device_train_batch_size=rows, gradient_accumulation_steps=a.grad_accum, loss_type=a.loss_type,
        learning_rate=a.lr, lr_scheduler_type="constant", weight_decay=0.01, max_grad_norm=a.grad_clip,
        max_completion_length=a.max_completion_length, temperature=a.temperature, max_steps=a.steps, beta=0.0,
        use_vllm=a.vllm != "none", vllm_mode=a.vllm if a.vllm != "none" else "colocate", bf16=a.bf16,
        use_cpu=a.cpu, seed=a.seed, report_to=[] if a.report_to == "none" else a.report_to.split(","),
        logging_steps=1, remove_unused_columns=False, end_token_ids=ends if a.eos_tokens else None,
        **activation_checkpointing(not a.cpu), **evaluation(a, trl_eval),
        save_strategy="steps" if a.save_every else "no", save_steps=a.save_every or 500, **SUITE_TRL_SETTINGS,
    )  # fmt: skip
    if suite is not None:
        check_same_method(args.sera_settings(), suite.settings)
    trainer = SERAGRPOTrainer(
        model=model, reward_funcs=math_verify, args=args, train_dataset=dataset(problems),
        eval_dataset=dataset(trl_eval) if trl_eval else None, processing_class=tokenizer,
        callbacks=records_callbacks(a, suite, tokenizer, problems, evals, ends),
    )  # fmt: skip
    trainer.train(resume_from_checkpoint=True if a.resume else None)
    return trainer


def grad_accum(step_rows: int, processes: int, micro_rows: int | None, given: int) -> int:
    """Micro-batches a step on each process: `given`, or with micro_rows the count that gives each micro-batch that
    many of the step's rows (which must divide evenly)."""
    if micro_rows is None:
        return given
    count, rest = divmod(step_rows, processes * micro_rows)
    if rest or count < 1:
        raise ValueError(f"{step_rows} rows a step do not split into micro-batches of {micro_rows} over {processes} "
                         "processes")  # fmt: skip
    return count


def check_same_method(trl_settings, study) -> None:
    """Refuse, before training, a TRL run whose allocation settings are not the study config's (`study`)."""
    keys = ("n0", "estimator", "pilot_m", "n_min", "n_max", "p_lo", "p_hi", "delta", "multiplicity_correction",
            "aggregation", "threshold")  # fmt: skip
    differ = {
        k: (getattr(study, k), getattr(trl_settings, k)) for k in keys if getattr(study, k) != getattr(trl_settings, k)
    }
    if differ:
        raise ValueError(f"the TRL run would not run the config's method: (config, TRL) {differ}")


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
