"""Tables 2 and 3 and the training-curve figure of the classification study, from run directories. No torch.

Run: python -m paper_figures.imagenet table2 --scale cpu   (after make reproduce-imagenet)
     python -m paper_figures.imagenet table3 --scale cpu   (after make ablate-pilot)
Outputs go to paper_figures/out/imagenet-<scale>/: markdown, CSV, LaTeX, and PNG/PDF figures. Every paper row is
shown, beside the reproduced rows or as "not run"; the CPU rows are digits1000 with an MLP, so only the direction
and rough size of the SERA-minus-MaxRL gap are comparable, not the values. A row's seeds are its runs that have an
evaluation (paper_figures/runs.py has the rules for unfinished, corrupt and NaN runs). The SERA-minus-MaxRL interval
pairs validation images by position in val_p.npy, which is validation-set order: runs whose data settings (DATA_KEYS)
or val_p lengths differ are an error naming them; two differently configured SERA (or MaxRL) groups at one n0 give a
"refused: ..." verdict row and a message naming their run paths.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import numpy as np

from paper_figures.render import bold_better, pyplot, read_reference, save_figure, write_table
from paper_figures.runs import (
    Run,
    baseline_pair,
    group_runs,
    label_groups,
    load_runs,
    mean_over,
    method_label,
    method_order,
    method_setting,
    paper_row_method,
    status_tags,
    tagged,
    tested_methods,
    verdict_methods,
    with_results,
)
from sera.allocation import scale_factor
from sera.methods import METHODS
from sera.runlog import ALLOC_SNAPSHOT, VAL_P_FILE
from sera.stats import paired_bootstrap_ci, seed_t_interval

KS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
OUT = Path(__file__).parent / "out"
COLORS = {"direct_ce": "C0", "maxrl": "C1", "sera": "C2", "grpo": "C3", "sera_pilot": "C4"}
DATA_KEYS = ("data.name", "data.num_val", "data.split_seed", "data.root")  # what fixes the validation-set order
NAME_OF_LABEL = {m.label: m.name for m in METHODS.values()}


def variant(run: Run) -> str:
    """'' for a method's default p_hat source (the registry's: SERA's 8 pilots), else 'm=2', 'history', 'oracle'...;
    the authors' rule with another active-set threshold: 'all prompts active' (0) or 'threshold=...'."""
    threshold = run.get("alloc.threshold")
    if threshold is not None:
        return "all prompts active" if threshold == 0 else f"threshold={threshold}"
    est, m = method_setting(run, "estimator"), method_setting(run, "pilot_m")
    entry = METHODS.get(run.get("method.name"))
    if est in (None, "none") or (entry is not None and (est, m) == (entry.estimator, entry.pilot_m)):
        return ""
    return f"m={m}" if est == "pilot" else est


def row_label(group: list[Run], extra: str = "") -> str:
    return tagged(method_label(group[0].get("method.name")), [variant(group[0]), extra, *status_tags(group)])


def evaluated(run: Run) -> bool:
    return run.last("eval/pass@1") is not None


def final_eval(run: Run) -> dict:
    """Pass@K (percent) of the run's last evaluation."""
    return {k: (v * 100 if (v := run.last(f"eval/pass@{k}")) is not None else None) for k in KS}


def rl_mean(run: Run, key: str) -> float | None:
    _, values = run.series(key)
    return float(values.mean()) if values.size else None


def exact(name: str) -> bool:
    """The registry's exact-likelihood row (Direct CE: no rollouts, no n0, the reference gradient itself)."""
    return name in METHODS and METHODS[name].advantage is None


def slot(name: str, n0) -> tuple:
    """Where a method's rows sit in Table 2: the exact likelihood (Direct CE) first, then by n0 and registry order."""
    return (not exact(name), 0 if exact(name) else n0, method_order(name))


def swept(run: Run) -> bool:
    """A run of another setting's ablation (make ablate): its folder names a setting changed from the scale's default
    (sera.identity.run_name), other than the active-set threshold, which Table 2 shows as a row of its own. Such runs
    share the grid's folder and belong to their ablation's table, not Table 2."""
    return "=" in re.sub(r"alloc\.threshold=[^_]+", "", run.path.name)


