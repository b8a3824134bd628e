"""Math reasoning (the paper's Tables 1, 5-9): a language model learns to solve math problems with GRPO, PKPO, MaxRL,
DARS-HW or SERA; the reward is math-verify on the last \\boxed{} of the response (experiments/math/grading.py).

Run (one run; the base model is trained or evaluated on first use and shared; the same command resumes a run):
    python -m experiments.math.train method=sera                        # CPU default: tiny-math on chain sums
    python -m experiments.math.train method=maxrl method.aggregation=seqnorm
    python -m experiments.math.train scale=math/smoke method=grpo        # seconds
    python -m experiments.math.train scale=math/smollm2_check          # SmolLM2-135M-Instruct check, ~9 min on CPU
    python -m experiments.math.train scale=math/paper method=sera       # SmolLM2-360M-Instruct, GSM8K (GPUs)
The Table 1 grid is `make reproduce-math`; its tables `python -m paper_figures.math --scale cpu`.

Runs live in runs/math-<scale>/<model.name>/: base_seed-<s> is the base (pre-RL) model's run (experiment: math-base;
for a from-scratch model it also holds the SFT checkpoint every RL run starts from), and each RL run is
<method>-<aggregation>_n0-<n0>_seed-<s>, with eval_step<N>_<set>.json per evaluation set (paper_figures/math.py).
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from experiments.math.data import DATA_DIR, load_dataset_spec
from experiments.math.generated import FAMILIES, HELDOUT_POOL, guessing_baseline, make_splits
from experiments.math.model import (
    EOS_ID,
    FROM_SCRATCH,
    MODELS,
    PAD_ID,
    PRETRAINED,
    build_tokenizer,
    check_available,
    load_pretrained,
)
from experiments.math.prompts import TEMPLATES
from experiments.math.sft import train_base
from experiments.math.task import EVAL_ID_BASE, MathTask
from sera.lm_loop import LoopSettings, evaluate_into, release, run_rl
from sera.lm_study import base_path, base_run, lm_main, make_engine, resolve_device, run_name, study_root, validate_lm
from sera.methods import MethodSettings, Study
from sera.threads import set_torch_threads

STUDY = Study("math", repeated_prompts=True)  # a finite training set that recurs: the historical p_hat exists
DTYPES = ("float32", "bfloat16", "float16")
SET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")  # an evaluation set's name is part of its record's file name


def from_scratch(cfg) -> bool:
    return cfg.model.path is None and cfg.model.name in FROM_SCRATCH


def family_set_name(family: str) -> str:
    """The evaluation set of a generated family: its held-out split, e.g. chain_sum -> chain-sum."""
    return family.replace("_", "-")


def validate(cfg) -> tuple[MethodSettings, LoopSettings]:
    """Every cross-field check, before any work starts; nothing is loaded (see `load_problems`, `check_available`)."""
    settings, loop = validate_lm(cfg, STUDY)
    model, data = cfg.model, cfg.data
    if model.path is None and model.name not in MODELS:
        raise ValueError(f"unknown model.name {model.name!r}; choose from {MODELS} or set model.path")
    if not model.name or not SET_NAME.fullmatch(str(model.name)):
        raise ValueError(f"model.name {model.name!r} names the run folder: letters, digits, '.', '_' and '-' only")
    if model.dtype not in DTYPES:
        raise ValueError(f"unknown model.dtype {model.dtype!r}; choose from {DTYPES}")
    if cfg.template not in TEMPLATES:
        raise ValueError(f"unknown template {cfg.template!r}; choose from {sorted(TEMPLATES)}")
    if from_scratch(cfg):
        if cfg.template != "plain":
            raise ValueError(f"{model.name} is trained from scratch with a character tokenizer: use template=plain")
        if model.eos_token is not None:
            raise ValueError(f"{model.name} has its own end token: leave model.eos_token=null")
        if data.family is None:
            raise ValueError(f"{model.name} is trained from scratch on worked solutions: set data.family (generated)")
        if cfg.sft.steps < 1 or cfg.sft.batch_size < 1 or not cfg.sft.lr > 0:
            raise ValueError(f"sft.steps and sft.batch_size must be >= 1 and sft.lr > 0, got {dict(cfg.sft)}")
        if cfg.sft.get("problems") is not None and not cfg.sft.batch_size <= cfg.sft.problems:
            raise ValueError(f"sft.problems must be null or >= sft.batch_size, got {cfg.sft.problems}")
        if not 0 <= cfg.sft.get("noise_p", 0.0) < 1 or cfg.sft.get("noise_width", 1) < 1:
            raise ValueError(f"sft.noise_p must be in [0, 1) and sft.noise_width >= 1, got {dict(cfg.sft)}")
        if cfg.sft.get("noise_p", 0.0) > 0 and data.family in FAMILIES and data.family != "chain_sum":
            raise ValueError("sft.noise_p moves an answer-only solution (\\boxed{N}): it needs data.family=chain_sum")
    if data.family is not None:
        if data.family not in FAMILIES:
            raise ValueError(f"unknown data.family {data.family!r}; choose from {sorted(FAMILIES)} or null")
        if data.train is not None or data.eval:
            raise ValueError(
                "data.family generates the training and held-out sets: leave data.train and data.eval empty"
            )
        if not 1 <= data.num_heldout <= HELDOUT_POOL:
            raise ValueError(f"data.num_heldout must lie in [1, {HELDOUT_POOL}], got {data.num_heldout}")
        if not cfg.train.batch_size <= data.num_train < EVAL_ID_BASE:
            raise ValueError(f"data.num_train={data.num_train} must be >= train.batch_size={cfg.train.batch_size}")
    else:
        if data.train is None or not data.eval:
            raise ValueError("set data.family (generated problems), or data.train and data.eval {name: dataset}")
        bad = [name for name in data.eval if not SET_NAME.fullmatch(str(name))]
        if bad:
            raise ValueError(f"evaluation set names {bad} name files: use letters, digits, '.', '_' and '-'")
    if data.eval_limit is not None and data.eval_limit < 1:
        raise ValueError(f"data.eval_limit must be >= 1 or null, got {data.eval_limit}")
    spec = PRETRAINED.get(model.name)
    if cfg.engine == "vllm" and model.path is None and spec is not None and spec.package is not None:
        raise ValueError(f"engine=vllm cannot load {model.name} (a GGUF file in a wheel): use engine=hf")
    return settings, loop


def load_problems(cfg) -> tuple[list[dict], dict[str, list[dict]], list[dict]]:
    """(RL training problems, {evaluation set: problems}, SFT problems). A generated family gives num_train RL
    problems, then sft.problems (default sft.steps x sft.batch_size) more for a from-scratch model's SFT (disjoint from
    both; SFT runs sft.steps steps over them, in epochs when they are fewer than steps x batch); a dataset is
    read from its local file (FileNotFoundError naming the path and the hub dataset when it is missing)."""
    data = cfg.data
    if data.family is not None:
        sft_count = (cfg.sft.get("problems") or cfg.sft.steps * cfg.sft.batch_size) if from_scratch(cfg) else 0
        options = OmegaConf.to_container(data.options).get(data.family, {})
        train, heldout = make_splits(data.family, data.num_train + sft_count, data.num_heldout, cfg.seed, **options)
        train, sft, evals = train[: data.num_train], train[data.num_train :], {family_set_name(data.family): heldout}
    else:
        data_dir = Path(data.dir).expanduser() if data.dir else DATA_DIR
        train, sft = load_dataset_spec(data.train, data_dir=data_dir), []
        evals = {str(name): load_dataset_spec(source, data_dir=data_dir) for name, source in data.eval.items()}
    if data.eval_limit is not None:
        evals = {name: problems[: data.eval_limit] for name, problems in evals.items()}
    if len(train) < cfg.train.batch_size:
        raise ValueError(f"{len(train)} training problems, fewer than train.batch_size={cfg.train.batch_size}")
    return train, evals, sft


def end_tokens(names, tokenizer, model_name: str) -> int | list[int]:
    """The id of the token that ends a response, or the ids of several (model.eos_token may be a list: a response
    ends at the first of them); a name the tokenizer does not have is an error."""
    single = isinstance(names, str)
    names = [names] if single else list(names)
    vocab = tokenizer.get_vocab()
    for name in names:
        if name not in vocab:
            raise ValueError(f"model.eos_token {name!r} is not a token of {model_name}'s tokenizer")
    ids = [tokenizer.convert_tokens_to_ids(name) for name in names]
    return ids[0] if single else ids


def load_policy(cfg, base: Path, device: str, with_model: bool = True):
    """(model, tokenizer, engine, eos_id, pad_id): the from-scratch base checkpoint in `base`, or a pretrained model.
    with_model=False (the base-only evaluation) loads no training copy of a pretrained model that vLLM samples from
    its own weights (model None: at paper scale a float32 copy of Qwen3-4B would take 16 GB of the GPU for nothing)."""
    if from_scratch(cfg):
        from transformers import AutoModelForCausalLM

        model, tokenizer = AutoModelForCausalLM.from_pretrained(base), build_tokenizer()
        eos_id, pad_id, source = EOS_ID, PAD_ID, base
    else:
        # float32 master weights whatever model.dtype says: bfloat16 is the loss forward's autocast (sera.lm_loop)
        needed = with_model or cfg.engine != "vllm"  # HFEngine samples from the model itself
        model, tokenizer = load_pretrained(cfg.model.name, cfg.model.path, "float32", model=needed)
        eos_id = end_tokens(cfg.model.eos_token or tokenizer.eos_token, tokenizer, cfg.model.name)
        first = eos_id if isinstance(eos_id, int) else eos_id[0]
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else first  # responses are masked
        source = cfg.model.path or PRETRAINED[cfg.model.name].hub
    model = model.to(device) if model is not None else None
    return model, tokenizer, make_engine(cfg, model, source, eos_id, pad_id), eos_id, pad_id


def base_config(cfg) -> dict:
    """The base run's config: the settings its model and evaluation depend on (a different one is refused)."""
    keys = ["model", "template", "data", "seed", "temperature", "top_p", "max_new_tokens", "eval"]
    config = OmegaConf.to_container(OmegaConf.masked_copy(cfg, keys + ["sft"] * from_scratch(cfg)), resolve=True)
    del config["eval"]["every"]  # when RL runs evaluate does not change the base run
    return {"experiment": f"{cfg.experiment}-base", **config}


