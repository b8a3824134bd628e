"""A new language-model study built from the kit (sera.lm_study): its config composes configs/lm.yaml and holds only
what differs, its entry point is a task, a model, `validate` and `run` - the shape of experiments/maze/train.py. The
toy task is tests/test_lm.py's; the study runs end to end, its base run is done once, and bad input fails early."""

import shutil
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from sera.lm_loop import evaluate_into, run_rl
from sera.lm_study import base_run, make_engine, resolve_device, run_name, study_root, validate_lm
from sera.methods import Study
from sera.rollout import HFEngine
from sera.runlog import RunExistsError, read_jsonl
from sera.threads import set_torch_threads
from tests.test_lm import EOS, PAD, ToyTask, tiny_model

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
TOY_CONFIG = """defaults:
  - lm
  - _self_
  - method: maxrl

experiment: toy
scale_name: smoke
n0: 4
max_new_tokens: 4
progress: false
threads: 1
train: {batch_size: 4, steps: 3}
eval: {every: 3, samples: 4, ks: [1, 4], max_rollouts_per_call: 64}
run: {checkpoint_every: 2}
"""


# ---- the toy study's entry point: what a new study writes (experiments/<study>/train.py) ----
def validate(cfg):
    settings, loop = validate_lm(cfg, Study("toy"))
    if cfg.max_new_tokens > 8:
        raise ValueError("the toy task answers in at most 8 tokens")
    return settings, loop


def run(cfg):
    settings, loop = validate(cfg)
    threads, device, root = set_torch_threads(cfg.threads), resolve_device(cfg), study_root(cfg)

    def prepare():
        def evaluate_base(run_dir):
            engine = HFEngine(tiny_model(cfg.seed), EOS, PAD)
            return 0, evaluate_into(run_dir, 0, loop, ToyTask(), engine, torch.Generator().manual_seed(0)), {}

        base_run(root / f"base_seed-{cfg.seed}", {"experiment": "toy-base", "seed": cfg.seed}, evaluate_base)
        model = tiny_model(cfg.seed).to(device)
        return model, ToyTask(), make_engine(cfg, model, None, EOS, PAD)

    return run_rl(cfg, settings, loop, root / run_name(cfg, settings), prepare, threads)


# ----
def toy_cfg(tmp_path, *overrides):
    configs = tmp_path / "configs"
    if not configs.exists():
        shutil.copytree(CONFIGS, configs)
        (configs / "toy.yaml").write_text(TOY_CONFIG)
    with initialize_config_dir(config_dir=str(configs), version_base=None):
        return compose("toy", overrides=[f"run.root={tmp_path / 'runs'}", *overrides])


def test_a_toy_study_runs_through_the_kit(tmp_path):
    cfg = toy_cfg(tmp_path, "method=sera_pilot", "method.pilot_m=2")
    assert cfg.optim.lr == 1e-4 and cfg.engine == "hf" and cfg.wandb.enabled is False  # from lm.yaml and base.yaml
    final = run(cfg)
    assert set(final) >= {"eval/pair/pass@1", "eval/single/pass@4"}
    study = tmp_path / "runs" / "toy-smoke"
    assert (study / "base_seed-0" / "DONE").exists()
    records = read_jsonl(study / "sera-m2-token-mean_n0-4_seed-0" / "metrics.jsonl")
    steps = [r for r in records if "alloc/budget" in r]
    assert len(steps) == 3 and all(r["alloc/budget"] == 16 for r in steps)
    base_done = (study / "base_seed-0" / "DONE").stat().st_mtime_ns
    run(toy_cfg(tmp_path, "method=maxrl", "run.if_finished=skip"))  # a second run shares the base run
    assert (study / "base_seed-0" / "DONE").stat().st_mtime_ns == base_done
    assert (study / "maxrl-token-mean_n0-4_seed-0" / "DONE").exists()


@pytest.mark.parametrize(
    "override, match",
    [
        ("engine=sglang", "engine must be one of"),
        ("max_new_tokens=9", "at most 8 tokens"),
        ("optim.lr=-1", "lr"),
        ("method=sera_pilot", "infeasible budget"),  # SERA's 8 pilots do not fit n0 = 4
    ],
)
def test_the_kit_refuses_bad_input_before_any_work(tmp_path, override, match):
    with pytest.raises(ValueError, match=match):
        run(toy_cfg(tmp_path, override))
    assert not (tmp_path / "runs").exists()


def test_extend_continues_a_shorter_run_to_the_run_a_fresh_config_makes(tmp_path):
    """run.if_finished=extend: a finished 3-step run continued to 6 steps has the records (evaluations included) of a
    fresh 6-step run; what would not equal a fresh run is refused, and a run already at the length is skipped."""
    study = tmp_path / "runs" / "toy-smoke"

    def records(name):
        run_dir = study / name
        rows = [
            {k: v for k, v in r.items() if not k.startswith("time/")} for r in read_jsonl(run_dir / "metrics.jsonl")
        ]
        return rows, {p.name: p.read_text() for p in sorted(run_dir.glob("eval_step*.json"))}

    run(toy_cfg(tmp_path, "train.steps=6", "run.name=fresh"))
    run(toy_cfg(tmp_path, "run.name=ext"))  # 3 steps, finished
    with pytest.raises(RunExistsError, match="different config: train.steps"):  # no extend: a longer one is refused
        run(toy_cfg(tmp_path, "train.steps=6", "run.name=ext"))
    with pytest.raises(RunExistsError, match="also differs in"):  # extend changes train.steps only
        run(toy_cfg(tmp_path, "train.steps=6", "run.name=ext", "run.if_finished=extend", "optim.lr=2e-4"))
    with pytest.raises(RunExistsError, match="cannot shorten"):
        run(toy_cfg(tmp_path, "train.steps=2", "run.name=ext", "run.if_finished=extend"))
    run(toy_cfg(tmp_path, "train.steps=6", "run.name=ext", "run.if_finished=extend"))
    assert (study / "ext" / "DONE").exists() and records("ext") == records("fresh")
    assert [r["step"] for r in records("ext")[0]] == list(range(6)) and len(records("ext")[1]) == 4  # 2 sets x 2
    done = (study / "ext" / "DONE").stat().st_mtime_ns
    run(toy_cfg(tmp_path, "train.steps=6", "run.name=ext", "run.if_finished=extend"))  # at the length: skipped
    assert (study / "ext" / "DONE").stat().st_mtime_ns == done

    run(toy_cfg(tmp_path, "eval.every=2", "run.name=off"))  # 3 steps: its final evaluation is off the schedule
    with pytest.raises(RunExistsError, match="off the evaluation schedule"):
        run(toy_cfg(tmp_path, "eval.every=2", "train.steps=4", "run.name=off", "run.if_finished=extend"))
    (study / "ext" / "checkpoint.pt").unlink()  # records only, as an archived run
    with pytest.raises(RunExistsError, match="no checkpoint.pt"):
        run(toy_cfg(tmp_path, "train.steps=9", "run.name=ext", "run.if_finished=extend"))
    assert (study / "ext" / "DONE").exists()  # a refused extension leaves the run as it was
