"""The CUDA path on this CPU: vLLM's TRITON_ATTN backend (what a GPU engine runs), the
plugin's Triton tree attention over its pages and the Triton KV mover, every kernel in
Triton's interpreter (``tests/v2/site``: an engine asking for ``attention_backend=
"TRITON_ATTN"`` gets it). The tiny trained pair (so drafts are accepted and the KV mover
moves), float32: every variant equals target-only decoding on the same path.

A fixture that can fail: on the pruned engine, tree rows without the tree recompute (the
stock causal kernel alone) or without the KV move give other tokens
(:func:`test_the_lane_sees_a_missing_tree_mask_or_kv_move`).
"""

from __future__ import annotations

import pytest
from conftest import v1_target_only

from vllm_dartree.harness.engine import generate_ids, spec_decode_counters
from vllm_dartree.models.tiny import random_prompts
from vllm_dartree.testing.draft_rpcs import counting_draft_rpcs

pytestmark = pytest.mark.e2e

TRITON = {"attention_backend": "TRITON_ATTN", "max_num_seqs": 8, "max_num_batched_tokens": 1024}
PROMPTS = random_prompts(6, 32, seed=5, min_len=4, max_len=20)
MAX_TOKENS = 32
TP2 = {"tensor_parallel_size": 2, "distributed_executor_backend": "mp"}
TREE = {"num_speculative_tokens": 16, "width": 4, "top_k": 8}


def greedy(max_tokens=MAX_TOKENS):
    from vllm import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


def seeded():
    """T > 0 with a seed per request: V2 draws each token from (seed, position), so the
    output is exactly the seeded target-only output. No top-k/top-p: vLLM's kernel for them
    does not run in the interpreter."""
    from vllm import SamplingParams

    return [SamplingParams(temperature=0.8, seed=100 + i, max_tokens=MAX_TOKENS,
                           ignore_eos=True) for i in range(len(PROMPTS))]


def dartree(drafter, **settings):
    return {"method": "dartree", "model": str(drafter), **settings}


def attention_impls(llm) -> set[str]:
    """The attention impls of the target's layers (the drafter's are vLLM's choice for a
    non-causal drafter: here its CPU backend, on a GPU one of its own)."""
    layers = llm.llm_engine.vllm_config.compilation_config.static_forward_context
    return {type(layer.impl).__name__ for layer in layers.values()
            if hasattr(layer, "impl") and not getattr(layer, "is_draft_layer", False)}


@pytest.fixture(scope="module")
def reference(engines, pair):
    """Target-only output on the lane (greedy and seeded), equal to the CPU backend's."""
    target, _ = pair
    llm = engines.get(model=str(target), **TRITON)
    # vLLM's Triton backend (the tree subclass once dartree was activated in this process: it
    # runs the stock kernel for an engine without trees).
    assert len(attention_impls(llm) & {"TritonAttentionImpl", "TreeTritonAttentionImpl"}) == 1
    expected = generate_ids(llm, PROMPTS, greedy())
    cpu = {k: v for k, v in TRITON.items() if k != "attention_backend"}
    assert expected == v1_target_only(str(target), PROMPTS, MAX_TOKENS, cpu)
    return expected, generate_ids(llm, PROMPTS, seeded())


class CountingMover:
    """Counts the Triton KV mover's launches that move something (``copy_kv_slots``)."""

    def __init__(self, monkeypatch) -> None:
        from vllm_dartree.integration import gpu_attention

        self.moves = 0
        copy = gpu_attention.copy_kv_slots

        def counting(caches, src, dst, table):
            self.moves += int((src != dst).any())
            return copy(caches, src, dst, table)

        monkeypatch.setattr(gpu_attention, "copy_kv_slots", counting)


def test_seeded_sampling_on_the_cuda_path_equals_target_only(engines, pair, reference):
    target, drafter = pair
    llm = engines.get(model=str(target), **TRITON, speculative_config=dartree(drafter, **TREE))
    assert generate_ids(llm, PROMPTS, seeded()) == reference[1]


def test_the_lane_sees_a_missing_tree_mask_or_kv_move(engines, pair, reference, monkeypatch):
    """The fixture can fail: the pruned engine with the tree recompute off (tree rows see
    their non-ancestors through the stock causal kernel), then with the KV move off,
    gives other tokens than target-only decoding; with both on, the same."""
    from vllm_dartree.integration import gpu_attention

    target, drafter = pair
    llm = engines.get(model=str(target), **TRITON, speculative_config=dartree(drafter, **TREE))
    with monkeypatch.context() as patch:
        patch.setattr(gpu_attention, "tree_attention", lambda *args, **kwargs: None)
        assert generate_ids(llm, PROMPTS, greedy()) != reference[0]
    with monkeypatch.context() as patch:
        patch.setattr(gpu_attention, "copy_kv_slots", lambda *args: None)
        assert generate_ids(llm, PROMPTS, greedy()) != reference[0]
    assert generate_ids(llm, PROMPTS, greedy()) == reference[0]


