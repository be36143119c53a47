# txstream developer tasks. `make help` lists them.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.DEFAULT_GOAL := help
.PHONY: help install run test lint bench bench-quick cluster-start cluster-stop clean

help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-z-]+:.*## / {printf "  make %-14s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

install: $(STAMP) ## create .venv and install txstream (editable) with its dev tools

$(STAMP): pyproject.toml
	@scripts/check-python.sh $(PYTHON)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,connect]'
	@scripts/pg-install.sh
	@touch $(STAMP)

run: install ## the main job: Linear Road on the Spark executor runtime, validated
	@scripts/check-java.sh
	rm -rf run-out/linear-road
	$(BIN)/txstream linear-road run --L 1 --minutes 8 --speedup 15 --out run-out/linear-road

# The suite waits more than it computes (JVM start-ups, subprocesses killed and
# restarted), so it runs on TEST_WORKERS pytest-xdist workers; worksteal hands a
# worker that is done the tests another has not started, so the long ones do
# not queue behind each other. TEST_WORKERS=0 runs it in this process.
TEST_WORKERS ?= 2
test: install lint ## lint, type check and the whole test suite
	@scripts/pg-install.sh
	$(BIN)/pytest -n $(TEST_WORKERS) --dist worksteal

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

CLUSTER ?= run-out/spark-cluster
cluster-start: install ## a Spark standalone cluster on loopback (2 workers); prints its master URL
	@scripts/check-java.sh
	@PYSPARK_PYTHON=$(abspath $(BIN))/python scripts/spark-cluster.sh start $(CLUSTER) 2 1

cluster-stop: ## stop the cluster cluster-start started
	@scripts/spark-cluster.sh stop $(CLUSTER)

clean: ## remove the virtual environment and caches
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis bench-out
