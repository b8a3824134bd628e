"""The sequential-allocation table (paper_figures/sara.py) on synthetic run directories: cumulative rollouts, the
ratio to DS per rollout generated and per trained rollout, groups trained a step, cap hits and shortfall, the
effective yield, the saturated share, DPS's calibration, the start of RL (the classifier's evaluation after the warm
start, an LM run's base run), rows kept apart by their sequential settings, and the abstract's claims with each seed's
value, computed by hand here."""

import csv
import json

import pytest
import yaml

from paper_figures import sara
from sera.runlog import CONFIG_FILE, DONE_FILE, METRICS_FILE


def write_run(root, method, steps, seed=0, finished=True, sequential=None, experiment="imagenet", name=None, first=0):
    """steps: list of per-step dicts, logged from step `first`; on the classifier every 2nd step also evaluates
    (Pass@1 = step / 100)."""
    path = root / (name or f"{method}_n0-8_seed-{seed}")
    path.mkdir(parents=True)
    config = {"experiment": experiment, "method": {"name": method}, "seed": seed, "n0": 8,
              "train": {"steps": 4, "batch_size": 2}}  # fmt: skip
    if sequential is not None:
        config["method"]["sequential"] = sequential
    (path / CONFIG_FILE).write_text(yaml.safe_dump(config))
    lines = []
    for i, record in enumerate(steps, start=first):
        record = {"step": i, **record}
        if i % 2 == 1 and experiment == "imagenet":
            record |= {"eval/pass@1": i / 100, "eval/pass@8": 2 * i / 100}
        lines.append(json.dumps(record))
    (path / METRICS_FILE).write_text("\n".join(lines) + "\n")
    if finished:
        (path / DONE_FILE).write_text("{}")


def step(generated, trained, effective, **extra):
    return {"alloc/generated": generated, "alloc/rollouts": trained, "alloc/effective_rollouts": effective, **extra}


def rows_of(path):
    with open(path) as f:
        return {r["method"]: r for r in csv.DictReader(f)}


