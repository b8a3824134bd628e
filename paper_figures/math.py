"""Tables 1 and 5-9 (math reasoning) from run directories: Pass@K tables and SERA-minus-MaxRL intervals. No torch.

Run: python -m paper_figures.math --scale paper
The run-directory contract (what a math run writes; the math study itself is a later issue): runs live under
runs/math-<scale>/, each with config.yaml (experiment: math, or math-base for the pre-RL model; model.name; method.name;
method.aggregation; train.steps; n0; seed) and one per-question record per evaluated dataset, named by
sera.runlog.eval_record_file: eval_step<N>_<dataset>.json = {"ids": [...], "n": samples per question, "correct": [...]}.
Pass@K comes from the newest record's counts with the unbiased estimator; deltas use a question-paired 95% bootstrap
(10,000 resamples), pairing questions by id. Seeds, unfinished and corrupt runs, NaN values and refused pairings
follow paper_figures/runs.py. A base run that logs an answer-guessing floor (eval/<dataset>/guess_pass@k: answers drawn
from the training answers' frequencies; guess_top_pass@k: the k commonest training answers) adds two rows with it.

Scales with their own tables (CPU_TABLES): `--scale cpu` builds Table 1 and Table 5 for the CPU default, the
from-scratch tiny-math model on generated chain sums (`--scale cpu_sft3000` and `cpu_earlier` for the earlier CPU
defaults, `--scale smoke` for the test scale's tiny model),
beside the paper's SmolLM2 numbers for the direction of the effect only (not comparable in absolute value); every
other table, and every table at other scales, is the paper's.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from paper_figures.render import bold_better, passk_figure, read_reference, regime_figure, write_table
from paper_figures.runs import (
    PerQuestion,
    Run,
    baseline_pair,
    group_runs,
    label_groups,
    load_runs,
    method_label,
    pair_by_question,
    per_question,
    seed_differences,
    status_tags,
    tagged,
    tested_and_baselines,
    tested_methods,
    trainer_tag,
    verdict_methods,
    with_results,
)
from sera.methods import METHODS
from sera.stats import paired_bootstrap_ci, seed_t_interval

OUT = Path(__file__).parent / "out"
DATASETS = {  # file slug -> the paper's name
    "gsm8k-platinum": "GSM8K-Platinum",
    "beyondaime": "BeyondAIME",
    "aime2025": "AIME 2025",
    "math500": "MATH-500",
    "minerva": "Minerva Math",
    "olympiadbench": "OlympiadBench",
    "chain-sum": "Chain sums (generated, CPU)",
}
PASSK_TABLES = {
    "table1": ("smollm2-360m-instruct", ["gsm8k-platinum"], [1, 32, 128, 256], "table1_smollm2_gsm8k_platinum.csv"),
    "table6": (
        "qwen2.5-math-1.5b",
        ["beyondaime", "aime2025"],
        [2**i for i in range(10)],
        "table6_qwen25math15b_passk.csv",
    ),
    "table8": (
        "qwen3-4b-base",
        ["beyondaime", "aime2025"],
        [2**i for i in range(10)],
        "table8_qwen3_4b_base_passk.csv",
    ),
}
DELTA_TABLES = {
    "table5": ("smollm2-360m-instruct", ["gsm8k-platinum"], [32, 128, 256], "table5_smollm2_uncertainty.csv"),
    "table7": (
        "qwen2.5-math-1.5b",
        ["beyondaime", "aime2025", "math500", "olympiadbench"],
        [32, 128, 256, 512],
        "table7_qwen25math15b_uncertainty.csv",
    ),
    "table9": (
        "qwen3-4b-base",
        ["beyondaime", "aime2025", "math500", "minerva"],
        [32, 128, 256, 512],
        "table9_qwen3_4b_base_uncertainty.csv",
    ),
}


CPU_MODEL = "tiny-math"  # the CPU default's from-scratch model (experiments/math/model.py)
CPU_KS = [1, 4, 16, 64, 128]  # the CPU default samples 128 a question
CPU_NOTE = (
    "CPU default: a ~1M-parameter model trained from scratch on generated chain sums, not SmolLM2-360M on "
    "GSM8K-Platinum. Its numbers are not comparable in absolute value with the paper's rows; compare the direction "
    "of the differences. The guessing rows are the floor a model that never reads the question reaches."
)
CHAIN_SUM_TABLES = {
    "table1": (CPU_MODEL, ["chain-sum"], CPU_KS, "table1_smollm2_gsm8k_platinum.csv"),
    "table5": (CPU_MODEL, ["chain-sum"], CPU_KS, "table5_smollm2_uncertainty.csv"),
}
CPU_TABLES = {  # scale -> tables built instead of the paper's of the same name
    "cpu": CHAIN_SUM_TABLES,
    "cpu_sft3000": CHAIN_SUM_TABLES,  # the previous default (configs/scale/math/cpu_sft3000.yaml)
    "cpu_earlier": CHAIN_SUM_TABLES,  # the default before issue 16
    "smoke": {  # the test scale's seconds-long runs: the same tables, end to end
        "table1": ("tiny-math-smoke", ["chain-sum"], [1, 2, 4, 8], "table1_smollm2_gsm8k_platinum.csv"),
        "table5": ("tiny-math-smoke", ["chain-sum"], [1, 2, 4, 8], "table5_smollm2_uncertainty.csv"),
    },
}


def table_spec(name: str, scale: str) -> tuple:
    """(model, datasets, ks, reference file) of table `name` at `scale`: the scale's own table, else the paper's."""
    own = CPU_TABLES.get(scale, {})
    return own[name] if name in own else {**PASSK_TABLES, **DELTA_TABLES}[name]


def table_note(name: str, scale: str) -> str:
    return f"{CPU_NOTE}\n\n" if name in CPU_TABLES.get(scale, {}) else ""


def paper_source(name: str, scale: str) -> str:
    """The source cell of the paper's rows: which model and dataset they are, where the table's runs are another."""
    return "paper (SmolLM2-360M, GSM8K-Platinum)" if name in CPU_TABLES.get(scale, {}) else "paper"


def evaluated_on(dataset: str):
    """Whether a run has a per-question record on `dataset` (a predicate for with_results)."""
    return lambda run: dataset in run.eval_records


def model_runs(runs_root: Path, scale: str, model: str) -> tuple[list[Run], list[list[Run]]]:
    runs = [r for r in load_runs(runs_root / f"math-{scale}") if r.get("model.name") == model]
    return [r for r in runs if r.get("experiment") == "math-base"], group_runs(
        [r for r in runs if r.get("experiment") == "math"]
    )


def row_label(group, extra=""):
    run = group[0]
    tags = [run.get("method.aggregation"), trainer_tag(run), extra, *status_tags(group)]
    return tagged(method_label(run.get("method.name")), tags)


def pct(pq: PerQuestion | None, ks: list[int]) -> list:
    """Pass@k in percent for each k of the table; None ('not run') where no run has enough samples for k."""
    if pq is None:
        return [None] * len(ks)
    means = dict(zip(pq.ks, 100 * pq.values.mean(axis=0), strict=True))
    return [means.get(k) for k in ks]


def guess_rows(base: list[Run], shown: str, dataset: str, ks: list[int]) -> list[list]:
    """The answer-guessing floor the base run logged (none when it logged none): two rows."""
    runs = [r for r in base if r.last(f"eval/{dataset}/guess_pass@{ks[0]}") is not None]
    if not runs:
        return []
    rows = []
    for key, label in [
        ("guess_pass", "Guessing: answers at training frequency"),
        ("guess_top_pass", "Guessing: k commonest answers"),
    ]:
        values = [runs[0].last(f"eval/{dataset}/{key}@{k}") for k in ks]
        rows.append([shown, label, "baseline", "", "", "", *[None if v is None else 100 * v for v in values]])
    return rows


def passk_table(name: str, runs_root: Path, scale: str, out_root: Path = OUT) -> str:
    model, datasets, ks, ref_name = table_spec(name, scale)
    base, groups = model_runs(runs_root, scale, model)
    reference = read_reference(ref_name)
    header = ["dataset", "method", "source", "seeds", "steps", "budget", *[f"Pass@{k}" for k in ks]]
    rows, bold = [], set()
    for dataset in datasets:
        shown = DATASETS[dataset]
        base_pk = per_question(base, dataset, ks)
        curves = {"Base": base_pk}
        source = "reproduced" if base_pk is not None else "not run"
        rows.append([shown, tagged("Base", status_tags(base)), source, seeds(base_pk), "", "", *pct(base_pk, ks)])
        rows += guess_rows(base, shown, dataset, ks)
        index, regime = {}, {}
        for label, g in label_groups(groups, row_label, key=lambda g: g[0].get("method.aggregation")):
            budget = budget_cell(g)
            pq = curves[label] = per_question(g, dataset, ks)
            rows.append([shown, label, "reproduced", seeds(pq), g[0].get("train.steps"), budget, *pct(pq, ks)])
            index[(g[0].get("method.name"), g[0].get("method.aggregation"))] = len(rows) - 1
            if g[0].get("method.name") in tested_and_baselines():
                regime[label] = with_results(g, evaluated_on(dataset))
        passk_figure(curves, out_root / f"math-{scale}" / f"{name}_{dataset}_passk", f"{model}: {shown}")
        regime_figure(regime, dataset, ks[-1], out_root / f"math-{scale}" / f"{name}_{dataset}_regime", shown,
                      base=with_results(base, evaluated_on(dataset)))  # fmt: skip
        for (tested, norm), i in index.items():  # bold the better of each reproduced (method, baseline) pair
            j = index.get((METHODS[tested].baseline, norm)) if tested in tested_methods() else None
            if j is not None:
                bold |= bold_better(rows, i, j, range(6, len(header)))
        run_labels = {method_label(m) for m, _ in index}
        for p in reference:
            if p.get("dataset", shown) != shown:
                continue
            method = p["method"] + (f" ({p['normalization']})" if p.get("normalization") else "")
            if p["method"] in ("MaxRL", "SERA", "GRPO", "DARS-HW") and p["method"] not in run_labels:
                rows.append([shown, method, "not run", "", "", "", *[None] * len(ks)])
            values = [float(p[f"pass@{k}"]) if f"pass@{k}" in p else "n/a" for k in ks]
            rows.append([shown, method, paper_source(name, scale), "", "", "", *values])
    md = write_table(out_root / f"math-{scale}" / name, header, rows, bold=bold)
    text = f"# {name.capitalize()} ({model}), scale={scale}\n\n{table_note(name, scale)}{md}"
    print(text)
    return text


def budget_cell(group: list[Run]):
    """The nominal budget B x n0 a step; where the rollouts actually generated differ (DARS-HW adds rollouts, the
    sequential allocators draw extra), also their mean per step over the group's runs and the ratio."""
    if not group[0].get("n0"):
        return ""
    nominal = group[0].get("train.batch_size", 0) * group[0].get("n0", 0)
    used = [float(np.mean(v)) for v in (r.series("alloc/generated")[1] for r in group) if v.size]
    if not used or abs(np.mean(used) / nominal - 1) < 0.005:
        return nominal
    return f"{nominal} (used {np.mean(used):.0f}, {np.mean(used) / nominal:.2f}x)"


