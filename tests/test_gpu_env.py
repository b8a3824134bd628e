"""The CUDA environment's pins (constraints-gpu.txt, make install-gpu) agree with the project: every package the
target installs is pinned, vLLM inside the range pyproject.toml's `vllm` extra allows (TRL 1.16's), TRL the version
the main environment and sera.trl require, and torch a CUDA build from PyPI (no +cpu local version)."""

import re
from pathlib import Path

from packaging.specifiers import SpecifierSet

ROOT = Path(__file__).resolve().parents[1]


def pins(name: str) -> dict[str, str]:
    lines = (ROOT / name).read_text().splitlines()
    found = (re.fullmatch(r"([A-Za-z0-9_.\-]+)==(\S+)", line.strip()) for line in lines)
    return {normal(m[1]): m[2] for m in found if m}


def normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()  # PEP 503


def test_the_gpu_pins_cover_the_target_and_agree_with_the_project():
    gpu, main = pins("constraints-gpu.txt"), pins("constraints.txt")
    makefile = (ROOT / "Makefile").read_text()
    packages = re.search(r"GPU_PACKAGES := ((?:.*\\\n)*.*)\n", makefile)[1].replace("\\\n", " ").split()
    assert len(packages) > 10 and [p for p in packages if normal(p) not in gpu] == []
    extra = re.search(r'vllm = \["vllm(.*?)"\]', (ROOT / "pyproject.toml").read_text())[1]
    assert gpu["vllm"] in SpecifierSet(extra)
    assert gpu["trl"] == main["trl"] == "1.16.0"
    assert "+" not in gpu["torch"]  # PyPI's torch for Linux is the CUDA build; a +cpu wheel is a mirror's
