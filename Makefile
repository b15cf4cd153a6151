# deployer: `make install` sets up .venv with the `deploy` command; `make test` runs the whole suite.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
SGLANG_VENV ?= .cache/sglang-venv

.PHONY: install test test-unit test-integration test-sglang-real sglang-venv typecheck demo bench clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $@

test: install
	$(PY) -m mypy
	$(PY) -m pytest -q -p no:cacheprovider tests

test-unit: install
	$(PY) -m pytest -q tests/unit

test-integration: install
	$(PY) -m pytest -q tests/integration

typecheck: install
	$(PY) -m mypy

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .mypy_cache