VARIANTS = [
    ("pruned", TREE),
    ("fixed", {"tree": "fixed", "num_speculative_tokens": 16, "top_k": 8}),
    ("ddtree", {"tree": "ddtree", "num_speculative_tokens": 16}),
    ("domino-chain", {"tree": "chain", "num_speculative_tokens": 15}),
    ("dflash-chain", {"tree": "chain", "correction": False, "num_speculative_tokens": 15}),
    ("adaptive", TREE | {"budget_policy": "adaptive"}),
]


@pytest.mark.parametrize(("name", "settings"), VARIANTS, ids=[v[0] for v in VARIANTS])
def test_every_variant_on_the_cuda_path_matches_target_only(engines, pair, reference,
                                                            monkeypatch, name, settings):
    from vllm_dartree.integration.v2.model_state import DARTreeModelState
    from vllm_dartree.integration.v2.speculator import DARTreeSpeculator

    target, drafter = pair
    llm = engines.get(model=str(target), **TRITON, speculative_config=dartree(drafter,
                                                                              **settings))
    assert attention_impls(llm) == {"TreeTritonAttentionImpl"}
    runner = llm.llm_engine.model_executor.driver_worker.worker.model_runner
    assert isinstance(runner.speculator, DARTreeSpeculator)
    assert isinstance(runner.model_state, DARTreeModelState)
    mover = CountingMover(monkeypatch)
    # The drafts come back with the sampled tokens: no take_draft_token_ids call of their own
    # (integration/v2/draft_handoff.py).
    with counting_draft_rpcs(llm) as draft_rpcs:
        assert generate_ids(llm, PROMPTS, greedy()) == reference[0]
    assert draft_rpcs == []
    counters = spec_decode_counters(llm)
    assert counters["num_accepted_tokens"] > 0, counters
    if name == "pruned":  # the trained pair's trees are accepted well past one token
        assert 1 + counters["num_accepted_tokens"] / counters["num_drafts"] > 1.5, counters
        assert mover.moves > 0  # paths off the first branch: the Triton KV mover moved them


def test_the_dspark_head_on_the_cuda_path(engines, trained_tiny_dspark, pair, reference):
    target, drafter = trained_tiny_dspark
    assert target == pair[0]  # the same tiny trained target: the same reference
    llm = engines.get(model=str(target), **TRITON, speculative_config=dartree(
        drafter, num_speculative_tokens=14, width=4, top_k=8))
    assert generate_ids(llm, PROMPTS, greedy()) == reference[0]
    assert spec_decode_counters(llm)["num_accepted_tokens"] > 0


def test_max_model_len_chunked_prefill_and_preemption_on_the_cuda_path(engines, pair,
                                                                        preemptions):
    """Long prompts prefilled in chunks (longer than a step's token budget), a KV cache of 5
    blocks of 32 tokens (requests are preempted: counted), and requests that run into
    max_model_len while others decode."""
    target, drafter = pair
    prompts = (random_prompts(4, 32, seed=42, min_len=4, max_len=10)
               + random_prompts(2, 32, seed=41, min_len=70, max_len=80))
    engine = {**TRITON, "max_model_len": 96, "max_num_batched_tokens": 64,
              "enable_chunked_prefill": True, "block_size": 32, "num_gpu_blocks_override": 5}
    sampling = greedy(50)
    expected = generate_ids(engines.get(model=str(target), **engine), prompts, sampling)
    assert any(len(p) + len(out) == 96 for p, out in zip(prompts, expected))
    llm = engines.get(model=str(target), **engine, speculative_config=dartree(drafter, **TREE))
    preemptions.clear()
    assert generate_ids(llm, prompts, sampling) == expected
    assert preemptions
    assert spec_decode_counters(llm)["num_accepted_tokens"] > 0


@pytest.mark.parametrize("drafter_fixture", ["pair", "trained_tiny_dspark"])
def test_trees_at_tp2_on_the_cuda_path(request, engines, reference, one_core_per_rank,
                                       drafter_fixture):
    """Two ranks, one core each (mp executor; each worker loads the test site): the pruned
    tree with the Domino head, and with the DSpark head under adaptive verification (rank 0's
    decisions on every rank). Every other variant at TP=2 runs on V1
    (tests/e2e/test_tensor_parallel.py): the tree core is the same on both runners."""
    target, drafter = request.getfixturevalue(drafter_fixture)
    settings = TREE if drafter_fixture == "pair" else {
        "num_speculative_tokens": 14, "width": 4, "top_k": 8, "budget_policy": "adaptive"}
    llm = engines.get(model=str(target), **TRITON, **TP2,
                      speculative_config=dartree(drafter, **settings))
    assert generate_ids(llm, PROMPTS, greedy()) == reference[0]
    assert spec_decode_counters(llm)["num_accepted_tokens"] > 0
