"""The grids `make` runs: the training commands each reproduce target prints under `make -n`, for the settings README
documents. Nothing is trained; the commands are read from make's dry run."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def dry_run(target: str, *variables: str) -> list[str]:
    """The recipe lines `make -n target` prints (the environment's stamp taken as made)."""
    command = ["make", "--no-print-directory", "-n", "-C", str(ROOT), "-o", ".venv/.installed-stamp", target]
    done = subprocess.run(
        [*command, f"PY={sys.executable}", *variables],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def trained(lines: list[str], study: str) -> list[tuple[str, str]]:
    """(method=..., seed=...) of every line that starts the study's training entry point."""
    runs = []
    for line in lines:
        if f"experiments.{study}.train" in line:
            method = re.search(r"\bmethod=(\S+)", line)
            seed = re.search(r"\bseed=(\S+)", line)
            runs.append((method.group(1) if method else "", seed.group(1) if seed else ""))
    return runs


def stray(lines: list[str]) -> list[str]:
    """Lines that are neither a known command nor a comment: what a broken $(if ...) leaves behind."""
    known = ("SERA_NUMERICS=", sys.executable, "@", "#", "test ", "echo")
    return [line for line in lines if line.strip() and not line.lstrip().startswith(known)]


@pytest.mark.parametrize(
    ("baselines", "expected"),
    [
        ("1", [("grpo,pkpo", "5,6"), ("dars_hw", "5,6"), ("maxrl,sera_pilot", "5,6")]),
        ("", [("maxrl,sera_pilot", "5,6")]),
    ],
)
def test_reproduce_math_runs_the_baselines_it_names_and_nothing_else(baselines, expected):
    lines = dry_run("reproduce-math", "MATH_SEEDS=5,6", f"BASELINES={baselines}")
    assert trained(lines, "math") == expected
    assert stray(lines) == []


@pytest.mark.parametrize(
    ("baselines", "expected"),
    [("1", [("grpo", "3,4"), ("maxrl,sera_pilot", "3,4")]), ("", [("maxrl,sera_pilot", "3,4")])],
)
def test_reproduce_maze_runs_the_baselines_it_names_and_nothing_else(baselines, expected):
    lines = dry_run("reproduce-maze", "MAZE_SEEDS=3,4", f"BASELINES={baselines}")
    assert trained(lines, "maze") == expected
    assert stray(lines) == []


@pytest.mark.parametrize("study", ["maze", "math"])
def test_sera_names_the_rule_a_grid_runs_beside_maxrl(study):
    """SERA=sera: the authors' rule's grids (claims C5, C6); the maze's at its fixed pool (cpu_pool)."""
    scale = "cpu_pool" if study == "maze" else "cpu"
    seeds = f"{study.upper()}_SEEDS=8-9"
    lines = dry_run(f"reproduce-{study}", f"SCALE={scale}", seeds, "BASELINES=", "AGGREGATIONS=token-mean",
                    "SERA=sera")  # fmt: skip
    assert trained(lines, study) == [("maxrl,sera", "8,9")]
    assert any(f"scale={study}/{scale}" in line for line in lines if f"experiments.{study}.train" in line)


def test_reproduce_sara_runs_every_arm_on_the_studies_named():
    lines = dry_run("reproduce-sara", "SARA_STUDIES=imagenet,math", "SARA_SEEDS=0,1")
    arms = "grpo,maxrl,ds,dps,sara,sara+dps,sara+sera,sara+maxrl"
    assert trained(lines, "imagenet") == [(arms, "0,1"), ("dps", "0,1"), ("sara", "0,1")]
    assert trained(lines, "math") == [(arms, "0,1")]
    assert trained(lines, "maze") == []
    assert stray(lines) == []


def test_reproduce_retrained_runs_every_paired_row_in_the_retrained_folder_only():
    # amendment 1 of the pre-registration: R1's and R2's seeds 1-2, with the base model and every run they pair
    lines = dry_run("reproduce-retrained", "RETRAINED_SEEDS=1,2")
    assert trained(lines, "maze") == [("grpo", "1,2")]
    assert trained(lines, "math") == [("grpo,pkpo,maxrl", "1,2"), ("dars_hw", "1,2")]
    training = [line for line in lines if ".train --multirun" in line]
    assert all("run.root=runs/retrained " in line and "method.aggregation=token-mean" in line for line in training)
    assert "alloc.n_max=32" in training[-1]
    assert any(line.endswith("paper_figures.archive save --folder retrained") for line in lines)
    assert stray(lines) == []


@pytest.mark.parametrize(
    ("seeds", "expected"), [("0-3", "0,1,2,3"), ("0-2,5,7-8", "0,1,2,5,7,8"), ("4", "4"), ("1,2", "1,2")]
)
def test_a_seed_range_is_swept_as_every_seed_in_it(seeds, expected):
    # README and make help quote grids as MAZE_SEEDS=0-11; Hydra sweeps only an explicit list
    assert trained(dry_run("reproduce-maze", f"MAZE_SEEDS={seeds}", "BASELINES="), "maze") == [
        ("maxrl,sera_pilot", expected)
    ]
    grid = [
        line for line in dry_run("reproduce-imagenet", "SCALE=cpu", f"SEEDS={seeds}") if "scale=imagenet/cpu " in line
    ]
    assert [seed for _, seed in trained(grid, "imagenet")] == [expected, expected]
    grid = trained(dry_run("reproduce-imagenet", f"CLASSIFY_SEEDS={seeds}"), "imagenet")
    assert [seed for _, seed in grid][:2] == [expected, expected]


GRID_TARGETS = [
    ("reproduce-imagenet", "imagenet", ()),
    ("reproduce-maze", "maze", ()),
    ("reproduce-math", "math", ()),
    ("reproduce-retrained", "maze", ()),
    ("reproduce-sara", "maze", ()),
    ("ablate", "maze", ("STUDY=maze", "SETTING=method.pilot_m", "VALUES=4,8")),
]


@pytest.mark.parametrize(("target", "study", "extra"), GRID_TARGETS, ids=lambda x: x if isinstance(x, str) else "")
def test_jobs_runs_every_sweep_through_the_joblib_launcher(target, study, extra):
    serial = [line for line in dry_run(target, "JOBS=1", *extra) if f"experiments.{study}.train" in line]
    parallel = [line for line in dry_run(target, "JOBS=3", *extra) if f"experiments.{study}.train" in line]
    assert serial and not any("hydra/launcher" in line or "base_only" in line for line in serial)
    assert all("hydra/launcher=joblib hydra.launcher.n_jobs=3" in line for line in parallel)
    if study == "imagenet":  # no shared base model: the same sweeps, launched in parallel
        assert len(parallel) == len(serial)
    else:  # the seeds' base models come first, in a sweep of their own, then the same RL sweeps
        bases = [line for line in parallel if "run.base_only=true" in line]
        assert bases and parallel.index(bases[0]) == 0
        assert trained([line for line in parallel if "base_only" not in line], study) == trained(serial, study)


def test_launcher_slurm_submits_each_sweep_with_the_editable_config():
    lines = [
        line for line in dry_run("reproduce-math", "LAUNCHER=slurm", "MATH_SEEDS=0-1") if "experiments.math" in line
    ]
    assert lines and all("hydra/launcher=slurm" in line and "joblib" not in line for line in lines)
    assert "run.base_only=true" in lines[0]
    assert (ROOT / "configs" / "hydra" / "launcher" / "slurm.yaml").exists()


def test_reproduce_imagenet_runs_the_registered_classification_grid_two_at_a_time():
    lines = dry_run("reproduce-imagenet")
    runs = trained(lines, "imagenet")
    assert runs == [("direct_ce", "0,1,2,3,4,5,6,7"), ("maxrl,sera", "0,1,2,3,4,5,6,7"), ("sera_pilot", "0,1,2"),
                    ("sera", "0,1,2")]  # fmt: skip
    grid = [line for line in lines if "experiments.imagenet.train" in line]
    assert all("scale=imagenet/gauss1000" in line and "hydra.launcher.n_jobs=2" in line for line in grid)
    assert "alloc.threshold=0.0" in grid[-1] and not stray(lines)
    digits = trained(dry_run("reproduce-imagenet", "SCALE=cpu"), "imagenet")
    assert digits == [("direct_ce", "0,1,2"), ("maxrl,sera_pilot", "0,1,2"), ("maxrl,sera_pilot", "0")]


def test_the_imagenet_paper_grid_takes_its_data_root_and_runs_one_run_a_gpu():
    """SCALE=paper: DATA_ROOT reaches every run as data.root, and the grid's runs go to sera.gpu_pool, one run a GPU
    on GPUS_IMAGENET GPUs (8 by default) at once, each the single-process run (JOBS= does not apply)."""
    (pool,) = [line for line in dry_run("reproduce-imagenet", "SCALE=paper", "DATA_ROOT=/data/imagenet", "SEEDS=69")
               if "sera.gpu_pool" in line]  # fmt: skip
    assert pool.startswith(f"{sys.executable} -m sera.gpu_pool --gpus 8 ")
    runs = re.findall(r'"([^"]*experiments\.imagenet\.train[^"]*)"', pool)
    assert len(runs) == 5 and all("data.root=/data/imagenet" in r and "scale=imagenet/paper" in r for r in runs)
    assert all("--multirun" not in r and "torchrun" not in r and "joblib" not in r for r in runs)
    chosen = [(re.search(r"method=(\S+)", r)[1], re.search(r"n0=(\S+)", r)[1] if "n0=" in r else "") for r in runs]
    assert chosen == [("direct_ce", ""), ("maxrl", "16"), ("maxrl", "128"), ("sera", "16"), ("sera", "128")]
    lines = [line for line in dry_run("reproduce-imagenet", "SCALE=paper", "DATA_ROOT=/d", "SEEDS=1-2", "JOBS=2",
                                      "GPUS_IMAGENET=4") if "sera.gpu_pool" in line]  # fmt: skip
    assert len(lines) == 1 and "--gpus 4 " in lines[0] and "joblib" not in lines[0]
    assert lines[0].count('seed=1"') == lines[0].count('seed=2"') == 5
    # without SEEDS=, the paper scale runs the authors' one seed and the CPU scale seeds 0-2
    default = " ".join(dry_run("reproduce-imagenet", "SCALE=paper", "DATA_ROOT=/d"))
    assert default.count('seed=69"') == 5 and "seed=0" not in default
    assert trained(dry_run("ablate-pilot", "SCALE=paper"), "imagenet")[0][1] == "69"
    maze = trained(dry_run("ablate", "STUDY=maze", "SCALE=paper", "SETTING=optim.lr", "VALUES=1e-4"), "maze")
    assert maze and all(seed == "0,1,2" for _, seed in maze)  # 69 is the classifier's seed only
    assert ("maxrl,sera_pilot", "0,1,2") in trained(dry_run("reproduce-imagenet", "SCALE=cpu"), "imagenet")


def test_where_the_data_lives_is_no_part_of_a_runs_identity():
    from sera import identity

    config = {"seed": 0, "data": {"name": "imagenet", "root": "/data/a"}, "method": {"name": "maxrl"}}
    assert identity.differences(config, {**config, "data": {"name": "imagenet", "root": "/mnt/b"}}) == []


def test_the_math_paper_scale_runs_through_trl_into_run_folders_the_tables_read():
    """SCALE=paper: each seed's base model evaluated by the loop (one process), then one accelerate launch a method and
    seed of examples.trl_math on the recipe's config, written as the suite's run folder (--run-dir auto), in the GPU
    environment; then the archive and the tables. No GRPO/PKPO/DARS-HW (no TRL path), and it says so."""
    lines = dry_run("reproduce-math", "SCALE=paper", "MODEL=qwen2.5-math-1.5b", "MATH_SEEDS=0,1")
    assert trained(lines, "math") == [("maxrl", "0,1")]
    (base,) = [line for line in lines if "experiments.math.train" in line]
    assert ".venv-gpu/bin/python -m experiments.math.train" in base
    (launch,) = [line for line in lines if "accelerate launch" in line]
    assert launch.strip().startswith(".venv-gpu/bin/accelerate launch --num_processes 8")
    assert "-m examples.trl_math --from-config scale=math/paper_qwen25math method=$m seed=$s" in launch
    assert "--micro-rows 4 --run-dir auto" in launch and "--cpu" not in launch
    assert any("for m in maxrl sera; do for s in $(echo 0,1" in line for line in lines)
    assert any("have no TRL path and are not run" in line for line in lines)
    assert lines[-2:] == [f"{sys.executable} -m paper_figures.archive save --folder math-paper",
                          f"{sys.executable} -m paper_figures.math --scale paper"]  # fmt: skip


def test_the_maze_paper_scale_runs_through_trl_into_run_folders_the_tables_read():
    """SCALE=paper: each seed's base model trained and evaluated by the loop (one process), then one accelerate launch a
    method and seed of examples.trl_maze on the paper config (its fixed pool), in the GPU environment; then the archive
    and the maze table. The authors' rule by default; no GRPO (no TRL path), and it says so."""
    lines = dry_run("reproduce-maze", "SCALE=paper", "MAZE_SEEDS=2")
    assert trained(lines, "maze") == [("maxrl", "2")]
    (base,) = [line for line in lines if "experiments.maze.train" in line]
    assert ".venv-gpu/bin/python -m experiments.maze.train" in base and "run.base_only=true" in base
    (launch,) = [line for line in lines if "accelerate launch" in line]
    assert launch.strip().startswith(".venv-gpu/bin/accelerate launch --num_processes 8")
    assert "-m examples.trl_maze scale=maze/paper  method=$m seed=$s --micro-rows 512" in launch
    assert "--cpu" not in launch
    assert any("for m in maxrl sera; do for s in $(echo 2" in line for line in lines)
    assert any("GRPO has no TRL path and is not run" in line for line in lines)
    assert lines[-2:] == [f"{sys.executable} -m paper_figures.archive save --folder maze-paper",
                          f"{sys.executable} -m paper_figures.maze --scale paper"]  # fmt: skip


def test_qwen3_at_paper_scale_launches_with_the_shipped_zero3_config_which_accelerate_reads():
    """MODEL=qwen3-4b-base at SCALE=paper: the launch takes configs/accelerate/zero3.yaml (ACCELERATE_CONFIG= wins);
    the other models and the maze take configs/accelerate/ddp.yaml; the shipped accelerate configs load with
    accelerate's own reader as DeepSpeed ZeRO-3, FSDP2 and data parallelism."""
    from accelerate.commands.config.config_args import load_config_from_file

    (launch,) = [line for line in dry_run("reproduce-math", "SCALE=paper", "MODEL=qwen3-4b-base") if "launch" in line]
    assert "--num_processes 8 --config_file configs/accelerate/zero3.yaml" in launch
    fsdp = dry_run(
        "reproduce-math", "SCALE=paper", "MODEL=qwen3-4b-base", "ACCELERATE_CONFIG=configs/accelerate/fsdp2.yaml"
    )
    (launch,) = [line for line in fsdp if "launch" in line]
    assert "--config_file configs/accelerate/fsdp2.yaml" in launch
    (launch,) = [line for line in dry_run("reproduce-math", "SCALE=paper") if "launch" in line]  # SmolLM2: DDP
    assert "--config_file configs/accelerate/ddp.yaml" in launch  # given, so a user's accelerate default is not read
    (launch,) = [line for line in dry_run("reproduce-maze", "SCALE=paper") if "launch" in line]
    assert "--config_file configs/accelerate/ddp.yaml" in launch
    (launch,) = [line for line in dry_run("reproduce-maze-trl", "SCALE=smoke", "GPUS_TRL=1") if "launch" in line]
    assert "--config_file" not in launch and "--cpu" in launch
    zero3 = load_config_from_file(str(ROOT / "configs/accelerate/zero3.yaml"))
    assert zero3.distributed_type == "DEEPSPEED" and zero3.deepspeed_config["zero_stage"] == 3
    fsdp2 = load_config_from_file(str(ROOT / "configs/accelerate/fsdp2.yaml"))
    assert fsdp2.distributed_type == "FSDP" and fsdp2.fsdp_config["fsdp_version"] == 2
    ddp = load_config_from_file(str(ROOT / "configs/accelerate/ddp.yaml"))
    assert ddp.distributed_type == "MULTI_GPU" and ddp.mixed_precision == "no"


@pytest.mark.parametrize("study, rows", [("maze", "512"), ("math", "4")])
def test_the_trl_plan_takes_the_studys_own_micro_batch(study, rows):
    """make plan TRL=1 plans the micro-batch the study's TRL launch uses (MAZE_TRL_MICRO_ROWS, MATH_TRL_MICRO_ROWS)."""
    line = " ".join(dry_run("plan", f"STUDY={study}", "SCALE=paper", "TRL=1"))  # the recipe spans two lines
    assert f"-m sera.plan {study} " in line and f"--trl --micro-rows {rows} " in f"{line} "


@pytest.mark.parametrize(
    "target, variables, study",
    [("reproduce-imagenet", (), "imagenet"), ("reproduce-imagenet", ("SCALE=cpu",), "imagenet"),
     ("reproduce-imagenet", ("SCALE=paper",), "imagenet"),
     ("reproduce-maze", ("BASELINES=",), "maze"), ("reproduce-math", ("BASELINES=",), "math"),
     ("reproduce-sara", ("SARA_STUDIES=imagenet,math",), "math"), ("reproduce-retrained", (), "maze"),
     ("ablate", ("STUDY=imagenet", "SETTING=n0", "VALUES=16,32", "SCALE=smoke"), "imagenet")],
)  # fmt: skip
def test_every_reproduce_target_trains_again_the_runs_restored_from_the_archive(target, variables, study):
    """A reproduction reruns what `make tables` restored (run.rerun_archived=true on every training sweep); the sink's
    grid continues its archive instead (a seed finished in an earlier session is not trained again)."""
    sweeps = [line for line in dry_run(target, *variables) if f"experiments.{study}.train" in line]
    assert sweeps and all("run.rerun_archived=true" in line for line in sweeps)
    sink = [line for line in dry_run("sink", "INTERVENTION=floor") if "experiments.maze.train" in line]
    assert sink and not any("rerun_archived" in line for line in sink)
