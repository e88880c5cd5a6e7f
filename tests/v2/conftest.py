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


# Float32 greedy decoding in transformers, in a process of its own: after an in-process
# engine ran, this one's OpenMP threads are bound for vLLM's CPU worker, and a transformers
# forward here takes many times longer (measured: 10 minutes instead of 10 s for 48 prompts).
FLOAT32_GREEDY = """
import json, sys, torch, transformers
torch.set_num_threads(1)
args = json.loads(sys.argv[1])
model = getattr(transformers, args["cls"]).from_pretrained(
    args["model"], torch_dtype=torch.float32).eval()
found = []
with torch.no_grad():
    for prompt in args["candidates"]:
        ids, tokens, margin = torch.tensor([prompt]), [], float("inf")
        for _ in range(args["max_tokens"]):
            logits = model(ids).logits[0, -1]
            top = logits.topk(2).values
            margin = min(margin, float(top[0] - top[1]))
            tokens.append(int(logits.argmax()))
            ids = torch.cat([ids, ids.new_tensor([[tokens[-1]]])], dim=1)
        if margin >= args["min_margin"]:
            found.append((prompt, tokens))
        if len(found) == args["count"]:
            break
print("RESULT" + json.dumps(found))
"""


def float32_clear_prompts(model: str, cls: str, candidates: list[list[int]], max_tokens: int,
                          min_margin: float, count: int | None = None
                          ) -> tuple[list[list[int]], list[list[int]]]:
    """(prompts, float32 greedy outputs) of the candidates (the first ``count`` of them, if
    given) whose float32 greedy top-1 - top-2 logit margin stays >= ``min_margin`` at every
    one of ``max_tokens`` tokens; ``cls`` names the transformers class of ``model``."""
    args = {"model": model, "cls": cls, "candidates": candidates, "max_tokens": max_tokens,
            "min_margin": min_margin, "count": count}
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "-c", FLOAT32_GREEDY, json.dumps(args)],
                         capture_output=True, text=True, env=env, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    (line,) = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT")]
    found = json.loads(line.removeprefix("RESULT"))
    return [prompt for prompt, _ in found], [tokens for _, tokens in found]


# Lattice drafters (DFlash2, LiLiCorr) trained for the tiny trained target: (target dir,
# drafter dir).
@pytest.fixture(scope="session")
def lattice_dflash2():
    from vllm_dartree.models.tiny_lattice_pair import trained_tiny_lattice_pair

    return trained_tiny_lattice_pair("dflash2")


@pytest.fixture(scope="session")
def lattice_lilicorr():
    from vllm_dartree.models.tiny_lattice_pair import trained_tiny_lattice_pair

    return trained_tiny_lattice_pair("lilicorr")