def seeds(pq: PerQuestion | None) -> int:
    """The number of runs that contributed a record."""
    return 0 if pq is None else len(pq.runs)


def delta_table(name: str, runs_root: Path, scale: str, out_root: Path = OUT, num_resamples: int = 10_000) -> str:
    model, datasets, ks, ref_name = table_spec(name, scale)
    _, groups = model_runs(runs_root, scale, model)
    reference = read_reference(ref_name)
    header = [
        "dataset",
        "normalization",
        "k",
        "delta (pp)",
        "95% CI low",
        "95% CI high",
        "questions",
        "seeds",
        "seed-level delta (pp)",
        "seed 95% low",
        "seed 95% high",
        "per seed (pp)",
        "paper delta",
        "paper low",
        "paper high",
    ]
    texts = []
    for position, tested in enumerate(verdict_methods(groups)):  # SERA's in `name`, any other's in name_<method>
        stem = name if position == 0 else f"{name}_{tested}"
        md = write_table(out_root / f"math-{scale}" / stem, header, delta_rows(tested, groups, datasets, ks, reference,
                                                                            num_resamples))  # fmt: skip
        what = f"{method_label(tested)} minus {method_label(METHODS[tested].baseline)}"
        texts.append(f"# {name.capitalize()} ({model}): {what}, scale={scale}\n\n{table_note(name, scale)}{md}")
    text = "\n\n".join(texts)
    print(text)
    return text


