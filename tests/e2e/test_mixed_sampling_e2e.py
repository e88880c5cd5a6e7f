"""A batch of mixed sampling parameters on a dartree engine, on the runner of the suite that
collects it (the V1 suite here; the V2 suite through ``tests/v2/test_v2_mixed_sampling.py``).
Every parameter of the batch (penalties, allowed token ids, logprobs, min_tokens, logit
bias, min p) is applied on trees, row by row: a penalized row counts its own path, a
min_tokens row its depth (V1: ``integration/v1/sampling.py``; V2: vLLM's sampler at the
row's depth position, ``integration/v2/penalties.py``). Grammars verify as chains of their
own beside plain requests' trees (the structured test). Every request decodes as it does
target-only (V1's seeded requests: the same distribution, other tokens), and the plain
requests keep the acceptance they have in a batch of their own."""

from __future__ import annotations

import os

import pytest
from mixed_case import (
    ENGINE,
    PLAIN,
    PROMPTS,
    READERS,
    SEEDED,
    check_logprobs,
    check_parameters_change_tokens,
    check_structured_outputs_beside_trees,
    generate,
    tree_acceptance,
)

pytestmark = pytest.mark.e2e

ON_V2 = os.environ.get("VLLM_USE_V2_MODEL_RUNNER") == "1"
EVERY = list(range(len(PROMPTS)))
# V2 draws by seed and position: seeded requests equal target-only token for token there.
EXACT = EVERY if ON_V2 else [i for i in EVERY if i not in SEEDED]
# (name, speculative-config keys, engine keys); V2 also on the CUDA path: vLLM's TRITON_ATTN
# with the Triton tree attention and KV mover (every kernel in Triton's interpreter).
VARIANTS = [("pruned-cpu-defaults", {}, {}), ("fixed", {"tree": "fixed", "top_k": 32}, {}),
            *([("pruned-cuda-path", {}, {"attention_backend": "TRITON_ATTN"})] if ON_V2
              else [])]


@pytest.fixture(scope="module")
def target_only(engines, pair):
    llm = engines.get(model=str(pair[0]), **ENGINE)
    out = generate(llm, EVERY)
    check_parameters_change_tokens(out, generate(llm, EVERY, mixed=False))
    return out


@pytest.mark.parametrize(("name", "settings", "engine"), VARIANTS,
                         ids=[v[0] for v in VARIANTS])
def test_mixed_batch_matches_target_only_request_by_request(engines, pair, target_only,
                                                            name, settings, engine):
    llm = engines.get(model=str(pair[0]), **ENGINE, **engine, speculative_config={
        "method": "dartree", "model": str(pair[1]), **settings})
    out, mixed_acceptance = tree_acceptance(llm, EVERY, mixed=True)
    for i in EXACT:
        assert out[i][0] == target_only[i][0], (i, READERS.get(i), SEEDED.get(i))
    logprobs = next(i for i, keys in READERS.items() if "logprobs" in keys)
    check_logprobs(target_only[logprobs][1], out[logprobs][1])
    _, alone = tree_acceptance(llm, PLAIN, mixed=False)
    for i in PLAIN:
        assert mixed_acceptance[i] >= 0.95 * alone[i], (i, mixed_acceptance[i], alone[i])
    assert sum(alone.values()) / len(alone) > 1.5  # drafts are accepted


@pytest.mark.skipif(ON_V2, reason="TP=2 runs in the V1 suite (one mixed case at TP=2)")
def test_mixed_batch_at_tp2_matches_target_only(engines, pair, target_only,
                                                one_core_per_rank):
    """The mixed batch at TP=2 (mp executor), against TP=1 target-only."""
    llm = engines.get(model=str(pair[0]), **ENGINE, tensor_parallel_size=2,
                      distributed_executor_backend="mp", speculative_config={
                          "method": "dartree", "model": str(pair[1])})
    out = generate(llm, EVERY)
    for i in EXACT:
        assert out[i][0] == target_only[i][0], (i, READERS.get(i))
    logprobs = next(i for i, keys in READERS.items() if "logprobs" in keys)
    check_logprobs(target_only[logprobs][1], out[logprobs][1])


def test_structured_outputs_beside_trees_match_target_only(engines):
    """Regex and choice requests (their drafts chains, the grammar's bitmask in chain order)
    beside plain requests' trees: every text equals target-only's, and the grammar changes
    every constrained request's text."""
    check_structured_outputs_beside_trees(engines)
