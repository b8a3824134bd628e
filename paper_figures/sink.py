"""The never-solved sink on the maze pool (results/cpu/PLAN_SINK.md; exploratory, it decides nothing). No torch.

    python -m paper_figures.sink --runs runs --out paper_figures/out --results results/cpu

Four tables into <out>/sink/ (published into <results>/sink/ unless the committed ones hold more):
- footprint.md: the registered runs of C5 (the maze pool) and C6 (tiny-math), per method: the steps with no gradient
  (no rollout with a non-zero advantage), the first such step, and the mean mixed groups a step.
- interventions.md: each intervention of the plan (runs/sink/maze-cpu_pool, named by configs/sink/), SERA with it
  minus MaxRL at C5's endpoint (held-out Pass@32 at step 800) seed by seed, the seed-level 95% t-interval, the same
  for the authors' rule on those seeds, their difference seed by seed (the intervention's SERA minus the rule's where
  MaxRL is the same run; where the intervention reruns MaxRL, the change in SERA minus MaxRL), and the plan's reading.
  A pair stands only where both runs started from one base model (`base.json`); MaxRL is C5's archived run of the seed
  unless the intervention changes MaxRL too and reruns it (authors_optim, strong_base).
- mechanism.md: each sink run's measures (sera.sink): the never-solved share at the first allocation (step 32), the
  mean share of a step's rollouts on never-solved prompts from epoch 1, mixed groups, steps with no gradient.
- regime.md: the regime picture's points, SERA minus MaxRL against the never-solved share at the first allocation,
  one a pair with both, and the OLS slope with its 95% interval (from three distinct shares); with it the figure
  (regime.png, published as docs/figures/sink_regime.png for docs/maze.md).
"""

from __future__ import annotations

import argparse
import functools
import shutil
from pathlib import Path

import numpy as np
import yaml

from paper_figures import guard
from paper_figures.prereg import CLAIMS, base_of, record_passk, runs_of
from paper_figures.render import pyplot, save_figure, write_table
from paper_figures.runs import Run, load_runs
from sera.stats import seed_t_interval

C5 = next(c for c in CLAIMS if c.name.startswith("C5"))
SINK_CONFIGS = Path(__file__).resolve().parent.parent / "configs" / "sink"
# the plan's seeds before an intervention is read: 6, the later ones 4 (amendments 2 and 3)
MIN_SEEDS = {"cap": 4, "strong_base": 4, "weight_cap": 4}