def guess_metrics(train: list[dict], evals: dict[str, list[dict]], ks) -> dict:
    """The answer-guessing floor on each generated held-out set: Pass@k of answers drawn from the training answers'
    frequencies (guess_pass@k, a model at chance) and of the k commonest training answers (guess_top_pass@k)."""
    metrics = {}
    for name, heldout in evals.items():
        guess = guessing_baseline(train, heldout, ks)
        metrics.update({f"eval/{name}/guess_pass@{k}": v for k, v in guess["sample"].items()})
        metrics.update({f"eval/{name}/guess_top_pass@{k}": v for k, v in guess["top"].items()})
    return metrics


def ensure_base(cfg, loop: LoopSettings, path: Path, problems, policy, device: str, need_weights: bool = True) -> None:
    """The base (pre-RL) run, the tables' "Base" row, done once and shared: for a from-scratch model, SFT into `path`
    then an evaluation; for a pretrained model, an evaluation of the untouched model. policy() gives the model.
    need_weights=False (run.base_only) accepts a base restored from the archive with its records only."""
    train, evals, sft = problems

    def evaluate_base(run_dir):
        metrics, step = {}, 0
        if from_scratch(cfg):
            torch.manual_seed(cfg.seed)
            metrics["train/sft_loss"] = train_base(cfg, sft, path, device)
            step = cfg.sft.steps
        _, tokenizer, engine, eos_id, pad_id = policy()
        try:
            task = MathTask(tokenizer, cfg.template, problems, cfg.train.batch_size, cfg.seed, eos_id, pad_id)
            metrics.update(evaluate_into(run_dir, step, loop, task, engine, torch.Generator().manual_seed(cfg.seed)))
        finally:
            release(engine)
        if cfg.data.family is not None:
            metrics.update(guess_metrics(train + sft, evals, loop.eval_ks))
        return step, metrics, {}

    base_run(path, base_config(cfg), evaluate_base, weights=need_weights and from_scratch(cfg))


