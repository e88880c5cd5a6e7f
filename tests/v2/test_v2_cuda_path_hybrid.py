"""Exact trees on hybrid Gated-DeltaNet targets on the CUDA path (``integration/gpu_gdn.py``):
vLLM's Triton GDN layer (``forward_cuda``) and TRITON_ATTN, every kernel in Triton's
interpreter (``tests/v2/site``: an engine asking for ``attention_backend="TRITON_ATTN"``).

Fixtures laid out as the released models (three GDN layers, one attention layer, twice), GDN
head dim 32 (the Triton path takes any; vLLM's CPU op needs 128), float16 (vLLM's Triton
GDN prefill refuses float32, and the interpreter computes bfloat16 as raw bits); their GDN
layers decide 0.76 (Qwen3-Next) and 0.87 (Qwen3.5) of float32 greedy tokens
(``benchmarks/hybrid_gdn_share.py``). Prompts: those whose float32 greedy margins stay at
least MIN_MARGIN logits, on which float16 target-only decoding equals float32 greedy
decoding; every variant must equal target-only decoding.

The broken-state test injects the defects a tree step on GDN layers can have (the accepted
path's state left in its tree slot, the conv window one step off) and sees tokens change.
"""

from __future__ import annotations

import pytest
from conftest import float32_clear_prompts

from vllm_dartree.harness.engine import generate_ids, spec_decode_counters
from vllm_dartree.models.tiny import TRITON_HYBRID_TARGET, random_prompts

pytestmark = pytest.mark.e2e

ENGINE = {"attention_backend": "TRITON_ATTN", "dtype": "float16", "max_num_seqs": 8,
          "max_num_batched_tokens": 1024}
QWEN3_5 = {**ENGINE, "language_model_only": True}  # no image processor here
TP2 = {"tensor_parallel_size": 2, "distributed_executor_backend": "mp"}
TREE = {"num_speculative_tokens": 12, "width": 4, "top_k": 8}
CANDIDATES = random_prompts(48, TRITON_HYBRID_TARGET.vocab_size, seed=21, min_len=2,
                            max_len=40)
MAX_TOKENS = 12
MIN_MARGIN = 0.15
NUM_PROMPTS = 4

def clear_prompts(model: str, cls: str) -> tuple[list[list[int]], list[list[int]]]:
    """(prompts, float32 greedy outputs): the first NUM_PROMPTS candidates whose float32
    greedy margins stay >= MIN_MARGIN."""
    prompts, outputs = float32_clear_prompts(model, cls, CANDIDATES, MAX_TOKENS, MIN_MARGIN,
                                             NUM_PROMPTS)
    assert len(prompts) == NUM_PROMPTS, f"{len(prompts)} candidates have clear margins"
    return prompts, outputs


def greedy():
    from vllm import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)


def dartree(drafter, **settings):
    return {"method": "dartree", "model": str(drafter), **settings}


def gdn_paths(llm) -> set[str]:
    layers = llm.llm_engine.vllm_config.compilation_config.static_forward_context
    return {layer._forward_method.__name__ for layer in layers.values()
            if type(layer).__name__ == "QwenGatedDeltaNetAttention"}


@pytest.fixture(scope="module")
def target_only(engines, tiny_triton_hybrid_target):
    prompts, float32_outputs = clear_prompts(str(tiny_triton_hybrid_target),
                                             "Qwen3NextForCausalLM")
    llm = engines.get(model=str(tiny_triton_hybrid_target), **ENGINE)
    assert gdn_paths(llm) == {"forward_cuda"}
    assert generate_ids(llm, prompts, greedy()) == float32_outputs
    return prompts, float32_outputs