def table2(runs_root: Path, scale: str, out_root: Path = OUT) -> str:
    runs = [r for r in load_runs(runs_root / f"imagenet-{scale}")
            if variant(r) in ("", "oracle", "all prompts active") and not swept(r)]  # fmt: skip
    groups = sorted(group_runs(runs), key=lambda g: (slot(g[0].get("method.name"), g[0].get("n0")), variant(g[0])))
    by_slot: dict[tuple, list] = {}
    for label, g in label_groups(groups, row_label, key=lambda g: g[0].get("n0")):
        by_slot.setdefault(slot(g[0].get("method.name"), g[0].get("n0")), []).append((label, g))
    # the paper's SERA is its authors' rule: beside it where it ran (the suite's pilot rule otherwise)
    ran = {g[0].get("method.name") for g in groups}
    paper = {
        slot(paper_row_method(NAME_OF_LABEL[p["method"]], ran), int(p["n0"]) if p["n0"] else None): p
        for p in read_reference("table2_imagenet_passk.csv")
    }
    header = ["n0", "method", "source", "seeds", "steps", *[f"Pass@{k}" for k in KS], "cos(g, CE)", "cos(E[g | n], CE)"]
    rows = []
    for where in sorted(by_slot.keys() | paper.keys()):
        for label, g in by_slot.get(where, []):
            rows.append(reproduced_row(label, g, scale))
        if where in paper:
            ref = paper[where]
            if not any(not variant(g[0]) for _, g in by_slot.get(where, [])):
                rows.append([ref["n0"], ref["method"], "not run", "", "", *[None] * (len(KS) + 2)])
            reference = [float(ref[f"pass@{k}"]) for k in KS]
            rows.append([ref["n0"], ref["method"], "paper (ImageNet, ResNet-50)", "", "", *reference, "n/a", "n/a"])
    bold = set()
    baseline_of = {METHODS[n].label: METHODS[METHODS[n].baseline].label for n in tested_methods()}
    for i, row in enumerate(rows):  # bold the better of each reproduced (method, baseline) pair at each n0, per column
        if row[1] in baseline_of and row[2].startswith("reproduced"):
            for j, other in enumerate(rows):
                if other[0] == row[0] and other[1] == baseline_of[row[1]] and other[2] == row[2]:
                    bold |= bold_better(rows, i, j, range(5, len(header)))
    out = out_root / f"imagenet-{scale}"
    md = write_table(out / "table2", header, rows, bold=bold)
    verdict = "\n".join(method_vs_baseline(groups, scale, name) for name in verdict_methods(groups))
    (out / "table2_verdict.md").write_text(verdict)
    training_figure(groups, out / "training_curves")
    allocation_figure(groups, out / "allocation")
    text = f"# Table 2 (classification as a policy), scale={scale}\n\n{md}\n\n{verdict}"
    print(text)
    return text


def reproduced_row(label: str, group: list[Run], scale: str) -> list:
    """One Table 2 row: seed means over the runs with an evaluation."""
    name, runs = group[0].get("method.name"), with_results(group, evaluated)
    cosines = (
        ["n/a", "n/a"]  # Direct CE is the reference gradient itself
        if exact(name)
        else [mean_over(runs, lambda r, k=k: rl_mean(r, k)) for k in ("grad/cos_ce", "grad/cos_expected_ce")]
    )
    return [
        "" if exact(name) else group[0].get("n0"),
        label,
        f"reproduced ({group[0].get('data.name')}, {scale})",
        len(runs),
        group[0].get("train.steps"),
        *[mean_over(runs, lambda r, k=k: final_eval(r)[k]) for k in KS],
        *cosines,
    ]


def uses_p_hat(name) -> bool:
    """Whether the method allocates from p_hat (SERA's waterline): the runs with an allocation picture."""
    return name in METHODS and METHODS[name].sampler.p_hat


def verdict_runs(group: list[Run]) -> list[Run]:
    """The seeds of a group that enter the SERA-minus-MaxRL verdict: evaluated, with per-image p saved at the end."""
    return [r for r in with_results(group, evaluated) if (r.path / VAL_P_FILE).exists()]


