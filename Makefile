# Two commands (see README): `make demo` runs the whole job on the shipped data, `make test` the tests.
# Both create .venv (Python >= 3.12) on first use and reuse it while pyproject.toml is unchanged.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
# The compile cache lives outside the checkout, so fresh clones on this machine (CI) reuse it.
export PYTENSOR_FLAGS ?= base_compiledir=$(or $(XDG_CACHE_HOME),$(HOME)/.cache)/bayesprism/pytensor
export MPLBACKEND ?= Agg

.PHONY: venv demo test test-slow lint bench clean

venv:
	@./scripts/bootstrap.sh

demo: venv
	$(VENV)/bin/bayesprism demo -o out/demo

test: venv
	$(PY) -m pytest -q

test-slow: venv
	$(PY) -m pytest -q -m slow

lint: venv
	$(VENV)/bin/ruff check .

bench: venv
	for b in benchmarks/*.py; do $(PY) $$b || exit 1; done

clean:
	rm -rf out .cache .pytest_cache
