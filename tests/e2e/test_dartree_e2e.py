"""`method: "dartree"` in real vLLM (CPU, float32): lossless for every tree variant and
through the scheduler's corner cases, seeded sampling reproducible."""

from __future__ import annotations

import pytest
from variants import VARIANTS as TREE_VARIANTS

from vllm_dartree.config import CPU_DEFAULTS
from vllm_dartree.harness.engine import generate_ids, spec_decode_counters
from vllm_dartree.models.tiny import TargetSpec, random_prompts
from vllm_dartree.testing.draft_rpcs import counting_draft_rpcs
from vllm_dartree.testing.plans import counting_branched_trees

pytestmark = pytest.mark.e2e

VOCAB = TargetSpec().vocab_size
PROMPTS = random_prompts(16, VOCAB, seed=21, min_len=2, max_len=60)
BATCH = {"max_num_seqs": 16, "max_num_batched_tokens": 2048}


def params(max_tokens=40, **kwargs):
    from vllm import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, **kwargs)


def dartree(drafter, **settings):
    return {"method": "dartree", "model": str(drafter), **settings}


@pytest.fixture(scope="module")
def baseline(engines, tiny_target):
    return generate_ids(engines.get(model=str(tiny_target), **BATCH), PROMPTS, params())


VARIANTS = [
    *TREE_VARIANTS,
    ("pruned-small-budget", {"num_speculative_tokens": 20, "width": 4, "top_k": 8}),
    # B below the drafter's 15 mask slots: vLLM's drafter buffers must still fit a block.
    ("pruned-budget-below-block", {"num_speculative_tokens": 6, "width": 3, "top_k": 8}),
]


@pytest.mark.parametrize(("name", "settings"), VARIANTS, ids=[v[0] for v in VARIANTS])
def test_every_variant_matches_target_only(engines, tiny_target, tiny_domino, baseline, name,
                                           settings):
    llm = engines.get(model=str(tiny_target), speculative_config=dartree(tiny_domino, **settings),
                      **BATCH)
    assert generate_ids(llm, PROMPTS, params()) == baseline
    counters = spec_decode_counters(llm)
    budget = settings.get("num_speculative_tokens", CPU_DEFAULTS["num_speculative_tokens"])
    assert counters["num_drafts"] > 0
    # Every step schedules the full tree, except where vLLM trims drafts at max_tokens.
    assert 0.9 * budget * counters["num_drafts"] <= counters["num_draft_tokens"]
    assert counters["num_draft_tokens"] <= budget * counters["num_drafts"]


@pytest.mark.parametrize("tree", ["ddtree", "chain"])
def test_zlab_dflash_drafter_is_lossless(engines, tiny_target, tiny_dflash, baseline, tree):
    llm = engines.get(model=str(tiny_target), speculative_config=dartree(tiny_dflash, tree=tree),
                      **BATCH)
    assert generate_ids(llm, PROMPTS, params()) == baseline


DSPARK_VARIANTS = [
    ("pruned", "tiny_dspark", {"num_speculative_tokens": 24, "width": 6, "top_k": 16}),
    ("chain", "tiny_dspark", {"tree": "chain", "num_speculative_tokens": 7}),
    ("fixed", "tiny_dspark", {"tree": "fixed", "num_speculative_tokens": 24, "top_k": 16}),
    ("pruned-reduced-vocab", "tiny_dspark_reduced", {}),
    # Adaptive verification reads the confidence head's chain survival.
    ("adaptive-confidence", "tiny_dspark", {"budget_policy": "adaptive",
                                            "num_speculative_tokens": 24, "width": 6,
                                            "top_k": 16}),
]


@pytest.mark.parametrize(("name", "drafter", "settings"), DSPARK_VARIANTS,
                         ids=[v[0] for v in DSPARK_VARIANTS])
def test_dspark_drafter_is_lossless(request, engines, tiny_target, baseline, name, drafter,
                                    settings):
    """A DSpark-format checkpoint (block 7, Markov head) as ``model``: its Markov head
    corrects chain and trees, and the output is target-only greedy decoding's."""
    llm = engines.get(model=str(tiny_target), **BATCH, speculative_config=dartree(
        request.getfixturevalue(drafter), **settings))
    assert generate_ids(llm, PROMPTS, params()) == baseline
    assert spec_decode_counters(llm)["num_drafts"] > 0


