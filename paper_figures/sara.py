"""The sequential-allocation comparison (make reproduce-sara): uniform GRPO and MaxRL, DS, DPS, SARA, SARA+DPS,
SARA+SERA and SARA+MaxRL on the classifier, the maze and tiny-math, set against the SARA abstract's claims. No torch.

Run: python -m paper_figures.sara --scale cpu_sara [--studies imagenet,maze,math]   (after make reproduce-sara)
Reads runs/<study>-<scale>/. Every RL step logs alloc/generated (everything sampled: probes, abandoned and surplus
groups included), alloc/rollouts (trained; absent on a step with nothing to train), alloc/effective_rollouts
(rollouts in trained groups with mixed rewards, the only ones with a GRPO gradient), the sequential allocators'
accounting (alloc/groups_committed, alloc/hit_wave_cap, alloc/shortfall), DPS's alloc/dps_predicted_partial and
alloc/dps_observed_partial, and on the classifier, where p is exact, alloc/abandon_error_mean (P(the abandoned group
would have ended mixed)) and, for the batch allocators, alloc/saturated_share (P(a fresh group of n0 is all-equal),
averaged over the step's images). Evaluations log train/distinct_prompts when the scale asks (train.log_coverage), and
an LM run with a finite training set then evaluates it at the end (eval/train_pool/pass@k).
Per row (a method and its sequential settings where they are not the defaults; mean over seeds): cumulative rollouts
generated and trained, rollouts generated per trained rollout and its ratio to DS's (the cap-neutral saving: arms
that hit their caps train fewer groups), groups trained a step, steps that hit the method's cap (named) and the mean
shortfall, the effective yield, the abandonment error, distinct prompts trained and Pass@1 on the training set at the
end (an LM study's finite pool: against held-out Pass@K, whether selection overfits it), Pass@K at the start of RL and
at the end, and Pass@1 at equal rollouts generated. The start of RL is the classifier's evaluation after the CE warm
start (eval.at_start) and, on the LM studies, the base run's evaluation (RL starts from that model). A second table
per study calibrates DPS's predictor; the claims table gives each seed's value beside the mean. The figure is Pass@1
against cumulative rollouts generated, one panel per study.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import numpy as np

from paper_figures.prereg import side_of_zero, size_against
from paper_figures.render import pyplot, save_figure, write_table
from paper_figures.runs import Run, group_runs, load_runs, mean_over, method_label, method_order, status_tags, tagged
from sera.identity import ADDED_DEFAULTS
from sera.methods import METHODS
from sera.runlog import TRAIN_POOL_SET
from sera.sequential import PRIOR_CLIP, SequentialSettings
from sera.stats import paired_t_power, seed_t_interval, seeds_for_equivalence, seeds_for_power, tost_power

OUT = Path(__file__).parent / "out"
STUDIES = {  # folder prefix -> title
    "imagenet": "Classification (digits1000, exact Pass@K)",
    "maze": "Maze navigation (held-out mazes)",
    "math": "Math (tiny-math, held-out chain sums)",
}
SHOWN_BEFORE_RUN = ("imagenet", "maze")  # studies whose (empty) tables are written before their grid has run
ABSTRACT = (
    "The SARA abstract (1.5B/3B models, math and planning): SARA matches DPS (both below the DS oracle) with 22% fewer "
    "rollouts than DS; SARA+DPS gives the best accuracy, slightly above DS, at 67% fewer rollouts."
)
LM_PASS1 = re.compile(r"eval/([^/]+)/pass@1")
TRAIN_POOL = f"eval/{TRAIN_POOL_SET}/pass@"  # the LM studies' training set, evaluated at the end (train.log_coverage)


def cumulative(run: Run, key: str) -> float | None:
    _, values = run.series(key)
    return float(np.nansum(values)) if values.size else None


def average(run: Run, key: str) -> float | None:
    """The mean of a per-step metric over the steps that log it, or None when none does."""
    _, values = run.series(key)
    return float(np.nanmean(values)) if values.size else None


def rl_steps(run: Run) -> int:
    """RL steps: every one logs alloc/generated, trained on or not."""
    return run.series("alloc/generated")[0].size


def eval_prefix(run: Run) -> str:
    """'eval/pass@' on the classifier, 'eval/<set>/pass@' (its first evaluation set) on the LM studies."""
    for record in run.records:
        for key in record:
            if key == "eval/pass@1":
                return "eval/pass@"
            if (match := LM_PASS1.fullmatch(key)) and f"eval/{match.group(1)}/pass@" != TRAIN_POOL:
                return f"eval/{match.group(1)}/pass@"
    return "eval/pass@"


def final_passk(run: Run, prefix: str) -> dict[int, float]:
    """{K: value} of the run's last evaluation."""
    last = next((r for r in reversed(run.records) if f"{prefix}1" in r), {})
    return {int(k[len(prefix) :]): float(v) for k, v in last.items() if k.startswith(prefix) and v is not None}


