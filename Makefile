# Two set-up commands for a fresh machine: `make up` (the cluster: node1 and its backup, node2,
# node3) and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: up down standalone test prerequisites lint proto bench sim clean

$(STAMP): pyproject.toml
	@$(PY) -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null || \
		{ echo "make: pinmq needs Python 3.11+ as $(PY) (make PY=python3.11 ...)" >&2; exit 1; }
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

up: $(STAMP)
	$(BIN)/pinmq up deploy/node1.yaml deploy/node1-backup.yaml deploy/node2.yaml deploy/node3.yaml

down: $(STAMP)
	$(BIN)/pinmq down

standalone: $(STAMP)
	$(BIN)/pinmq node --config deploy/standalone.yaml

# Java for the Spark tests, a network namespace for the README tour: checked before installing.
prerequisites:
	@$(PY) tests/prerequisites.py

test: prerequisites $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports  # the layers and no import cycles: pyproject.toml, docs/architecture.md
	$(BIN)/python -m pytest -q --ignore=tests/test_pipeline.py
	# Spark in a process of its own: after the gRPC tests its JVM gateway failed to start in-process.
	$(BIN)/python -m pytest -q tests/test_pipeline.py

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/ruff format --check .

proto: $(STAMP)
	$(BIN)/python -m pinmq.protogen

bench: $(STAMP)
	$(BIN)/python bench/core_dispatch.py
	$(BIN)/python bench/group_memory.py
	$(BIN)/python bench/end_to_end.py

# The failover simulation over more seeds than `make test` runs (10,000): SEEDS=N START=S.
SEEDS ?= 100000
START ?= 10000
sim: $(STAMP)
	$(BIN)/python tests/failover_sim.py --seeds $(SEEDS) --start $(START)

clean:
	rm -rf $(VENV) build *.egg-info
