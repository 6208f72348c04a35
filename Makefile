# GEM ads foundation model: the Makefile is the interface. `make help` lists targets.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# GPU hosts: make install FBGEMM=fbgemm-gpu (never install both: they ship the same package).
FBGEMM ?= fbgemm-gpu-cpu
STAMP := $(VENV)/.installed-$(FBGEMM)
DATA ?=
# the pipeline's preset (tiny / small / ...): empty runs its default (small)
PRESET ?=
OUT ?= runs/main
PYTEST_ARGS ?=
# pytest-xdist processes (auto: one per core); 0 runs the suite in this process
TEST_WORKERS ?= auto

.PHONY: help install run test bench compile feast-apply lint ui-check clean

help:  ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

install: $(STAMP)  ## create .venv from the fully pinned requirements.lock

$(STAMP): requirements.lock pyproject.toml
	@echo "installing $(VENV) from requirements.lock (a few minutes the first time)"
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@sed 's/^fbgemm_gpu-cpu==/$(FBGEMM)==/' requirements.lock > $(VENV)/requirements.txt
	@# -qq: errors only (a mirror's per-package "location ignored" warnings are not news)
	@$(BIN)/pip install -qq --no-deps -r $(VENV)/requirements.txt
	@$(BIN)/pip install -qq --no-deps -e .
	@rm -f $(VENV)/.installed-*
	@touch $@

run: install  ## the main job: gem_pipeline on kfp.local, on simulator data (or DATA=path, PRESET=tiny)
	@$(BIN)/python -m gem pipeline run --workspace $(OUT) $(if $(DATA),--data $(DATA),) $(if $(PRESET),--preset $(PRESET),)

compile: install  ## compile gem_pipeline and refresh_pipeline to IR YAML (pipelines/compiled/)
	$(BIN)/python -m gem pipeline compile --out pipelines/compiled

feast-apply: install  ## apply feature_repo/ on a simulated dataset and materialize it
	$(BIN)/python -m gem data simulate --preset tiny --out runs/feast-data
	$(BIN)/python -m gem features feast-apply --data runs/feast-data
	$(BIN)/python -m gem features materialize --end 2100-01-01T00:00:00+00:00

test: install  ## install, then run the whole test suite
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

bench: install  ## run every benchmark; results in benchmarks/results/*.json
	$(BIN)/python -m benchmarks

lint: install  ## ruff (config in pyproject.toml) and the import-layer contracts
	$(BIN)/ruff check .
	$(BIN)/lint-imports

# make ui-check: the workspace whose MLflow store it opens (default: make run's) and where its results go;
# INSTALL_BROWSER=1 first installs Debian's chromium (apt-get, as root) and the ui-check extra if missing
WORKSPACE ?= $(OUT)
UI_CHECK_OUT ?= docs/ui-check
CHROMIUM ?= /usr/bin/chromium
INSTALL_BROWSER ?=

ui-check: install  ## check in headless Chromium what WORKSPACE's MLflow UI shows (docs/ui-check/; INSTALL_BROWSER=1)
	@if [ -n "$(INSTALL_BROWSER)" ]; then \
		test -x $(CHROMIUM) || (apt-get update -qq && apt-get install -y -qq chromium); \
		$(BIN)/python -c "import playwright" 2>/dev/null || $(BIN)/pip install -qq $$($(BIN)/python -c \
			"import tomllib; print(*tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['ui-check'])"); \
	fi
	$(BIN)/python -m checks.mlflow_ui $(WORKSPACE) --out $(UI_CHECK_OUT) --chromium $(CHROMIUM)

clean:  ## remove run outputs (keeps .venv)
	rm -rf runs mlruns mlflow.db .pytest_cache
