"""The kit a language-model study's entry point is built from: what the maze and math entry points share.

A study supplies its task (a `sera.lm_loop.Task`), its model, its own checks, and a `prepare()` that returns
(model, task, engine); the kit gives the checks every LM config shares (`validate_lm`), the device, the run folder
and name, the rollout engine (`make_engine`), the base (pre-RL) model's run done once and shared (`base_run`), and
the Hydra entry (`lm_main`). Its configs compose configs/lm.yaml (and through it configs/base.yaml), so a study's
config file holds only what differs. `tests/test_lm_study.py` builds a toy study in about 40 lines this way;
experiments/maze/train.py is the worked example.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import hydra
import torch
from omegaconf import DictConfig, OmegaConf

from sera import identity
from sera.config import (
    check_group_choices,
    check_optim,
    check_parallel,
    check_run_settings,
    name_failures,
    vllm_options,
)
from sera.driver import NO_CUDA
from sera.lm_loop import LoopSettings, check_sink_settings
from sera.methods import MethodSettings, Study
from sera.plan import check_fits
from sera.rollout import HFEngine, VLLMEngine
from sera.runlog import ARCHIVED_FILE, RunDir, base_identity, finished_summary

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
ENGINES = ("hf", "vllm")


def validate_lm(cfg, study: Study) -> tuple[MethodSettings, LoopSettings]:
    """The checks every LM study's config needs (method, run, optimizer, vLLM, parallelism, loop settings, engine,
    device), before any work starts. The study adds its own after this."""
    settings = MethodSettings.from_config(cfg, study)
    check_run_settings(cfg)
    check_optim(cfg.optim)
    vllm_options(cfg)
    check_parallel(cfg)
    loop = LoopSettings.from_config(cfg)
    check_sink_settings(settings, loop)
    if cfg.engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {cfg.engine!r}")
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(NO_CUDA)
    return settings, loop


def resolve_device(cfg) -> str:
    """'cuda' when asked for, or when auto finds one; else 'cpu'. On a GPU an RL run's memory plan (sera.plan) must
    fit the device before any work starts (a base-only run evaluates, and trains no more than the SFT base)."""
    device = "cuda" if cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available()) else "cpu"
    if device == "cuda" and torch.cuda.is_available() and not cfg.run.get("base_only", False):
        check_fits(cfg, 1, torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory / 1e9)
    return device


def study_root(cfg, *parts: str) -> Path:
    """runs/<experiment>-<scale>[/parts]: the folder of a study's runs at one scale."""
    return Path(cfg.run.root, f"{cfg.experiment}-{cfg.scale_name}", *parts)


def run_name(cfg, settings: MethodSettings, default: dict | None = None) -> str:
    """<method>[variant]-<aggregation>_n0-<n0>[_<other settings that differ from the default>]_seed-<seed>
    (sera.identity.run_name), or run.name when set. `default`: the config to compare with (None: the scale's and
    method's, from Hydra)."""
    if cfg.run.name:
        return cfg.run.name
    stem = (
        f"{settings.method.folder_name}{settings.variant(name_default_source=False)}-{settings.aggregation}_n0-{cfg.n0}"
    )
    config = OmegaConf.to_container(cfg, resolve=True)
    default = default if default is not None else identity.hydra_default()
    return identity.run_name(stem, cfg.seed, config, default, identity.LM_STEM_KEYS)


def base_path(root: Path, cfg, base_config: Callable, default: dict | None = None) -> Path:
    """root/base[_<settings that differ from the default's>]_seed-<s>: the folder of the base run that a config's RL
    runs share; base_config(cfg) gives the base run's config (sera.identity.run_name names it). `default`: the config
    to compare with (None: the scale's and method's, from Hydra)."""
    default = default if default is not None else identity.hydra_default()
    default_base = base_config(OmegaConf.create(default)) if default is not None else None
    return root / identity.run_name("base", cfg.seed, base_config(cfg), default_base)