def sequential_settings(run: Run) -> SequentialSettings:
    """The run's method.sequential settings, with the value runs made before a setting existed had (ADDED_DEFAULTS)
    where the config lacks it (the defaults when it has no method.sequential at all)."""
    if run.get("method.sequential") is None:
        return SequentialSettings()
    values = dict(run.get("method.sequential"))
    for path, default in ADDED_DEFAULTS.items():
        if path[:2] == ("method", "sequential"):
            values.setdefault(path[2], default)
    known = {k: v for k, v in values.items() if k in SequentialSettings.__dataclass_fields__}
    return SequentialSettings(**known)


def changes(run: Run) -> dict:
    """{setting: value} of the sequential settings the run's allocator reads that are not the defaults."""
    name = run.get("method.name")
    if name not in METHODS:
        return {}
    return sequential_settings(run).changes(METHODS[name].sampler.reads)


def row_label(group: list[Run]) -> str:
    name = group[0].get("method.name")
    extra = ", ".join(f"{k}={v}" for k, v in changes(group[0]).items())
    return tagged(method_label(name), [extra, *status_tags(group)])


def cap_of(run: Run) -> str:
    """The method's cap on generation rounds or waves a step, named: '10 rounds', '16 waves'; '' for none."""
    name = run.get("method.name")
    if name not in METHODS:
        return ""
    cap = METHODS[name].sampler.cap  # the allocator's registry entry names its cap
    return f"{getattr(sequential_settings(run), cap[0])} {cap[1]}" if cap else ""


def groups_per_step(run: Run) -> float | None:
    """Groups trained a step, over RL steps: the sequential allocators' committed groups (0 on a skipped step), the
    batch allocators' B."""
    _, committed = run.series("alloc/groups_committed")
    if committed.size:
        return float(committed.mean())
    batch = run.get("train.batch_size")
    return float(batch) if batch is not None and rl_steps(run) else None


def share_of_steps(run: Run, key: str) -> float | None:
    """Share of RL steps on which a 0/1 metric is 1 (None when never logged)."""
    _, values = run.series(key)
    return float(values.sum() / rl_steps(run)) if values.size else None


def mixed_share(run: Run) -> float | None:
    """Mean share of trained groups with mixed rewards a step (effective groups / groups trained)."""
    _, effective = run.series("alloc/effective_groups")
    _, committed = run.series("alloc/groups_committed")
    batch = run.get("train.batch_size")
    if not effective.size or (not committed.size and batch is None):
        return None
    trained = committed[committed > 0] if committed.size else np.full(effective.size, float(batch))
    return float(np.mean(effective / trained)) if trained.size == effective.size else None


def base_pass1(runs: list[Run], run: Run, prefix: str) -> float | None:
    """Pass@1 of the model an LM run starts from: its base run's evaluation (same seed), or None."""
    for base in runs:
        if base.get("experiment") == f"{run.get('experiment')}-base" and base.get("seed") == run.get("seed"):
            value = final_passk(base, prefix).get(1)
            if value is not None:
                return value
    return None


