"""The V2 suite: every engine here runs vLLM's V2 model runner (``make test`` runs this folder
in its own pytest process with ``VLLM_USE_V2_MODEL_RUNNER=1`` and ``tests/v2/site`` on
PYTHONPATH, whose ``sitecustomize`` gives Triton a stand-in CPU backend in every process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent / "e2e"))  # variants.py

if os.environ.get("VLLM_USE_V2_MODEL_RUNNER") != "1":
    raise pytest.UsageError("tests/v2 runs with VLLM_USE_V2_MODEL_RUNNER=1 and tests/v2/site "
                            "on PYTHONPATH (see the Makefile's test target)")


def v1_target_only(model: str, prompts: list[list[int]], max_tokens: int,
                   engine: dict) -> list[list[int]]:
    """Greedy target-only output of vLLM's V1 runner (a child process without the stand-in,
    so vLLM sees no Triton and picks V1, as on any CPU install)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("VLLM_USE_V2_MODEL_RUNNER", "TRITON_INTERPRET", "PYTHONPATH")}
    script = (
        "import json, sys\n"
        "from vllm_dartree.harness.engine import build_llm, generate_ids\n"
        "from vllm import SamplingParams\n"
        "args = json.loads(sys.argv[1])\n"
        "llm = build_llm(model=args['model'], **args['engine'])\n"
        "runner = llm.llm_engine.model_executor.driver_worker.worker.model_runner\n"
        "assert type(runner).__module__ == 'vllm.v1.worker.cpu_model_runner', type(runner)\n"
        "sp = SamplingParams(temperature=0.0, max_tokens=args['max_tokens'], ignore_eos=True)\n"
        "print('RESULT' + json.dumps(generate_ids(llm, args['prompts'], sp)))\n")
    args = json.dumps({"model": model, "prompts": prompts, "max_tokens": max_tokens,
                       "engine": engine})
    out = subprocess.run([sys.executable, "-c", script, args], capture_output=True, text=True,
                         env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    (line,) = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT")]
    return json.loads(line.removeprefix("RESULT"))
