"""Run shell commands side by side, one a GPU: each starts on a free GPU of `--gpus` (CUDA_VISIBLE_DEVICES=k, so
its `cuda` is that GPU), at most that many at once, the next one taking the first GPU freed. What `make
reproduce-imagenet SCALE=paper` runs the classifier's grid with: every run the single-process run (all of Table 2's
columns, the gradient cosines included), every GPU of the node busy while runs remain. Standard library only.

    python -m sera.gpu_pool --gpus 8 "CMD 1" "CMD 2" ...    exit 1 after all have ended if any failed, naming them
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time


def run_pool(commands: list[str], gpus: int, poll_s: float = 1.0) -> list[str]:
    """Run every command (a shell line), at most `gpus` at once, each with CUDA_VISIBLE_DEVICES set to a GPU no
    other running command holds. Returns the commands that failed, in the order given."""
    if gpus < 1:
        raise ValueError(f"--gpus must be >= 1, got {gpus}")
    waiting, running, failed = list(enumerate(commands)), {}, set()  # running: GPU -> (index, process)
    while waiting or running:
        for gpu in [g for g in range(gpus) if g not in running][: len(waiting)]:
            index, command = waiting.pop(0)
            env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(gpu)}
            print(f"[gpu {gpu}] {command}", flush=True)
            running[gpu] = (index, subprocess.Popen(command, shell=True, env=env))
        for gpu, (index, process) in list(running.items()):
            if process.poll() is not None:
                del running[gpu]
                if process.returncode:
                    failed.add(index)
        if running:
            time.sleep(poll_s)
    return [commands[i] for i in sorted(failed)]


def machine_gpus() -> int | None:
    """The GPUs nvidia-smi lists (None without nvidia-smi)."""
    if shutil.which("nvidia-smi") is None:
        return None
    done = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False)
    return sum(line.startswith("GPU ") for line in done.stdout.splitlines())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, required=True, help="GPUs 0 .. N-1 of this machine")
    parser.add_argument("commands", nargs="+", help="shell command lines, one a run")
    args = parser.parse_args(argv)
    present = machine_gpus()
    if present is not None and args.gpus > present:
        sys.exit(f"--gpus {args.gpus} but nvidia-smi lists {present} GPUs: give at most {present} (GPUS_IMAGENET=)")
    failed = run_pool(args.commands, args.gpus)
    if failed:
        sys.exit("run failed: " + "\nrun failed: ".join(failed))


if __name__ == "__main__":
    main()
