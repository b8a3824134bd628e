"""Tables 1 and 5-9 (math reasoning) from run directories: Pass@K tables and SERA-minus-MaxRL intervals. No torch.

Run: python -m paper_figures.math --scale paper
The run-directory contract (what a math run writes; the math study itself is a later issue): runs live under
runs/math-<scale>/, each with config.yaml (experiment: math, or math-base for the pre-RL model; model.name; method.name;
method.aggregation; train.steps; n0; seed) and one per-question record per evaluated dataset,
eval_step<N>_<dataset>.json = {"ids": [...], "n": samples per question, "correct": [...]}. Pass@K comes from the last
step's counts with the unbiased estimator; deltas use a question-paired 95% bootstrap (10,000 resamples).
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import numpy as np

from paper_figures.render import passk_figure, read_reference, write_table
from paper_figures.runs import Run, group_runs, label_groups, load_runs
from sera.passk import pass_at_k
from sera.stats import paired_bootstrap_ci

OUT = Path(__file__).parent / "out"
DATASETS = {  # file slug -> the paper's name
    "gsm8k-platinum": "GSM8K-Platinum",
    "beyondaime": "BeyondAIME",
    "aime2025": "AIME 2025",
    "math500": "MATH-500",
    "minerva": "Minerva Math",
    "olympiadbench": "OlympiadBench",
}
SLUG = {v: k for k, v in DATASETS.items()}
LABELS = {"grpo": "GRPO", "maxrl": "MaxRL", "sera": "SERA", "pkpo": "PKPO (T=16)", "dars_hw": "DARS-HW"}
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
_RECORD = re.compile(r"eval_step(\d+)_(.+)\.json")


def final_record(run: Run, dataset: str) -> dict | None:
    """The per-question record of the run's last evaluation on `dataset`, or None."""
    found = [
        (int(m.group(1)), p)
        for p in run.path.glob("eval_step*_*.json")
        if (m := _RECORD.fullmatch(p.name)) and m.group(2) == dataset
    ]
    return json.loads(max(found)[1].read_text()) if found else None


def per_question(group: list[Run], dataset: str, ks: list[int]) -> np.ndarray | None:
    """(questions, K) Pass@K per question in sorted question-id order, averaged over the group's seeds; None when no
    run evaluated it. Sorting by id makes rows of two methods line up question by question for the paired bootstrap."""
    records = [r for r in (final_record(run, dataset) for run in group) if r is not None]
    if not records:
        return None
    records = [
        {**r, "ids": sorted(r["ids"]), "correct": [c for _, c in sorted(zip(r["ids"], r["correct"], strict=True))]}
        for r in records
    ]
    if len({tuple(r["ids"]) for r in records}) > 1:
        raise ValueError(f"seeds of {group[0].path.parent} evaluated different questions on {dataset}")
    usable = [k for k in ks if k <= min(r["n"] for r in records)]
    values = np.mean([pass_at_k(r["n"], np.asarray(r["correct"]), usable) for r in records], axis=0)
    return np.pad(values, ((0, 0), (0, len(ks) - len(usable))), constant_values=np.nan)


def question_ids(group: list[Run], dataset: str) -> list:
    """Sorted question ids of the group's evaluation on `dataset`."""
    record = next(r for r in (final_record(run, dataset) for run in group) if r is not None)
    return sorted(record["ids"])


def model_runs(runs_root: Path, scale: str, model: str) -> tuple[list[Run], list[list[Run]]]:
    runs = [r for r in load_runs(runs_root / f"math-{scale}") if r.get("model.name") == model]
    return [r for r in runs if r.get("experiment") == "math-base"], group_runs(
        [r for r in runs if r.get("experiment") == "math"]
    )


def row_label(group, extra=""):
    tags = [t for t in (group[0].get("method.aggregation"), extra) if t]
    if not all(r.finished for r in group):
        tags.append("unfinished")
    return LABELS.get(group[0].get("method.name"), group[0].get("method.name")) + f" ({', '.join(tags)})"


def pct(values: np.ndarray | None, ks) -> list:
    if values is None:
        return [None] * len(ks)
    return [None if np.isnan(v) else 100 * float(v) for v in values.mean(axis=0)]  # NaN: k above the samples