def test_table_and_claims_from_runs(tmp_path):
    root = tmp_path / "imagenet-x"
    write_run(root, "grpo", [step(100, 100, 20, **{"alloc/saturated_share": s, "alloc/effective_groups": e})
                             for s, e in ((0.7, 1), (0.9, 0), (0.8, 1), (0.8, 2))])  # fmt: skip
    ds = {"alloc/groups_committed": 2, "alloc/hit_wave_cap": 0, "alloc/shortfall": 0}
    write_run(root, "ds", [step(400, 100, 100, **ds)] * 4)
    write_run(root, "ds", [step(600, 100, 100, **ds)] * 3 + [step(600, 50, 50, **(ds | {"alloc/hit_wave_cap": 1,
              "alloc/shortfall": 1, "alloc/groups_committed": 1}))], seed=1)  # fmt: skip
    sara_step = {"alloc/abandon_error_mean": 0.1, "alloc/groups_committed": 2, "alloc/hit_wave_cap": 0,
                 "alloc/committed_at": [0, 0, 1, 0, 1], "alloc/continued_at": [0, 0, 1, 0, 0],
                 "alloc/abandoned_at": [0, 0, 2, 0, 1], "alloc/prior_a0": 0.05, "alloc/prior_b0": 50.0}  # fmt: skip
    empty = {"alloc/generated": 50, "train/skipped_empty": 1, "alloc/groups_committed": 0, "alloc/hit_wave_cap": 1,
             "alloc/shortfall": 2}  # fmt: skip
    for seed in (0, 1):
        write_run(root, "sara", [step(300, 80, 80, **sara_step)] * 3 + [empty], seed=seed)
    write_run(root, "sara+dps", [step(100, 100, 100)] * 2, finished=False)
    dps = {"alloc/dps_predicted_partial": 0.4, "alloc/dps_observed_partial": 0.25}
    write_run(root, "dps", [step(100, 100, 30, **dps)] * 4)
    write_run(root, "dps", [step(100, 100, 30, **(dps | {"alloc/dps_predicted_partial": 0.6}))] * 4,
              sequential={"dps_decay": 0.7, "dps_ratio": 64}, name="dps-fair")  # fmt: skip
    text = sara.build(tmp_path, "x", tmp_path / "out", ["imagenet"])
    rows = rows_of(tmp_path / "out" / "sara-x" / "imagenet.csv")
    assert rows["DS (DAPO)"]["seeds"] == "2" and rows["DS (DAPO)"]["generated (k)"] == "2.0"  # (1600 + 2400) / 2
    assert rows["GRPO"]["vs DS"] == "-80%" and rows["GRPO"]["effective yield (%)"] == "20.00"
    assert rows["SARA"]["generated (k)"] == "0.9" and rows["SARA"]["vs DS"] == "-52%"  # 950 vs 2000
    assert rows["SARA"]["trained (k)"] == "0.2" and rows["SARA"]["abandon error (%)"] == "10.00"
    assert rows["SARA"]["empty steps (all seeds)"] == "2" and rows["SARA"]["Pass@1 (%)"] == "3.00"
    # per trained rollout, seeds pooled: DS 2000/375 = 5.333, SARA 950/240 = 3.958: 26% fewer, not 52%
    assert rows["DS (DAPO)"]["generated per trained"] == "5.33" and rows["SARA"]["generated per trained"] == "3.96"
    assert rows["SARA"]["vs DS per trained"] == "-26%"
    assert rows["DS (DAPO)"]["groups trained a step"] == "1.9" and rows["GRPO"]["groups trained a step"] == "2.0"
    assert rows["DS (DAPO)"]["cap"] == "10 rounds" and rows["SARA"]["cap"] == "16 waves"
    assert rows["GRPO"]["cap"] == "none"
    assert rows["DS (DAPO)"]["steps at the cap (%)"] == "12.50" and rows["SARA"]["steps at the cap (%)"] == "25.00"
    assert rows["DS (DAPO)"]["shortfall a step"] == "0.1"  # (0 + 0.25) / 2
    assert rows["SARA+DPS (unfinished)"]["seeds"] == "0"  # an unfinished run gives no numbers
    assert rows["DPS (dps_ratio=64, dps_decay=0.7)"]["seeds"] == "1" and rows["DPS"]["seeds"] == "1"  # kept apart
    at = "Pass@1 at 0.4k generated (%)"  # the smallest total (GRPO's 400), where every curve is read
    assert rows["GRPO"][at] == "3.00" and rows["DS (DAPO)"][at] == "n/a"  # DS's first evaluation is past 400
    assert "Saturated share under uniform GRPO" in text and "80.0%" in text
    dps_rows = rows_of(tmp_path / "out" / "sara-x" / "imagenet_dps.csv")
    assert dps_rows["DPS"]["predicted P(partial) of the selected (%)"] == "40.00"
    assert dps_rows["DPS (dps_ratio=64, dps_decay=0.7)"]["predicted P(partial) of the selected (%)"] == "60.00"
    assert dps_rows["DPS"]["observed partial (%)"] == "25.00"
    assert dps_rows["GRPO (uniform)"]["observed partial (%)"] == "50.00"  # (1 + 0 + 1 + 2) / 2 / 4 steps
    # the abstract's claims, seed by seed: SARA's saving is 1 - 950/1600 on seed 0 and 1 - 950/2400 on seed 1
    # the classifier registers 3 seeds: with 2 in, every claim says so and decides nothing
    claim = "| imagenet | SARA uses 22% fewer rollouts than DS (generated; secondary) | +50.52 [-75.22, +176.26]"
    assert claim + " % fewer | 2 | +40.62, +60.42 | in progress (2 of 3 seeds): no decision |" in text
    # per rollout trained: DS 1600/400 = 4 and 2400/350 = 6.857, SARA 950/240 = 3.958 on both seeds
    saving = [100 * (1 - (950 / 240) / (1600 / 400)), 100 * (1 - (950 / 240) / (2400 / 350))]
    assert f"| 2 | {saving[0]:+.2f}, {saving[1]:+.2f} | in progress" in text
    trained = [100 * (1 - 240 / 400), 100 * (1 - 240 / 350)]  # the context row: rollouts trained
    assert f"| SARA trains fewer rollouts than DS (context) | {sum(trained) / 2:+.2f} [" in text
    matches = "| imagenet | SARA matches DPS (Pass@1, equivalent within +/-2 pp) | +0.00 pp | 1 | +0.00 | in progress"
    assert matches in text
    assert "| imagenet | SARA+DPS is slightly above DS (Pass@1) | n/a | 0 |  | not run |" in text  # unfinished
    # without the registration's seed counts, the readings themselves
    summary = sara.study_table(tmp_path, "imagenet", "x", tmp_path / "out2")[1]
    unregistered = sara.claim_rows({"imagenet": summary}, sara.ABSTRACT_CLAIMS)
    row = next(r for r in unregistered if "(generated; secondary)" in r and "| SARA uses" in r)
    assert row.endswith("| not decided at this power; consistent with the claimed 22% |")
    assert text.index("## What this suite adds") > text.index("SARA+DPS uses 67% fewer")
    rule = rows_of(tmp_path / "out" / "sara-x" / "imagenet_rule.csv")["SARA"]
    assert rule["at 2: committed / continued / abandoned (%)"] == "25.0 / 25.0 / 50.0"
    assert rule["at 4: committed / continued / abandoned (%)"] == "50.0 / 0.0 / 50.0"
    assert rule["steps with the prior at a clip (%)"] == "100.00"  # (0.05, 50) on every step that fits one
    # per rollout that carries a gradient: DS 2000/375, SARA 950/240, the same as per trained here (all mixed)
    assert rows["SARA"]["generated per gradient rollout"] == "3.96"
    assert rows["SARA"]["vs DS per gradient rollout"] == "-26%"
    assert (tmp_path / "out" / "sara-x" / "pass1_vs_rollouts.png").exists()


