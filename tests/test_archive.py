"""The run archive (paper_figures.archive): finished runs kept in git as records, restored into runs/ so that a grid
spread over sessions skips them and builds one table from every seed."""

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from paper_figures import archive, numerics
from paper_figures.runs import load_runs
from sera.lm_study import base_run
from sera.runlog import ARCHIVED_FILE, RunDir, finished_summary


def make_run(path, config, steps=3, done=True):
    """A run directory as the loops leave it: config, metrics, an evaluation record, a checkpoint and weights."""
    with RunDir(path, config) as run_dir:
        for step in range(steps):
            run_dir.log(step, {"train/reward": step / 10, **({"eval/heldout/pass@1": 0.25} if step == 2 else {})})
        run_dir.write_json("eval_step3_heldout.json", {"n": 4, "correct": [1, 0, 2]})
        (path / "checkpoint.pt").write_bytes(b"x" * 100)
        (path / "model.safetensors").write_bytes(b"w" * 100)
        if done:
            run_dir.finish({"step": steps, "eval/heldout/pass@1": 0.25})


CONFIG = {"experiment": "maze", "seed": 0, "method": {"name": "maxrl"}, "optim": {"lr": 3e-4}}


def test_save_keeps_records_only_and_never_writes_over_an_archived_run(tmp_path):
    runs, store = tmp_path / "runs", tmp_path / "archive"
    make_run(runs / "maxrl_seed-0", CONFIG)
    make_run(
        runs / "tiny-math" / "sera_seed-0", CONFIG | {"method": {"name": "sera_pilot"}}
    )  # nested, like math's runs
    make_run(runs / "sera_seed-1", CONFIG | {"seed": 1}, done=False)  # unfinished: not archived
    saved = archive.save(runs, store)
    assert [str(p) for p in saved] == ["maxrl_seed-0", "tiny-math/sera_seed-0"]
    files = sorted(p.name for p in (store / "maxrl_seed-0").iterdir())
    assert files == ["DONE", "config.yaml", "eval_step3_heldout.json", "metrics.jsonl.gz", "numerics.json"]
    original = (runs / "maxrl_seed-0" / "metrics.jsonl").read_bytes()
    assert gzip.decompress((store / "maxrl_seed-0" / "metrics.jsonl.gz").read_bytes()) == original
    assert archive.save(runs, store) == []  # already archived, same config: left alone
    (runs / "maxrl_seed-0" / "config.yaml").write_text(yaml.safe_dump(CONFIG | {"optim": {"lr": 1e-4}}))
    before = (store / "maxrl_seed-0" / "config.yaml").read_text()
    with pytest.raises(ValueError, match="not the run archived"):
        archive.save(runs, store)
    assert (store / "maxrl_seed-0" / "config.yaml").read_text() == before


def test_two_grids_saving_at_once_leave_one_whole_run_and_copies_under_way_are_not_runs(tmp_path, monkeypatch):
    runs, store = tmp_path / "runs", tmp_path / "archive"
    make_run(runs / "maxrl_seed-0", CONFIG)
    archive.save(runs, tmp_path / "other")  # what the other grid writes
    kept = archive.kept

    def other_grid_wins(name):  # the other grid renames its copy in while this one is copying
        if not (store / "maxrl_seed-0").exists():
            shutil.copytree(tmp_path / "other" / "maxrl_seed-0", store / "maxrl_seed-0")
        return kept(name)

    monkeypatch.setattr(archive, "kept", other_grid_wins)
    assert [str(p) for p in archive.save(runs, store)] == ["maxrl_seed-0"]
    assert sorted(p.name for p in store.iterdir()) == ["maxrl_seed-0"]  # no copy left under way
    under_way = store / f"sera_seed-0{archive.PARTIAL[0]}123"
    shutil.copytree(store / "maxrl_seed-0", under_way)
    assert [str(p) for p in archive.finished_runs(store)] == ["maxrl_seed-0"]
    assert [str(p) for p in archive.restore(store, runs / "restored")] == ["maxrl_seed-0"]