def val_p(sera: list[Run], maxrl: list[Run]) -> tuple[np.ndarray, np.ndarray]:
    """(seeds, images) exact p per validation image of each group. val_p.npy is in validation-set order, so runs
    are paired by position only when their data settings and lengths agree; otherwise an error naming them."""
    a, b = sera[0], maxrl[0]  # the seeds of a group share every data setting
    differ = [k for k in DATA_KEYS if a.get(k) != b.get(k)]
    if differ:
        raise ValueError(f"refusing to pair {a.path} and {b.path}: their validation sets differ in {differ}")
    arrays = {r.path: np.load(r.path / VAL_P_FILE).ravel() for r in [*sera, *maxrl]}
    if len({a.size for a in arrays.values()}) > 1:
        sizes = ", ".join(f"{path} ({a.size} images)" for path, a in arrays.items())
        raise ValueError(f"{VAL_P_FILE} lengths differ: {sizes}")
    return np.stack([arrays[r.path] for r in sera]), np.stack([arrays[r.path] for r in maxrl])


def method_vs_baseline(groups: list[list[Run]], scale: str, name: str) -> str:
    """Per n0: a method (SERA) minus its registry baseline (MaxRL) at Pass@1 and Pass@1024 (question-paired 95%
    bootstrap CI over validation images, seeds averaged), at Pass@1 seed by seed and as the seed-level 95%
    t-interval over those differences (unrounded; the bootstrap does not cover training randomness, this interval
    does, and the claims read it), and in gradient cosine to CE."""
    lines = [
        f"## {method_label(name)} minus {method_label(METHODS[name].baseline)} (scale={scale})",
        "",
        "| n0 | seeds | dPass@1 (pp) [95% CI] | dPass@1024 (pp) [95% CI] | dPass@1 per seed (pp) "
        "| dPass@1 (pp) [seed 95% t] | d cos(g, CE) | d cos(E[g | n], CE) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for n0 in sorted({g[0].get("n0") for g in groups if g[0].get("method.name") == name}):
        candidates = [g for g in groups if g[0].get("n0") == n0 and not variant(g[0]) and verdict_runs(g)]
        pair = baseline_pair(candidates, f"n0 = {n0}", name)
        if not isinstance(pair, tuple):
            lines.append(f"| {n0} | {pair or 'not run'} | | | | | | |")  # refused, or not run
            continue
        s, m = verdict_runs(pair[0]), verdict_runs(pair[1])
        p_sera, p_maxrl = val_p(s, m)
        cells = []
        for k in (1, 1024):
            ci = paired_bootstrap_ci(np.mean(1 - (1 - p_sera) ** k, axis=0), np.mean(1 - (1 - p_maxrl) ** k, axis=0))
            cells.append(f"{100 * ci.delta:+.2f} [{100 * ci.low:+.2f}, {100 * ci.high:+.2f}]")
        dcos = []
        for key in ("grad/cos_ce", "grad/cos_expected_ce"):
            a, b = (mean_over(g, lambda r, k=key: rl_mean(r, k)) for g in (s, m))
            dcos.append("not run" if a is None or b is None else f"{a - b:+.3f}")
        diffs = per_seed_differences(s, m)
        each = ", ".join(f"seed {k}: {d:+.2f}" for k, d in diffs.items()) or "not run"
        row = [f"{len(s)} vs {len(m)}", *cells, each, seed_interval(list(diffs.values())), *dcos]
        lines.append(f"| {n0} | " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def per_seed_differences(sera: list[Run], maxrl: list[Run]) -> dict[int, float]:
    """{seed: final Pass@1 of SERA minus MaxRL, pp} for each seed both have, unrounded."""
    final = [{r.get("seed"): final_eval(r)[1] for r in g} for g in (sera, maxrl)]
    return {k: final[0][k] - final[1][k] for k in sorted(final[0].keys() & final[1].keys())}


def seed_interval(diffs: list[float]) -> str:
    """'+4.81 [+3.52, +6.10]': the seed-level 95% t-interval over per-seed differences (one seed: no interval)."""
    if len(diffs) < 2:
        return "one seed: no interval" if diffs else "not run"
    ci = seed_t_interval(np.asarray(diffs))
    return f"{ci.delta:+.2f} [{ci.low:+.2f}, {ci.high:+.2f}]"


def training_figure(groups: list[list[Run]], stem: Path) -> None:
    """Pass@1 and gradient cosine to CE over training, one row per n0 (seed means)."""
    plt = pyplot()
    n0s = sorted({g[0].get("n0") for g in groups if not exact(g[0].get("method.name"))})
    if not n0s:
        return
    fig, axes = plt.subplots(len(n0s), 2, figsize=(10, 3.2 * len(n0s)), squeeze=False)
    for row, n0 in enumerate(n0s):
        for g in groups:
            name, runs = g[0].get("method.name"), with_results(g, evaluated)
            if not runs or (not exact(name) and g[0].get("n0") != n0):
                continue
            label = row_label(g)
            steps, values = runs[0].series("eval/pass@1")
            curves = [r.series("eval/pass@1")[1] for r in runs if r.series("eval/pass@1")[1].size == values.size]
            axes[row, 0].plot(steps, np.mean(curves, axis=0), marker="o", ms=3, label=label, color=COLORS.get(name))
            if not exact(name):
                steps, values = runs[0].series("grad/cos_ce")
                curves = [r.series("grad/cos_ce")[1] for r in runs if r.series("grad/cos_ce")[1].size == values.size]
                axes[row, 1].plot(steps, np.mean(curves, axis=0), label=label, alpha=0.8, color=COLORS.get(name))
        axes[row, 0].set(title=f"n0 = {n0}: validation Pass@1", xlabel="step", ylabel="Pass@1")
        axes[row, 1].set(title=f"n0 = {n0}: cos(step gradient, CE gradient)", xlabel="step", ylabel="cosine")
        axes[row, 0].legend(fontsize=8)
        axes[row, 1].legend(fontsize=8)
    save_figure(fig, stem)


def snapshot(group: list[Run], which: int = -1) -> dict | None:
    """One allocation snapshot (alloc_step<N>.npz: p_exact, p_hat, counts of one batch) of the group's first run
    that has one, by position in step order (-1: the last), or None."""
    for run in group:
        found = sorted((int(m.group(1)), p) for p in run.path.iterdir() if (m := ALLOC_SNAPSHOT.fullmatch(p.name)))
        if found:
            return dict(np.load(found[which][1]))
    return None


def allocation_figure(groups: list[list[Run]], stem: Path) -> None:
    """SERA's allocation on one batch per n0: n_i against p_hat, and the scale factors c(p, n) at the exact p under
    uniform n0 (before) and under SERA's n_i (after), against p. The first snapshot (early in RL, when p still
    varies) is drawn; late in training nearly every image has p near 1."""
    snaps = {
        g[0].get("n0"): (s, g[0])
        for g in groups
        if uses_p_hat(g[0].get("method.name")) and not variant(g[0]) and (s := snapshot(g, 0)) is not None
    }
    if not snaps:
        return
    plt = pyplot()
    fig, axes = plt.subplots(len(snaps), 2, figsize=(10, 3.2 * len(snaps)), squeeze=False)
    for row, (n0, (snap, run)) in enumerate(sorted(snaps.items())):
        p, p_hat, counts = snap["p_exact"], snap["p_hat"], snap["counts"]
        delta = 0 if run.get("method.keep_cv_on_zero") else 1
        axes[row, 0].scatter(p_hat, counts, s=6, alpha=0.6)
        axes[row, 0].axhline(n0, color="gray", ls="--", lw=1, label=f"uniform n0 = {n0}")
        axes[row, 0].set(xscale="log", xlabel="p_hat (pilot estimate)", ylabel="n_i", title=f"n0 = {n0}: SERA's n_i")
        axes[row, 0].legend(fontsize=8)
        axes[row, 1].scatter(p, scale_factor(p, n0, delta), s=6, label="uniform (before)", color="C1")
        axes[row, 1].scatter(p, scale_factor(p, counts, delta), s=6, label="SERA (after)", color="C2")
        axes[row, 1].set(xscale="log", xlabel="exact p", ylabel="c(p, n)", title=f"n0 = {n0}: scale factors")
        axes[row, 1].legend(fontsize=8)
    save_figure(fig, stem)


def phat_figure(groups: list[list[Run]], stem: Path) -> None:
    """p_hat against the exact p on one batch, one panel per pilot size m (m = 0: history)."""
    snaps = [(method_setting(g[0], "pilot_m"), s) for g in groups if (s := snapshot(g)) is not None]
    if not snaps:
        return
    plt = pyplot()
    fig, axes = plt.subplots(1, len(snaps), figsize=(3 * len(snaps), 3), squeeze=False)
    for ax, (m, snap) in zip(axes[0], snaps, strict=True):
        ax.scatter(snap["p_exact"], snap["p_hat"], s=5, alpha=0.5)
        ax.plot([0, 1], [0, 1], color="gray", lw=1)
        ax.set(xlabel="exact p", ylabel="p_hat", title="history (m = 0)" if m == 0 else f"pilots m = {m}")
    save_figure(fig, stem)


def epoch_steps(run: Run) -> int:
    """Steps in one epoch of training batches, as the run logged it at its evaluations."""
    steps = run.last("train/steps_per_epoch")
    if steps is None:
        raise ValueError(f"{run.path}: no train/steps_per_epoch logged; Table 3 needs it (a run from older code)")
    return int(steps)


def last_epoch(run: Run, key: str) -> np.ndarray:
    """A per-step metric's values over the run's last epoch of batches (NaN where logged as null)."""
    return run.series(key)[1][-epoch_steps(run) :]


def last_epoch_mean(run: Run, key: str) -> float | None:
    values = last_epoch(run, key)
    return float(values.mean()) if values.size else None


def per_batch_pearson(run: Run) -> float | None:
    """The paper's Pearson r: one r per training batch, averaged over the last epoch. A batch whose p_hat or p has
    zero spread has no r (logged as null) and is left out; NaN when no batch has one."""
    r = last_epoch(run, "phat/pearson")
    if not r.size:
        return None
    return float("nan") if np.isnan(r).all() else float(np.nanmean(r))


def pooled_pearson(runs: list[Run]) -> float | None:
    """Pearson r of p_hat against exact p pooled over every image of each run's last epoch of batches (from the
    logged sufficient statistics n, sum x, sum y, sum x^2, sum y^2, sum xy)."""
    totals = np.zeros(6)
    for r in runs:
        moments = [rec["phat/moments"] for rec in r.records if rec.get("phat/moments")]
        if moments:
            totals += np.sum(np.asarray(moments[-epoch_steps(r) :], dtype=float), axis=0)
    n, sx, sy, sxx, syy, sxy = totals
    if n == 0:
        return None
    cov, vx, vy = sxy / n - sx * sy / n**2, sxx / n - (sx / n) ** 2, syy / n - (sy / n) ** 2
    return float(cov / np.sqrt(vx * vy)) if vx > 0 and vy > 0 else float("nan")


def table3(runs_root: Path, scale: str, out_root: Path = OUT) -> str:
    """Pilot-size ablation at n0 = 16: MAE and Pearson r of p_hat vs exact p over the last epoch of batches (r per
    batch and averaged, as the paper defines it, and pooled over the epoch's images), plus final Pass@1 and
    Pass@64. The paper's rows (m = 0 and 8) are shown even when not run."""
    runs = [
        r
        for r in load_runs(runs_root / f"imagenet-{scale}")
        if r.get("method.name") == "sera_pilot"
        and r.get("n0") == 16
        and method_setting(r, "estimator") in ("pilot", "history")
        and not swept(r)  # another setting's ablation (the p_hat clip) in the same folder
    ]
    groups = sorted(group_runs(runs), key=lambda g: method_setting(g[0], "pilot_m"))
    paper = {int(p["m"]): p for p in read_reference("table3_imagenet_p_estimation.csv")}
    header = ["estimator", "m", "seeds", "MAE", "Pearson r (per batch)", "Pearson r (pooled)", "Pass@1", "Pass@64"]
    header += ["paper MAE", "paper Pearson r"]

    def estimator(m: int) -> str:
        return "historical" if m == 0 else "pilot"

    def label(g, extra=""):
        return tagged(estimator(method_setting(g[0], "pilot_m")), [extra, *status_tags(g)])

    def paper_cells(m: int) -> list:
        ref = paper.get(m)
        return [float(ref["mae"]), float(ref["pearson_r"])] if ref else ["n/a", "n/a"]

    rows = []
    for name, g in label_groups(groups, label, key=lambda g: method_setting(g[0], "pilot_m")):
        m, runs = method_setting(g[0], "pilot_m"), with_results(g, evaluated)
        rows.append(
            [
                name,
                m,
                len(runs),
                mean_over(runs, lambda r: last_epoch_mean(r, "phat/mae")),
                mean_over(runs, per_batch_pearson),
                pooled_pearson(runs),
                mean_over(runs, lambda r: final_eval(r)[1]),
                mean_over(runs, lambda r: final_eval(r)[64]),
                *paper_cells(m),
            ]
        )
    for m in sorted(paper.keys() - {method_setting(g[0], "pilot_m") for g in groups}):
        rows.append([estimator(m), m, "", None, None, None, None, None, *paper_cells(m)])
    rows.sort(key=lambda row: row[1])
    md = write_table(out_root / f"imagenet-{scale}" / "table3", header, rows, digits=4)
    phat_figure(groups, out_root / f"imagenet-{scale}" / "phat_vs_p")
    text = f"# Table 3 (p_hat estimation, n0 = 16, last epoch of batches), scale={scale}\n\n{md}"
    print(text)
    return text


# The classifier's pre-registered claims (results/cpu/PREREGISTRATION_CLASSIFICATION.md): the authors' SERA minus
# its registry baseline (MaxRL) at the final step, per n0, over the registered seeds; (claim, n0, paper's effect at
# Pass@1, at Pass@1024)
CLASSIFICATION_TESTED = "sera"  # the method the registration names
CLASSIFICATION_CLAIMS = (("C7", 16, 7.94, -1.86), ("C8", 128, 18.21, 36.65))
CLASSIFICATION_SEEDS = tuple(range(8))
PREREG_HEADER = ["claim", "endpoint", "seeds", "difference (pp) [seed 95% t]", "decision", "paper (pp)", "vs the paper",
                 "per seed (pp)"]  # fmt: skip


def registered(run: Run, name: str, n0: int) -> bool:
    """A finished run of the registered rows: the method at n0, with no variant (its default p_hat source and, for
    the authors' rule, the default active set)."""
    return run.get("method.name") == name and run.get("n0") == n0 and not variant(run) and run.finished


def classification_prereg(runs_root: Path, scale: str = "gauss1000", out_root: Path = OUT,
                          seeds=CLASSIFICATION_SEEDS) -> str:  # fmt: skip
    """C7 and C8 by the pre-registered rule (paper_figures.prereg.decide), from each run's final Pass@K (unrounded),
    seeds paired; written as imagenet-<scale>/preregistered.md."""
    from paper_figures.prereg import decide

    runs = load_runs(runs_root / f"imagenet-{scale}")
    rows = []
    tested, baseline = CLASSIFICATION_TESTED, METHODS[CLASSIFICATION_TESTED].baseline
    for claim, n0, paper_1, paper_1024 in CLASSIFICATION_CLAIMS:
        by_seed = {name: {r.get("seed"): r for r in runs if registered(r, name, n0)} for name in (tested, baseline)}
        paired = [s for s in seeds if s in by_seed[tested] and s in by_seed[baseline]]
        for endpoint, k, paper in (("primary: Pass@1", 1, paper_1), ("secondary: Pass@1024", 1024, paper_1024)):
            diffs = [final_eval(by_seed[tested][s])[k] - final_eval(by_seed[baseline][s])[k] for s in paired]
            cell, decision, against = decide(diffs, len(seeds), paper)
            if endpoint.startswith("secondary") and decision in (
                "supported",
                "contradicted",
                "not decided at this power",
            ):
                decision += " (decides nothing)"
            per_seed = ", ".join(f"{s}: {d:+.2f}" for s, d in zip(paired, diffs, strict=True))
            seen = f"{len(paired)} of {len(seeds)}"
            rows.append([f"{claim} classification n0 = {n0}", f"{endpoint} at the final step", seen, cell, decision,
                         f"{paper:+.2f}", against, per_seed])  # fmt: skip
    out = out_root / f"imagenet-{scale}"
    md = write_table(out / "preregistered", PREREG_HEADER, rows)
    text = f"# Pre-registered classification claims, scale={scale}\n\n{md}"
    print(text)
    return text


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("table", choices=["table2", "table3", "prereg"])
    parser.add_argument("--scale", default="cpu")
    parser.add_argument("--runs", type=Path, default=Path("runs"))
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    {"table2": table2, "table3": table3, "prereg": classification_prereg}[args.table](args.runs, args.scale, args.out)


if __name__ == "__main__":
    main()