def test_a_reduced_draft_vocabulary_is_lossless(engines, tiny_target, tiny_domino_reduced,
                                                baseline):
    """A Domino drafter whose lm_head keeps 300 of 512 ids (vLLM scatters its logits into
    the full vocabulary): trees draft only kept ids, the output stays target-only decoding's,
    and drafts are still accepted."""
    llm = engines.get(model=str(tiny_target), speculative_config=dartree(tiny_domino_reduced),
                      **BATCH)
    assert generate_ids(llm, PROMPTS, params()) == baseline
    counters = spec_decode_counters(llm)
    assert counters["num_drafts"] > 0 and counters["num_accepted_tokens"] > 0


@pytest.mark.parametrize("settings", [{}, {"budget_policy": "adaptive"}],
                         ids=["fixed", "adaptive"])
def test_drafts_come_back_with_the_sampled_tokens(engines, tiny_target, tiny_domino, baseline,
                                                   settings):
    """The engine core never asks the worker for the next drafts in a call of their own
    (integration/draft_handoff.py); the drafts it schedules still give AR's output."""
    llm = engines.get(model=str(tiny_target), speculative_config=dartree(tiny_domino, **settings),
                      **BATCH)
    drafted_before = spec_decode_counters(llm).get("num_drafts", 0)
    with counting_draft_rpcs(llm) as calls:
        assert generate_ids(llm, PROMPTS, params()) == baseline
    assert spec_decode_counters(llm)["num_drafts"] > drafted_before
    assert calls == []


def test_stops_and_lengths_cut_exactly(engines, tiny_target, tiny_domino, baseline):
    """max_tokens, stop tokens and EOS falling inside an accepted path end the output
    exactly where target-only decoding ends it."""
    from vllm import SamplingParams

    stop_token = baseline[0][5]
    sampling = [SamplingParams(temperature=0.0, max_tokens=3 + (7 * i) % 37, ignore_eos=i % 2 == 0,
                               stop_token_ids=[stop_token] if i % 3 == 0 else None)
                for i in range(len(PROMPTS))]
    expected = generate_ids(engines.get(model=str(tiny_target), **BATCH), PROMPTS, sampling)
    llm = engines.get(model=str(tiny_target), speculative_config=dartree(tiny_domino), **BATCH)
    assert generate_ids(llm, PROMPTS, sampling) == expected


def test_near_max_model_len_and_chunked_prefill(engines, tiny_target, tiny_domino):
    """Long prompts prefilled in chunks, generation running into max_model_len. Steps that
    mix prefill chunks with tree verification (vLLM's kernel, then the tree rows) and steps
    of tree rows only (the stock kernel skipped) both occur, and both are exact."""
    from vllm_dartree.step.profile import StepProfile

    prompts = random_prompts(6, VOCAB, seed=4, min_len=150, max_len=230)
    engine = {"max_model_len": 256, "max_num_seqs": 8, "max_num_batched_tokens": 128,
              "enable_chunked_prefill": True}
    sampling = params(max_tokens=200)
    expected = generate_ids(engines.get(model=str(tiny_target), **engine), prompts, sampling)
    assert all(len(p) + len(o) == 256 for p, o in zip(prompts, expected))
    llm = engines.get(model=str(tiny_target), speculative_config=dartree(tiny_domino), **engine)
    with StepProfile.recording() as rounds:
        assert generate_ids(llm, prompts, sampling) == expected
    trees = [r for r in rounds if r.get("tree_attention")]
    assert any(r.get("stock_attention") for r in trees)  # mixed steps
    assert any(not r.get("stock_attention") for r in trees)  # tree rows only


def test_one_request_reaching_max_model_len_while_others_decode(engines, tiny_target,
                                                               tiny_domino):
    """Near max_model_len the long request's trees are cut to the rows that fit (down to
    none) while the others keep drafting; output identical, no crash."""
    prompts = (random_prompts(1, VOCAB, seed=41, min_len=100, max_len=100)
               + random_prompts(5, VOCAB, seed=42, min_len=4, max_len=10))
    engine = {"max_model_len": 160, "max_num_seqs": 8, "max_num_batched_tokens": 512}
    sampling = params(max_tokens=120)
    expected = generate_ids(engines.get(model=str(tiny_target), **engine), prompts, sampling)
    assert len(prompts[0]) + len(expected[0]) == 160  # the long request hits the limit
    assert all(len(out) == 120 for out in expected[1:])  # the others run past that point
    llm = engines.get(model=str(tiny_target), **engine, speculative_config=dartree(
        tiny_domino, num_speculative_tokens=24, width=4, top_k=8))
    assert generate_ids(llm, prompts, sampling) == expected


