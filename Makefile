# One command each: `make demo` runs the DDP example locally, `make test` runs every test.
# Both create .venv with pinned versions first (Python 3.11 and pip assumed): the demo only
# the runtime (requirements-demo.txt), the tests everything (requirements-dev.txt).
PYTHON ?= python3
VENV ?= .venv
BIN := $(abspath $(VENV))/bin
# Metaflow refuses to run without a user name, and takes root for none; CI may have none.
export METAFLOW_USER ?= $(or $(filter-out root,$(USER)),metaflow-torchrun)
# Metaflow's local runtime starts the other nodes with `python` from PATH.
export PATH := $(BIN):$(PATH)
# mkdocs-material prints a banner about its successor on every build.
export NO_MKDOCS_2_WARNING := 1

.PHONY: install demo-install demo hello test test-fast unit lint docs docs-install docs-serve docs-screenshots pictures dist wheel-venv package-check matrix bench bench-gang gpu-check clean

# Python's default, bytecode written beside what it compiles, even where the machine turns it off
# (PYTHONDONTWRITEBYTECODE; CI's machines do): there every process compiled every module it imported
# again, our package alone about 0.13 CPU-s in each of a thousand Metaflow processes in `make test`.
# So nothing installed is compiled ahead (pip took 55 of its 96 s here compiling 17,000 modules):
# what is imported is compiled once, by the first process that imports it.
unexport PYTHONDONTWRITEBYTECODE

# `pip install` into a venv, done by uv (pinned, fetched once into .uv/, given pip's own settings)
# where it can be, else by pip: 55 -> 11 s for the development venv on a fresh clone (tools/install.py).
INSTALL = $(PYTHON) tools/install.py

install: $(VENV)/.installed

# metaflow-checkpoint, apart from the venv's site-packages (requirements-checkpoint.txt says why).
CHECKPOINT_SITE = $(VENV)/extras/checkpoint

$(VENV)/.installed: requirements-dev.txt requirements-hf.txt requirements-checkpoint.txt setup.py tools/install.py
	$(PYTHON) -m venv $(VENV)
	$(INSTALL) $(VENV) "setuptools>=68" -r requirements-dev.txt
	$(INSTALL) $(VENV) --no-deps -e .
	@# a venv made before it moved there: one copy only, apart
	@if ls $(VENV)/lib/python*/site-packages/metaflow_checkpoint-*.dist-info >/dev/null 2>&1; then \
	  $(BIN)/python -m pip uninstall --quiet --yes metaflow-checkpoint; \
	  rm -rf $(VENV)/lib/python*/site-packages/metaflow_extensions/obcheckpoint; fi
	rm -rf $(CHECKPOINT_SITE)
	$(INSTALL) $(VENV) --no-deps --target $(CHECKPOINT_SITE) -r requirements-checkpoint.txt
	touch $@

# The demo's venv: metaflow and torch only. `make test` later adds the development set.
demo-install: $(VENV)/.demo-installed

$(VENV)/.demo-installed: requirements-demo.txt setup.py tools/install.py
	$(PYTHON) -m venv $(VENV)
	$(INSTALL) $(VENV) "setuptools>=68" -r requirements-demo.txt
	$(INSTALL) $(VENV) --no-deps -e .
	touch $@

demo: demo-install
	cd examples/ddp && $(BIN)/python flow.py run

hello: demo-install
	cd examples/hello && $(BIN)/python flow.py run

# Two pools at once (tools/pools.py, docs/development.md): the tests that spend CPU
# (real flows, about 5 CPU-s each, waiting for part of it) at PYTEST_WORKERS, three for 2 cores; those that
# mostly wait (marked `waits` in tests/conftest.py) at WAIT_WORKERS, so that a test
# waiting out a 20 s timeout never holds one of the three. Every test runs once; the
# exit status fails if either pool failed. PYTEST_WORKERS=0: one process, in file
# order, no pools. PYTEST_ARGS go to both pytest runs (select with -k or a path, not -m).
PYTEST_WORKERS ?= 3
WAIT_WORKERS ?= 4
POOLS = $(BIN)/python tools/pools.py --workers $(PYTEST_WORKERS) --wait-workers $(WAIT_WORKERS)

# The lint runs beside the pools (its 9 s on one core no longer come first); its output is
# shown once both end, and the exit status fails if it failed.
test: install
	@mkdir -p build
	@$(MAKE) --no-print-directory lint >build/lint.log 2>&1 & lint=$$!; \
	$(POOLS) -- $(PYTEST_ARGS); status=$$?; \
	if wait $$lint; then echo "make lint: passed"; else cat build/lint.log; echo "make lint failed" >&2; status=1; fi; \
	exit $$status

# The development loop: every test but those that wait 20 s or more by design
# (marked `slow`), without the lint. `make test` runs them all.
test-fast: install
	$(POOLS) --select "not slow" -- $(PYTEST_ARGS)

# Linter, type checker and import contracts (pinned in requirements-dev.txt; config in pyproject.toml).
lint: install
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/mkdocs build --strict --quiet --site-dir build/site