def passk_table(name: str, runs_root: Path, scale: str, out_root: Path = OUT) -> str:
    model, datasets, ks, ref_name = PASSK_TABLES[name]
    base, groups = model_runs(runs_root, scale, model)
    reference = read_reference(ref_name)
    header = ["dataset", "method", "source", "seeds", "steps", "budget", *[f"Pass@{k}" for k in ks]]
    rows, bold = [], set()
    for dataset in datasets:
        shown = DATASETS[dataset]
        base_pk = per_question(base, dataset, ks) if base else None
        curves = {"Base": base_pk}
        rows.append(
            [shown, "Base", "reproduced" if base_pk is not None else "not run", len(base), "", "", *pct(base_pk, ks)]
        )
        index = {}
        for label, g in label_groups(groups, row_label, key=lambda g: g[0].get("method.aggregation")):
            budget = g[0].get("train.batch_size", 0) * g[0].get("n0", 0) if g[0].get("n0") else ""
            rows.append(
                [
                    shown,
                    label,
                    "reproduced",
                    len(g),
                    g[0].get("train.steps"),
                    budget,
                    *pct(curves.setdefault(label, per_question(g, dataset, ks)), ks),
                ]
            )
            index[(g[0].get("method.name"), g[0].get("method.aggregation"))] = len(rows) - 1
        passk_figure(curves, ks, out_root / f"math-{scale}" / f"{name}_{dataset}_passk", f"{model}: {shown}")
        for norm in {n for _, n in index}:  # bold the better of each reproduced MaxRL/SERA pair
            i, j = index.get(("sera", norm)), index.get(("maxrl", norm))
            if i is not None and j is not None:
                for col in range(6, len(header)):
                    if rows[i][col] is not None and rows[j][col] is not None:
                        bold.add((i, col) if rows[i][col] > rows[j][col] else (j, col))
        for p in reference:
            if p.get("dataset", shown) != shown:
                continue
            method = p["method"] + (f" ({p['normalization']})" if p.get("normalization") else "")
            run_keys = {LABELS.get(m, m): m for m, _ in index}
            if p["method"] in ("MaxRL", "SERA", "GRPO", "DARS-HW") and p["method"] not in run_keys:
                rows.append([shown, method, "not run", "", "", "", *[None] * len(ks)])
            rows.append([shown, method, "paper", "", "", "", *[float(p[f"pass@{k}"]) for k in ks]])
    md = write_table(out_root / f"math-{scale}" / name, header, rows, bold=bold)
    text = f"# {name.capitalize()} ({model}), scale={scale}\n\n{md}"
    print(text)
    return text


def delta_table(name: str, runs_root: Path, scale: str, out_root: Path = OUT, num_resamples: int = 10_000) -> str:
    model, datasets, ks, ref_name = DELTA_TABLES[name]
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
        "paper delta",
        "paper low",
        "paper high",
    ]
    rows = []
    for dataset in datasets:
        shown = DATASETS[dataset]
        by_norm: dict[str, dict[str, list[Run]]] = {}
        for g in groups:
            by_norm.setdefault(g[0].get("method.aggregation"), {})[g[0].get("method.name")] = g
        norms = [n for n, m in by_norm.items() if "sera" in m and "maxrl" in m] or ["token-mean"]
        for norm in norms:
            pair = by_norm.get(norm, {})
            a = per_question(pair["sera"], dataset, ks) if "sera" in pair else None
            b = per_question(pair["maxrl"], dataset, ks) if "maxrl" in pair else None
            if (
                a is not None
                and b is not None
                and question_ids(pair["sera"], dataset) != question_ids(pair["maxrl"], dataset)
            ):
                raise ValueError(f"SERA and MaxRL ({norm}) evaluated different {shown} questions; refusing to pair")
            ci = paired_bootstrap_ci(a, b, num_resamples=num_resamples) if a is not None and b is not None else None
            for col, k in enumerate(ks):
                ref = paper_delta(reference, shown, k)
                cells = (
                    [None, None, None, None]
                    if ci is None or np.isnan(ci.delta[col])
                    else [100 * ci.delta[col], 100 * ci.low[col], 100 * ci.high[col], len(a)]
                )
                rows.append([shown, norm, k, *cells, *ref])
    md = write_table(out_root / f"math-{scale}" / name, header, rows)
    text = f"# {name.capitalize()} ({model}): SERA minus MaxRL, scale={scale}\n\n{md}"
    print(text)
    return text


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
    for name in PASSK_TABLES:
        passk_table(name, args.runs, args.scale, args.out)
    for name in DELTA_TABLES:
        delta_table(name, args.runs, args.scale, args.out)


if __name__ == "__main__":
    main()
