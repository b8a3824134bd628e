"""Whether this machine's NVIDIA driver can run the CUDA build of torch an environment installs or holds, checked
before any install or GPU test (`make install-gpu`, `make test-gpu`), saying what is needed when it cannot. Standard
library only (torch is imported only to read an installed build), so it runs before any environment exists.

    python -m sera.driver            the driver against CUDA 13.0, which the pinned torch wheels are built for
    .venv/bin/python -m sera.driver --torch   the driver against the installed torch's CUDA; torch must see a GPU

Exit 0 with one line saying what was found, or 1 with what is needed.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys

PINNED_CUDA = "13.0"  # torch 2.13.0 (constraints-gpu.txt) and 2.14.1 (constraints.txt) from PyPI: CUDA 13.0 builds
# the oldest Linux driver each CUDA major version runs on (NVIDIA's CUDA toolkit release notes, minor version
# compatibility: 12.x from 525.60.13, 13.x from 580.65.06)
MIN_DRIVER = {12: "525.60.13", 13: "580.65.06"}
# what a run told device=cuda says on a machine where torch sees no GPU
NO_CUDA = (
    "device=cuda but no CUDA device is available (use device=cpu or auto; `python -m sera.driver --torch` says "
    "whether the NVIDIA driver suits this torch's CUDA build, and what it needs)"
)
OLDER_TORCH = (
    "or install a torch built for the CUDA this driver supports, e.g. for CUDA 12.6: pip install torch==<the pinned "
    "version> --index-url https://download.pytorch.org/whl/cu126 (vLLM's PyPI wheel is a CUDA 13 build too; such an "
    "environment is not pinned or tested here)"
)


def version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def parse_smi(text: str) -> tuple[str, str] | None:
    """(driver version, the newest CUDA it supports) from nvidia-smi's header, None when it shows neither."""
    driver = re.search(r"Driver Version:\s*([\d.]+)", text)
    cuda = re.search(r"CUDA Version:\s*([\d.]+)", text)
    return (driver[1], cuda[1]) if driver and cuda else None


def verdict(smi: str | None, cuda: str = PINNED_CUDA) -> str | None:
    """None when the driver nvidia-smi reports (`smi`: its output; None: no nvidia-smi) runs CUDA `cuda`, else what
    is needed."""
    need = MIN_DRIVER.get(version(cuda)[0], "0")
    if smi is None or parse_smi(smi) is None:
        return (f"no NVIDIA driver found (nvidia-smi is missing or shows no driver): torch here is a CUDA {cuda} "
                f"build, which needs an NVIDIA driver {need} or newer")  # fmt: skip
    driver, supported = parse_smi(smi)
    if version(driver) < version(need):
        return (
            f"NVIDIA driver {driver} supports CUDA up to {supported}; torch here is a CUDA {cuda} build "
            f"(torch.cuda.is_available() would be False): update the driver to {need} or newer, {OLDER_TORCH}"
        )
    return None


def smi_output() -> str | None:
    if shutil.which("nvidia-smi") is None:
        return None
    done = subprocess.run(["nvidia-smi"], capture_output=True, text=True, check=False)
    return done.stdout if done.returncode == 0 else None


def installed_torch() -> tuple[str | None, str | None]:
    """(the installed torch's CUDA version, None for a CPU build; what is wrong with it, or None)."""
    import torch

    build = f"torch {torch.__version__}"
    if torch.version.cuda is None:
        return None, (f"{build} is a CPU build: the index pip used served no CUDA wheel; reinstall from PyPI "
                      "(make install-gpu GPU_PIP_INDEX=https://pypi.org/simple) or a mirror of it")  # fmt: skip
    if not torch.cuda.is_available():
        return torch.version.cuda, (f"{build} (CUDA {torch.version.cuda}) sees no GPU: check CUDA_VISIBLE_DEVICES "
                                    "and the container's access to the GPUs")  # fmt: skip
    return torch.version.cuda, None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--torch", action="store_true", help="check against the installed torch's CUDA build")
    args = parser.parse_args(argv)
    smi, cuda, problem = smi_output(), PINNED_CUDA, None
    if args.torch:
        cuda, problem = installed_torch()
        if cuda is None:
            sys.exit(problem)
    problem = verdict(smi, cuda) or problem
    if problem:
        sys.exit(problem)
    driver, supported = parse_smi(smi)
    print(f"NVIDIA driver {driver} (CUDA up to {supported}) runs torch's CUDA {cuda} build")


if __name__ == "__main__":
    main()
