"""Run directories: resolved config, JSONL metrics, checkpoints, a DONE marker, and an optional wandb mirror.

A run directory holds `config.yaml` (the resolved config), `metrics.jsonl` (one JSON object a line, keys namespaced
train/ eval/ alloc/ time/), `checkpoint.pt`, and `DONE`, written last. Opening a directory that holds a finished run
is refused; opening one that holds an unfinished run with the same config resumes it; a different config is
refused. JSONL is the truth; wandb (offline unless configured otherwise) only mirrors it.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import yaml

# Keys that may differ between an interrupted run and its resumption without changing its results.
RESUME_IGNORED_KEYS = ("threads", "wandb", "progress", "run")


class RunExistsError(RuntimeError):
    """The run directory holds a finished run, or an unfinished run with another config."""


def check_same_config(path: Path, config: dict) -> None:
    """Raise RunExistsError when `path` already holds a run with a config that differs in a result-changing key."""
    config_file = Path(path) / "config.yaml"
    if not config_file.exists():
        return
    previous = yaml.safe_load(config_file.read_text())
    changed = sorted(
        k for k in set(previous) | set(config) if k not in RESUME_IGNORED_KEYS and previous.get(k) != config.get(k)
    )
    if changed:
        state = "a finished" if (Path(path) / "DONE").exists() else "an unfinished"
        raise RunExistsError(
            f"{path} holds {state} run with a different config (differs in: {changed}); delete it to start over, "
            "or rerun with the original config."
        )


def finished_summary(path: str | os.PathLike, config: dict) -> dict | None:
    """The DONE summary when `path` holds a finished run of this config; None when unfinished or absent."""
    check_same_config(Path(path), config)
    done = Path(path) / "DONE"
    return json.loads(done.read_text() or "{}") if done.exists() else None


def _jsonable(value: Any) -> Any:
    if hasattr(value, "item"):  # numpy / torch scalars
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else str(value)
    return value


class RunDir:
    """One run's directory. `RunDir(path, config)` creates it, or reopens an unfinished run for resume."""

    def __init__(self, path: str | os.PathLike, config: dict, wandb_cfg: dict | None = None):
        self.path = Path(path)
        if finished_summary(self.path, config) is not None:
            raise RunExistsError(
                f"{self.path} holds a finished run (DONE exists); refusing to overwrite it. "
                "Delete the directory or choose another run name or seed."
            )
        self.resumed = (self.path / "config.yaml").exists()
        self.path.mkdir(parents=True, exist_ok=True)
        (self.path / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
        self.metrics_file = self.path / "metrics.jsonl"
        self.checkpoint_file = self.path / "checkpoint.pt"
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

    def log(self, step: int, metrics: dict) -> None:
        """Append one JSONL record {"step": step, **metrics} and mirror it to wandb."""
        record = {"step": int(step), **{k: _jsonable(v) for k, v in metrics.items()}}
        with self.metrics_file.open("a") as f:
            f.write(json.dumps(record) + "\n")
        if self._wandb is not None:
            self._wandb.log({k: v for k, v in record.items() if isinstance(v, int | float)}, step=int(step))

    def rewind(self, step: int) -> None:
        """Drop JSONL records logged after `step` (work lost with an interruption, redone on resume)."""
        if not self.metrics_file.exists():
            return
        lines = self.metrics_file.read_text().splitlines()
        keep = [line for line in lines if line.strip() and json.loads(line).get("step", -1) <= step]
        self.metrics_file.write_text("".join(line + "\n" for line in keep))

    def save_checkpoint(self, state: dict) -> None:
        """Write the checkpoint atomically (temp file, then rename), so a kill never leaves a torn one."""
        import torch

        tmp = self.checkpoint_file.with_suffix(".tmp")
        torch.save(state, tmp)
        os.replace(tmp, self.checkpoint_file)

    def load_checkpoint(self) -> dict | None:
        """The last checkpoint, or None when the run has none."""
        if not self.checkpoint_file.exists():
            return None
        import torch

        return torch.load(self.checkpoint_file, map_location="cpu", weights_only=False)

    def write_json(self, name: str, obj: Any) -> None:
        (self.path / name).write_text(json.dumps(obj, indent=1, default=_jsonable))

    def finish(self, summary: dict | None = None) -> None:
        """Mark the run finished: DONE is written last and holds the final summary."""
        if self._wandb is not None:
            self._wandb.finish()
        (self.path / "DONE").write_text(json.dumps(summary or {}, default=_jsonable) + "\n")


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """All records of a metrics.jsonl file."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