def make_engine(cfg, model, source, eos_id, pad_id):
    """The rollout engine the config asks for: HFEngine over `model`, or VLLMEngine loading `source` (a checkpoint
    directory or a hub name; the trainer syncs its weights after every update)."""
    if cfg.engine == "vllm":
        return VLLMEngine(str(source), eos_id, pad_id, cfg.temperature, cfg.seed, **vllm_options(cfg))
    return HFEngine(model, eos_id, pad_id, cfg.temperature)


def base_run(path: Path, config: dict, body: Callable[[RunDir], tuple[int, dict, dict]], weights: bool = True) -> None:
    """The base (pre-RL) model's run, done once and shared by every RL run of the same settings: nothing when `path`
    holds a finished run of `config` (a different config is refused); else body(run_dir) -> (step, metrics,
    summary extras) is logged and the run finished.

    `weights`: the run saves the model RL starts from (SFT), which a run restored from the archive (records only)
    lacks. Such a base is trained again, its archived records kept aside meanwhile (`<path>.archived`, also across an
    interruption); when the new evaluation records equal the archived ones byte for byte, the base model reproduced
    and RL runs from it pair with the archived runs of its seed. When they differ (another CPU or library version:
    docs/numerics.md), the archived records go back to `path`, the retrained base is kept in `<path>.mismatch`, and
    RuntimeError says so: RL from it would not pair with the archive."""
    aside = path.with_name(f"{path.name}.archived")
    if finished_summary(path, config) is not None:
        if not (weights and (path / ARCHIVED_FILE).exists()):
            return
        shutil.rmtree(aside, ignore_errors=True)
        path.rename(aside)
    with RunDir(path, config) as run_dir:
        step, metrics, extra = body(run_dir)
        run_dir.log(step, metrics)
        run_dir.finish({"step": step, **metrics, **extra})
    if aside.exists():
        check_reproduced(path, aside)


def check_reproduced(path: Path, archived: Path) -> None:
    """A base trained again against its archived records (base_run): the aside copy removed when they match."""
    if base_identity(path)["eval_sha256"] == base_identity(archived)["eval_sha256"]:
        shutil.rmtree(archived)
        return
    mismatch = path.with_name(f"{path.name}.mismatch")
    shutil.rmtree(mismatch, ignore_errors=True)
    path.rename(mismatch)
    archived.rename(path)
    raise RuntimeError(
        f"{path} was restored from results/runs with its records only, so its base model was trained again; the "
        f"retrained model's evaluation records differ from the archived ones (another CPU or library version makes "
        f"another model: docs/numerics.md), so RL runs from it would not pair with the archived runs of this seed. "
        f"The archived records are back in {path}; the retrained base is in {mismatch}. Run this seed's RL runs in a "
        "folder of their own (run.root=runs/retrained, as make reproduce-retrained does), every side of a comparison "
        "from the same base."
    )


def refuse_multiprocess_launch(study: str) -> None:
    """The studies' own loop is one process: it starts no process group, so under torchrun (WORLD_SIZE > 1) every
    worker would run the whole study on its own, each on the first GPU. Refused before any work, naming the path that
    runs on several GPUs."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        sys.exit(
            f"experiments.{study}.train runs in one process, and this launch has {world} (WORLD_SIZE): each would run "
            "the whole study on its own. On several GPUs, train with SERA inside TRL's GRPOTrainer "
            "(sera.trl.SERAGRPOTrainer under accelerate, DeepSpeed or FSDP, vLLM for generation: docs/trl.md, "
            "docs/paper-scale.md); the loop's own data parallelism (sera.lm_loop under torch.distributed) is a library "
            "path its tests exercise, not this entry point."
        )


def lm_main(config_name: str, run: Callable[[DictConfig], dict], report: Callable[[dict], None] | None = None):
    """The command-line entry of a study: check the method= and scale= choices (a clear list of the valid ones),
    then Hydra runs `run` on the composed config (or on each config of a --multirun sweep)."""
    check_group_choices(CONFIGS, sys.argv[1:])
    refuse_multiprocess_launch(config_name)

    @name_failures
    def main(cfg: DictConfig) -> None:
        final = run(cfg)
        if report is not None:
            report(final)

    hydra.main(version_base=None, config_path=str(CONFIGS), config_name=config_name)(main)()