def test_prefix_caching_and_preemption(engines, tiny_target, tiny_domino, preemptions):
    """Shared prefixes with prefix caching on, and a KV cache of 40 blocks of 32 tokens:
    requests are preempted (counted) and resumed."""
    stem = random_prompts(1, VOCAB, seed=8, min_len=140, max_len=140)[0]
    prompts = [stem + tail for tail in random_prompts(12, VOCAB, seed=9, min_len=1, max_len=30)]
    engine = {"max_model_len": 384, "max_num_seqs": 12, "max_num_batched_tokens": 1024,
              "enable_prefix_caching": True, "block_size": 32, "num_gpu_blocks_override": 40}
    sampling = params(max_tokens=120)
    expected = generate_ids(engines.get(model=str(tiny_target), **engine), prompts, sampling)
    llm = engines.get(model=str(tiny_target), speculative_config=dartree(tiny_domino), **engine)
    preemptions.clear()
    assert generate_ids(llm, prompts, sampling) == expected
    assert preemptions


def test_a_batch_with_penalties_verifies_trees_exactly(engines, tiny_target, tiny_domino):
    """Penalties count each tree row's path (its context in target-only decoding): a batch
    where every request has them verifies branching trees and decodes as target-only
    (mixed batches: test_mixed_sampling_e2e.py)."""
    from vllm import SamplingParams

    sampling = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True,
                              repetition_penalty=1.3, presence_penalty=0.5)
    expected = generate_ids(engines.get(model=str(tiny_target), **BATCH), PROMPTS[:6], sampling)
    llm = engines.get(model=str(tiny_target), speculative_config=dartree(tiny_domino), **BATCH)
    with counting_branched_trees() as branched:
        assert generate_ids(llm, PROMPTS[:6], sampling) == expected
    assert sum(branched) > 0


def test_seeded_sampling_is_reproducible(engines, tiny_target, tiny_domino):
    from vllm import SamplingParams

    llm = engines.get(model=str(tiny_target), speculative_config=dartree(tiny_domino), **BATCH)

    def run(seed_offset):
        sampling = [SamplingParams(temperature=1.0, top_p=0.95, top_k=50, seed=seed_offset + i,
                                   max_tokens=30, ignore_eos=True) for i in range(8)]
        return generate_ids(llm, PROMPTS[:8], sampling)

    first, again, other = run(0), run(0), run(1000)
    assert first == again
    assert first != other


ADAPTIVE = {"budget_policy": "adaptive", "num_speculative_tokens": 24, "width": 6,
            "top_k": 16}


def test_an_auto_width_stays_within_its_bounds_and_lossless(engines, tiny_target, tiny_domino,
                                                            baseline):
    """``width: "auto"``: every drafted step's pruned tree is between ceil(B / D) and the
    default width wide (the CPU's here), read off the width histogram the budget exports;
    output stays target-only decoding's. (How the width follows the counts: test_adaptive.)"""
    from prometheus_client import REGISTRY

    from vllm_dartree.config import parse_speculative_config

    def width_samples() -> tuple[float, float]:
        return tuple(REGISTRY.get_sample_value(f"vllm_dartree:budget_width_{part}") or 0.0
                     for part in ("sum", "count"))

    settings = ADAPTIVE | {"width": "auto"}
    llm = engines.get(model=str(tiny_target), speculative_config=dartree(tiny_domino, **settings),
                      **BATCH)
    before = width_samples()
    assert generate_ids(llm, PROMPTS, params()) == baseline
    total, steps = (a - b for a, b in zip(width_samples(), before))
    assert steps > 0
    widest = parse_speculative_config(dartree(tiny_domino, **settings), on_cpu=True).max_width
    narrowest = -(-24 // 16)  # B = 24 nodes over the tiny Domino drafter's 16 depths
    assert narrowest * steps <= total <= widest * steps


def test_the_adaptive_verification_is_lossless_through_every_kind_of_step(engines, tiny_target,
                                                                     tiny_domino, baseline):
    """Its start-up probes alone give steps with the whole tree, with part of it, with no
    node for any request, and without drafting; output stays target-only decoding's."""
    from vllm_dartree.step.policy_report import PolicyReport

    llm = engines.get(model=str(tiny_target), speculative_config=dartree(tiny_domino, **ADAPTIVE),
                      **BATCH)
    steps: list[list[int] | None] = []
    with PolicyReport.observing(steps.append):
        assert generate_ids(llm, PROMPTS, params()) == baseline
    drafted = [counts for counts in steps if counts is not None]
    assert None in steps  # a step that did not draft
    assert any(sum(c) == 0 for c in drafted)  # a step that verified no node at all
    assert any(0 < sum(c) < 24 * len(c) for c in drafted)  # part of the trees
    assert all(0 <= n <= 24 for c in drafted for n in c)
    counters = spec_decode_counters(llm)
    assert 0 < counters["num_draft_tokens"] < 24 * counters["num_drafts"]  # rows not verified

