"""Grids launched in parallel give the records they give one run after another: a smoke maze grid (MaxRL and SERA,
two seeds, sharing each seed's base model) run serially, with JOBS=2's joblib launcher, and with submitit's local
executor (what LAUNCHER=slurm uses, run here without a cluster), compared run by run; a parallel sweep killed
mid-run resumes to the same records; a failed run is named and the others finish."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sera.runlog import DONE_FILE, EVAL_RECORD, METRICS_FILE, read_jsonl

ROOT = Path(__file__).resolve().parents[1]
GRID = ["scale=maze/smoke", "method=maxrl,sera_pilot", "seed=0,1"]
PARALLEL = {
    "joblib": ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"],
    "submitit_local": ["hydra/launcher=submitit_local", "hydra.launcher.timeout_min=10"],
}


def sweep(root: Path, *overrides: str, check: bool = True, **popen) -> subprocess.CompletedProcess | subprocess.Popen:
    command = [sys.executable, "-m", "experiments.maze.train", "--multirun", f"run.root={root}", "threads=1",
               "run.if_finished=skip", *overrides]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline"}
    if popen:
        return subprocess.Popen(command, cwd=ROOT, env=env, **popen)
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    if check:
        assert done.returncode == 0, done.stderr[-4000:]
    return done


def grid(root: Path, launcher: str | None) -> None:
    """The grid as make runs it: with a parallel launcher, the seeds' base models first, then the RL sweep."""
    extra = PARALLEL[launcher] if launcher else []
    if launcher:
        sweep(root, "scale=maze/smoke", "method=maxrl", "run.base_only=true", "seed=0,1", *extra)
    sweep(root, *GRID, *extra)


def records(root: Path) -> dict:
    """Every run's training records, evaluations and final summary, timings left out."""
    out = {}
    for run in sorted((root / "maze-smoke").iterdir()):
        if not (run / DONE_FILE).exists():
            continue
        drop = lambda d: {k: v for k, v in d.items() if not k.startswith("time/")}  # noqa: E731
        evals = {p.name: json.loads(p.read_text()) for p in run.iterdir() if EVAL_RECORD.fullmatch(p.name)}
        out[run.name] = ([drop(r) for r in read_jsonl(run / METRICS_FILE)], evals,
                         drop(json.loads((run / DONE_FILE).read_text())))  # fmt: skip
    return out


@pytest.fixture(scope="module")
def serial(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("serial")
    grid(root, None)
    return records(root)


@pytest.mark.slow
@pytest.mark.parametrize("launcher", list(PARALLEL))
def test_a_parallel_grid_gives_the_serial_records_run_by_run(serial, launcher, tmp_path):
    grid(tmp_path, launcher)
    got = records(tmp_path)
    assert sorted(got) == sorted(serial) and len(serial) == 6  # two base models and four RL runs
    for name in serial:
        assert got[name] == serial[name], name


@pytest.mark.slow
def test_a_parallel_sweep_killed_mid_run_resumes_to_the_records_of_one_not_killed(tmp_path):
    longer = ["train.steps=40", "eval.every=20"]
    sweep(tmp_path, "scale=maze/smoke", "method=maxrl", "run.base_only=true", "seed=0,1", *longer, *PARALLEL["joblib"])
    killed = sweep(tmp_path, *GRID, *PARALLEL["joblib"], *longer,
                   start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.time() + 120
    while time.time() < deadline and not list((tmp_path / "maze-smoke").glob("*_seed-*/checkpoint.pt")):
        time.sleep(0.2)
    os.killpg(killed.pid, signal.SIGKILL)  # the sweep and its workers, mid-run
    killed.wait()
    assert len(list((tmp_path / "maze-smoke").glob("*/DONE"))) < 6  # killed before every run had finished
    uninterrupted = tmp_path / "uninterrupted"
    sweep(uninterrupted, *GRID, *longer)
    sweep(tmp_path, *GRID, *PARALLEL["joblib"], *longer)
    assert records(tmp_path) == records(uninterrupted)


def test_a_failed_run_is_named_and_the_others_finish(tmp_path):
    # n0=1 is refused by validate (no MaxRL signal with one rollout); n0=8 runs
    done = sweep(tmp_path, "scale=maze/smoke", "method=maxrl", "seed=0", "n0=8,1", "train.steps=2", "eval.every=2",
                 *PARALLEL["joblib"], check=False)  # fmt: skip
    assert done.returncode != 0
    assert "run failed:" in done.stderr and "n0=1" in done.stderr.split("run failed:")[1].splitlines()[0]
    assert [p.parent.name for p in (tmp_path / "maze-smoke").glob(f"maxrl-*/{DONE_FILE}")] == [
        "maxrl-token-mean_n0-8_train.steps=2_seed-0"
    ]
