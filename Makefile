# deployer: `make install` sets up .venv with the `deploy` command; `make test` runs the whole suite.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
SGLANG_VENV ?= $(HOME)/.cache/deployer/sglang-venv
VLLM_VENV ?= $(HOME)/.cache/deployer/vllm-venv

.PHONY: install test test-unit test-integration test-sglang-real sglang-venv test-vllm-real vllm-venv typecheck demo bench clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -e '.[test]'
	touch $@

test: install
	$(PY) -m mypy
	$(PY) -m pytest -q -p no:cacheprovider -m "not sglang_real and not vllm_real" tests

test-unit: install
	$(PY) -m pytest -q tests/unit

test-integration: install
	$(PY) -m pytest -q tests/integration

# Real SGLang 0.5.23 code on the CPU (argument parser + resolution), in a venv cached under .cache/.
sglang-venv:
	bash scripts/build-sglang-venv.sh $(SGLANG_VENV)

test-sglang-real: install sglang-venv
	SGLANG_VENV=$(SGLANG_VENV) $(PY) -m pytest -q -p no:cacheprovider -m sglang_real tests/sglang_real

# Real vLLM 0.33.0 code on the CPU (its serve argument parser), in a venv cached under ~/.cache/deployer.
vllm-venv:
	bash scripts/build-vllm-venv.sh $(VLLM_VENV)

test-vllm-real: install vllm-venv
	VLLM_VENV=$(VLLM_VENV) $(PY) -m pytest -q -p no:cacheprovider -m vllm_real tests/vllm_real

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
