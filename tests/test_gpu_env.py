"""The CUDA environment's pins (constraints-gpu.txt, make install-gpu) agree with the project: every package the
target installs is pinned, vLLM inside the range pyproject.toml's `vllm` extra allows (TRL 1.16's), TRL the version
the main environment and sera.trl require, and torch a CUDA build from PyPI (no +cpu local version)."""

import re
from pathlib import Path

import pytest
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


OLD_DRIVER = """| NVIDIA-SMI 535.104.05             Driver Version: 535.104.05   CUDA Version: 12.2     |"""
NEW_DRIVER = """| NVIDIA-SMI 580.82.07              Driver Version: 580.82.07      CUDA Version: 13.0     |"""


def test_the_driver_is_checked_against_the_pinned_cuda_and_says_what_it_needs():
    """torch 2.13.0 (PyPI, constraints-gpu.txt) is a CUDA 13.0 build: a driver older than 580.65.06 (CUDA 12.2's
    535 here) is refused with the driver it needs and the other way out; 580.82 passes; no nvidia-smi is refused;
    a CUDA 12.6 torch runs on the 535 driver."""
    from sera.driver import parse_smi, verdict

    assert parse_smi(OLD_DRIVER) == ("535.104.05", "12.2") and verdict(NEW_DRIVER) is None
    old = verdict(OLD_DRIVER)
    assert "535.104.05 supports CUDA up to 12.2" in old and "580.65.06 or newer" in old and "whl/cu126" in old
    assert "no NVIDIA driver found" in verdict(None) and "580.65.06" in verdict(None)
    assert verdict(OLD_DRIVER, cuda="12.6") is None


def test_install_gpu_checks_the_driver_first_and_keeps_the_users_pip_configuration():
    from tests.test_makefile import dry_run

    lines = dry_run("install-gpu", "PYTHON=python3")
    assert lines[0] == "python3 -m sera.driver" and lines[-1] == ".venv-gpu/bin/python -m sera.driver --torch"
    (install,) = [line for line in lines if "constraints-gpu.txt" in line]
    assert "--isolated" not in install and "--index-url" not in install
    (install,) = [line for line in dry_run("install-gpu", "GPU_PIP_INDEX=https://mirror.example/simple")
                  if "constraints-gpu.txt" in line]  # fmt: skip
    assert "--index-url https://mirror.example/simple" in install
    assert dry_run("test-gpu", "PY=.venv/bin/python")[0] == ".venv/bin/python -m sera.driver --torch"


def test_the_gpu_pool_runs_one_command_a_gpu_and_names_the_failures(tmp_path, capsys):
    """sera.gpu_pool (make reproduce-imagenet SCALE=paper): 5 commands on 2 GPUs run at most 2 at once, never two on
    one GPU at the same time, every command runs, and a failed one is named after all have ended."""
    from sera.gpu_pool import run_pool

    log = tmp_path / "log"
    # each command logs (start, GPU), sleeps, logs (end, GPU); command 3 fails
    commands = [f'echo "start $CUDA_VISIBLE_DEVICES" >> {log}; sleep 0.3; echo "end $CUDA_VISIBLE_DEVICES" >> {log}'
                + ("; exit 3" if i == 3 else "") for i in range(5)]  # fmt: skip
    assert run_pool(commands, gpus=2, poll_s=0.05) == [commands[3]]
    held: set[str] = set()
    for event, gpu in (line.split() for line in log.read_text().splitlines()):
        if event == "start":
            assert gpu not in held and gpu in ("0", "1")
            held.add(gpu)
        else:
            held.remove(gpu)
    assert log.read_text().count("start") == 5 and not held
    with pytest.raises(ValueError, match="--gpus must be >= 1"):
        run_pool(commands, gpus=0)
