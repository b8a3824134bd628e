"""Every archived LM run (results/runs/) is the run its scale config composes today.

`make reproduce-maze` and `make reproduce-math` restore the archive into runs/ and skip a finished run only when the
config the grid composes is the same run (sera.runlog.config_changes); a scale config edited or renamed without its
archive would make the next grid refuse the restored seeds (or, renamed, run them again). The run's own choices
(method and its allocation settings, seed) are taken from the archived config; everything else (the scale's steps,
learning rates, SFT, evaluation, task, model) must come out of the scale config unchanged.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from sera.lm_study import run_name
from sera.runlog import config_changes

ROOT = Path(__file__).resolve().parents[1]
RUN_CHOICES = ("method", "alloc", "seed")  # what a grid's command line sets per run, not the scale


def archived_rl_configs() -> list[Path]:
    return sorted(
        path
        for path in (ROOT / "results" / "runs").glob("*/**/config.yaml")
        if not path.parent.name.startswith("base_seed-")
    )


@pytest.mark.parametrize("path", archived_rl_configs(), ids=lambda p: str(p.parent.relative_to(ROOT / "results")))
def test_an_archived_run_is_what_its_scale_config_composes(path):
    stored = yaml.safe_load(path.read_text())
    experiment, scale = stored["experiment"], stored["scale_name"]
    assert (ROOT / "configs" / "scale" / experiment / f"{scale}.yaml").exists(), (
        f"{path.parent} was made at scale {scale!r}, which configs/scale/{experiment}/ no longer has"
    )
    overrides = [f"scale={experiment}/{scale}", f"method={stored['method']['name']}"]
    if "model" in stored and "name" in stored["model"]:  # the LM studies' model (math: a folder of runs per model)
        overrides.append(f"model.name={stored['model']['name']}")
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base=None):
        composed = OmegaConf.to_container(compose(experiment, overrides=overrides), resolve=True)
    default = {**composed}
    choices = (*RUN_CHOICES, "n0") if experiment == "imagenet" else RUN_CHOICES  # the classifier's grid sweeps n0
    composed.update({key: stored[key] for key in choices if key in stored})
    assert config_changes(stored, composed) == [], f"{path.parent} differs from scale={experiment}/{scale}"
    # and its folder has the name the loop gives this config today (sera.identity), so a grid finds and skips it
    study = importlib.import_module(f"experiments.{experiment}.train")
    cfg = OmegaConf.create(stored)
    if experiment == "imagenet":  # the classifier's loop names its runs without an aggregation
        assert study.run_name(cfg, study.validate(cfg), default) == path.parent.name
    else:
        assert run_name(cfg, study.validate(cfg)[0], default) == path.parent.name


def test_the_archive_holds_runs_to_check():
    """The check above is not vacuous: the committed archive has RL runs of both LM studies."""  # and ablations
    experiments = {yaml.safe_load(p.read_text())["experiment"] for p in archived_rl_configs()}
    assert {"maze", "math"} <= experiments


# Scale files whose runs share a folder name other than their own on purpose: the Qwen paper scales write under
# math-paper/<model>/ beside SmolLM2's, and the SmolLM2 check keeps its first folder name
SHARED_FOLDERS = {("math", "paper_qwen25math"): "paper", ("math", "paper_qwen3"): "paper",
                  ("math", "smollm2_check"): "check"}  # fmt: skip


@pytest.mark.parametrize("experiment", ["imagenet", "maze", "math"])
def test_each_scale_file_names_its_own_run_folder(experiment):
    """scale_name, the run folder's suffix, is the scale file's own name: a copied scale file that kept its
    original's would write into that scale's folder (where the run-identity check would then refuse its runs)."""
    scales = sorted(p.stem for p in (ROOT / "configs" / "scale" / experiment).glob("*.yaml") if not p.stem[0] == "_")
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base=None):
        for scale in scales:
            cfg = compose(experiment, overrides=[f"scale={experiment}/{scale}"])
            assert cfg.scale_name == SHARED_FOLDERS.get((experiment, scale), scale), f"{experiment}/{scale}.yaml"
