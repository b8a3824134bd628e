"""Every module `make bench` runs imports in a fresh interpreter the way `python -m bench.<module>` loads it (the
bench package first, which puts the numeric pin in force before torch). Timings themselves are never tested."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sera.numerics import PINNED_VARS

ROOT = Path(__file__).resolve().parents[1]


def bench_modules() -> list[str]:
    makefile = (ROOT / "Makefile").read_text()
    recipe = makefile.split("\nbench:", 1)[1].split("\n\n", 1)[0]
    return re.findall(r"-m (bench\.\w+)", recipe)


def test_make_bench_runs_the_modules_found_here():
    assert {"bench.bench_core", "bench.bench_imagenet", "bench.bench_maze"} <= set(bench_modules())


@pytest.mark.parametrize("module", bench_modules())
def test_a_bench_module_imports_under_the_numeric_pin(module):
    # the environment `make bench` starts from: the pin's variables unset (this test process has them set)
    env = {key: value for key, value in os.environ.items() if key not in PINNED_VARS}
    command = [sys.executable, "-c", f"import {module}"]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
