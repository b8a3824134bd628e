"""What an allocator can do is data in one registry entry (sera.allocators.SAMPLERS), and a method is one entry of
sera.methods.METHODS plus its config file: validation, the collection step and the tables read them from there.

The acceptance test of issue 18 point 1: a method that differs from SERA only in its p_hat clip is added as one
registry entry and one config file, validates through the shipped settings, and shows up as its own row of Table 2
and as its own block of the verdict against its registry baseline."""

import shutil
from dataclasses import fields, replace
from pathlib import Path

import numpy as np
import pytest
import yaml
from hydra import compose, initialize_config_dir

from paper_figures import imagenet
from sera.allocators import SAMPLERS, Sampler
from sera.collect import COLLECTORS, collect
from sera.methods import METHODS, MethodSettings, Study
from sera.sequential import SequentialSettings
from tests.test_paper_figures_imagenet import make_run, read_csv_rows

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
CLIP_METHOD = replace(METHODS["sera_pilot"], name="sera_clip32", label="SERA (clip 1/32)")


def test_common_yaml_holds_the_sequential_settings_defaults():
    """configs/method/common.yaml and SequentialSettings are the config's and the library's view of one set of
    defaults: every config key is a field, and every value equals the field's default."""
    common = yaml.safe_load((CONFIGS / "method" / "common.yaml").read_text())["sequential"]
    defaults = {f.name: f.default for f in fields(SequentialSettings)}
    assert set(common) <= set(defaults)
    assert {k: defaults[k] for k in common} == common


def test_every_method_names_a_registered_sampler_and_baseline():
    for m in METHODS.values():
        assert isinstance(m.sampler, Sampler)
        assert m.baseline is None or (m.baseline in METHODS and METHODS[m.baseline].sampler is SAMPLERS["uniform"])


def test_validation_reads_the_samplers_flags(monkeypatch):
    """A new allocator's needs come from its flags alone: a stream allocator is refused by a study without one, a
    p_hat allocator needs an estimator, and the collection step refuses a missing stream or predictor."""
    monkeypatch.setitem(SAMPLERS, "probe", Sampler(stream=True, predictor=True))
    monkeypatch.setitem(COLLECTORS, "probe", COLLECTORS["sara"])
    monkeypatch.setitem(METHODS, "probe", replace(METHODS["sara"], name="probe", allocator="probe"))
    cfg = compose_cfg(CONFIGS, "method=sara", "method.name=probe")
    with pytest.raises(ValueError, match="draws extra prompts"):
        MethodSettings.from_config(cfg, Study("t", sequential=False))
    with pytest.raises(ValueError, match="needs prompts that recur"):
        MethodSettings.from_config(cfg, Study("t", repeated_prompts=False))
    settings = MethodSettings.from_config(cfg, Study("t"))
    with pytest.raises(ValueError, match="prompt stream"):
        collect(settings, 4, lambda counts: (None, np.zeros(int(counts.sum()))), stream=object())


def compose_cfg(config_dir: Path, *overrides):
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        return compose("imagenet", overrides=list(overrides))


def test_a_new_method_is_one_registry_entry_and_one_config_file(tmp_path, monkeypatch):
    configs = tmp_path / "configs"
    shutil.copytree(CONFIGS, configs)
    (configs / "method" / "sera_clip32.yaml").write_text(
        "defaults:\n  - common\n  - _self_\n\nname: sera_clip32\np_lo: 0.03125\np_hi: 0.96875\n"
    )
    monkeypatch.setitem(METHODS, CLIP_METHOD.name, CLIP_METHOD)
    settings = MethodSettings.from_config(compose_cfg(configs, "method=sera_clip32"), Study("imagenet"))
    assert (settings.p_lo, settings.p_hi, settings.estimator, settings.pilot_m) == (1 / 32, 31 / 32, "pilot", 8)
    assert settings.sampler is SAMPLERS["waterline"] and settings.multiplicity_correction

    rng = np.random.default_rng(0)
    p = rng.uniform(0, 0.9, 50)
    make_run(tmp_path / "runs", "maxrl", val_p=p, pass1=0.4)
    make_run(tmp_path / "runs", "sera_pilot", val_p=p + 0.02, pass1=0.5)
    make_run(tmp_path / "runs", "sera_clip32", val_p=p + 0.04, pass1=0.6)
    imagenet.table2(tmp_path / "runs", "cpu", tmp_path / "out")
    rows = read_csv_rows(tmp_path / "out" / "imagenet-cpu" / "table2.csv")
    reproduced = [r["method"] for r in rows if r["source"].startswith("reproduced")]
    assert reproduced == ["MaxRL", "SERA with pilots", "SERA (clip 1/32)"]
    verdict = (tmp_path / "out" / "imagenet-cpu" / "table2_verdict.md").read_text()
    assert "## SERA with pilots minus MaxRL" in verdict and "## SERA (clip 1/32) minus MaxRL" in verdict
    clip_block = verdict.split("## SERA (clip 1/32) minus MaxRL")[1]
    assert "+4.00 [+4.00, +4.00]" in clip_block.splitlines()[4]  # every image's p is 4 pp above MaxRL's


def test_sequential_settings_name_runs_and_are_checked_against_the_study():
    """A sequential setting the allocator reads and that is not the default names the run (the fair-DPS arm, the
    flat SARA of earlier runs); settings it does not read do not. SARA's history prior needs prompts that recur."""
    fair = compose_cfg(CONFIGS, "method=dps", "method.sequential.dps_ratio=64", "method.sequential.dps_decay=0.7",
                       "method.sequential.k0=4")  # fmt: skip
    assert MethodSettings.from_config(fair, Study("t")).variant() == "-dps_ratio=64-dps_decay=0.7"
    flat = compose_cfg(CONFIGS, "method=sara", "method.sequential.prior=flat", "method.sequential.k0=4")
    assert MethodSettings.from_config(flat, Study("t")).variant() == "-k0=4-prior=flat"
    assert MethodSettings.from_config(compose_cfg(CONFIGS, "method=sara+maxrl"), Study("t")).variant() == ""
    history = compose_cfg(CONFIGS, "method=sara", "method.sequential.prior=history")
    with pytest.raises(ValueError, match="prior=history"):
        MethodSettings.from_config(history, Study("t", repeated_prompts=False))
    with pytest.raises(ValueError, match="k0 >= 2"):
        MethodSettings.from_config(compose_cfg(CONFIGS, "method=sara", "method.sequential.k0=1"), Study("t"))
