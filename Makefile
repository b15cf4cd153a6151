# deployer: `make install` sets up .venv with the `deploy` command; `make test` runs the whole suite.
# Both first check this machine has what they need (scripts/provision-test-host.sh): as root with apt-get they
# install it, otherwise they stop with one line naming the command to run.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
SGLANG_VENV ?= $(HOME)/.cache/deployer/sglang-venv
VLLM_VENV ?= $(HOME)/.cache/deployer/vllm-venv
SMG_VENV ?= $(HOME)/.cache/deployer/smg-venv
UV_VENV ?= $(HOME)/.cache/deployer/uv-venv
# The fast tier's workers (pytest-xdist): its tests mostly wait on sshd, bash and HTTP, so a 2-core box runs 4
# well; each worker has its own beds (sshd, ports, network namespaces). The order is shuffled (pytest-randomly);
# an idle worker takes tests queued on a busy one (--dist worksteal: a few tests take 30-100 s, most under 2 s).
TEST_WORKERS ?= 4
# The real-parser tiers (sglang-real, vllm-real): each test waits on a real engine's import on the target, one
# module per worker (its beds are module-scoped). Measured on 2 cores: sglang-real 354 s serial, 185 s with 2.
PARSER_WORKERS ?= 2
# Tests slower than this are listed at the end of a run (pytest --durations), to be made faster or moved to a tier.
SLOW_S ?= 30
# The real-engine tier: real vLLM (CPU build) and real SGLang (CPU engine) serving a tiny model made here.
REAL_VLLM_VENV ?= $(HOME)/.cache/deployer/real-vllm-venv
REAL_SGLANG_VENV ?= $(HOME)/.cache/deployer/real-sglang-venv
TINY_MODEL ?= $(HOME)/.cache/deployer/tiny-llama
# The seed era: the release the shipped qwen36-mtp profile was written for (--mamba-scheduler-strategy).
SGLANG_SEED_VERSION ?= 0.5.10
SGLANG_SEED_VENV ?= $(HOME)/.cache/deployer/sglang-venv-$(SGLANG_SEED_VERSION)
# Every supported engine release's wheel (pip download --no-deps), read by the per-release knowledge tests.
RELEASE_WHEELS ?= $(HOME)/.cache/deployer/release-wheels

.PHONY: install provision walkthrough test lint-imports test-unit test-integration test-browser test-sglang-real sglang-venv sglang-seed-venv smg-venv uv-venv test-vllm-real vllm-venv real-vllm-venv real-sglang-venv tiny-model real-engines envs test-real-engines typecheck demo bench docs clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	@PYTHON=$(PYTHON) bash scripts/provision-test-host.sh install
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --no-compile -e '.[test]'
	touch $@

# What the tests need on this machine (sshd, sftp-server, ssh client, unshare, pkill, iproute2, nft, python3).
provision:
	@PYTHON=$(PYTHON) bash scripts/provision-test-host.sh test

