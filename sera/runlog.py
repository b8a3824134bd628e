"""Run directories: resolved config, JSONL metrics, checkpoints, a DONE marker, and an optional wandb mirror.

A run directory holds `config.yaml` (the resolved config), `metrics.jsonl` (one JSON object a line, keys namespaced
train/ eval/ alloc/ time/), `checkpoint.pt`, and `DONE`, written last. Opening a directory that holds a finished run
is refused; opening one that holds an unfinished run with the same config resumes it; a different config is
refused. JSONL is the truth; wandb (offline unless configured otherwise) only mirrors it.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import re
import shutil
from pathlib import Path
from typing import Any

import yaml

from sera.identity import describe, differences

# The file names of a run directory: the one place both sides of the contract (the loops that write, paper_figures
# that reads) take them from.
CONFIG_FILE = "config.yaml"  # the resolved config
BASE_FILE = "base.json"  # LM studies: which base model an RL run started from (its folder and evaluation's hash)
METRICS_FILE = "metrics.jsonl"  # one JSON object a line: {"step": ..., "train/...": ...}
CHECKPOINT_FILE = "checkpoint.pt"
DONE_FILE = "DONE"  # written last; holds the final summary
SET_ASIDE = (".archived", ".mismatch")  # a base run's folder moved aside while it is trained again (sera.lm_study)
ARCHIVED_FILE = "ARCHIVED"  # a finished run restored from results/runs (paper_figures.archive): records only
LOCK_FILE = "LOCK"  # held (flock) by the process running the run; holds its pid
VAL_P_FILE = "val_p.npy"  # classifier: exact p of every validation image at the end, in validation-set order
TRAIN_POOL_SET = "train_pool"  # LM studies: evaluation set name of a task's finite training set (train.log_coverage)
EVAL_RECORD = re.compile(r"eval_step(\d+)_(.+)\.json")  # LM studies: one per-question record per evaluation set
ALLOC_SNAPSHOT = re.compile(r"alloc_step(\d+)\.npz")  # classifier: one batch's p_exact, p_hat, counts


def eval_record_file(step: int, eval_set: str) -> str:
    """Per-question record of one evaluation set at one step: {"ids": [...], "n": samples, "correct": [...]}."""
    return f"eval_step{step}_{eval_set}.json"


def alloc_snapshot_file(step: int) -> str:
    return f"alloc_step{step}.npz"


class RunExistsError(RuntimeError):
    """The run directory holds a finished run, or an unfinished run with another config."""


class RunLockedError(RuntimeError):
    """Another live process is running this run directory."""


class CorruptRunError(RuntimeError):
    """A file of the run directory cannot be read back; the message says which and what to do."""


def read_config(path: Path) -> dict:
    """The config.yaml of run directory `path`; RunExistsError when it is empty or corrupt."""
    previous = yaml.safe_load((path / CONFIG_FILE).read_text())
    if not isinstance(previous, dict):
        raise RunExistsError(f"{path / CONFIG_FILE} is empty or corrupt; delete {path} to start over.")
    return previous


def config_changes(previous: dict, config: dict) -> list[str]:
    """The dotted keys in which two run configs differ in what changes a result (sera.identity), sorted."""
    return [key for key, _, _ in differences(previous, config)]


def check_same_config(path: Path, config: dict) -> None:
    """Raise RunExistsError when `path` already holds a run with a config that differs in a result-changing key,
    or holds run state (metrics, checkpoint) without the config that produced it."""
    path = Path(path)
    config_file = path / CONFIG_FILE
    if not config_file.exists():
        orphans = [name for name in (METRICS_FILE, CHECKPOINT_FILE, DONE_FILE) if (path / name).exists()]
        if orphans:
            raise RunExistsError(
                f"{path} holds {', '.join(orphans)} but no {CONFIG_FILE}, so the config that produced them is unknown "
                f"and resuming could mix two configs; delete the directory to start over (or restore {CONFIG_FILE})."
            )
        return
    changed = differences(read_config(path), config)
    started = any((path / name).exists() for name in (METRICS_FILE, CHECKPOINT_FILE, DONE_FILE))
    if changed and started:  # a config.yaml alone (a run that failed at start-up) holds no work: it may be replaced
        state = "a finished" if (path / DONE_FILE).exists() else "an unfinished"
        raise RunExistsError(
            f"{path} holds {state} run with a different config: {describe(changed)}. A setting that differs from the "
            "default names its run's folder, so this happens when a default changed or run.name was reused: rerun "
            "with the original setting, give this run its own folder with run.name=..., or delete the folder to "
            "start over."
        )


def drop_restored(path: str | os.PathLike) -> bool:
    """Remove a run restored from the archive (a finished run marked ARCHIVED: records only), so that it is trained
    again here: what a reproduce target does (run.rerun_archived), since a copy of the archive reproduces nothing.
    The archive keeps its records, and `paper_figures.archive save` compares the new run with them. True when one
    was removed."""
    path = Path(path)
    if not ((path / ARCHIVED_FILE).exists() and (path / DONE_FILE).exists()):
        return False
    shutil.rmtree(path)
    print(f"{path}: restored from the archive (records only); trained again here (run.rerun_archived)")
    return True


def finished_summary(path: str | os.PathLike, config: dict) -> dict | None:
    """The DONE summary when `path` holds a finished run of this config; None when unfinished or absent."""
    check_same_config(Path(path), config)
    done = Path(path) / DONE_FILE
    return json.loads(done.read_text() or "{}") if done.exists() else None


def extend_run(path: str | os.PathLike, config: dict) -> bool:
    """run.if_finished=extend: let the run in `path`, made with fewer train.steps and otherwise the same config,
    continue from its last checkpoint to config's train.steps (DONE is removed, then config.yaml rewritten). Returns
    True when it was prepared; False when there is nothing to extend (no run, or the same step count).

    The LM loop reads train.steps only as where to stop (constant rate after warmup, an evaluation every eval.every
    steps, the generator in the checkpoint), so with resume exact the extended run is the run a fresh config of the
    new length makes; an old length off the evaluation schedule is refused, since its final evaluation drew from the
    generator where a longer run does not. Records-only (archived) runs have no checkpoint and are refused."""
    path = Path(path)
    if not (path / CONFIG_FILE).exists():
        return False
    previous = read_config(path)
    old, new = (c.get("train", {}).get("steps") for c in (previous, config))
    if old == new:
        return False
    extended = {**previous, "train": {**previous["train"], "steps": new}}  # what config.yaml becomes
    changed = config_changes(extended, config)
    if changed:
        raise RunExistsError(
            f"{path}: run.if_finished=extend changes train.steps only; the config also differs in {changed}"
        )
    if new < old:
        raise RunExistsError(f"{path} holds a run of {old} steps; extend cannot shorten it to {new}")
    every = config.get("eval", {}).get("every")
    if not every or old % every:
        raise RunExistsError(
            f"{path}: its {old} steps end off the evaluation schedule (eval.every={every}), so its final evaluation "
            "drew from the training generator where a longer run does not; extending it would not equal a fresh run"
        )
    if (path / ARCHIVED_FILE).exists() or not (path / CHECKPOINT_FILE).exists():
        raise RunExistsError(f"{path} has no {CHECKPOINT_FILE} (records only) to continue from; rerun it from scratch")
    with _lock(path):  # DONE first: a kill in between leaves an unfinished run of the old length, which extends again
        (path / DONE_FILE).unlink(missing_ok=True)
        _atomic_write(path / CONFIG_FILE, yaml.safe_dump(extended, sort_keys=False))
    return True


def _jsonable(value: Any) -> Any:
    if hasattr(value, "item"):  # numpy / torch scalars
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else str(value)
    return value


def _atomic_write(path: Path, text: str) -> None:
    """Write through a temporary file and a rename, so a kill leaves either the old file or the new one."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _lock(path: Path):
    """Take the run directory's exclusive lock (flock, released by the kernel when the process dies, so a lock left
    by a dead process is simply taken over) and write our pid into it. Returns the open lock file."""
    handle = open(path / LOCK_FILE, "a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        owner = handle.read().strip() or "unknown"
        handle.close()
        raise RunLockedError(
            f"{path} is being run by another process (pid {owner}); wait for it to finish or stop it first."
        ) from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    return handle


class RunDir:
    """One run's directory. `RunDir(path, config)` creates it, or reopens an unfinished run for resume.

    The process holds the directory's lock from opening to `finish` / `close` (use it as a context manager): a
    second process on the same directory gets RunLockedError instead of interleaving its records.
    """

    def __init__(self, path: str | os.PathLike, config: dict, wandb_cfg: dict | None = None):
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self._lock = _lock(self.path)
        try:
            if finished_summary(self.path, config) is not None:
                raise RunExistsError(
                    f"{self.path} holds a finished run (DONE exists); refusing to overwrite it. "
                    "Delete the directory or choose another run name or seed."
                )
            self.resumed = (self.path / CONFIG_FILE).exists()
            self._record_numerics()
        except Exception:
            self.close()
            raise
        _atomic_write(self.path / CONFIG_FILE, yaml.safe_dump(config, sort_keys=False))
        self.metrics_file = self.path / METRICS_FILE
        self.checkpoint_file = self.path / CHECKPOINT_FILE
        self._wandb = None
        if wandb_cfg and wandb_cfg.get("enabled"):
            import wandb

            self._wandb = wandb.init(
                project=wandb_cfg.get("project", "sera"),
                name=self.path.name,
                mode=wandb_cfg.get("mode", "offline"),
                dir=str(self.path),
                config=config,
                resume="allow",
                id=self.path.name,
            )

    def _record_numerics(self) -> None:
        """Write the numeric fingerprint (sera.numerics) of a new run; refuse to resume a run at another kernel level
        than it started with, which would splice two float paths into one record."""
        from sera.numerics import NUMERICS_FILE, fingerprint

        now = fingerprint()
        recorded_file = self.path / NUMERICS_FILE
        if recorded_file.exists():
            recorded = json.loads(recorded_file.read_text())
            keys = ("level", "torch_cpu_capability")
            if any(recorded.get(k) != now[k] for k in keys):
                raise RunExistsError(
                    f"{self.path} was started at numerics {[recorded.get(k) for k in keys]} and this process runs at "
                    f"{[now[k] for k in keys]}; resume it with SERA_NUMERICS={recorded.get('level')} (or delete it to "
                    "start over at this level)"
                )
            return
        _atomic_write(recorded_file, json.dumps(now, indent=1) + "\n")

    def __enter__(self) -> RunDir:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Release the lock (idempotent)."""
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def log(self, step: int, metrics: dict) -> None:
        """Append one JSONL record {"step": step, **metrics} and mirror it to wandb."""
        record = {"step": int(step), **{k: _jsonable(v) for k, v in metrics.items()}}
        with self.metrics_file.open("a") as f:
            f.write(json.dumps(record) + "\n")
        if self._wandb is not None:
            self._wandb.log({k: v for k, v in record.items() if isinstance(v, int | float)}, step=int(step))

    def rewind(self, step: int) -> None:
        """Drop JSONL records logged after `step` (work lost with an interruption, redone on resume).

        A kill can tear the file's last line; that line lies past the last checkpoint, so it is dropped with a
        message. A corrupt line anywhere else is an error naming the file and line. The file is rewritten
        atomically, so a kill during the rewind loses nothing.
        """
        if not self.metrics_file.exists():
            return
        lines = self.metrics_file.read_bytes().split(b"\n")
        while lines and not lines[-1].strip():
            lines.pop()
        keep = []
        for number, line in enumerate(lines, start=1):
            try:
                record = json.loads(line)
                if not isinstance(record, dict) or "step" not in record:
                    raise ValueError("not a JSON object with a 'step'")
            except ValueError as err:
                if number == len(lines):
                    print(f"{self.metrics_file}:{number}: torn last line dropped (an interrupted write)")
                    continue
                raise CorruptRunError(
                    f"{self.metrics_file}:{number}: corrupt record ({err}) before the last checkpoint; fix or delete "
                    f"that line, or delete {self.path} to start over"
                ) from None
            if record["step"] <= step:
                keep.append(line.decode() + "\n")
        _atomic_write(self.metrics_file, "".join(keep))

    def save_checkpoint(self, state: dict) -> None:
        """Write the checkpoint atomically (temp file, then rename), so a kill never leaves a torn one."""
        import torch

        tmp = self.checkpoint_file.with_suffix(".tmp")
        torch.save(state, tmp)
        os.replace(tmp, self.checkpoint_file)

    def load_checkpoint(self) -> dict | None:
        """The last checkpoint, or None when the run has none. CorruptRunError when it cannot be read."""
        if not self.checkpoint_file.exists():
            return None
        import torch

        try:
            return torch.load(self.checkpoint_file, map_location="cpu", weights_only=False)
        except Exception as err:
            raise CorruptRunError(
                f"{self.checkpoint_file} cannot be read ({type(err).__name__}: {err}). Delete it to restart this run "
                f"from its first step, or delete {self.path} to start over."
            ) from None

    def write_json(self, name: str, obj: Any) -> None:
        _atomic_write(self.path / name, json.dumps(obj, indent=1, default=_jsonable))

    def finish(self, summary: dict | None = None) -> None:
        """Mark the run finished: DONE is written last and holds the final summary; the lock is released."""
        if self._wandb is not None:
            self._wandb.finish()
        _atomic_write(self.path / DONE_FILE, json.dumps(summary or {}, default=_jsonable) + "\n")
        self.close()


class NonFiniteError(RuntimeError):
    """Training or evaluation produced non-finite numbers; the run stops without DONE."""


class SkipGuard:
    """Counts consecutive skipped (non-finite) steps and stops the run after `limit` of them."""

    def __init__(self, limit: int):
        self.limit, self.consecutive = limit, 0

    def record(self, skipped: bool, step: int) -> None:
        self.consecutive = self.consecutive + 1 if skipped else 0
        if self.consecutive >= self.limit:
            raise NonFiniteError(
                f"{self.consecutive} consecutive steps up to step {step} had a non-finite loss or gradient and were "
                "skipped (run.max_skipped_steps); the run stops without DONE. Check the learning rate and settings."
            )


def check_finite_eval(metrics: dict, step: int) -> None:
    """Raise NonFiniteError when an evaluation metric is NaN or infinite."""
    bad = {k: v for k, v in metrics.items() if isinstance(v, float) and not math.isfinite(v)}
    if bad:
        raise NonFiniteError(f"non-finite evaluation at step {step}: {bad}; the run stops without DONE")


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """All records of a metrics.jsonl file."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def base_identity(base: Path) -> dict:
    """What identifies a base model run for pairing: its folder's name and a SHA-256 over its per-question evaluation
    records (names and bytes, in name order), which an archived base keeps when its weights are gone."""
    import hashlib

    digest = hashlib.sha256()
    records = sorted(p for p in Path(base).iterdir() if EVAL_RECORD.fullmatch(p.name))
    if not records:
        raise FileNotFoundError(f"{base} holds no evaluation record to identify the base model by")
    for path in records:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return {"base": Path(base).name, "eval_sha256": digest.hexdigest()}


def record_base(run_path: Path, base: Path) -> None:
    """Write the base model's identity into an RL run's folder (BASE_FILE); a resumed run that finds another base
    there is refused, since its records so far were made from the other model."""
    identity = base_identity(base)
    path = Path(run_path) / BASE_FILE
    if path.exists():
        recorded = json.loads(path.read_text())
        if recorded != identity:
            raise ValueError(f"{run_path} started from base model {recorded} and would continue from {identity}: "
                             "remove the run to start it again from this base")  # fmt: skip
        return
    path.write_text(json.dumps(identity, indent=1) + "\n")