def test_restored_runs_are_skipped_and_read_like_the_originals(tmp_path):
    runs, store, fresh = tmp_path / "runs", tmp_path / "archive", tmp_path / "fresh"
    make_run(runs / "maxrl_seed-0", CONFIG)
    archive.save(runs, store)
    (fresh / "other").mkdir(parents=True)
    assert [str(p) for p in archive.restore(store, fresh)] == ["maxrl_seed-0"]
    restored = fresh / "maxrl_seed-0"
    assert (restored / ARCHIVED_FILE).exists() and not (restored / "checkpoint.pt").exists()
    assert finished_summary(restored, CONFIG) == {"step": 3, "eval/heldout/pass@1": 0.25}  # run.if_finished=skip
    (a,), (b,) = load_runs(runs), load_runs(fresh)
    assert a.records == b.records and a.config == b.config and a.finished and b.finished
    assert json.loads((restored / "eval_step3_heldout.json").read_text()) == {"n": 4, "correct": [1, 0, 2]}
    (restored / "DONE").write_text("{}")  # an existing run directory is never replaced
    assert archive.restore(store, fresh) == [] and (restored / "DONE").read_text() == "{}"


def test_a_restored_base_run_is_trained_again_where_weights_are_needed_and_must_reproduce(tmp_path):
    """A base restored with its records only is trained again when an RL run needs its weights; the retrained model
    stands only if its evaluation records equal the archived ones, else the archive's records go back and the
    retrained base is kept aside, with an error saying its RL runs would not pair."""
    runs, store, fresh = tmp_path / "runs", tmp_path / "archive", tmp_path / "fresh"
    config = {"experiment": "maze-base", "seed": 0}
    make_run(runs / "base_seed-0", config)
    archive.save(runs, store)
    archive.restore(store, fresh)
    archived_record = (fresh / "base_seed-0" / "eval_step3_heldout.json").read_bytes()

    def never(run_dir):
        raise AssertionError("a finished base run is not trained again")

    base_run(runs / "base_seed-0", config, never)  # the original has its weights
    base_run(fresh / "base_seed-0", config, never, weights=False)  # a pretrained model's evaluation needs none

    def trains(correct):
        def body(run_dir):
            run_dir.write_json("eval_step3_heldout.json", {"n": 4, "correct": correct})
            (run_dir.path / "model.safetensors").write_bytes(b"w")
            return 3, {"eval/heldout/pass@1": 0.25}, {}

        return body

    with pytest.raises(RuntimeError, match="differ from the archived ones"):
        base_run(fresh / "base_seed-0", config, trains([0, 0, 0]))  # another model
    assert (fresh / "base_seed-0" / ARCHIVED_FILE).exists()  # the archive's records are back
    assert (fresh / "base_seed-0" / "eval_step3_heldout.json").read_bytes() == archived_record
    assert (fresh / "base_seed-0.mismatch" / "model.safetensors").exists()
    assert [r.path.name for r in load_runs(fresh)] == ["base_seed-0"]  # the set-aside copy is not a run
    assert archive.finished_runs(fresh) == [Path("base_seed-0")]
    base_run(fresh / "base_seed-0", config, trains([1, 0, 2]))  # the same model: it stands, with its weights
    assert (fresh / "base_seed-0" / "model.safetensors").exists()
    assert not (fresh / "base_seed-0" / ARCHIVED_FILE).exists() and not (fresh / "base_seed-0.archived").exists()


def test_command_line_restores_every_archived_folder_and_skips_smoke(tmp_path, capsys):
    runs, store = tmp_path / "runs", tmp_path / "archive"
    make_run(runs / "maze-cpu" / "maxrl_seed-0", CONFIG)
    make_run(runs / "maze-smoke" / "maxrl_seed-0", CONFIG)
    args = ["--runs", str(runs), "--archive", str(store)]
    assert archive.main(["save", *args, "--folder", "maze-cpu"]) == 0
    assert archive.main(["save", *args, "--folder", "maze-smoke"]) == 0 and not (store / "maze-smoke").exists()
    fresh = tmp_path / "fresh"
    assert archive.main(["restore", "--runs", str(fresh), "--archive", str(store)]) == 0
    assert (fresh / "maze-cpu" / "maxrl_seed-0" / "DONE").exists()
    assert "1 run(s)" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        archive.main(["save", *args])