test: provision install smg-venv uv-venv
	$(PY) -m mypy
	$(VENV)/bin/lint-imports --no-logo
	SMG_VENV=$(SMG_VENV) UV_VENV=$(UV_VENV) $(PY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist worksteal \
	  --durations=0 --durations-min=$(SLOW_S) -m "not sglang_real and not vllm_real and not real_engines and not browser" tests

test-unit: install
	$(PY) -m pytest -q tests/unit

# The dashboard in a real headless Chromium (tests/browser): Debian's chromium and chromium-driver, installed with
# apt-get when run as root (scripts/provision-test-host.sh browser); skipped without them, a failure under CI=true.
test-browser: provision install
	@PYTHON=$(PYTHON) bash scripts/provision-test-host.sh browser
	$(PY) -m pytest -q -p no:cacheprovider -m browser tests/browser

test-integration: provision install
	$(PY) -m pytest -q tests/integration

# Real SGLang code on the CPU (argument parser + resolution), in venvs cached under ~/.cache/deployer:
# 0.5.23 and the seed-era release. The tier runs once per release.
sglang-venv:
	bash scripts/build-sglang-venv.sh $(SGLANG_VENV) 0.5.23

# The real SGLang Model Gateway (smg, PyPI; runs on a CPU) for the fleet tests, cached like the SGLang venv.
smg-venv:
	bash scripts/build-smg-venv.sh $(SMG_VENV)

# uv (PyPI; a binary in a wheel) for the tests whose target builds a managed environment with it.
uv-venv:
	bash scripts/build-uv-venv.sh $(UV_VENV)

sglang-seed-venv:
	bash scripts/build-sglang-venv.sh $(SGLANG_SEED_VENV) $(SGLANG_SEED_VERSION)

test-sglang-real: provision install sglang-venv sglang-seed-venv
	SGLANG_VENV=$(SGLANG_VENV) SGLANG_SEED_VENV=$(SGLANG_SEED_VENV) RELEASE_WHEELS=$(RELEASE_WHEELS) \
	  $(PY) -m pytest -q -p no:cacheprovider -n $(PARSER_WORKERS) --dist loadfile -m sglang_real tests/sglang_real
	SGLANG_VENV=$(SGLANG_SEED_VENV) RELEASE_WHEELS=$(RELEASE_WHEELS) \
	  $(PY) -m pytest -q -p no:cacheprovider -n $(PARSER_WORKERS) --dist loadfile -m sglang_real tests/sglang_real

# Real vLLM 0.33.0 code on the CPU (its serve argument parser), in a venv cached under ~/.cache/deployer.
vllm-venv:
	bash scripts/build-vllm-venv.sh $(VLLM_VENV)

# The real-engine tier's vLLM 0.32.0 too: `deploy upgrade` is tested from it to the parser's 0.33.0.
real-vllm-venv:
	bash scripts/build-real-vllm-venv.sh $(REAL_VLLM_VENV)

test-vllm-real: provision install vllm-venv real-vllm-venv
	VLLM_VENV=$(VLLM_VENV) REAL_VLLM_VENV=$(REAL_VLLM_VENV) RELEASE_WHEELS=$(RELEASE_WHEELS) \
	  $(PY) -m pytest -q -p no:cacheprovider -n $(PARSER_WORKERS) --dist loadfile -m vllm_real tests/vllm_real

real-sglang-venv:
	bash scripts/build-real-sglang-venv.sh $(REAL_SGLANG_VENV)

# The tiny model is made with the real vLLM venv's numpy and tokenizers.
tiny-model: real-vllm-venv
	$(REAL_VLLM_VENV)/bin/python scripts/make-tiny-model.py $(TINY_MODEL)

# Real engines serving a tiny local model (~4 min cold: two venvs and the model; cached under ~/.cache/deployer).
real-engines: real-vllm-venv real-sglang-venv tiny-model

# Every environment the tiers after the fast one use: `make -j3 envs` builds three at a time (.ci/run starts it in
# the background, at the lowest priority, while the fast tier runs). A build is single-threaded pip waiting on the
# disk as much as on a core: measured here on 2 cores, cold (empty HOME), all of them took ~700 s one at a time,
# 367 s with -j2, 290 s with -j3. Each venv has its own lock (scripts/cpu-venv-lib.sh); pip's cache is shared
# safely. The longest builds come first. smg and uv are not here: `make test` builds them first (seconds), and a
# low-priority build of them would hold their locks while the fast tier waits.
envs: real-sglang-venv real-vllm-venv sglang-venv sglang-seed-venv vllm-venv tiny-model

# deployer deploys them over the real sshd test host, end to end (one engine at a time, ~3 GB each: two at a time
# on 2 cores starved the deployments' own ssh, a lease not renewed within 30 s; docs/real-engines.md).
test-real-engines: provision install smg-venv uv-venv real-engines
	SMG_VENV=$(SMG_VENV) UV_VENV=$(UV_VENV) REAL_VLLM_VENV=$(REAL_VLLM_VENV) REAL_SGLANG_VENV=$(REAL_SGLANG_VENV) TINY_MODEL=$(TINY_MODEL) \
	  $(PY) -m pytest -q -p no:cacheprovider --timeout 900 --durations=10 \
	  -m real_engines tests/real_engines

# A throwaway sshd on 127.0.0.1 and the stand-in engine (no GPU): the whole flow, including a failure that heals.
demo: provision install
	$(PY) scripts/demo.py

# README's newcomer walkthrough, run for real against a throwaway sshd and the stand-in engine: docs/walkthrough.md.
walkthrough: provision install
	$(PY) scripts/walkthrough.py docs/walkthrough.md

# Benchmarks: ratios against a baseline run in the same command; results in bench/results/.
bench: provision install
	$(PY) bench/run.py

# The docs site (mkdocs.yml, Material): built strict, so a broken link, a missing anchor or a page left out of the
# nav fails it; the site is written to build/site/. docs/reference/ is generated: $(PY) scripts/gen_docs.py.
docs: install
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

typecheck: install
	$(PY) -m mypy

# The import contracts in pyproject.toml ([tool.importlinter]): layers, no cycles, stdlib-only supervisor.
lint-imports: install
	$(VENV)/bin/lint-imports --no-logo

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .mypy_cache
