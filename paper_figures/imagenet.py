"""Tables 2 and 3 and the training-curve figure of the classification study, from run directories. No torch.

Run: python -m paper_figures.imagenet table2 --scale cpu   (after make reproduce-imagenet)
     python -m paper_figures.imagenet table3 --scale cpu   (after make ablate-pilot)
Outputs go to paper_figures/out/imagenet-<scale>/: markdown, CSV, LaTeX, and PNG/PDF figures. Every reproduced row
sits beside the paper's (ImageNet, ResNet-50) numbers; the CPU rows are digits1000 with an MLP, so only the
direction and rough size of the SERA-minus-MaxRL gap are comparable, not the values.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from paper_figures.render import pyplot, read_reference, save_figure, write_table
from paper_figures.runs import Run, group_runs, label_groups, load_runs
from sera.allocation import scale_factor
from sera.stats import paired_bootstrap_ci

KS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
OUT = Path(__file__).parent / "out"
LABELS = {"direct_ce": "Direct CE", "grpo": "GRPO", "maxrl": "MaxRL", "sera": "SERA"}
ORDER = ["direct_ce", "grpo", "maxrl", "sera"]
COLORS = {"direct_ce": "C0", "maxrl": "C1", "sera": "C2", "grpo": "C3"}


def variant(run: Run) -> str:
    """'' for a method's default p_hat source (SERA: 8 pilots), else e.g. 'm=2', 'history', 'oracle'."""
    est, m = run.get("method.estimator"), run.get("method.pilot_m")
    if est in (None, "none") or (est == "pilot" and m == 8):
        return ""
    return f"m={m}" if est == "pilot" else est


def row_label(group: list[Run], extra: str = "") -> str:
    run = group[0]
    label = LABELS.get(run.get("method.name"), run.get("method.name"))
    tags = [t for t in (variant(run), extra) if t]
    if not all(r.finished for r in group):
        tags.append("unfinished")
    return label + (f" ({', '.join(tags)})" if tags else "")


def final_eval(run: Run) -> dict:
    """Pass@K (percent) of the run's last evaluation."""
    return {k: (v * 100 if (v := run.last(f"eval/pass@{k}")) is not None else None) for k in KS}


def mean_over(group: list[Run], fn) -> float | None:
    values = [v for v in (fn(r) for r in group) if v is not None]
    return float(np.mean(values)) if values else None


def rl_mean(run: Run, key: str) -> float | None:
    _, values = run.series(key)
    return float(values.mean()) if values.size else None


def val_passk(group: list[Run], k: int) -> np.ndarray | None:
    """Per-image Pass@k = 1 - (1 - p)^k on the validation set, computed per seed and then averaged over seeds."""
    arrays = [np.load(r.path / "val_p.npy") for r in group if (r.path / "val_p.npy").exists()]
    return np.mean([1 - (1 - p) ** k for p in arrays], axis=0) if arrays else None


def table2(runs_root: Path, scale: str, out_root: Path = OUT) -> str:
    runs = [r for r in load_runs(runs_root / f"imagenet-{scale}") if variant(r) in ("", "oracle")]
    groups = sorted(
        group_runs(runs),
        key=lambda g: (
            g[0].get("method.name") != "direct_ce",
            g[0].get("n0"),
            ORDER.index(g[0].get("method.name")) if g[0].get("method.name") in ORDER else 99,
            variant(g[0]),
        ),
    )
    paper = read_reference("table2_imagenet_passk.csv")
    header = ["n0", "method", "source", "seeds", "steps", *[f"Pass@{k}" for k in KS], "cos(g, CE)", "cos(E g, CE)"]
    rows, bold = [], set()
    for label, g in label_groups(groups, row_label, key=lambda g: g[0].get("n0")):
        name, n0 = g[0].get("method.name"), g[0].get("n0")
        n0_cell = "" if name == "direct_ce" else n0
        passk = {k: mean_over(g, lambda r, k=k: final_eval(r)[k]) for k in KS}
        rows.append(
            [
                n0_cell,
                label,
                f"reproduced ({g[0].get('data.name')}, {scale})",
                len(g),
                g[0].get("train.steps"),
                *[passk[k] for k in KS],
                *(
                    ["n/a", "n/a"]  # Direct CE is the reference gradient itself
                    if name == "direct_ce"
                    else [mean_over(g, lambda r, k=k: rl_mean(r, k)) for k in ("grad/cos_ce", "grad/cos_expected_ce")]
                ),
            ]
        )
        ref = [
            p for p in paper if p["method"] == LABELS.get(name) and p["n0"] == ("" if name == "direct_ce" else str(n0))
        ]
        if ref and not variant(g[0]):
            rows.append(
                [
                    n0_cell,
                    LABELS[name],
                    "paper (ImageNet, ResNet-50)",
                    "",
                    "",
                    *[float(ref[0][f"pass@{k}"]) for k in KS],
                    "n/a",
                    "n/a",
                ]
            )
    for i, row in enumerate(rows):  # bold the better of each reproduced MaxRL/SERA pair at each n0, per column
        if row[1] != "SERA" or "reproduced" not in row[2]:
            continue
        partner = [j for j, r in enumerate(rows) if r[0] == row[0] and r[1] == "MaxRL" and r[2] == row[2]]
        for j in partner:
            for col in range(5, len(header)):
                a, b = rows[i][col], rows[j][col]
                if a is not None and b is not None:
                    bold.add((i, col) if a > b else (j, col))
    out = out_root / f"imagenet-{scale}"
    md = write_table(out / "table2", header, rows, bold=bold)
    verdict = sera_vs_maxrl(groups, scale)
    (out / "table2_verdict.md").write_text(verdict)
    training_figure(groups, out / "training_curves")
    allocation_figure(groups, out / "allocation")
    text = f"# Table 2 (classification as a policy), scale={scale}\n\n{md}\n\n{verdict}"
    print(text)
    return text


