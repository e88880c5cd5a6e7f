"""Tensor parallelism on V2 (two ranks, one core each, vLLM's mp executor; every worker
process loads the Triton stand-in through tests/v2/site): every variant and the DSpark head
give exactly TP=1 target-only output."""

from __future__ import annotations

import pytest
from variants import VARIANTS

from vllm_dartree.harness.engine import generate_ids, spec_decode_counters
from vllm_dartree.models.tiny import TargetSpec, random_prompts

pytestmark = pytest.mark.e2e

PROMPTS = random_prompts(6, TargetSpec().vocab_size, seed=31, min_len=2, max_len=50)
BATCH = {"max_num_seqs": 8, "max_num_batched_tokens": 1024}
TP2 = {"tensor_parallel_size": 2, "distributed_executor_backend": "mp"}


def greedy():
    from vllm import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


@pytest.fixture(scope="module")
def tp1_target_only(engines, tiny_target):
    return generate_ids(engines.get(model=str(tiny_target), **BATCH), PROMPTS, greedy())


TP2_VARIANTS = [v for v in VARIANTS if v[0] in ("pruned-cpu-defaults", "fixed", "ddtree",
                                                 "domino-chain", "dflash-chain")]


@pytest.mark.parametrize(("name", "settings"), TP2_VARIANTS, ids=[v[0] for v in TP2_VARIANTS])
def test_every_variant_at_tp2_matches_tp1_target_only(engines, tiny_target, tiny_domino,
                                                      tp1_target_only, one_core_per_rank,
                                                      name, settings):
    llm = engines.get(model=str(tiny_target), **BATCH, **TP2, speculative_config={
        "method": "dartree", "model": str(tiny_domino), **settings})
    assert generate_ids(llm, PROMPTS, greedy()) == tp1_target_only
    assert spec_decode_counters(llm)["num_drafts"] > 0


def test_dspark_head_at_tp2_matches_tp1_target_only(engines, tiny_target, tiny_dspark,
                                                    tp1_target_only, one_core_per_rank):
    """The Markov head builds the trees; with the adaptive budget its confidence head is
    the acceptance estimate rank 0 decides on."""
    llm = engines.get(model=str(tiny_target), **BATCH, **TP2, speculative_config={
        "method": "dartree", "model": str(tiny_dspark), "num_speculative_tokens": 24,
        "width": 6, "top_k": 16, "budget_policy": "adaptive"})
    assert generate_ids(llm, PROMPTS, greedy()) == tp1_target_only
    assert spec_decode_counters(llm)["num_drafts"] > 0


@pytest.mark.parametrize("width", [4, "auto"])
def test_the_adaptive_budget_at_tp2_matches_tp1_target_only(engines, tiny_target, tiny_domino,
                                                            tp1_target_only, one_core_per_rank,
                                                            width):
    """Rank 0's drafting decision on every rank; its counts are the scheduler's."""
    llm = engines.get(model=str(tiny_target), **BATCH, **TP2, speculative_config={
        "method": "dartree", "model": str(tiny_domino), "budget_policy": "adaptive",
        "num_speculative_tokens": 24, "width": width, "top_k": 8})
    assert generate_ids(llm, PROMPTS, greedy()) == tp1_target_only
    assert spec_decode_counters(llm)["num_drafts"] > 0