def pass1_curve(run: Run, prefix: str, start: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(cumulative rollouts generated at each evaluation, Pass@1 there); `start` (the base model's Pass@1) adds the
    point at 0 rollouts when the run has none."""
    steps, generated = run.series("alloc/generated")
    at, pass1 = run.series(f"{prefix}1")
    total = np.array([generated[steps <= s].sum() for s in at])
    if start is not None and not (total.size and total[0] == 0):
        total, pass1 = np.concatenate([[0.0], total]), np.concatenate([[start], pass1])
    return total, pass1


def at_rollouts(curve, x) -> float | None:
    """Pass@1 of one run's curve at x rollouts generated, linearly interpolated; None outside its evaluations."""
    generated, pass1 = curve
    if x is None or not generated.size or not generated[0] <= x <= generated[-1]:
        return None
    return float(np.interp(x, generated, pass1))


def thousands(x) -> str:
    return "n/a" if x is None else f"{x / 1000:.1f}"


def percent(x) -> str:
    return "n/a" if x is None or not np.isfinite(x) else f"{100 * x:.2f}"


def number(x, digits: int = 2) -> str:
    return "n/a" if x is None or not np.isfinite(x) else f"{x:.{digits}f}"


def summarise(group: list[Run], runs: list[Run], prefix: str, show: list[int]) -> dict:
    """One row's numbers: per seed where the claims need them, else the mean over seeds."""
    done = [r for r in group if r.finished and final_passk(r, prefix)]
    starts = {id(r): base_pass1(runs, r, prefix) for r in done}
    per_seed = {
        int(r.get("seed")): {"generated": cumulative(r, "alloc/generated"), "trained": cumulative(r, "alloc/rollouts"),
                             "effective": cumulative(r, "alloc/effective_rollouts"),
                             "pass1": final_passk(r, prefix).get(1)}
        for r in done
    }  # fmt: skip
    return {
        "name": group[0].get("method.name"),
        "default": not changes(group[0]),
        "label": row_label(group),
        "seeds": len(done),
        "steps": group[0].get("train.steps"),
        "cap": cap_of(group[0]),
        "generated": mean_over(done, lambda r: cumulative(r, "alloc/generated")),
        "trained": mean_over(done, lambda r: cumulative(r, "alloc/rollouts")),
        "effective": mean_over(done, lambda r: cumulative(r, "alloc/effective_rollouts")),
        "groups": mean_over(done, groups_per_step),
        "cap_steps": mean_over(done, lambda r: share_of_steps(r, "alloc/hit_wave_cap")),
        "shortfall": mean_over(done, lambda r: average(r, "alloc/shortfall")),
        "abandon": mean_over(done, lambda r: average(r, "alloc/abandon_error_mean")),
        "saturated": mean_over(done, lambda r: average(r, "alloc/saturated_share")),
        "mixed": mean_over(done, mixed_share),
        "predicted": mean_over(done, lambda r: average(r, "alloc/dps_predicted_partial")),
        "observed": mean_over(done, lambda r: average(r, "alloc/dps_observed_partial")),
        "distinct": mean_over(done, lambda r: r.last("train/distinct_prompts")),
        "pool": mean_over(done, lambda r: final_passk(r, TRAIN_POOL).get(1)),
        "empty": int(sum(cumulative(r, "train/skipped_empty") or 0 for r in done)),
        "start": mean_over(done, lambda r: start_of(pass1_curve(r, prefix, starts[id(r)]))),
        "passk": {k: mean_over(done, lambda r, k=k: final_passk(r, prefix).get(k)) for k in show},
        "curve": [pass1_curve(r, prefix, starts[id(r)]) for r in done],
        "verdicts": verdicts(done),
        "prior_clip": mean_over(done, prior_at_clip),
        "per_seed": per_seed,
    }  # fmt: skip


def verdicts(runs: list[Run]) -> dict[int, tuple[float, float, float]] | None:
    """SARA's rule at work: for each probe size j at which any group was decided, the shares of the groups decided
    there that were committed, continued and abandoned (summed over steps and seeds); None for a run that never logs
    them (every allocator but SARA's)."""
    totals = {}
    for run in runs:
        for record in run.records:
            for action in ("committed", "continued", "abandoned"):
                for j, count in enumerate(record.get(f"alloc/{action}_at") or []):
                    totals.setdefault(j, {"committed": 0, "continued": 0, "abandoned": 0})[action] += count
    if not totals:
        return None
    return {j: tuple(c[a] / sum(c.values()) for a in ("committed", "continued", "abandoned"))
            for j, c in sorted(totals.items()) if sum(c.values())}  # fmt: skip


def prior_at_clip(run: Run) -> float | None:
    """Share of RL steps on which SARA's fitted prior had a parameter at a clip of SequentialSettings.prior_clip
    (None when the run logs no prior)."""
    _, a0 = run.series("alloc/prior_a0")
    _, b0 = run.series("alloc/prior_b0")
    if not a0.size:
        return None
    lo, hi = PRIOR_CLIP
    at = np.isclose(a0, lo) | np.isclose(a0, hi) | np.isclose(b0, lo) | np.isclose(b0, hi)
    return float(at.mean())


def per_gradient(s: dict) -> float | None:
    """Rollouts generated per rollout that carries a gradient (in a trained group with mixed rewards)."""
    return s["generated"] / s["effective"] if s.get("generated") and s.get("effective") else None


def start_of(curve) -> float | None:
    """Pass@1 at 0 rollouts generated (the start of RL), when the curve has that point."""
    total, pass1 = curve
    return float(pass1[0]) if total.size and total[0] == 0 else None


def reference(summary: dict, name: str) -> dict:
    """The row of method `name` at its default sequential settings, else its only row, else {}."""
    rows = [s for s in summary.values() if s["name"] == name]
    default = [s for s in rows if s["default"]]
    return default[0] if default else (rows[0] if len(rows) == 1 else {})


def per_trained(s: dict) -> float | None:
    return s["generated"] / s["trained"] if s.get("generated") and s.get("trained") else None


def study_table(runs_root: Path, study: str, scale: str, out_root: Path) -> tuple[str, dict]:
    """The markdown tables of one study (the comparison and DPS's calibration) and its rows {label: summary}."""
    every = load_runs(runs_root / f"{study}-{scale}")
    runs = [r for r in every if r.get("experiment") == study]
    groups = sorted(group_runs(runs), key=lambda g: (method_order(g[0].get("method.name")), bool(changes(g[0]))))
    prefix = eval_prefix(runs[0]) if runs else "eval/pass@"
    ks = sorted({k for r in runs for k in final_passk(r, prefix)})
    show = [k for k in ks if k in (1, 8, max(ks, default=1))]
    summary = {}
    for g in groups:
        s = summarise(g, every, prefix, show)
        summary[s["label"]] = s
    ds = reference(summary, "ds")
    # Pass@1 at equal rollouts generated: every method's curve read at the smallest total any method reached
    budgets = [s["generated"] for s in summary.values() if s["generated"]]
    common = min(budgets) if budgets else None
    header = ["method", "seeds", "steps", "generated (k)", "vs DS", "trained (k)", "generated per trained",
              "vs DS per trained", "generated per gradient rollout", "vs DS per gradient rollout",
              "groups trained a step", "cap", "steps at the cap (%)", "shortfall a step",
              "effective yield (%)", "abandon error (%)", "empty steps (all seeds)", "distinct prompts trained",
              "training-set Pass@1 (%)", "Pass@1 at start (%)", *[f"Pass@{k} (%)" for k in show],
              f"Pass@1 at {thousands(common)}k generated (%)"]  # fmt: skip
    rows = []
    for s in summary.values():
        ratio = "n/a"
        if ds.get("generated") and s["generated"]:
            ratio = f"{100 * (s['generated'] / ds['generated'] - 1):+.0f}%"
        cost, ds_cost = per_trained(s), per_trained(ds)
        neutral = f"{100 * (cost / ds_cost - 1):+.0f}%" if cost and ds_cost else "n/a"
        grad, ds_grad = per_gradient(s), per_gradient(ds)
        grad_ratio = f"{100 * (grad / ds_grad - 1):+.0f}%" if grad and ds_grad else "n/a"
        rows.append([
            s["label"], s["seeds"], s["steps"], thousands(s["generated"]), ratio, thousands(s["trained"]),
            number(cost), neutral, number(grad), grad_ratio, number(s["groups"], 1), s["cap"] or "none",
            percent(s["cap_steps"]), number(s["shortfall"], 1),
            percent(s["effective"] / s["generated"] if s["effective"] is not None and s["generated"] else None),
            percent(s["abandon"]), s["empty"], number(s["distinct"], 0), percent(s["pool"]), percent(s["start"]),
            *[percent(s["passk"][k]) for k in show],
            percent(mean_over(s["curve"], lambda curve: at_rollouts(curve, common))),
        ])  # fmt: skip
    md = write_table(out_root / f"sara-{scale}" / f"{study}", header, rows)
    grpo = reference(summary, "grpo")
    note = ""
    if grpo.get("saturated") is not None:
        note = (f"\nSaturated share under uniform GRPO (P[a fresh group of n0 has all-equal rewards], exact p, mean "
                f"over RL steps): {100 * grpo['saturated']:.1f}%.\n")  # fmt: skip
    elif grpo.get("effective") is not None and grpo.get("trained"):
        share = 1 - grpo["effective"] / grpo["trained"]
        note = f"\nSaturated share under uniform GRPO (rollouts in all-equal groups / rollouts): {100 * share:.1f}%.\n"
    tables = dps_table(summary, study, scale, out_root) + rule_table(summary, study, scale, out_root)
    return f"### {STUDIES[study]}\n\n{md}{note}{tables}", summary


def rule_table(summary: dict, study: str, scale: str, out_root: Path) -> str:
    """SARA's rule at work, per arm that runs it: the verdicts at each probe size (committed / continued / abandoned,
    % of the groups decided there) and the share of steps with the fitted prior at a clip."""
    arms = {label: s for label, s in summary.items() if s["verdicts"]}
    if not arms:
        return ""
    sizes = sorted({j for s in arms.values() for j in s["verdicts"]})
    header = [
        "method",
        *[f"at {j}: committed / continued / abandoned (%)" for j in sizes],
        "steps with the prior at a clip (%)",
    ]
    rows = [[label, *[" / ".join(f"{100 * x:.1f}" for x in s["verdicts"][j]) if j in s["verdicts"] else "n/a"
                      for j in sizes], percent(s["prior_clip"])] for label, s in arms.items()]  # fmt: skip
    md = write_table(out_root / f"sara-{scale}" / f"{study}_rule", header, rows)
    return f"\nSARA's rule at work (the groups decided at each probe size, all steps and seeds):\n\n{md}"


def dps_table(summary: dict, study: str, scale: str, out_root: Path) -> str:
    """DPS's calibration: for every arm ranked by DPS's predictor, the mean predicted P(partial) of the prompts it
    selected against the share of their groups observed partial, and uniform GRPO's share of mixed groups (the rate
    DPS has to beat)."""
    rows = [[s["label"], percent(s["predicted"]), percent(s["observed"])]
            for s in summary.values() if s["predicted"] is not None]  # fmt: skip
    grpo = reference(summary, "grpo")
    if not rows or not grpo:
        return ""
    rows.append([grpo["label"] + " (uniform)", "n/a", percent(grpo["mixed"])])
    header = ["method", "predicted P(partial) of the selected (%)", "observed partial (%)"]
    md = write_table(out_root / f"sara-{scale}" / f"{study}_dps", header, rows)
    return f"\nDPS's predictor, mean over steps (GRPO: its share of mixed groups):\n\n{md}"


# The abstract's claims, read as results/cpu/PREREGISTRATION_SARA.md registers them: (claim, tested row, reference
# row or rows, quantity, direction). Accuracy is final Pass@1 in pp (tested minus reference). A saving is read first
# per rollout trained (rollouts generated per rollout trained, 1 - tested / reference: arms that stop at their caps
# train less, so rollouts generated alone would count less training as a saving), then per rollout that carries a
# gradient, then, as a secondary reading, in rollouts generated; the rollouts trained are shown beside them.
EQUIVALENCE_MARGIN = 2.0  # pp of Pass@1: "matches" holds when the 90% seed interval lies inside +/- this (TOST)
REGISTERED_SEEDS = {"imagenet": 3, "maze": 15, "math": 8}  # seeds 0..n-1 of each study decide (PREREGISTRATION_SARA)
OTHER_ARMS = ("grpo", "ds", "dps", "sara")  # the abstract's arms that "the best accuracy" is read against
ABSTRACT_CLAIMS = [
    ("SARA matches DPS (Pass@1, equivalent within +/-2 pp)", "sara", "dps", "pass1", "equivalent"),
    ("DPS is below the DS oracle (Pass@1)", "dps", "ds", "pass1", "below"),
    ("SARA is below the DS oracle (Pass@1)", "sara", "ds", "pass1", "below"),
    ("SARA uses 22% fewer rollouts than DS (per rollout trained)", "sara", "ds", "per_trained", "fewer"),
    ("SARA uses 22% fewer rollouts than DS (per gradient rollout)", "sara", "ds", "gradient", "fewer"),
    ("SARA uses 22% fewer rollouts than DS (generated; secondary)", "sara", "ds", "generated", "fewer"),
    ("SARA trains fewer rollouts than DS (context)", "sara", "ds", "trained", "context"),
    ("SARA+DPS is slightly above DS (Pass@1)", "sara+dps", "ds", "pass1", "above"),
    ("SARA+DPS gives the best accuracy (Pass@1 above GRPO, DS, DPS and SARA)", "sara+dps", OTHER_ARMS, "pass1",
     "best"),
    ("SARA+DPS uses 67% fewer rollouts than DS (per rollout trained)", "sara+dps", "ds", "per_trained", "fewer"),
    ("SARA+DPS uses 67% fewer rollouts than DS (per gradient rollout)", "sara+dps", "ds", "gradient", "fewer"),
    ("SARA+DPS uses 67% fewer rollouts than DS (generated; secondary)", "sara+dps", "ds", "generated", "fewer"),
    ("SARA+DPS trains fewer rollouts than DS (context)", "sara+dps", "ds", "trained", "context"),
]  # fmt: skip
CLAIMED_SAVING = re.compile(r"uses (\d+)% fewer")  # a saving the abstract quantifies: the interval is read against it
SUITE_ADDS = [  # what this suite adds, kept apart from the abstract's claims (exploratory: nothing is registered)
    ("SARA+SERA against SARA (Pass@1)", "sara+sera", "sara", "pass1", "above"),
    ("SARA+SERA against SARA+MaxRL (Pass@1): SERA's advantage with SARA's allocation", "sara+sera", "sara+maxrl",
     "pass1", "above"),
    ("SARA+SERA uses fewer rollouts per gradient rollout than DS", "sara+sera", "ds", "gradient", "fewer"),
]  # fmt: skip
UNITS = {"pass1": "pp", "trained": "% fewer trained"}


def seed_values(summary: dict, tested: str, against: str, quantity: str, seeds: int | None = None) -> list[float]:
    """Per seed both rows ran (the first `seeds` seeds when given): tested minus reference Pass@1 (pp), or the saving
    against the reference in % (1 - tested / reference) of rollouts generated per rollout trained (`per_trained`),
    per gradient-carrying rollout (`gradient`), generated (`generated`), or of rollouts trained (`trained`)."""
    a, b = reference(summary, tested), reference(summary, against)
    if not a or not b:
        return []
    out = []
    for seed in sorted(set(a["per_seed"]) & set(b["per_seed"])):
        if seeds is not None and seed >= seeds:
            continue
        x, y = a["per_seed"][seed], b["per_seed"][seed]
        if quantity == "pass1":
            if x["pass1"] is not None and y["pass1"] is not None:
                out.append(100 * (x["pass1"] - y["pass1"]))
            continue
        denominator = {"per_trained": "trained", "gradient": "effective", "generated": None, "trained": None}[quantity]
        numerator = "trained" if quantity == "trained" else "generated"
        if not (x[numerator] and y[numerator]) or (denominator and not (x[denominator] and y[denominator])):
            continue
        ratio_x = x[numerator] / (x[denominator] if denominator else 1)
        ratio_y = y[numerator] / (y[denominator] if denominator else 1)
        out.append(100 * (1 - ratio_x / ratio_y))
    return out


def equivalence_reading(values: list[float], margin: float = EQUIVALENCE_MARGIN) -> str:
    """Two one-sided tests at 5% each: equivalent when the seed-level 90% t-interval lies inside (-margin, +margin);
    else "differ" when the 95% interval excludes zero; else not decided."""
    inner, outer = seed_t_interval(np.asarray(values), level=0.90), seed_t_interval(np.asarray(values))
    if -margin < inner.low and inner.high < margin:
        return f"equivalent within +/-{margin:g} pp"
    if outer.low > 0 or outer.high < 0:
        return "differ"
    return "not decided at this power"


def reading(values: list[float], direction: str, claimed: float | None = None) -> str:
    """What the seed-level 95% t-interval says of a claimed direction: decided for or against it, or not decided;
    with a claimed size (a saving in %), also whether the interval lies below, above or around it; "equivalent" reads
    the two one-sided tests; "context" only says on which side of zero the interval lies."""
    if len(values) < 2:
        return "one seed: no interval" if values else "not run"
    if direction == "equivalent":
        return equivalence_reading(values)
    ci = seed_t_interval(np.asarray(values))
    if direction == "context":
        side = side_of_zero(ci.low, ci.high, 1)
        return {1: "trains fewer", -1: "trains more", 0: "no difference detected"}[side] + " (context, no claim)"
    sign = {"below": -1, "above": 1, "fewer": 1}[direction]
    side = side_of_zero(ci.low, ci.high, sign)
    verdict = {1: "as claimed", -1: "against the claim", 0: "not decided at this power"}[side]
    if claimed is None:
        return verdict
    return f"{verdict}; {size_against(ci.low, ci.high, sign, claimed)} the claimed {claimed:g}%"


def interval_cell(values: list[float], unit: str, equivalence: bool = False) -> str:
    if len(values) < 2:
        return f"{values[0]:+.2f} {unit}" if values else "n/a"
    ci = seed_t_interval(np.asarray(values))
    cell = f"{ci.delta:+.2f} [{ci.low:+.2f}, {ci.high:+.2f}] {unit}"
    if equivalence:
        inner = seed_t_interval(np.asarray(values), level=0.90)
        cell += f"; 90%: [{inner.low:+.2f}, {inner.high:+.2f}]"
    return cell


def best_row(study: str, claim: str, summary: dict, tested: str, arms: tuple, registered: int | None) -> str:
    """\"Best accuracy\" as the comparison against every other arm: as claimed when the tested row is above each arm
    (each interval above zero), against the claim when it is below any, else not decided. The cell shows the arm it
    is closest to; the per-seed column each arm's difference with its interval (labelled "each arm")."""
    per_arm = {arm: seed_values(summary, tested, arm, "pass1", registered) for arm in arms}
    present = {arm: v for arm, v in per_arm.items() if v}
    counts = sorted({len(v) for v in per_arm.values()})
    if not present:
        return f"| {study} | {claim} | n/a | 0 |  | not run |"
    closest = min(present, key=lambda arm: np.mean(present[arm]))
    each = "each arm: " + "; ".join(f"{METHODS[arm].label} {interval_cell(v, 'pp')}" for arm, v in present.items())
    measured = f"vs {METHODS[closest].label}: " + interval_cell(present[closest], "pp")
    seeds = counts[0] if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
    if registered is not None and (len(present) < len(arms) or counts[0] < registered):
        progress = f"in progress ({counts[0]} of {registered} seeds): no decision"
        return f"| {study} | {claim} | {measured} | {seeds} | {each} | {progress} |"
    readings = [reading(v, "above") for v in present.values()]
    if all(r == "as claimed" for r in readings):
        said = "as claimed (above every arm)"
    elif any(r == "against the claim" for r in readings):
        below = [METHODS[a].label for a, r in zip(present, readings, strict=True) if r == "against the claim"]
        said = f"against the claim (below {', '.join(below)})"
    else:
        said = "not decided at this power"
    return f"| {study} | {claim} | {measured} | {seeds} | {each} | {said} |"


EXPLORATORY_WORDS = {"as claimed": "in the stated direction", "against the claim": "against the stated direction"}


def claim_rows(
    summaries: dict[str, dict], spec: list[tuple], registered: dict[str, int] | None = None, exploratory: bool = False
) -> list[str]:
    """One row per study and claim. With `registered` (study -> seeds), a claim reads only those seeds and decides
    nothing until all of them are in. An exploratory row claims nothing, so its reading names the side of zero its
    interval lies on against the direction the row states, not "as claimed"."""
    rows = []
    for study, summary in summaries.items():
        seeds = registered.get(study) if registered is not None else None
        for claim, tested, against, quantity, direction in spec:
            if direction == "best":
                rows.append(best_row(study, claim, summary, tested, against, seeds))
                continue
            values = seed_values(summary, tested, against, quantity, seeds)
            measured = interval_cell(values, UNITS.get(quantity, "% fewer"), direction == "equivalent")
            each = ", ".join(f"{v:+.2f}" for v in values)
            size = CLAIMED_SAVING.search(claim)
            if seeds is not None and values and len(values) < seeds and direction != "context":
                said = f"in progress ({len(values)} of {seeds} seeds): no decision"
            else:
                said = reading(values, direction, float(size.group(1)) if size else None)
                if exploratory:
                    said = EXPLORATORY_WORDS.get(said, said)
            rows.append(f"| {study} | {claim} | {measured} | {len(values)} | {each} | {said} |")
    return rows


def claims(summaries: dict[str, dict], registered: dict[str, int] | None = None) -> str:
    """The abstract's claims as results/cpu/PREREGISTRATION_SARA.md reads them, each with the seed-level 95%
    t-interval over the registered seeds both rows ran; then what this suite adds, apart and exploratory."""
    registered = REGISTERED_SEEDS if registered is None else registered
    header = ["| study | claim | measured [seed 95% t] | seeds | per seed | reading |", "|---|---|---|---|---|---|"]
    said = ", ".join(f"{study} seeds 0-{n - 1}" for study, n in registered.items())
    best_arms = ", ".join(METHODS[arm].label for arm in OTHER_ARMS[:-1]) + f" and {METHODS[OTHER_ARMS[-1]].label}"
    return "\n".join(
        ["## Against the SARA abstract", "", ABSTRACT, "",
         f"Read as `results/cpu/PREREGISTRATION_SARA.md` registers it ({said}; a saving per rollout trained first, "
         f"rollouts generated second; \"matches\" is equivalence within +/-{EQUIVALENCE_MARGIN:g} pp by two one-sided "
         f"tests, the 90% interval shown; \"best\" is above each of {best_arms}).", "",
         *header, *claim_rows(summaries, ABSTRACT_CLAIMS, registered), "",
         "## What this suite adds (not the abstract's claims; exploratory)", "", *header,
         *claim_rows(summaries, SUITE_ADDS, exploratory=True)]
    ) + "\n"  # fmt: skip


def power_rows(summaries: dict[str, dict], registered: dict[str, int]) -> list[list[str]]:
    """For each abstract claim on each study: the exploratory seeds' mean and SD, the seeds that would give 80% power
    at that mean and SD (the seed-level t-test; for "matches", the two one-sided tests within the margin), and the
    power at the registered seeds. The mean is the 3 seeds' own, so the estimate is rough and, for a small mean,
    optimistic about nothing: a mean near zero asks for many seeds."""
    out = []
    for study, summary in summaries.items():
        n = registered[study]
        for claim, tested, against, quantity, direction in ABSTRACT_CLAIMS:
            if direction == "context":
                continue
            pairs = [(a, f" vs {METHODS[a].label}") for a in against] if direction == "best" else [(against, "")]
            for arm, suffix in pairs:
                values = seed_values(summary, tested, arm, quantity)
                if len(values) < 2:
                    out.append([study, claim + suffix, str(len(values)), "", "", "", "", ""])
                    continue
                mean, sd = float(np.mean(values)), float(np.std(values, ddof=1))
                if sd == 0:
                    out.append([study, claim + suffix, str(len(values)), f"{mean:+.2f}", "0", "", "", ""])
                    continue
                if direction == "equivalent":
                    needed = seeds_for_equivalence(mean, sd, EQUIVALENCE_MARGIN)
                    power = tost_power(mean, sd, n, EQUIVALENCE_MARGIN)
                else:
                    needed, power = seeds_for_power(mean, sd, cap=200), paired_t_power(mean, sd, n)
                out.append([study, claim + suffix, str(len(values)), f"{mean:+.2f}", f"{sd:.2f}",
                            "over 200" if needed is None else str(needed), str(n), f"{100 * power:.0f}%"])  # fmt: skip
    return out


POWER_HEADER = ["study", "claim", "seeds in", "mean", "SD", "seeds for 80% power", "registered seeds",
                "power at the registered seeds"]  # fmt: skip


def figure(summaries: dict[str, dict], stem: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, max(1, len(summaries)), figsize=(6 * max(1, len(summaries)), 4), squeeze=False)
    for ax, (study, summary) in zip(axes[0], summaries.items(), strict=False):
        for j, s in enumerate(summary.values()):
            for i, (x, y) in enumerate(s["curve"]):  # one line per seed, one colour per row
                ax.plot(x / 1000, 100 * y, marker="o", ms=3, color=f"C{j % 10}", label=s["label"] if i == 0 else None)
        ax.set(xlabel="cumulative rollouts generated (thousands)", ylabel="Pass@1 (%)", title=STUDIES[study])
        if ax.lines:
            ax.legend(fontsize=7)
    save_figure(fig, stem)


class _Quiet:
    """A report stream that drops what it is told (the first look at a folder only asks whether it has runs)."""

    def write(self, text: str) -> int:
        return len(text)


_QUIET = _Quiet()


def build(runs_root: Path, scale: str, out_root: Path = OUT, studies=None) -> str:
    """Every study's tables, the claims and the figure for one scale; `studies` (default: all) picks the studies."""
    parts, summaries = [f"# Sequential allocation (SARA, DS, DPS), scale={scale}", ""], {}
    for study in studies or STUDIES:
        if study not in STUDIES:
            raise ValueError(f"unknown study {study!r}; choose from {', '.join(STUDIES)}")
        if study not in SHOWN_BEFORE_RUN and not any(
            r.get("experiment") == study for r in load_runs(runs_root / f"{study}-{scale}", report=_QUIET)
        ):
            continue  # the math grid's table appears once it has runs
        text, summary = study_table(runs_root, study, scale, out_root)
        parts += [text, ""]
        if summary:
            summaries[study] = summary
    parts.append(claims(summaries))
    figure(summaries, out_root / f"sara-{scale}" / "pass1_vs_rollouts")
    text = "\n".join(parts)
    (out_root / f"sara-{scale}" / "sara.md").write_text(text)
    print(text)
    return text


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", default="cpu_sara")
    parser.add_argument("--runs", default="runs")
    parser.add_argument("--out", default=str(OUT))
    parser.add_argument("--studies", default=",".join(STUDIES), help="comma-separated: imagenet,maze,math")
    parser.add_argument("--power", action="store_true", help="print the power estimate of each claim (no tables)")
    args = parser.parse_args(argv)
    studies = [s for s in args.studies.split(",") if s]
    if args.power:
        summaries = {}
        for study in studies:
            summary = study_table(Path(args.runs), study, args.scale, Path(args.out))[1]
            if summary:
                summaries[study] = summary
        rows = power_rows(summaries, REGISTERED_SEEDS)
        print("| " + " | ".join(POWER_HEADER) + " |\n|" + "---|" * len(POWER_HEADER))
        print("\n".join("| " + " | ".join(r) + " |" for r in rows))
        return
    build(Path(args.runs), args.scale, Path(args.out), studies)


if __name__ == "__main__":
    main()
