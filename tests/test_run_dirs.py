"""Run directories that survive kills, races and bad input (sera.runlog and the entry points that use it).

The fault-injection test kills a real classifier smoke run with SIGKILL at random moments, reruns the same command
until it finishes, and compares every record with an uninterrupted run; `make test-faults` runs it with many more
kills (FAULT_KILLS).
"""

import json
import os
import random
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from sera.runlog import (
    CHECKPOINT_FILE,
    CONFIG_FILE,
    LOCK_FILE,
    METRICS_FILE,
    CorruptRunError,
    RunDir,
    RunExistsError,
    RunLockedError,
    read_jsonl,
)

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline", "PYTHONHASHSEED": "0"}
CFG = {"method": "sera_pilot", "n0": 16}


def write_records(path, steps):
    with RunDir(path, CFG) as run:
        for step in steps:
            run.log(step, {"train/reward": step / 10})


def test_torn_last_line_is_dropped_with_a_message(tmp_path, capsys):
    write_records(tmp_path / "r", range(4))
    with open(tmp_path / "r" / METRICS_FILE, "a") as f:
        f.write('{"step": 4, "train/rew')  # a kill in the middle of a write
    with RunDir(tmp_path / "r", CFG) as run:
        run.rewind(10)
    assert [r["step"] for r in read_jsonl(tmp_path / "r" / METRICS_FILE)] == [0, 1, 2, 3]
    assert "torn last line dropped" in capsys.readouterr().out


def test_corrupt_line_before_the_end_is_an_error_naming_file_and_line(tmp_path):
    write_records(tmp_path / "r", range(4))
    lines = (tmp_path / "r" / METRICS_FILE).read_text().splitlines()
    lines[1] = lines[1][:5] + "\xff garbage"
    (tmp_path / "r" / METRICS_FILE).write_text("\n".join(lines) + "\n")
    with RunDir(tmp_path / "r", CFG) as run, pytest.raises(CorruptRunError, match=rf"{METRICS_FILE}:2: corrupt"):
        run.rewind(10)


def test_rewind_is_atomic(tmp_path, monkeypatch):
    """A kill while the rewind rewrites the file (simulated: the rename never happens) leaves the old file intact."""
    write_records(tmp_path / "r", range(5))
    before = (tmp_path / "r" / METRICS_FILE).read_text()

    def killed(*args):
        raise KeyboardInterrupt("killed during the rewind")

    with RunDir(tmp_path / "r", CFG) as run:
        monkeypatch.setattr(os, "replace", killed)
        with pytest.raises(KeyboardInterrupt):
            run.rewind(2)
        monkeypatch.undo()
    assert (tmp_path / "r" / METRICS_FILE).read_text() == before


def test_state_without_config_is_refused(tmp_path):
    (tmp_path / "r").mkdir()
    torch.save({"step": 3}, tmp_path / "r" / CHECKPOINT_FILE)
    with pytest.raises(RunExistsError, match=f"no {CONFIG_FILE}"):
        RunDir(tmp_path / "r", CFG)


def test_a_config_stub_without_work_is_replaced(tmp_path):
    """A run that failed at start-up leaves only config.yaml: a corrected config may take the directory over."""
    RunDir(tmp_path / "r", CFG).close()
    with RunDir(tmp_path / "r", {**CFG, "n0": 32}) as run:
        assert run.resumed
        run.log(0, {})
    with pytest.raises(RunExistsError, match="different config"):  # once it has work, a different config is refused
        RunDir(tmp_path / "r", CFG)