def delta_rows(tested: str, groups, datasets, ks, reference, num_resamples: int) -> list[list]:
    """The rows of one tested method against its registry baseline: per dataset, normalisation and k, the
    question-paired bootstrap, the seed-level t-interval and the per-seed differences, beside the paper's."""
    baseline = METHODS[tested].baseline
    what = f"{method_label(tested)} vs {method_label(baseline)}"
    rows = []
    by_norm: dict[str, set] = {}
    for g in groups:
        by_norm.setdefault(g[0].get("method.aggregation"), set()).add(g[0].get("method.name"))
    norms = sorted(n for n, names in by_norm.items() if {tested, baseline} <= names)
    for dataset in datasets:
        shown = DATASETS[dataset]
        for norm in norms or ["token-mean"]:
            candidates = [
                g for g in groups if g[0].get("method.aggregation") == norm and with_results(g, evaluated_on(dataset))
            ]
            pair = baseline_pair(candidates, f"{shown}, {norm}", tested)
            cells = {}
            if isinstance(pair, tuple):  # pooled over the seeds both ran: each seed's pair started from one base model
                both = {r.get("seed") for r in pair[0]} & {r.get("seed") for r in pair[1]}
                pair = tuple([r for r in g if r.get("seed") in both] for g in pair) if both else pair
                a, b = (per_question(g, dataset, ks) for g in pair)
                x, y, common = pair_by_question(a, b, f"{shown} {what} ({norm})")
                ci = paired_bootstrap_ci(x, y, num_resamples=num_resamples)
                no_seed = [0, "", "", "", ""]  # until a seed both ran fills them
                for col, k in enumerate(common):
                    cells[k] = [100 * ci.delta[col], 100 * ci.low[col], 100 * ci.high[col], len(a.ids), *no_seed]
                # seeds are the unit here: the interval covers training randomness, which the bootstrap does not
                seed_ids, seed_ks, diffs = seed_differences(*pair, dataset, ks, f"{shown} {what} ({norm})")
                by_seed = seed_t_interval(diffs) if diffs is not None else None
                for col, k in enumerate(seed_ks if diffs is not None else []):
                    low, high = (100 * by_seed.low[col], 100 * by_seed.high[col]) if len(seed_ids) > 1 else ("", "")
                    per_seed = ", ".join(f"{s}: {100 * d:+.2f}" for s, d in zip(seed_ids, diffs[:, col], strict=True))
                    cells[k] = [*cells.get(k, [None] * 4)[:4], len(seed_ids), 100 * by_seed.delta[col], low, high,
                                per_seed]  # fmt: skip
            for k in ks:
                missing = [pair, *[""] * 8] if isinstance(pair, str) else [None] * 9  # refused, or not run
                rows.append([shown, norm, k, *cells.get(k, missing), *paper_delta(reference, shown, k)])
    return rows


def paper_delta(reference: list[dict], dataset: str, k: int) -> list:
    for p in reference:
        if p.get("dataset", dataset) == dataset and int(p.get("k", 0)) == k:
            return [float(p["delta"]), float(p["ci95_low"]), float(p["ci95_high"])]
    wide = [p for p in reference if p.get("quantity")]  # table 5: one row per quantity, one column per k
    if wide and f"pass@{k}" in wide[0]:
        by_q = {p["quantity"]: float(p[f"pass@{k}"]) for p in wide}
        return [by_q["delta_sera_minus_maxrl"], by_q["ci95_low"], by_q["ci95_high"]]
    return ["n/a"] * 3


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", default="paper")
    parser.add_argument("--runs", type=Path, default=Path("runs"))
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    own = CPU_TABLES.get(args.scale)  # a scale with its own tables builds only those
    for name in PASSK_TABLES:
        if own is None or name in own:
            passk_table(name, args.runs, args.scale, args.out)
    for name in DELTA_TABLES:
        if own is None or name in own:
            delta_table(name, args.runs, args.scale, args.out)


if __name__ == "__main__":
    main()