def test_start_of_rl_from_the_warm_start_evaluation_or_the_base_run(tmp_path):
    """The classifier logs an evaluation after the CE warm start (before any rollout): Pass@1 at 0 rollouts. An LM
    run starts from its base run's model, whose evaluation is that point."""
    root = tmp_path / "imagenet-x"
    write_run(root, "ds", [{}, step(10, 8, 8), step(20, 8, 8), step(30, 8, 8)], first=0)  # step 1 is a CE step here
    records = (root / "ds_n0-8_seed-0" / METRICS_FILE).read_text().splitlines()
    records[0] = json.dumps({"step": 0, "eval/pass@1": 0.005})  # the warm start's last step, evaluated
    (root / "ds_n0-8_seed-0" / METRICS_FILE).write_text("\n".join(records) + "\n")
    sara.build(tmp_path, "x", tmp_path / "out", ["imagenet"])
    assert rows_of(tmp_path / "out" / "sara-x" / "imagenet.csv")["DS (DAPO)"]["Pass@1 at start (%)"] == "0.50"

    maze = tmp_path / "maze-x"
    held = [{"eval/heldout/pass@1": 0.1 * i} if i % 2 else {} for i in range(4)]
    held[-1] |= {"eval/train_pool/pass@1": 0.75}  # the training pool, evaluated at the end
    write_run(maze, "grpo", [step(8, 8, 4) | h for h in held], experiment="maze")
    base = maze / "base_seed-0"
    base.mkdir()
    (base / CONFIG_FILE).write_text(yaml.safe_dump({"experiment": "maze-base", "seed": 0}))
    (base / METRICS_FILE).write_text(json.dumps({"step": 3, "eval/heldout/pass@1": 0.02}) + "\n")
    (base / DONE_FILE).write_text("{}")
    sara.build(tmp_path, "x", tmp_path / "out", ["maze"])
    row = rows_of(tmp_path / "out" / "sara-x" / "maze.csv")["GRPO"]
    assert row["Pass@1 at start (%)"] == "2.00" and row["Pass@1 (%)"] == "30.00"  # held-out, not the pool
    assert row["training-set Pass@1 (%)"] == "75.00"
    run = [r for r in sara.load_runs(maze) if r.get("experiment") == "maze"][0]
    x, y = sara.pass1_curve(run, "eval/heldout/pass@", 0.02)
    assert x.tolist() == [0, 16, 32] and y.tolist() == pytest.approx([0.02, 0.1, 0.3])


def test_old_runs_are_labelled_by_the_settings_they_were_made_with(tmp_path):
    """A SARA run made before the prior existed (k0 = 4, no prior key: the flat prior) is a row of its own."""
    root = tmp_path / "imagenet-x"
    old = {"k0": 4, "k_min": 2, "chunk": 2, "tau_lo": 0.45, "tau_hi": 0.95, "max_waves": 16, "mode": "fill",
           "gen_batch": None, "max_rounds": 10, "dps_ratio": 8, "dps_decay": 0.5}  # fmt: skip
    write_run(root, "sara", [step(300, 80, 80)] * 4, sequential=old)
    write_run(root, "sara", [step(200, 80, 80)] * 4, sequential=old | {"k0": 2, "prior": "population"}, name="new")
    sara.build(tmp_path, "x", tmp_path / "out", ["imagenet"])
    rows = rows_of(tmp_path / "out" / "sara-x" / "imagenet.csv")
    assert rows["SARA (k0=4, prior=flat)"]["generated (k)"] == "1.2" and rows["SARA"]["generated (k)"] == "0.8"
    with pytest.raises(ValueError, match="unknown study"):
        sara.build(tmp_path, "x", tmp_path / "out", ["chess"])


def test_pass1_curve_is_against_cumulative_rollouts_generated(tmp_path):
    root = tmp_path / "imagenet-x"
    write_run(root, "ds", [step(g, 8, 8) for g in (10, 20, 30, 40)])
    run = sara.load_runs(root)[0]
    x, y = sara.pass1_curve(run, "eval/pass@")
    assert x.tolist() == [30, 100] and y.tolist() == [0.01, 0.03]
    assert sara.at_rollouts((x, y), 65) == pytest.approx(0.02) and sara.at_rollouts((x, y), 101) is None


