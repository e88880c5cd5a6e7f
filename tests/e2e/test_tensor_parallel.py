"""Tensor parallelism on this CPU (two ranks, one core each, vLLM's mp executor): every tree
variant gives exactly the output of TP=1 target-only decoding."""

from __future__ import annotations

import pytest
from variants import VARIANTS

from vllm_dartree.harness.engine import generate_ids, spec_decode_counters
from vllm_dartree.models.tiny import TargetSpec, random_prompts
from vllm_dartree.testing.draft_rpcs import counting_draft_rpcs

pytestmark = pytest.mark.e2e

PROMPTS = random_prompts(8, TargetSpec().vocab_size, seed=31, min_len=2, max_len=50)
BATCH = {"max_num_seqs": 8, "max_num_batched_tokens": 1024}
TP2 = {"tensor_parallel_size": 2, "distributed_executor_backend": "mp"}


def greedy():
    from vllm import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)


@pytest.fixture(scope="module")
def tp1_target_only(engines, tiny_target):
    return generate_ids(engines.get(model=str(tiny_target), **BATCH), PROMPTS, greedy())


@pytest.mark.parametrize(("name", "settings"), VARIANTS, ids=[v[0] for v in VARIANTS])
def test_every_variant_at_tp2_matches_tp1_target_only(engines, tiny_target, tiny_domino,
                                                      tp1_target_only, one_core_per_rank,
                                                      name, settings):
    llm = engines.get(model=str(tiny_target), **BATCH, **TP2, speculative_config={
        "method": "dartree", "model": str(tiny_domino), **settings})
    assert generate_ids(llm, PROMPTS, greedy()) == tp1_target_only
    assert spec_decode_counters(llm)["num_drafts"] > 0


@pytest.mark.parametrize("drafter", ["tiny_dspark", "tiny_dspark_reduced"])
def test_dspark_markov_head_at_tp2_matches_tp1_target_only(request, engines, tiny_target,
                                                           tp1_target_only, one_core_per_rank,
                                                           drafter):
    """The Markov head's weights are replicated on every rank (as in vLLM): trees over a
    DSpark drafter, with the full and with a reduced draft vocabulary, stay lossless."""
    llm = engines.get(model=str(tiny_target), **BATCH, **TP2, speculative_config={
        "method": "dartree", "model": str(request.getfixturevalue(drafter)),
        "num_speculative_tokens": 24, "width": 6, "top_k": 16})
    assert generate_ids(llm, PROMPTS, greedy()) == tp1_target_only
    assert spec_decode_counters(llm)["num_drafts"] > 0


@pytest.mark.parametrize("width", [6, "auto"])
def test_the_adaptive_verification_at_tp2_matches_tp1_target_only(engines, tiny_target, tiny_domino,
                                                           tp1_target_only, one_core_per_rank,
                                                           width):
    """Each rank times its own steps, so only rank 0's counts reach the scheduler and rank
    0's drafting decision is broadcast (the drafter's forward runs collectives); the trees,
    in priority order, are the same on both ranks whatever the counts. An auto width follows
    the counts the scheduler sent (the same on both ranks), so it agrees too."""
    llm = engines.get(model=str(tiny_target), **BATCH, **TP2, speculative_config={
        "method": "dartree", "model": str(tiny_domino), "budget_policy": "adaptive",
        "num_speculative_tokens": 24, "width": width, "top_k": 16})
    with counting_draft_rpcs(llm) as calls:  # drafts come back with rank 0's tokens
        assert generate_ids(llm, PROMPTS, greedy()) == tp1_target_only
    counters = spec_decode_counters(llm)
    assert 0 < counters["num_draft_tokens"] < 24 * counters["num_drafts"]
    assert calls == []