def test_restore_brings_the_folder_record_of_runs_that_recorded_no_fingerprint(tmp_path):
    runs, store = tmp_path / "runs", tmp_path / "archive"
    make_run(runs / "maxrl_seed-0", CONFIG)
    archive.save(runs, store)
    (store / "maxrl_seed-0" / "numerics.json").unlink()  # made before runs recorded one
    (store / "numerics.json").write_text(json.dumps({"level": "avx512", "recorded": False}))
    back = tmp_path / "back"
    archive.restore(store, back)
    assert json.loads((back / "numerics.json").read_text())["level"] == "avx512"
    assert numerics.run_fingerprints(back) == [{"level": "avx512", "recorded": False}]


def test_save_says_when_a_run_trained_again_gives_other_records_and_keeps_the_archived_ones(tmp_path, capsys):
    """A base run retrained on another CPU has the archived run's name and config but another model: save keeps the
    archive as it is and says so, since the tables read the local records until runs/ is cleared."""
    runs, store = tmp_path / "runs", tmp_path / "archive"
    config = {"experiment": "maze-base", "seed": 3}
    make_run(runs / "maze-cpu" / "base_seed-3", config)
    args = ["--runs", str(runs), "--archive", str(store), "--folder", "maze-cpu"]
    assert archive.main(["save", *args]) == 0
    assert "trained again" not in capsys.readouterr().out
    assert archive.retrained(runs / "maze-cpu", store / "maze-cpu") == []
    archived = (store / "maze-cpu" / "base_seed-3" / "eval_step3_heldout.json").read_bytes()
    shutil.rmtree(runs / "maze-cpu" / "base_seed-3")
    archive.restore(store / "maze-cpu", runs / "maze-cpu")
    assert archive.retrained(runs / "maze-cpu", store / "maze-cpu") == []  # restored: the archive's own records
    shutil.rmtree(runs / "maze-cpu" / "base_seed-3")
    make_run(runs / "maze-cpu" / "base_seed-3", config)
    (runs / "maze-cpu" / "base_seed-3" / "eval_step3_heldout.json").write_text(
        json.dumps({"n": 4, "correct": [2, 2, 2]})
    )
    assert archive.main(["save", *args]) == 0
    said = capsys.readouterr().out
    assert "1 run(s) under" in said and "were trained again and their evaluation records differ" in said
    assert "(first: base_seed-3)" in said
    assert (store / "maze-cpu" / "base_seed-3" / "eval_step3_heldout.json").read_bytes() == archived
    assert [str(p) for p in archive.retrained(runs / "maze-cpu", store / "maze-cpu")] == ["base_seed-3"]


@pytest.mark.slow
def test_a_reproduction_trains_again_a_run_restored_by_make_tables(tmp_path):
    """`make tables` restores the archive into runs/ (records only, ARCHIVED); a reproduce target's sweep
    (run.rerun_archived=true) then trains that run again instead of skipping it as finished, and the comparison
    counts it as made here. Without the setting the restored run is skipped, as a grid continuing an archive wants."""
    runs, store = tmp_path / "runs", tmp_path / "archive"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline"}

    def train(*extra):
        command = [sys.executable, "-m", "experiments.imagenet.train", "scale=imagenet/smoke", "method=maxrl",
                   f"run.root={runs}", "run.if_finished=skip", "threads=1", "progress=false", *extra]  # fmt: skip
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout

    train()
    (folder,) = [p.name for p in runs.iterdir() if p.is_dir()]
    archive.save(runs / folder, store / folder)
    shutil.rmtree(runs)
    archive.restore(store / folder, runs / folder)  # what make tables leaves behind
    (run,) = [p for p in (runs / folder).iterdir() if (p / "DONE").exists()]
    assert (run / ARCHIVED_FILE).exists()
    assert "is finished with this config; skipping" in train()  # a grid that continues the archive
    assert numerics.made_here(runs / folder) == ([], 1)
    said = train("run.rerun_archived=true")
    assert "trained again here (run.rerun_archived)" in said and "skipping" not in said
    assert not (run / ARCHIVED_FILE).exists() and (run / "DONE").exists()
    here, restored = numerics.made_here(runs / folder)
    assert len(here) == 1 and restored == 0
    assert archive.retrained(runs / folder, store / folder) == []  # one CPU, one seed: the same records
