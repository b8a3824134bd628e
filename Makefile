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
.PHONY: help install test test-faults lint format bench reproduce-imagenet ablate-pilot reproduce-maze reproduce-math tables figures clean

help: ## list the targets
	@grep -E '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-20s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -c constraints.txt -e ".[dev]"
	touch $(STAMP)

install: $(STAMP) ## create .venv and install the pinned environment (constraints.txt)

test: install ## run the test suite (CPU, offline, a few minutes)
	$(PY) -m pytest -q tests

test-faults: install ## fault injection: SIGKILL a real run at random moments FAULT_KILLS times, resume, compare
	FAULT_KILLS=$${FAULT_KILLS:-40} $(PY) -m pytest -q tests/test_run_dirs.py -k random_kills

lint: install ## ruff lint and format check
	$(VENV)/bin/ruff check sera experiments paper_figures tests bench
	$(VENV)/bin/ruff format --check sera experiments paper_figures tests bench

format: install ## ruff autoformat
	$(VENV)/bin/ruff format sera experiments paper_figures tests bench
	$(VENV)/bin/ruff check --fix sera experiments paper_figures tests bench

bench: install ## speed figures (printed ratios; not tests)
	$(PY) -m bench.bench_core
	$(PY) -m bench.bench_tables
	$(PY) -m bench.bench_imagenet
	$(PY) -m bench.bench_maze $(if $(wildcard runs/maze-cpu/base_seed-0/DONE),--model runs/maze-cpu/base_seed-0)

SEEDS ?= 0,1,2
IMAGENET := $(PY) -m experiments.imagenet.train --multirun run.if_finished=skip

reproduce-imagenet: install ## Table 2 grid (classification as a policy), SCALE=cpu|paper; SEEDS=0,1,2
	$(IMAGENET) scale=imagenet/$(SCALE) method=direct_ce seed=$(SEEDS)
	$(IMAGENET) scale=imagenet/$(SCALE) method=maxrl,sera n0=16,128 seed=$(SEEDS)
ifeq ($(SCALE),cpu)
	$(IMAGENET) scale=imagenet/cpu_scratch method=maxrl,sera n0=16,128 seed=0
endif
	$(PY) -m paper_figures.imagenet table2 --scale $(SCALE)

ablate-pilot: install ## Table 3 pilot-size ablation (m = 0, 2, 4, 8, 16 at n0 = 16), SCALE=cpu|paper
	$(IMAGENET) scale=imagenet/$(SCALE) method=sera n0=16 method.estimator=pilot method.pilot_m=2,4,8,16 seed=$(SEEDS)
	$(IMAGENET) scale=imagenet/$(SCALE) method=sera n0=16 method.estimator=history method.pilot_m=0 seed=$(SEEDS)
	$(PY) -m paper_figures.imagenet table3 --scale $(SCALE)

MAZE := $(PY) -m experiments.maze.train --multirun run.if_finished=skip
MAZE_SEEDS ?= 0

reproduce-maze: install ## Table 4 (maze navigation): base SFT, GRPO, MaxRL and SERA x token-mean/seqnorm, SCALE=cpu|paper
	$(MAZE) scale=maze/$(SCALE) method=grpo method.aggregation=token-mean seed=$(MAZE_SEEDS)
	$(MAZE) scale=maze/$(SCALE) method=maxrl,sera method.aggregation=token-mean,seqnorm seed=$(MAZE_SEEDS)
	$(PY) -m paper_figures.maze --scale $(SCALE)

reproduce-math: ## Tables 1, 5-9 (math reasoning; GPUs and model weights) - not implemented yet
	@echo "reproduce-math: the math study is not implemented yet (see README, Math reasoning)"; exit 1

tables: install ## rebuild the paper tables (runs/ -> paper_figures/out/, tables copied to results/SCALE/), SCALE=cpu|paper
	$(PY) -m paper_figures.report --scale $(SCALE) --results results/$(SCALE)

figures: tables ## rebuild the figures (written by the table commands: training curves, Pass@K curves)

clean: ## remove caches (keeps .venv and runs/)
	rm -rf .pytest_cache .ruff_cache .hypothesis
