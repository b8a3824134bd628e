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
.PHONY: help install test lint format bench reproduce-imagenet ablate-pilot reproduce-maze reproduce-math tables figures clean

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

lint: install ## ruff lint and format check
	$(VENV)/bin/ruff check sera experiments paper_figures tests bench
	$(VENV)/bin/ruff format --check sera experiments paper_figures tests bench

format: install ## ruff autoformat
	$(VENV)/bin/ruff format sera experiments paper_figures tests bench
	$(VENV)/bin/ruff check --fix sera experiments paper_figures tests bench

bench: install ## speed figures (printed ratios; not tests)
	$(PY) -m bench.bench_core
	$(PY) -m bench.bench_imagenet

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

reproduce-maze: install ## Table 4 (maze navigation)

reproduce-math: install ## Tables 1, 5-9 (math reasoning; GPUs and model weights)

tables: install ## rebuild paper tables from runs/ into paper_figures/out/

figures: install ## rebuild paper figures from runs/ into paper_figures/out/

clean: ## remove caches (keeps .venv and runs/)
	rm -rf .pytest_cache .ruff_cache .hypothesis
