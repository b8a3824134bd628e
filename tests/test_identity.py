"""Run identity (sera.identity): which settings make two runs different runs, and the folder name they give."""

from sera import identity

SERA = {"seed": 0, "n0": 16, "threads": 1, "run": {"root": "runs"},
        "method": {"name": "sera_pilot", "estimator": None, "pilot_m": None, "p_lo": None, "p_hi": None, "pkpo_k": 16,
                   "multiplicity_correction": None, "aggregation": "token-mean"},
        "optim": {"lr": 0.003}}  # fmt: skip


def with_method(**changes) -> dict:
    return {**SERA, "method": {**SERA["method"], **changes}}


def test_a_default_spelled_out_is_the_same_run():
    spelled = with_method(estimator="pilot", pilot_m=8, p_lo=0.0625, p_hi=0.9375, multiplicity_correction=True)
    assert identity.differences(SERA, spelled) == []
    history = with_method(estimator="history", pilot_m=0)
    assert identity.differences(SERA, history) == [("method.estimator", "pilot", "history"), ("method.pilot_m", 8, 0)]


def test_settings_a_run_does_not_read_or_that_do_not_change_results_are_not_its_identity():
    other = {**with_method(pkpo_k=4), "threads": 2, "run": {"root": "elsewhere"}, "device": "cuda"}
    assert identity.differences(SERA, other) == []  # pkpo_k is PKPO's only
    pkpo = {**SERA, "method": {**SERA["method"], "name": "pkpo"}}
    assert identity.differences(pkpo, {**pkpo, "method": {**pkpo["method"], "pkpo_k": 4}}) == [
        ("method.pkpo_k", 16, 4)]  # fmt: skip


def test_the_name_spells_out_what_differs_from_the_default_beyond_the_stem():
    ablation = {**with_method(p_lo=0.03125), "optim": {"lr": 0.001}}
    assert (
        identity.run_name("sera-m8_n0-16", 0, ablation, SERA)
        == "sera-m8_n0-16_method.p_lo=0.03125,optim.lr=0.001_seed-0"
    )
    assert identity.run_name("sera-m8_n0-16", 0, with_method(pilot_m=4), SERA) == "sera-m8_n0-16_seed-0"  # stem's
    assert identity.run_name("sera-m8_n0-16", 3, ablation, None) == "sera-m8_n0-16_seed-3"  # no default: no suffix


def test_a_long_suffix_is_shortened_with_a_hash_that_tells_ablations_apart():
    a = {**SERA, "optim": {"lr": 0.001, "schedule": "cosine-with-a-very-long-name", "weight_decay": 0.125}}
    b = {**a, "optim": {**a["optim"], "weight_decay": 0.25}}
    name_a, name_b = (identity.run_name("sera-m8_n0-16", 0, c, SERA) for c in (a, b))
    assert name_a != name_b and ".." in name_a and len(name_a) <= len("sera-m8_n0-16_seed-0") + identity.MAX_SUFFIX + 1


def test_a_refusal_names_each_key_with_both_values():
    text = identity.describe(identity.differences(SERA, with_method(p_lo=0.03125)))
    assert text == "method.p_lo: 0.0625 there, 0.03125 here"


def test_sera_without_pilots_is_sera_with_the_historical_p_hat():
    """method.pilot_m=0 alone (make ablate-pilot's m = 0) is the run `method.estimator=history method.pilot_m=0` was:
    the same settings, the same name."""
    from hydra import compose, initialize_config_dir

    from experiments.imagenet import train
    from tests.test_imagenet import CONFIGS

    with initialize_config_dir(config_dir=str(CONFIGS), version_base=None):
        default = compose("imagenet", ["method=sera_pilot"])
        short = compose("imagenet", ["method=sera_pilot", "method.pilot_m=0"])
        spelled = compose("imagenet", ["method=sera_pilot", "method.pilot_m=0", "method.estimator=history"])
    settings = train.validate(short)
    assert (settings.estimator, settings.pilot_m) == ("history", 0)
    plain = identity.result_settings
    assert plain(container(short)) == plain(container(spelled)) != plain(container(default))
    assert train.run_name(short, settings, container(default)) == "sera-history_n0-16_seed-0"


def container(cfg) -> dict:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(cfg, resolve=True)


def test_a_config_recorded_before_the_rename_is_read_with_the_earlier_names():
    """Before method.naming existed, `sera` named the pilot rule and `sera_authors` the authors' rule: such a recorded
    config is the same run as today's config of that rule, and not the same as a config of the other rule; the
    translation happens once (a translated config is marked and not translated again)."""
    from sera.methods import NAMING, current_names

    recorded_pilot = with_method(name="sera")  # no naming key: written under the earlier names
    today_pilot = with_method(name="sera_pilot", naming=NAMING)
    assert identity.differences(recorded_pilot, today_pilot) == []
    recorded_authors = {**SERA, "method": {"name": "sera_authors", "aggregation": "token-mean"}}
    today_authors = {**SERA, "method": {"name": "sera", "naming": NAMING, "aggregation": "token-mean"}}
    assert identity.differences(recorded_authors, today_authors) == []
    assert ("method.name", "sera_pilot", "sera") in identity.differences(recorded_pilot, today_authors)
    once = current_names(recorded_pilot)
    assert once["method"]["name"] == "sera_pilot" and current_names(once) == once