def flat(node: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in node.items():
        out |= flat(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value}
    return out


@functools.cache
def interventions() -> dict[str, dict]:
    """Each named intervention (configs/sink/<name>.yaml) as its dotted settings (read once)."""
    return {p.stem: flat(yaml.safe_load(p.read_text())) for p in sorted(SINK_CONFIGS.glob("*.yaml"))}


def intervention_of(run: Run) -> str | None:
    """The intervention whose every setting the run's config holds (None: none does)."""
    for name, settings in interventions().items():
        if all(run.get(key) == value for key, value in settings.items()):
            return name
    return None


def by_intervention(sink: list[Run]) -> dict[str, list[Run]]:
    """The sink folder's runs under each named intervention (every name present, empty where none ran)."""
    groups = {name: [] for name in interventions()}
    for run in sink:
        name = intervention_of(run)
        if name is not None:
            groups[name].append(run)
    return groups


def reruns_maxrl(name: str) -> bool:
    """Whether an intervention changes MaxRL too (a setting outside `alloc`, which only the authors' rule reads: the
    optimiser, the base model), so that MaxRL is rerun with it (the Makefile's SINK_METHODS reads the same)."""
    return any(not key.startswith("alloc.") for key in interventions().get(name, {}))  # the control: none


def against_of(name: str, seed: int, own: list[Run], registered_maxrl: dict[int, Run]) -> Run | None:
    """The MaxRL run an intervention's SERA run of `seed` pairs with: its own rerun where the intervention changes
    MaxRL too (reruns_maxrl), else C5's archived run of the seed."""
    return by_seed(own, "maxrl").get(seed) if reruns_maxrl(name) else registered_maxrl.get(seed)


def endpoint(run: Run) -> float | None:
    return record_passk(run, C5.eval_set, C5.final, C5.k)


def by_seed(runs: list[Run], method: str) -> dict[int, Run]:
    return {r.get("seed"): r for r in runs if r.finished and r.get("method.name") == method}


def paired(a: Run | None, b: Run | None) -> float | None:
    """a minus b at C5's endpoint, where both exist and started from one base model."""
    if a is None or b is None or base_of(a) != base_of(b):
        return None
    x, y = endpoint(a), endpoint(b)
    return None if x is None or y is None else x - y


def interval_cell(diffs: list[float]) -> str:
    if not diffs:
        return "not run"
    ci = seed_t_interval(np.asarray(diffs))
    return f"{ci.delta:+.2f} [{ci.low:+.2f}, {ci.high:+.2f}]" if len(diffs) > 1 else f"{ci.delta:+.2f}"


def reading(own: list[float], rule: list[float], against_rule: list[float], minimum: int = 6) -> str:
    """The plan's reading: removes the sink (own interval not below zero where the rule's is), helps (paired
    difference against the rule above zero), or not shown to help; in progress below MIN_SEEDS seeds."""
    if len(own) < minimum:
        return f"in progress ({len(own)} of {minimum} seeds)"
    own_ci, rule_ci = seed_t_interval(np.asarray(own)), seed_t_interval(np.asarray(rule))
    words = []
    if own_ci.high >= 0 > rule_ci.high:
        words.append("removes the sink")
    if len(against_rule) > 1 and seed_t_interval(np.asarray(against_rule)).low > 0:
        words.append("helps")
    return "; ".join(words) or "not shown to help"


def intervention_rows(registered: list[Run], sink: list[Run]) -> list[list]:
    maxrl, rule = by_seed(registered, "maxrl"), by_seed(registered, "sera")
    rows = []
    for name, runs in by_intervention(sink).items():
        pairs = []
        for seed, run in sorted(by_seed(runs, "sera").items()):
            d, c5 = paired(run, against_of(name, seed, runs, maxrl)), paired(rule.get(seed), maxrl.get(seed))
            if d is not None:
                pairs.append((seed, d, c5, None if c5 is None else d - c5))  # the change in SERA minus MaxRL
        own = [d for _, d, _, _ in pairs]
        c5 = [c for _, _, c, _ in pairs if c is not None]
        versus = [v for _, _, _, v in pairs if v is not None]
        each = ", ".join(f"{s}: {d:+.2f}" for s, d, _, _ in pairs)
        rows.append([name, len(own), interval_cell(own), interval_cell(c5), interval_cell(versus),
                     reading(own, c5, versus, MIN_SEEDS.get(name, 6)), each])  # fmt: skip
    return rows


def footprint_rows(claim, runs: list[Run]) -> list[list]:
    """A registered claim's runs (C5: the maze pool, C6: tiny-math), per method over its seeds: steps with no gradient
    (no rollout with a non-zero advantage: a median a run, in total, how many runs have one, the first such step's
    median) and the median of the runs' mean mixed groups a step."""
    rows = []
    for method in (claim.against, claim.tested):
        chosen = [r for seed, r in sorted(runs_of(runs, claim, method).items()) if seed in claim.seeds]
        dead = [steps[values == 0] for steps, values in (r.series("train/live_rollouts") for r in chosen)]
        firsts = [int(d[0]) for d in dead if d.size]
        mixed = [float(np.mean(r.series("alloc/effective_groups")[1])) for r in chosen]
        median = lambda values: float(np.median(values)) if values else None  # noqa: E731
        runs_with = f"{len(firsts)} of {len(chosen)}"
        first = median(firsts) if firsts else "none"  # no run had such a step (not "not run")
        rows.append([claim.name.split(",")[0], method, len(chosen), median([d.size for d in dead]),
                     sum(d.size for d in dead), runs_with, first, median(mixed)])  # fmt: skip
    return rows


def measures(run: Run) -> dict:
    """A sink run's measures (sera.sink): the never-solved share at the first allocation, the mean share of a step's
    rollouts on never-solved prompts from epoch 1, mean mixed groups, steps with no gradient."""
    allocation = run.get("task.pool_size") // run.get("train.batch_size")  # the first step after the uniform epoch
    first = next((r.get("pool/never_solved") for r in run.records if r["step"] == allocation), None)
    _, share = run.series("alloc/unsolved_share")
    steps, live = run.series("train/live_rollouts")
    _, groups = run.series("alloc/effective_groups")
    mixed = float(groups.mean()) if groups.size else None
    return {"first": first, "share": float(share.mean()) if share.size else None, "mixed": mixed,
            "dead": int(np.sum(live == 0))}  # fmt: skip


def mechanism_rows(sink: list[Run], controls: list[Run]) -> list[list]:
    rows = []
    for label, runs in {"control": controls, **by_intervention(sink)}.items():
        for run in sorted((r for r in runs if r.finished), key=lambda r: (r.get("method.name"), r.get("seed"))):
            m = measures(run)
            rows.append([label, run.get("method.name"), run.get("seed"), m["first"], m["share"], m["mixed"], m["dead"]])
    return rows


def regime_points(
    sink: list[Run], controls: list[Run], registered: list[Run], shares: list[Run] = ()
) -> list[tuple[str, int, float, float]]:
    """(intervention, seed, never-solved share at the first allocation, SERA minus MaxRL in pp): a point a pair with
    both, the controls (C5's own runs again) among them. `shares` (make sink-shares): the authors' rule's first epoch
    and first allocation again from a seed's base model, which gives C5's archived pair of that seed its share where
    the base model is the archived one (a control of the seed already gives it)."""
    maxrl, rule = by_seed(registered, "maxrl"), by_seed(registered, "sera")
    points = []
    controlled = set(by_seed(controls, "sera"))
    for seed, run in sorted(by_seed(shares, "sera").items()):
        d, first = paired(rule.get(seed), maxrl.get(seed)), measures(run)["first"]
        same_base = rule.get(seed) is not None and base_of(run) == base_of(rule[seed])
        if seed not in controlled and same_base and d is not None and first is not None:
            points.append(("C5", seed, first, d))
    for name, runs in {"control": controls, **by_intervention(sink)}.items():
        for seed, run in sorted(by_seed(runs, "sera").items()):
            d, first = paired(run, against_of(name, seed, runs, maxrl)), measures(run)["first"]
            if d is not None and first is not None:
                points.append((name, seed, first, d))
    return points


def regime_fit(points) -> tuple[float, float, float] | None:
    """The OLS slope of the difference on the share and its 95% t-interval; None below three distinct shares. The
    interval takes the points as independent, which they are not (the pairs of one seed share a base model and, most,
    a MaxRL run): it is narrower than it should be, one more reason the picture is exploratory."""
    x, y = np.array([p[2] for p in points]), np.array([p[3] for p in points])
    if len(set(x.tolist())) < 3:  # a slope needs the share to vary: three distinct values at least
        return None
    from scipy.stats import t

    slope, intercept = np.polyfit(x, y, 1)
    resid = y - (slope * x + intercept)
    half = t.ppf(0.975, x.size - 2) * np.sqrt(resid @ resid / (x.size - 2) / np.sum((x - x.mean()) ** 2))
    return float(slope), float(slope - half), float(slope + half)


def regime_figure(points, fit, stem: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for name in sorted({p[0] for p in points}):
        ax.scatter([p[2] for p in points if p[0] == name], [p[3] for p in points if p[0] == name], label=name, s=18)
    x, y = np.array([p[2] for p in points]), np.array([p[3] for p in points])
    slope, low, high = fit
    grid = np.linspace(x.min(), x.max(), 2)
    ax.plot(grid, slope * grid + (y.mean() - slope * x.mean()), color="black", lw=1)
    ax.axhline(0, color="grey", lw=0.5)
    ax.set(
        xlabel="never-solved share at the first allocation",
        ylabel="SERA minus MaxRL, Pass@32 at step 800 (pp)",
        title=f"exploratory, {x.size} pairs: slope {slope:+.1f} pp per unit share\n[{low:+.1f}, {high:+.1f}] (95% t)",
    )
    ax.legend(fontsize=7)
    save_figure(fig, stem)


def regime_rows(points, fit) -> list[list]:
    """The regime table: a row a pair, then the slope's row (or why there is none)."""
    rows = [[name, seed, first, f"{d:+.2f}"] for name, seed, first, d in points]
    distinct = len({p[2] for p in points})
    slope = f"{fit[0]:+.2f} [{fit[1]:+.2f}, {fit[2]:+.2f}]" if fit else f"none: {distinct} distinct share(s), 3 needed"
    label = "OLS slope over the pairs above (pp per unit share) [95% t, the pairs taken as independent]"
    return rows + [[label, "", "", slope]]


FOOTPRINT = ["claim", "method", "seeds", "steps with no gradient (median a run)", "in total", "runs with one",
             "first such step (median)", "mixed groups a step (median of run means)"]  # fmt: skip
INTERVENTIONS = ["intervention", "seeds", "SERA minus MaxRL (pp) [seed 95% t]", "the authors' rule on those seeds",
                 "intervention minus the authors' rule", "reading (exploratory)", "per seed (pp)"]  # fmt: skip
REGIME = ["pair", "seed", "never solved at the first allocation", "SERA minus MaxRL (pp)"]
MECHANISM = ["run", "method", "seed", "never solved at the first allocation", "share on never-solved (epoch 1 on)",
             "mixed groups a step", "steps with no gradient"]  # fmt: skip


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=Path, default=Path("runs"))
    parser.add_argument("--out", type=Path, default=Path("paper_figures/out"))
    parser.add_argument("--results", type=Path, default=Path("results/cpu"))
    parser.add_argument("--figures", type=Path, default=Path("docs/figures"), help="where the regime figure goes")
    parser.add_argument("--force", action="store_true")
    args = parser.parse_args(argv)
    folder = "maze-cpu_pool"
    registered = load_runs(args.runs / folder)
    rl = lambda root: [r for r in load_runs(root) if r.get("experiment") == "maze"]  # noqa: E731 (not base models)
    sink, controls = rl(args.runs / "sink" / folder), rl(args.runs / "e2" / folder)
    shares = rl(args.runs / "shares" / folder)
    out = args.out / "sink"
    c6 = next(c for c in CLAIMS if c.name.startswith("C6"))
    rows = footprint_rows(C5, registered) + footprint_rows(c6, load_runs(args.runs / f"{c6.study}-cpu"))
    write_table(out / "footprint", FOOTPRINT, rows)
    write_table(out / "interventions", INTERVENTIONS, intervention_rows(registered, sink))
    write_table(out / "mechanism", MECHANISM, mechanism_rows(sink, controls), digits=3)
    points = regime_points(sink, controls, registered, shares)
    fit = regime_fit(points)
    write_table(out / "regime", REGIME, regime_rows(points, fit), digits=3)
    if fit:
        regime_figure(points, fit, out / "regime")
    published = {}
    for stem in ("footprint", "interventions", "mechanism", "regime"):
        print((out / f"{stem}.md").read_text())
        published[stem] = guard.publish_table(stem, out, args.results / "sink", args.force)
        print(published[stem])
    if fit and (out / "regime.png").exists() and published["regime"].startswith("wrote"):  # docs/maze.md's figure
        args.figures.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(out / "regime.png", args.figures / "sink_regime.png")
        print(f"wrote {args.figures / 'sink_regime.png'}")


if __name__ == "__main__":
    main()
