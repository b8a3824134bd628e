"""An ablation of any setting as a table and a plot: Pass@K per value, and each value against the first. No torch.

Run: python -m paper_figures.ablate --study imagenet --method sera --setting method.p_lo --values 0.0625,0.03125
     (make ablate runs the sweep, then this)

The runs of one method whose config holds each value of the setting (the other settings equal) are read from
runs/<study>-<scale>/: final Pass@K per question (the classifier's exact p of every validation image, the language
models' newest per-question record), averaged over seeds. Each value is set against the first, paired by seed and by
question: the seed-level 95% t-interval of the per-seed differences (training randomness) and the question-paired 95%
bootstrap (the choice of questions, seeds pooled).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from paper_figures import guard
from paper_figures.render import pyplot, save_figure, write_table
from paper_figures.runs import (
    PerQuestion,
    Run,
    group_runs,
    load_runs,
    pair_by_question,
    per_question,
    seed_differences,
)
from sera.identity import result_settings
from sera.runlog import TRAIN_POOL_SET, VAL_P_FILE
from sera.stats import paired_bootstrap_ci, seed_t_interval

OUT = Path(__file__).parent / "out"
KS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]


def parse_value(text: str):
    """A command-line value as Hydra reads it: 0.05 and 3e-4 -> float, 8 -> int, true -> bool, else the string."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create().parse_override(f"key={text}").value()


def exact_per_question(runs: list[Run], ks: list[int]) -> PerQuestion | None:
    """The classifier's Pass@k per validation image from its exact p (val_p.npy): 1 - (1 - p)^k, mean over seeds."""
    runs = [r for r in runs if (r.path / VAL_P_FILE).exists()]
    if not runs:
        return None
    values = [1 - (1 - np.load(r.path / VAL_P_FILE).astype(np.float64)[:, None]) ** np.asarray(ks) for r in runs]
    return PerQuestion(tuple(range(values[0].shape[0])), ks, np.mean(values, axis=0), runs)


def eval_set(runs: list[Run]) -> str | None:
    """The language models' held-out evaluation set (the one every run has, the training pool aside)."""
    sets = set.intersection(*[set(r.eval_records) for r in runs]) - {TRAIN_POOL_SET} if runs else set()
    return min(sets) if sets else None


def questions(runs: list[Run], ks: list[int]) -> PerQuestion | None:
    """Per-question Pass@k of a group: the classifier's exact p, else the newest per-question record."""
    if any((r.path / VAL_P_FILE).exists() for r in runs):
        return exact_per_question(runs, ks)
    name = eval_set(runs)
    if name is None:
        return None
    usable = [k for k in ks if k <= min(r.eval_records[name]["n"] for r in runs)]
    return per_question(runs, name, usable)


def groups_by_value(runs: list[Run], method: str, setting: str, values: list) -> dict:
    """{value: the finished runs of `method` holding it}; ValueError when a value has no run, or when the runs of one
    value split into several settings and the other values do not say which one the sweep ran (a folder that also
    holds another ablation's runs: the one group whose other settings are those of another value's runs is taken;
    a value may change more than its own key, as method.pilot_m=0 turns the estimator to the history)."""
    chosen = [r for r in runs if r.get("method.name") == method and r.finished]
    found = {}
    for value in values:
        held = [r for r in chosen if result_settings(r.config).get(setting) == value]  # defaults filled in
        found[value] = group_runs(held)
        if not found[value]:
            raise ValueError(f"no finished {method} run with {setting}={value} (run the sweep first: make ablate)")

    def others(group: list[Run]) -> dict:
        return {k: v for k, v in result_settings(group[0].config).items() if k not in (setting, "seed")}

    sweep = [others(groups[0]) for groups in found.values() if len(groups) == 1]
    out = {}
    for value, groups in found.items():
        if len(groups) > 1 and sweep:
            groups = [g for g in groups if any(others(g) == s for s in sweep)] or groups
        if len(groups) > 1:
            paths = [str(g[0].path) for g in groups]
            raise ValueError(f"the {method} runs with {setting}={value} differ in other settings too: {paths}")
        out[value] = groups[0]
    return out


def seed_level(a: list[Run], b: list[Run], ks: list[int]) -> list[tuple[float, float, float] | None]:
    """Per K: the seed-level 95% t-interval (pp) of a minus b over the seeds both ran; None with fewer than two."""
    seeds, _, diffs = seed_differences(a, b, None, ks, "ablation", questions=questions)
    if len(seeds) < 2:
        return [None] * len(ks)
    ci = seed_t_interval(100 * diffs)
    return list(zip(ci.delta, ci.low, ci.high, strict=True))


def interval(ci) -> str:
    return "n/a" if ci is None else f"{ci[0]:+.2f} [{ci[1]:+.2f}, {ci[2]:+.2f}]"