def sera_vs_maxrl(groups: list[list[Run]], scale: str) -> str:
    """Per n0: SERA minus MaxRL at Pass@1 and Pass@1024 (question-paired 95% bootstrap CI over validation images,
    seeds averaged), at Pass@1 seed by seed (the CI does not cover training randomness; this column shows it), and
    in gradient cosine to CE."""
    lines = [
        f"## SERA minus MaxRL (scale={scale})",
        "",
        "| n0 | seeds | dPass@1 (pp) [95% CI] | dPass@1024 (pp) [95% CI] | dPass@1 per seed (pp) | d cos(g, CE) "
        "| d cos(E g, CE) |",
        "|---|---|---|---|---|---|---|",
    ]
    for n0 in sorted({g[0].get("n0") for g in groups if g[0].get("method.name") == "sera"}):
        pick = {g[0].get("method.name"): g for g in groups if g[0].get("n0") == n0 and not variant(g[0])}
        if "sera" not in pick or "maxrl" not in pick:
            lines.append(f"| {n0} | not run | | | | | |")
            continue
        s, m = pick["sera"], pick["maxrl"]
        cells = []
        for k in (1, 1024):
            a, b = val_passk(s, k), val_passk(m, k)
            if a is None or b is None:
                cells.append("not run")
                continue
            ci = paired_bootstrap_ci(a, b)
            cells.append(f"{100 * ci.delta:+.2f} [{100 * ci.low:+.2f}, {100 * ci.high:+.2f}]")
        dcos = [
            f"{a - b:+.3f}"
            if (a := mean_over(s, lambda r, k=key: rl_mean(r, k))) is not None
            and (b := mean_over(m, lambda r, k=key: rl_mean(r, k))) is not None
            else "not run"
            for key in ("grad/cos_ce", "grad/cos_expected_ce")
        ]
        row = [f"{len(s)} vs {len(m)}", *cells, per_seed_delta(s, m), *dcos]
        lines.append(f"| {n0} | " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def per_seed_delta(sera: list[Run], maxrl: list[Run]) -> str:
    """'seed 0: +1.60, seed 1: ...': final Pass@1 of SERA minus MaxRL for each seed both have finished."""
    final = [{r.get("seed"): final_eval(r)[1] for r in g if r.finished} for g in (sera, maxrl)]
    seeds = sorted(k for k in final[0].keys() & final[1].keys() if None not in (final[0][k], final[1][k]))
    return ", ".join(f"seed {k}: {final[0][k] - final[1][k]:+.2f}" for k in seeds) or "not run"


def training_figure(groups: list[list[Run]], stem: Path) -> None:
    """Pass@1 and gradient cosine to CE over training, one row per n0 (seed means)."""
    plt = pyplot()
    n0s = sorted({g[0].get("n0") for g in groups if g[0].get("method.name") != "direct_ce"})
    if not n0s:
        return
    fig, axes = plt.subplots(len(n0s), 2, figsize=(10, 3.2 * len(n0s)), squeeze=False)
    for row, n0 in enumerate(n0s):
        for g in groups:
            name = g[0].get("method.name")
            if name != "direct_ce" and g[0].get("n0") != n0:
                continue
            label = row_label(g)
            steps, values = g[0].series("eval/pass@1")
            curves = [r.series("eval/pass@1")[1] for r in g if r.series("eval/pass@1")[1].size == values.size]
            axes[row, 0].plot(steps, np.mean(curves, axis=0), marker="o", ms=3, label=label, color=COLORS.get(name))
            if name != "direct_ce":
                steps, values = g[0].series("grad/cos_ce")
                curves = [r.series("grad/cos_ce")[1] for r in g if r.series("grad/cos_ce")[1].size == values.size]
                axes[row, 1].plot(steps, np.mean(curves, axis=0), label=label, alpha=0.8, color=COLORS.get(name))
        axes[row, 0].set(title=f"n0 = {n0}: validation Pass@1", xlabel="step", ylabel="Pass@1")
        axes[row, 1].set(title=f"n0 = {n0}: cos(step gradient, CE gradient)", xlabel="step", ylabel="cosine")
        axes[row, 0].legend(fontsize=8)
        axes[row, 1].legend(fontsize=8)
    save_figure(fig, stem)


def last_mean(run: Run, key: str, last: int) -> float | None:
    """Mean of a metric over its last `last` logged values."""
    _, values = run.series(key)
    return float(values[-last:].mean()) if values.size else None


def snapshot(run: Run, which: int = -1) -> dict | None:
    """One of the run's allocation snapshots (alloc_step<N>.npz: p_exact, p_hat, counts of one batch), by position
    in step order (-1: the last), or None."""
    files = sorted(run.path.glob("alloc_step*.npz"), key=lambda p: int(p.stem.removeprefix("alloc_step")))
    return dict(np.load(files[which])) if files else None


def allocation_figure(groups: list[list[Run]], stem: Path) -> None:
    """SERA's allocation on one batch per n0: n_i against p_hat, and the scale factors c(p, n) at the exact p under
    uniform n0 (before) and under SERA's n_i (after), against p. The first snapshot (early in RL, when p still
    varies) is drawn; late in training nearly every image has p near 1."""

    snaps = {
        g[0].get("n0"): (s, g[0])
        for g in groups
        if g[0].get("method.name") == "sera" and not variant(g[0]) and (s := snapshot(g[0], 0)) is not None
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
    snaps = [(g[0].get("method.pilot_m"), s) for g in groups if (s := snapshot(g[0])) is not None]
    if not snaps:
        return
    plt = pyplot()
    fig, axes = plt.subplots(1, len(snaps), figsize=(3 * len(snaps), 3), squeeze=False)
    for ax, (m, snap) in zip(axes[0], snaps, strict=True):
        ax.scatter(snap["p_exact"], snap["p_hat"], s=5, alpha=0.5)
        ax.plot([0, 1], [0, 1], color="gray", lw=1)
        ax.set(xlabel="exact p", ylabel="p_hat", title="history (m = 0)" if m == 0 else f"pilots m = {m}")
    save_figure(fig, stem)


def pooled_pearson(runs: list[Run], last_steps: int) -> float | None:
    """Pearson r of p_hat against exact p pooled over the last `last_steps` logged batches of each run."""
    totals = np.zeros(6)
    for r in runs:
        moments = [rec["phat/moments"] for rec in r.records if rec.get("phat/moments")]
        if moments:
            totals += np.sum(moments[-last_steps:], axis=0)
    n, sx, sy, sxx, syy, sxy = totals
    if n == 0:
        return None
    cov, vx, vy = sxy / n - sx * sy / n**2, sxx / n - (sx / n) ** 2, syy / n - (sy / n) ** 2
    return float(cov / np.sqrt(vx * vy)) if vx > 0 and vy > 0 else None


def table3(runs_root: Path, scale: str, out_root: Path = OUT) -> str:
    """Pilot-size ablation at n0 = 16: MAE and Pearson r of p_hat vs exact p over the last epoch of batches, plus
    final Pass@1 and Pass@64."""
    runs = [
        r
        for r in load_runs(runs_root / f"imagenet-{scale}")
        if r.get("method.name") == "sera" and r.get("n0") == 16 and r.get("method.estimator") in ("pilot", "history")
    ]
    groups = sorted(group_runs(runs), key=lambda g: g[0].get("method.pilot_m"))
    paper = {int(p["m"]): p for p in read_reference("table3_imagenet_p_estimation.csv")}
    header = ["estimator", "m", "seeds", "MAE", "Pearson r", "Pass@1", "Pass@64", "paper MAE", "paper Pearson r"]
    rows = []
    for label, g in label_groups(groups, row_label, key=lambda g: g[0].get("n0")):
        m = g[0].get("method.pilot_m")
        # an epoch of batches as the run logged it (falls back to the digits1000 count for older runs)
        epoch = int(g[0].last("train/steps_per_epoch") or g[0].get("data.num_train") // g[0].get("train.batch_size"))
        mae = mean_over(g, lambda r, e=epoch: last_mean(r, "phat/mae", e))
        ref = paper.get(m, {})
        rows.append(
            [
                "historical" if m == 0 else "pilot",
                m,
                len(g),
                mae,
                pooled_pearson(g, epoch),
                mean_over(g, lambda r: final_eval(r)[1]),
                mean_over(g, lambda r: final_eval(r)[64]),
                float(ref["mae"]) if ref else "n/a",
                float(ref["pearson_r"]) if ref else "n/a",
            ]
        )
        if "unfinished" in label:
            rows[-1][0] += " (unfinished)"
    md = write_table(out_root / f"imagenet-{scale}" / "table3", header, rows, digits=4)
    phat_figure(groups, out_root / f"imagenet-{scale}" / "phat_vs_p")
    text = f"# Table 3 (p_hat estimation, n0 = 16, last epoch of batches), scale={scale}\n\n{md}"
    print(text)
    return text


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("table", choices=["table2", "table3"])
    parser.add_argument("--scale", default="cpu")
    parser.add_argument("--runs", type=Path, default=Path("runs"))
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    {"table2": table2, "table3": table3}[args.table](args.runs, args.scale, args.out)


if __name__ == "__main__":
    main()
