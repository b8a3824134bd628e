"""Time to rebuild a Pass@K table and its bootstrap table from run directories. Run: python -m bench.bench_tables.

Fixture runs of 3 methods (GRPO, MaxRL, SERA) x 500 questions x 512 samples are written to a temporary folder; the
Table 1 and Table 5 builders (per-question Pass@K, 10,000-resample paired bootstrap, markdown/CSV/LaTeX) are timed.
Target: under 10 s.
"""

from __future__ import annotations

import io
import json
import tempfile
import time
from contextlib import redirect_stdout
from pathlib import Path

import numpy as np
import yaml

from paper_figures import math as math_tables


def write_runs(root: Path, rng: np.random.Generator) -> None:
    for method in ("grpo", "maxrl", "sera"):
        path = root / "math-paper" / method
        path.mkdir(parents=True)
        config = {
            "experiment": "math",
            "seed": 0,
            "n0": 16,
            "model": {"name": "smollm2-360m-instruct"},
            "method": {"name": method, "aggregation": "token-mean"},
            "train": {"steps": 2000, "batch_size": 32},
        }
        (path / "config.yaml").write_text(yaml.safe_dump(config))
        (path / "metrics.jsonl").write_text('{"step": 1999}\n')
        correct = rng.binomial(512, rng.beta(0.5, 1.5, 500)).tolist()
        record = {"ids": list(range(500)), "n": 512, "correct": correct}
        (path / "eval_step2000_gsm8k-platinum.json").write_text(json.dumps(record))
        (path / "DONE").write_text("{}")


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_runs(root, np.random.default_rng(0))
        start = time.perf_counter()
        with redirect_stdout(io.StringIO()):
            math_tables.passk_table("table1", root, "paper", root / "out")
            math_tables.delta_table("table5", root, "paper", root / "out", num_resamples=10_000)
        elapsed = time.perf_counter() - start
    print(
        f"tables 1 and 5 from 3 methods x 500 questions x 512 samples, 10,000 bootstrap resamples: "
        f"{elapsed:.2f} s (target < 10 s)"
    )


if __name__ == "__main__":
    main()