def run(cfg: DictConfig) -> dict:
    """Train one RL run from the shared base model (or resume it) and return the final evaluation."""
    settings, loop = validate(cfg)
    threads = set_torch_threads(cfg.threads)
    device, root = resolve_device(cfg), study_root(cfg, cfg.model.name)
    base = base_path(root, cfg, base_config)

    def shared_base(need_weights: bool = True, with_model: bool = True):
        problems = load_problems(cfg)  # missing data or weights: a clear error before any work
        if not from_scratch(cfg):
            check_available(cfg.model.name, cfg.model.path)
        policy = functools.cache(lambda: load_policy(cfg, base, device, with_model))
        ensure_base(cfg, loop, base, problems, policy, device, need_weights)
        return problems, policy

    if cfg.run.get("base_only", False):
        shared_base(need_weights=bool(cfg.run.get("base_weights", False)), with_model=False)
        return {}

    def prepare():
        problems, policy = shared_base()
        model, tokenizer, engine, eos_id, pad_id = policy()
        torch.manual_seed(cfg.seed)
        task = MathTask(tokenizer, cfg.template, problems, cfg.train.batch_size, cfg.seed, eos_id, pad_id)
        return model, task, engine

    return run_rl(cfg, settings, loop, root / run_name(cfg, settings), prepare, threads, base)


def report(final: dict) -> None:
    print(", ".join(f"{k}={v:.4f}" for k, v in final.items() if "/pass@" in k))


if __name__ == "__main__":
    lm_main("math", run, report)