def test_truncated_checkpoint_names_the_file_and_the_fix(tmp_path):
    with RunDir(tmp_path / "r", CFG) as run:
        run.save_checkpoint({"step": 2, "weights": torch.zeros(1000)})
        data = run.checkpoint_file.read_bytes()
        run.checkpoint_file.write_bytes(data[: len(data) // 2])
        with pytest.raises(CorruptRunError, match=rf"{CHECKPOINT_FILE} cannot be read.*Delete it"):
            run.load_checkpoint()


HOLD = """
import sys, time
from sera.runlog import RunDir
run = RunDir(sys.argv[1], {"method": "sera_pilot", "n0": 16})
print("locked", flush=True)
time.sleep(60)
"""


def test_lock_names_the_live_owner_and_is_taken_over_after_its_death(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path / "r")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(RunLockedError, match=f"pid {holder.pid}"):
            RunDir(tmp_path / "r", CFG)
    finally:
        holder.kill()  # SIGKILL: no clean-up; the kernel drops the flock
        holder.wait()
    assert (tmp_path / "r" / LOCK_FILE).exists()
    with RunDir(tmp_path / "r", CFG) as run:  # the dead process's lock is taken over
        assert (run.path / LOCK_FILE).read_text().strip() == str(os.getpid())


def classifier_cmd(root, *extra):
    return [
        sys.executable, "-m", "experiments.imagenet.train", "scale=imagenet/smoke", "method=sera_pilot", "threads=1",
        f"run.root={root}", *extra,
    ]  # fmt: skip


def test_two_concurrent_launches_exactly_one_runs(tmp_path):
    cmd = classifier_cmd(tmp_path, "train.steps=300", "eval.every=100")
    first = subprocess.Popen(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # the two overrides differ from the smoke scale's defaults, so they name the run's folder (sera.identity)
    metrics = tmp_path / "imagenet-smoke" / "sera-m8_n0-16_eval.every=100,train.steps=300_seed-0" / METRICS_FILE
    deadline = time.time() + 120
    while not metrics.exists() and time.time() < deadline and first.poll() is None:
        time.sleep(0.1)
    second = subprocess.run(cmd, env=ENV, capture_output=True, text=True)
    assert first.wait(timeout=300) == 0, first.stderr.read()[-4000:]
    assert second.returncode != 0 and f"pid {first.pid}" in second.stderr, second.stderr[-4000:]
    steps = [r["step"] for r in read_jsonl(metrics)]
    assert steps == list(range(300))  # no interleaved or duplicated records
    assert (metrics.parent / "DONE").exists()


def test_nonfinite_training_stops_without_done(tmp_path):
    out = subprocess.run(
        classifier_cmd(tmp_path, "optim.name=sgd", "optim.lr=1e30", "run.max_skipped_steps=2", "method=maxrl"),
        env=ENV,
        capture_output=True,
        text=True,
    )
    assert out.returncode != 0 and "non-finite" in out.stderr, out.stderr[-4000:]
    run = tmp_path / "imagenet-smoke" / "maxrl_n0-16_seed-0"
    assert not (run / "DONE").exists()


# the settings off the smoke scale's defaults name the folder (sera.identity); pilot_m is the stem's -m4
KILLED_RUN = "sera-m4_n0-16_eval.every=5,train.steps=40_seed-0"


def run_with_kills(root, kills: int, seed: int) -> int:
    """Run the smoke command, SIGKILLing it at random moments `kills` times, then once more to the end."""
    rng = random.Random(seed)
    cmd = classifier_cmd(root, "train.steps=40", "run.checkpoint_every=2", "eval.every=5", "method.pilot_m=4")
    done = root / "imagenet-smoke" / KILLED_RUN / "DONE"
    killed = 0
    while killed < kills and not done.exists():
        proc = subprocess.Popen(cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(2.5, 7.0))  # start-up is ~3 s: kills land in the loop and in its writes
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            killed += 1
        proc.wait()
    final = subprocess.run(cmd, env=ENV, capture_output=True, text=True)
    assert final.returncode == 0 or "finished run" in final.stderr, final.stderr[-2000:]
    return killed


def records_and_result(root):
    run = root / "imagenet-smoke" / KILLED_RUN
    records = [{k: v for k, v in r.items() if not k.startswith("time/")} for r in read_jsonl(run / METRICS_FILE)]
    done = {k: v for k, v in json.loads((run / "DONE").read_text()).items() if not k.startswith("time/")}
    return records, done, np.load(run / "val_p.npy")


@pytest.mark.slow
def test_random_kills_resume_to_the_uninterrupted_result(tmp_path):
    kills = int(os.environ.get("FAULT_KILLS", "4"))
    subprocess.run(
        classifier_cmd(
            tmp_path / "clean", "train.steps=40", "run.checkpoint_every=2", "eval.every=5", "method.pilot_m=4"
        ),
        env=ENV,
        check=True,
        capture_output=True,
    )
    assert run_with_kills(tmp_path / "killed", kills, seed=kills) >= 1  # at least one kill landed mid-run
    clean, killed = records_and_result(tmp_path / "clean"), records_and_result(tmp_path / "killed")
    assert killed[0] == clean[0] and killed[1] == clean[1]
    np.testing.assert_array_equal(killed[2], clean[2])