def test_a_claimed_saving_is_read_against_its_size():
    """A saving the abstract quantifies ("67% fewer") is read in direction and against the size: a saving of 61% on
    every seed is fewer rollouts, as claimed, but smaller than claimed."""
    assert sara.reading([60.8, 60.9, 61.0], "fewer", 67) == "as claimed; smaller than the claimed 67%"
    assert sara.reading([40.0, 41.0, 39.0], "fewer", 22) == "as claimed; larger than the claimed 22%"
    assert sara.reading([60.0, 75.0, 68.0], "fewer", 67) == "as claimed; consistent with the claimed 67%"
    assert sara.reading([-5.0, 5.0, 1.0], "fewer", 22) == "not decided at this power; smaller than the claimed 22%"
    assert sara.reading([60.8, 60.9, 61.0], "fewer") == "as claimed"


def test_matches_is_read_as_equivalence_within_the_margin():
    # 90% interval of [0.1, -0.2, 0.3, 0.0]: inside +/-2 pp
    assert sara.reading([0.1, -0.2, 0.3, 0.0], "equivalent") == "equivalent within +/-2 pp"
    assert sara.reading([5.0, 5.5, 6.0], "equivalent") == "differ"  # far outside, and the 95% interval excludes 0
    assert sara.reading([-3.0, 4.0, 0.5], "equivalent") == "not decided at this power"  # wide, covers zero
    # a small difference that the 95% interval excludes is still equivalent: it lies inside the margin
    assert sara.reading([0.50, 0.52, 0.51, 0.49], "equivalent") == "equivalent within +/-2 pp"
    cell = sara.interval_cell([0.1, -0.2, 0.3, 0.0], "pp", equivalence=True)
    assert cell.startswith("+0.05 [") and "; 90%: [" in cell


def test_best_is_above_every_other_arm():
    def summary(pass1):  # method -> per-seed final Pass@1 (fractions)
        return {m: {"name": m, "default": True, "label": m,
                    "per_seed": {s: {"pass1": p, "generated": 1, "trained": 1, "effective": 1}
                                 for s, p in enumerate(ps)}} for m, ps in pass1.items()}  # fmt: skip

    arms = ("grpo", "ds")
    above = summary({"sara+dps": [0.50, 0.51, 0.52], "grpo": [0.40, 0.40, 0.41], "ds": [0.45, 0.46, 0.46]})
    row = sara.best_row("m", "best", above, "sara+dps", arms, None)
    assert row.endswith("| as claimed (above every arm) |") and "vs DS (DAPO): +5.33 [" in row
    assert "| each arm: GRPO +10.67 [" in row and "; DS (DAPO) +5.33 [" in row  # each arm's difference, interval
    below = summary({"sara+dps": [0.50, 0.51, 0.52], "grpo": [0.40, 0.40, 0.41], "ds": [0.55, 0.56, 0.56]})
    assert sara.best_row("m", "best", below, "sara+dps", arms, None).endswith("| against the claim (below DS (DAPO)) |")
    mixed = summary({"sara+dps": [0.50, 0.51, 0.52], "grpo": [0.40, 0.40, 0.41], "ds": [0.45, 0.56, 0.46]})
    assert sara.best_row("m", "best", mixed, "sara+dps", arms, None).endswith("| not decided at this power |")
    assert "in progress (3 of 8 seeds)" in sara.best_row("m", "best", above, "sara+dps", arms, 8)


def test_exploratory_rows_claim_nothing():
    """The suite's own rows are exploratory: their reading names the side of zero against the stated direction, never
    "as claimed"; the registered rows keep the registration's words, and "best" names the abstract's four arms."""
    per_seed = {"sara+sera": [0.50, 0.51, 0.52], "sara": [0.40, 0.40, 0.41], "sara+maxrl": [0.60, 0.61, 0.61]}
    summary = {m: {"name": m, "default": True, "label": m,
                   "per_seed": {s: {"pass1": p, "generated": 1, "trained": 1, "effective": 1}
                                for s, p in enumerate(ps)}} for m, ps in per_seed.items()}  # fmt: skip
    spec = sara.SUITE_ADDS[:2]  # SARA+SERA above SARA, above SARA+MaxRL
    explored = sara.claim_rows({"m": summary}, spec, exploratory=True)
    assert explored[0].endswith("| in the stated direction |")
    assert explored[1].endswith("| against the stated direction |")
    assert sara.claim_rows({"m": summary}, spec)[0].endswith("| as claimed |")
    text = sara.claims({"m": summary}, registered={"m": 3})
    assert '"best" is above each of GRPO, DS (DAPO), DPS and SARA).' in text and "| in the stated direction |" in text