# The docs site (docs/, mkdocs.yml) into site/; `make docs-serve` to read it at localhost:8000.
# Its own venv with the `docs` extra's pins only (requirements-docs.txt; docs/development.md
# says its size): the API page reads the code's source, so neither metaflow nor torch is needed.
DOCS_VENV ?= .venv-docs
DOCS_BIN := $(abspath $(DOCS_VENV))/bin

docs-install: $(DOCS_VENV)/.installed

$(DOCS_VENV)/.installed: requirements-docs.txt
	$(PYTHON) -m venv $(DOCS_VENV)
	$(DOCS_BIN)/python -m pip install --upgrade --quiet "pip>=23.1"
	$(DOCS_BIN)/python -m pip install --quiet -r requirements-docs.txt
	touch $@

docs: docs-install
	$(DOCS_BIN)/mkdocs build --strict --site-dir site

docs-serve: docs-install
	$(DOCS_BIN)/mkdocs serve

# Every page of site/ photographed by headless Chromium into build/screenshots/ (out of
# git), and each SVG's text measured as drawn (Debian: apt-get install -y chromium).
docs-screenshots: docs
	$(DOCS_BIN)/python tools/docs_screenshots.py site build/screenshots

# The pictures in docs/, each made by a script (never pasted). The plot needs
# benchmarks/requirements.txt; the card screenshot needs Chromium (Debian:
# apt-get install -y chromium). Not part of CI.
pictures: install $(VENV)/.bench-installed
	$(BIN)/python tools/pictures/lifecycle.py docs/lifecycle.svg
	$(BIN)/python benchmarks/report.py benchmarks/results docs/benchmarks.png
	$(BIN)/python tools/pictures/card_screenshot.py docs

# The sdist and wheel, checked as PyPI would.
dist: install
	rm -rf dist
	$(BIN)/python -m build --outdir dist .
	$(BIN)/twine check --strict dist/*

# The wheel installed into a fresh virtualenv (with its [torch] extra, versions as
# pinned in requirements-demo.txt), then examples/hello run with it. The venv and the pins
# come first (`make wheel-venv`, no wheel needed: CI makes it beside `make install`); the wheel
# goes in anew each time, with its extra resolved against them. Nothing is compiled ahead (pip
# would compile every module of torch, 35 s of CPU here); the run compiles what it imports.
WHEEL_VENV := $(abspath .venv-wheel)
WHEEL_PINS = grep -E '^(metaflow|torch)==' requirements-demo.txt
wheel-venv: $(WHEEL_VENV)/.pinned

$(WHEEL_VENV)/.pinned: requirements-demo.txt tools/install.py
	rm -rf $(WHEEL_VENV)
	$(PYTHON) -m venv $(WHEEL_VENV)
	pins="$$($(WHEEL_PINS))" && [ -n "$$pins" ] && $(INSTALL) $(WHEEL_VENV) $$pins
	touch $@

package-check: dist wheel-venv
	$(WHEEL_VENV)/bin/python -m pip uninstall --quiet --yes metaflow-torchrun
	pins="$$($(WHEEL_PINS))" && [ -n "$$pins" ] && \
	$(INSTALL) $(WHEEL_VENV) "$$(ls dist/*.whl)[torch]" $$pins
	cd examples/hello && PATH=$(WHEEL_VENV)/bin:$$PATH METAFLOW_DATASTORE_SYSROOT_LOCAL=$(WHEEL_VENV)/mf \
		$(WHEEL_VENV)/bin/python flow.py run

# Version matrix (not part of CI): a venv per cell under MATRIX_DIR, README "Versions".
MATRIX_DIR ?= /tmp/matrix
matrix:
	$(PYTHON) tools/matrix.py --dir $(MATRIX_DIR) $(MATRIX_ARGS)

unit: install
	$(BIN)/python -m pytest tests/unit $(PYTEST_ARGS)

# Measurements, not tests (benchmarks/README.md): about 35 minutes on 2 cores.
# benchmarks/resume.py's flow uses @checkpoint: metaflow-checkpoint on its path.
bench: install $(VENV)/.bench-installed
	PYTHONPATH=$(abspath $(CHECKPOINT_SITE)) $(BIN)/python benchmarks/run.py $(BENCH_ARGS)

# The gang service at 64 to 4,096 simulated nodes (benchmarks/README.md, "The gang at
# scale"), e.g. GANG_ARGS="--nodes 64,256 --runs 3 --label after".
bench-gang: install
	$(BIN)/python benchmarks/gang_scale.py $(GANG_ARGS)

$(VENV)/.bench-installed: benchmarks/requirements.txt
	$(BIN)/python -m pip install --quiet -r benchmarks/requirements.txt
	touch $@

# On a machine with at least one NVIDIA GPU and a CUDA torch (never in CI):
# the GPU cases and timings, written to benchmarks/results/gpu.json.
gpu-check: install
	$(BIN)/python benchmarks/gpu.py $(GPU_ARGS)

clean:
	rm -rf $(VENV) .venv-wheel .uv $(DOCS_VENV) build dist site .metaflow examples/*/.metaflow