def ablation_table(runs_root: Path, study: str, scale: str, method: str, setting: str, values: list[str],
                   out_root: Path = OUT) -> str:  # fmt: skip
    """Write out/<study>-<scale>/ablate_<setting>.{md,csv} and its plot; return the markdown."""
    parsed = [parse_value(v) for v in values]
    groups = groups_by_value(load_runs(runs_root / f"{study}-{scale}"), method, setting, parsed)
    per_value = {v: questions(g, KS) for v, g in groups.items()}
    ks = [k for k in KS if all(pq is not None and k in pq.ks for pq in per_value.values())]
    shown = sorted({ks[0], ks[-1]}) if ks else []
    header = ["value", "seeds", *[f"Pass@{k}" for k in ks]]  # the setting is named in the title and the file name
    for k in shown:
        header += [f"dPass@{k} vs {values[0]} (seed 95% t)", f"dPass@{k} vs {values[0]} (question-paired 95%)"]
    rows, first = [], parsed[0]
    for text, value in zip(values, parsed, strict=True):
        pq, group = per_value[value], groups[value]
        row = [text, len({r.get("seed") for r in group}), *[100 * pq.values[:, pq.ks.index(k)].mean() for k in ks]]
        seeds = seed_level(group, groups[first], shown) if value != first else [None] * len(shown)
        for i, k in enumerate(shown):
            if value == first:
                row += ["", ""]
                continue
            x, y, _ = pair_by_question(pq, per_value[first], f"{setting}={text}")
            j = ks.index(k)
            boot = paired_bootstrap_ci(x[:, j], y[:, j])
            row += [interval(seeds[i]), interval((100 * boot.delta, 100 * boot.low, 100 * boot.high))]
        rows.append(row)
    out = out_root / f"{study}-{scale}"
    stem = f"ablate_{setting.replace('.', '_')}"
    md = write_table(out / stem, header, rows)
    plot(values, [[r[2 + ks.index(k)] for r in rows] for k in ks], ks, setting, out / stem)
    text = f"# Ablation of {setting} ({method}, {study}, scale={scale})\n\n{md}"
    print(text)
    written = sorted(str(p) for p in out.glob(f"{stem}.*"))
    print("wrote " + ", ".join(written))  # the table (markdown, CSV, LaTeX) and the plot
    return text


def x_positions(values: list[str]) -> tuple[list[float], bool]:
    """Where each value sits on the x-axis: at its number when every value is one (log scale when they are all
    positive and span more than 20x), else evenly spaced in the order given. Returns (positions, log scale)."""
    try:
        numbers = [float(v) for v in values]
    except ValueError:
        return list(range(len(values))), False
    positive = all(x > 0 for x in numbers)
    return numbers, positive and max(numbers) / min(numbers) > 20


def plot(values: list[str], curves: list[list[float]], ks: list[int], setting: str, stem: Path) -> None:
    """Pass@K against the setting's value, one line per K, each K its own colour (a sequential colormap) and marker;
    the points joined in the order of the x-axis."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    x, log = x_positions(values)
    order = sorted(range(len(values)), key=lambda i: x[i])
    colours = plt.get_cmap("viridis")([i / max(1, len(ks) - 1) for i in range(len(ks))])
    markers = "osD^v<>ph*X"
    for i, (k, curve) in enumerate(zip(ks, curves, strict=True)):
        ax.plot([x[j] for j in order], [curve[j] for j in order], marker=markers[i % len(markers)], color=colours[i],
                label=f"Pass@{k}")  # fmt: skip
    if log:
        ax.set_xscale("log")
    ax.set_xticks(x, values)
    ax.set(xlabel=setting, ylabel="Pass@K (%)")
    ax.legend(fontsize=7, ncol=2)
    save_figure(fig, stem)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--study", required=True, choices=("imagenet", "maze", "math"))
    parser.add_argument("--scale", default="cpu")
    parser.add_argument("--method", default="sera")  # the authors' rule; sera_pilot for the suite's first
    parser.add_argument("--setting", required=True, help="a config key, e.g. method.p_lo")
    parser.add_argument("--values", required=True, help="comma-separated; the first is the reference")
    parser.add_argument("--runs", type=Path, default=Path("runs"))
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--results", type=Path, help="also publish the table there (results/<scale>/<study>-<scale>)")
    parser.add_argument("--force", action="store_true", help="write over a committed table even if poorer")
    args = parser.parse_args(argv)
    values = [v for v in args.values.split(",") if v]
    if len(values) < 2:
        parser.error("--values needs two values or more")
    ablation_table(args.runs, args.study, args.scale, args.method, args.setting, values, args.out)
    if args.results is not None:
        stem = f"ablate_{args.setting.replace('.', '_')}"
        print(guard.publish_table(stem, args.out / f"{args.study}-{args.scale}", args.results, args.force))


if __name__ == "__main__":
    main()
