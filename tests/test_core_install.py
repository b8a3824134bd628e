"""The numpy core stands alone: `pip install .` declares numpy and scipy only, the core modules import with torch and
the other heavy packages blocked, and in a clean virtual environment the package installs without extras and runs
README's quick start and examples/allocator_loop.py (docs/allocator.md), each printing what its page shows."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.test_docs import code_and_output

ROOT = Path(__file__).resolve().parents[1]
CORE = ("sera", "sera.allocation", "sera.estimation", "sera.advantages", "sera.passk", "sera.stats", "sera.sequential",
        "sera.sink")  # fmt: skip
# what the extras bring: an import of any of these from the core fails the guard
HEAVY = ("torch", "torchvision", "transformers", "trl", "accelerate", "datasets", "hydra", "omegaconf", "wandb",
         "numba", "matplotlib", "sklearn", "yaml", "tqdm")  # fmt: skip
EXAMPLE = ROOT / "examples" / "allocator_loop.py"
PACKAGE_FILES = ("pyproject.toml", "README.md", "LICENSE", "sera", "experiments", "paper_figures")


# what the studies add to the trl extra (torch, transformers, trl and what they pull): sera.trl must do without them
STUDIES_ONLY = ("torchvision", "hydra", "omegaconf", "wandb", "numba", "matplotlib", "sklearn", "math_verify",
                "reasoning_gym", "gguf")  # fmt: skip


def run_blocked(code: str, blocked: tuple[str, ...] = HEAVY) -> subprocess.CompletedProcess:
    """Run `code` in a fresh interpreter at the repository root in which importing any `blocked` package raises."""
    block = f"import sys\nfor name in {blocked!r}:\n    sys.modules[name] = None\n"
    return subprocess.run([sys.executable, "-c", block + code], cwd=ROOT, capture_output=True, text=True)


def requirement_names(requirements: list[str]) -> set[str]:
    return {re.match(r"[A-Za-z0-9_.-]+", r)[0].lower() for r in requirements}


def test_the_core_declares_numpy_and_scipy_alone_and_make_install_takes_every_extra():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert requirement_names(project["dependencies"]) == {"numpy", "scipy"}
    extras = project["optional-dependencies"]
    assert "torch" in requirement_names(extras["studies"]) and "trl" in requirement_names(extras["trl"])
    install = re.search(r'pip install -q -c constraints.txt -e "\.\[([\w,]+)\]"', (ROOT / "Makefile").read_text())
    assert install and set(install[1].split(",")) == {"dev", "studies", "trl"}


@pytest.mark.parametrize("module", CORE)
def test_a_core_module_imports_without_the_heavy_packages(module):
    done = run_blocked(f"import {module}")
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_guard_catches_a_module_that_imports_torch():
    done = run_blocked("import sera.losses")
    assert done.returncode != 0 and "torch" in done.stderr


def test_sera_trl_imports_with_the_trl_extra_alone():
    done = run_blocked("import sera.trl", STUDIES_ONLY)
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_allocator_example_runs_without_the_heavy_packages_and_prints_what_its_page_shows():
    done = run_blocked(f"import runpy; runpy.run_path({str(EXAMPLE)!r}, run_name='__main__')")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == code_and_output("docs/allocator.md", "## A runnable example")[1]


def clean_environment(tmp_path: Path) -> Path:
    """A fresh virtual environment's python, with nothing but pip (and what venv puts beside it)."""
    subprocess.run([sys.executable, "-m", "venv", str(tmp_path / "venv")], check=True, capture_output=True)
    python = tmp_path / "venv" / "bin" / "python"
    probe = subprocess.run([python, "-m", "pip", "download", "-q", "--no-deps", "-d", tmp_path / "probe",
                            "setuptools>=68"], capture_output=True, text=True)  # fmt: skip
    if probe.returncode != 0:
        pytest.skip(f"no package index reachable: {probe.stderr.strip()[-300:]}")
    return python


@pytest.mark.slow
def test_a_clean_environment_installs_the_core_alone_and_runs_the_quick_start(tmp_path):
    python = clean_environment(tmp_path)
    source = tmp_path / "source"  # a copy, so that the build writes nothing into the repository
    source.mkdir()
    for name in PACKAGE_FILES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(ROOT / name, source / name)
    subprocess.run([python, "-m", "pip", "install", "-q", str(source)], check=True, capture_output=True, text=True)
    freeze = subprocess.run([python, "-m", "pip", "freeze"], check=True, capture_output=True, text=True).stdout
    assert requirement_names(freeze.splitlines()) == {"numpy", "scipy", "sera"}, freeze
    away = {"cwd": tmp_path, "capture_output": True, "text": True}  # outside the clone: the installed package runs
    assert subprocess.run([python, "-c", "import torch"], **away).returncode != 0
    code, shown = code_and_output("README.md", "## Quick start")
    assert subprocess.run([python, "-c", code], check=True, **away).stdout == shown
    example = subprocess.run([python, str(EXAMPLE)], check=True, **away).stdout
    assert example == code_and_output("docs/allocator.md", "## A runnable example")[1]
