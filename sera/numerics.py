"""The numeric kernel level: one setting that pins which CPU code path every float kernel takes, and the fingerprint
each run records.

Vectorised kernels sum in a different order at each instruction-set level, so the same seed gives different float
results on an AVX2 and an AVX-512 machine (the classifier's Table 2 moved by up to 1.5 points between the two). The
level is chosen by the environment variable SERA_NUMERICS and must be in force before torch, MKL, oneDNN or numba
load their dispatch tables: `experiments/__init__.py` applies it first thing, so `make`, `python -m experiments...`
and torchrun (whose workers inherit the environment) all run at it.

    SERA_NUMERICS=avx2     the default: every x86-64 machine since 2013 has it, so any such machine reproduces
    SERA_NUMERICS=avx512   the level the maze and math archives were made at (needs AVX-512)
    SERA_NUMERICS=native   whatever this machine picks: no pin, not portable

A library user who imports sera after torch gets no pin; `fingerprint()` then records what is in force.
"""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path

ENV = "SERA_NUMERICS"
DEFAULT = "avx2"
NUMERICS_FILE = "numerics.json"  # a run directory's fingerprint (sera.runlog writes it)

# Per level, what each library is told. torch's vectorised ATen kernels (ATEN_CPU_CAPABILITY), MKL's BLAS
# (MKL_CBWR: conditional numerical reproducibility, the code path fixed), oneDNN (ONEDNN_MAX_CPU_ISA: the highest ISA
# its JIT may use) and numba's compiled label sampler (NUMBA_CPU_NAME: the LLVM target).
LEVELS: dict[str, dict[str, str]] = {
    "avx2": {
        "ATEN_CPU_CAPABILITY": "avx2",
        "MKL_CBWR": "AVX2",
        "ONEDNN_MAX_CPU_ISA": "AVX2",
        "NUMBA_CPU_NAME": "haswell",
    },
    "avx512": {
        "ATEN_CPU_CAPABILITY": "avx512",
        "MKL_CBWR": "AVX512",
        "ONEDNN_MAX_CPU_ISA": "AVX512_CORE",
        "NUMBA_CPU_NAME": "skylake-avx512",
    },
    "native": {},
}
PINNED_VARS = sorted({var for env in LEVELS.values() for var in env})
# The CPU flag a level needs (/proc/cpuinfo); a level this machine lacks is refused before any work.
NEEDS_FLAG = {"avx2": "avx2", "avx512": "avx512f"}


class NumericsError(RuntimeError):
    """The level asked for cannot be put in force (unknown, unsupported by this CPU, or torch already loaded)."""


def level_asked() -> str:
    """The level SERA_NUMERICS names (the default when unset); NumericsError for an unknown one."""
    level = os.environ.get(ENV, "") or DEFAULT
    if level not in LEVELS:
        raise NumericsError(f"unknown {ENV}={level!r}; choose from {sorted(LEVELS)}")
    return level


def cpu_flags() -> set[str]:
    """This CPU's feature flags ({} where /proc/cpuinfo is absent, e.g. macOS)."""
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.exists():
        return set()
    for line in cpuinfo.read_text().splitlines():
        if line.startswith("flags"):
            return set(line.partition(":")[2].split())
    return set()


def cpu_model() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    return platform.processor() or platform.machine()


def pin() -> str:
    """Put the asked level in force: set its variables in os.environ (children inherit them). Call before torch
    loads. Returns the level; NumericsError when the CPU lacks it or torch is already loaded at another setting."""
    level = level_asked()
    flag = NEEDS_FLAG.get(level)
    flags = cpu_flags()
    if flag and flags and flag not in flags and platform.machine() in ("x86_64", "AMD64"):
        raise NumericsError(
            f"{ENV}={level} needs the CPU flag {flag}, which this CPU ({cpu_model()}) lacks: its results cannot be "
            f"reproduced bit for bit here; run with {ENV}=avx2 (or native) and expect other numbers"
        )
    wanted = LEVELS[level]
    if "torch" in sys.modules:
        differing = [var for var in PINNED_VARS if os.environ.get(var) != wanted.get(var)]
        if differing:
            raise NumericsError(
                f"torch was imported before {ENV}={level} could be applied ({', '.join(differing)} not as the level "
                f"sets them): import experiments (or call sera.numerics.pin()) before torch"
            )
        return level
    for var in PINNED_VARS:
        if var in wanted:
            os.environ[var] = wanted[var]
        else:
            os.environ.pop(var, None)
    os.environ[ENV] = level
    return level


def fingerprint(threads: int | None = None) -> dict:
    """What decides a run's float results beyond its config: the level in force (torch's reported CPU capability and
    the pinned variables), the library versions, the CPU model and the thread count."""
    import numpy
    import torch

    versions = {"python": platform.python_version(), "torch": torch.__version__, "numpy": numpy.__version__}
    for name in ("numba", "transformers"):
        module = sys.modules.get(name)
        if module is not None:
            versions[name] = module.__version__
    return {
        "level": os.environ.get(ENV, "unpinned"),
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "env": {var: os.environ[var] for var in PINNED_VARS if var in os.environ},
        "versions": versions,
        "cpu": cpu_model(),
        "threads": threads if threads is not None else torch.get_num_threads(),
    }


def summary(fp: dict) -> str:
    """One line for a table's settings line: level, torch's capability, torch version, CPU."""
    return f"numerics {fp['level']} (torch {fp['versions']['torch']} at {fp['torch_cpu_capability']}, {fp['cpu']})"
