# One command each: `make demo` runs the DDP example locally, `make test` runs every test.
# Both create .venv with pinned versions first (Python 3.11 and pip assumed).
PYTHON ?= python3
VENV ?= .venv
BIN := $(abspath $(VENV))/bin
# Metaflow refuses to run without a user name; CI may have none.
export METAFLOW_USER ?= $(or $(USER),metaflow-torchrun)
# Metaflow's local runtime starts the other nodes with `python` from PATH.
export PATH := $(BIN):$(PATH)

.PHONY: install demo hello test unit bench clean

install: $(VENV)/.installed

$(VENV)/.installed: requirements-dev.txt setup.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade --quiet "pip>=23.1" "setuptools>=68"
	$(BIN)/python -m pip install --quiet -r requirements-dev.txt
	$(BIN)/python -m pip install --quiet --no-deps -e . --config-settings editable_mode=compat
	touch $@

demo: install
	cd examples/ddp && $(BIN)/python flow.py run

hello: install
	cd examples/hello && $(BIN)/python flow.py run

test: install
	$(BIN)/python -m pytest tests $(PYTEST_ARGS)

unit: install
	$(BIN)/python -m pytest tests/unit $(PYTEST_ARGS)

# Measurements, not tests (benchmarks/README.md): about 35 minutes on 2 cores.
bench: install $(VENV)/.bench-installed
	$(BIN)/python benchmarks/run.py $(BENCH_ARGS)

$(VENV)/.bench-installed: benchmarks/requirements.txt
	$(BIN)/python -m pip install --quiet -r benchmarks/requirements.txt
	touch $@

clean:
	rm -rf $(VENV) .metaflow examples/*/.metaflow
