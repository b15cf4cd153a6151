# deployer: `make install` sets up .venv with the `deploy` command; `make test` runs the whole suite.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
SGLANG_VENV ?= $(HOME)/.cache/deployer/sglang-venv
# The seed era: the release the shipped qwen36-mtp profile was written for (--mamba-scheduler-strategy).
SGLANG_SEED_VERSION ?= 0.5.10
SGLANG_SEED_VENV ?= $(HOME)/.cache/deployer/sglang-venv-$(SGLANG_SEED_VERSION)

.PHONY: install test test-unit test-integration test-sglang-real sglang-venv sglang-seed-venv typecheck demo bench clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -e '.[test]'
	touch $@

test: install
	$(PY) -m mypy
	$(PY) -m pytest -q -p no:cacheprovider -m "not sglang_real" tests

test-unit: install
	$(PY) -m pytest -q tests/unit

test-integration: install
	$(PY) -m pytest -q tests/integration

# Real SGLang code on the CPU (argument parser + resolution), in venvs cached under ~/.cache/deployer:
# 0.5.23 and the seed-era release. The tier runs once per release.
sglang-venv:
	bash scripts/build-sglang-venv.sh $(SGLANG_VENV) 0.5.23

sglang-seed-venv:
	bash scripts/build-sglang-venv.sh $(SGLANG_SEED_VENV) $(SGLANG_SEED_VERSION)

test-sglang-real: install sglang-venv sglang-seed-venv
	SGLANG_VENV=$(SGLANG_VENV) $(PY) -m pytest -q -p no:cacheprovider -m sglang_real tests/sglang_real
	SGLANG_VENV=$(SGLANG_SEED_VENV) $(PY) -m pytest -q -p no:cacheprovider -m sglang_real tests/sglang_real

# A throwaway sshd on 127.0.0.1 and the stand-in engine (no GPU): the whole flow, including a failure that heals.
demo: install
	$(PY) scripts/demo.py

# Benchmarks: ratios against a baseline run in the same command; results in bench/results/.
bench: install
	$(PY) bench/run.py

typecheck: install
	$(PY) -m mypy

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .mypy_cache
