# txstream developer tasks. `make help` lists them.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.DEFAULT_GOAL := help
.PHONY: help install run test lint bench bench-quick clean

help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-z-]+:.*## / {printf "  make %-12s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

install: $(STAMP) ## create .venv and install txstream (editable) with its dev tools

$(STAMP): pyproject.toml
	@scripts/check-python.sh $(PYTHON)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@scripts/pg-install.sh
	@touch $(STAMP)

run: install ## the main job: Linear Road on the Spark executor runtime, validated
	@scripts/check-java.sh
	rm -rf run-out/linear-road
	$(BIN)/txstream linear-road run --L 1 --minutes 8 --speedup 15 --out run-out/linear-road

test: install lint ## lint, type check and the whole test suite
	@scripts/pg-install.sh
	$(BIN)/pytest

lint: install ## ruff (lint and format) and mypy
	$(BIN)/ruff check src tests
	$(BIN)/ruff format --check src tests
	$(BIN)/mypy

bench: install ## run every benchmark (full grids, about an hour) into bench-out/
	@scripts/pg-install.sh
	$(BIN)/txstream bench all --out bench-out

bench-quick: install ## every benchmark on its small grid (a few minutes) into bench-out/
	@scripts/pg-install.sh
	$(BIN)/txstream bench all --quick --out bench-out

clean: ## remove the virtual environment and caches
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis bench-out
