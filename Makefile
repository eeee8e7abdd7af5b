# bucketq developer tasks. `make help` lists them.

SHELL := /bin/bash
.DEFAULT_GOAL := help

# The first Python >= 3.11 on PATH (override: make PYTHON=/path/to/python3.12 test).
PYTHON ?= $(shell for p in python3.13 python3.12 python3.11 python3; do \
	if command -v $$p >/dev/null 2>&1 && $$p -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; \
	then echo $$p; break; fi; done)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: help venv demo test lint bench clean tools

help: ## Show this help
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | \
		awk 'BEGIN {FS = ":.*## "}; {printf "  %-8s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	@test -n "$(PYTHON)" || { echo "need Python >= 3.11 on PATH (or make PYTHON=...)"; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $@

venv: $(STAMP) ## Create .venv with bucketq and its dev tools (reinstalls when pyproject.toml changes)

demo: $(STAMP) ## Run the demo: publish and consume through a local bucket
	$(BIN)/bucketq demo

lint: $(STAMP) ## Ruff and mypy
	$(BIN)/ruff check .
	$(BIN)/mypy bucketq

tools: ## Install system tools the tests use: promtool (Debian package prometheus)
	@command -v promtool >/dev/null 2>&1 || { \
		SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
		$$SUDO apt-get update -qq && \
		$$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus; }

test: lint tools ## Lint, type-check, then run the whole test suite
	$(BIN)/pytest -q

bench: $(STAMP) ## Benchmark against a moto server, results in bench.json
	$(BIN)/bucketq bench --backend moto --json bench.json

clean: ## Remove the venv, caches and build output
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis build dist *.egg-info
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