def test_a_broken_gdn_state_changes_tokens(engines, tiny_triton_hybrid_target,
                                           tiny_triton_hybrid_domino, target_only,
                                           monkeypatch):
    """The pruned tree of the Domino drafter (the first of every tree on this path) equals
    target-only decoding on the Triton GDN layer, with accepted paths off their tree's first
    branch (their state and conv inputs really move); with the accepted path's state left
    where the tree put it (no commit), or with each request's conv inputs written one column
    late, it gives other tokens."""
    import torch

    from vllm_dartree.integration import gdn_rows, gpu_gdn

    llm = engines.get(model=str(tiny_triton_hybrid_target), **ENGINE,
                      speculative_config=dartree(tiny_triton_hybrid_domino, **TREE))
    assert gdn_paths(llm) == {"forward_cuda"}
    prompts, expected = target_only
    moved = []
    commit = gdn_rows.commit_accepted_paths

    def counting(recorded, paths):
        nodes = paths.accepted_nodes
        column = torch.arange(nodes.shape[1], device=nodes.device)
        moved.append(int(((nodes >= 0) & (nodes != column)).any(dim=1).sum()))
        commit(recorded, paths)

    with monkeypatch.context() as patch:
        patch.setattr(gdn_rows, "commit_accepted_paths", counting)
        assert generate_ids(llm, prompts, greedy()) == expected
    assert sum(moved) > 0
    with monkeypatch.context() as patch:
        patch.setattr(gdn_rows, "commit_accepted_paths", lambda recorded, paths: None)
        assert generate_ids(llm, prompts, greedy()) != expected
    shift = gdn_rows.shift_conv_windows

    def one_column_late(conv_state, rows, x):
        shift(conv_state, rows, x)
        conv_state[rows.window_slot] = conv_state[rows.window_slot].roll(1, dims=-1)

    with monkeypatch.context() as patch:
        patch.setattr(gpu_gdn, "shift_conv_windows", one_column_late)
        assert generate_ids(llm, prompts, greedy()) != expected


# The Domino pruned tree is the broken-state test's own engine (above).
VARIANTS = [
    ("domino-fixed", "tiny_triton_hybrid_domino", {"tree": "fixed", "num_speculative_tokens": 12,
                                                   "top_k": 8}),
    ("domino-ddtree", "tiny_triton_hybrid_domino", {"tree": "ddtree",
                                                    "num_speculative_tokens": 12}),
    ("domino-adaptive", "tiny_triton_hybrid_domino", TREE | {"budget_policy": "adaptive"}),
    ("dspark-pruned", "tiny_triton_hybrid_dspark", TREE),
]


@pytest.mark.parametrize(("name", "drafter", "settings"), VARIANTS,
                         ids=[v[0] for v in VARIANTS])
def test_every_tree_on_a_hybrid_target_on_the_cuda_path(request, engines,
                                                        tiny_triton_hybrid_target, target_only,
                                                        name, drafter, settings):
    llm = engines.get(model=str(tiny_triton_hybrid_target), **ENGINE,
                      speculative_config=dartree(request.getfixturevalue(drafter), **settings))
    prompts, expected = target_only
    assert gdn_paths(llm) == {"forward_cuda"}
    assert generate_ids(llm, prompts, greedy()) == expected
    counters = spec_decode_counters(llm)
    assert counters["num_accepted_tokens"] > 0, counters


def test_qwen3_5_trees_on_the_cuda_path(engines, tiny_triton_qwen3_5_target,
                                        tiny_triton_qwen3_5_domino):
    """Qwen3.5 as released (M-RoPE, its own GDN projection layout), text requests."""
    prompts, expected = clear_prompts(str(tiny_triton_qwen3_5_target),
                                      "Qwen3_5ForConditionalGeneration")
    llm = engines.get(model=str(tiny_triton_qwen3_5_target), **QWEN3_5)
    assert gdn_paths(llm) == {"forward_cuda"}
    assert generate_ids(llm, prompts, greedy()) == expected
    llm = engines.get(model=str(tiny_triton_qwen3_5_target), **QWEN3_5,
                      speculative_config=dartree(tiny_triton_qwen3_5_domino, **TREE))
    assert generate_ids(llm, prompts, greedy()) == expected
    assert spec_decode_counters(llm)["num_accepted_tokens"] > 0


@pytest.mark.parametrize(("drafter", "settings"), [
    ("tiny_triton_hybrid_domino", TREE),
    ("tiny_triton_hybrid_dspark", TREE | {"budget_policy": "adaptive"}),
], ids=["domino-pruned", "dspark-adaptive"])
def test_trees_at_tp2_on_a_hybrid_target_on_the_cuda_path(request, engines,
                                                          tiny_triton_hybrid_target,
                                                          target_only, one_core_per_rank,
                                                          drafter, settings):
    llm = engines.get(model=str(tiny_triton_hybrid_target), **ENGINE, **TP2,
                      speculative_config=dartree(request.getfixturevalue(drafter), **settings))
    prompts, expected = target_only
    assert generate_ids(llm, prompts, greedy()) == expected
    assert spec_decode_counters(llm)["num_accepted_tokens"] > 0
