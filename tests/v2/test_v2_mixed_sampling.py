"""A batch of mixed sampling parameters on a dartree engine (V2 runner, vLLM's CPU
attention): the requests whose sampling reads the drafted prefix (penalties) verify as
chains of their own, each row processed by vLLM's sampler in chain order, in the same step
as the other requests' trees; allowed token ids and logprobs are applied on trees, row by
row (logprobs from each sampled token's own node); every request decodes as it does
target-only, and the plain requests keep the acceptance they have in a batch of their
own."""

from __future__ import annotations

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

EVERY = list(range(len(PROMPTS)))
# (name, speculative-config keys, engine keys); the CUDA path: vLLM's TRITON_ATTN with the
# Triton tree attention and KV mover (every kernel in Triton's interpreter).
VARIANTS = [("pruned-cpu-defaults", {}, {}), ("fixed", {"tree": "fixed", "top_k": 32}, {}),
            ("pruned-cuda-path", {}, {"attention_backend": "TRITON_ATTN"})]


@pytest.fixture(scope="module")
def target_only(engines, pair):
    llm = engines.get(model=str(pair[0]), **ENGINE)
    out = generate(llm, EVERY)
    check_parameters_change_tokens(out, generate(llm, EVERY, mixed=False))
    return out


@pytest.mark.parametrize(("name", "settings", "engine"), VARIANTS,
                         ids=[v[0] for v in VARIANTS])
def test_mixed_batch_matches_target_only_request_by_request_on_v2(engines, pair, target_only,
                                                                  name, settings, engine):
    llm = engines.get(model=str(pair[0]), **ENGINE, **engine, speculative_config={
        "method": "dartree", "model": str(pair[1]), **settings})
    out, mixed_acceptance = tree_acceptance(llm, EVERY, mixed=True)
    # V2 draws by seed and position: seeded requests too, token for token.
    for i in EVERY:
        assert out[i][0] == target_only[i][0], (i, READERS.get(i), SEEDED.get(i))
    logprobs = next(i for i, keys in READERS.items() if "logprobs" in keys)
    check_logprobs(target_only[logprobs][1], out[logprobs][1])
    _, alone = tree_acceptance(llm, PLAIN, mixed=False)
    for i in PLAIN:
        assert mixed_acceptance[i] >= 0.95 * alone[i], (i, mixed_acceptance[i], alone[i])
    assert sum(alone.values()) / len(alone) > 1.5  # drafts are accepted


def test_structured_outputs_beside_trees_match_target_only_on_v2(engines):
    """Regex and choice requests (their drafts chains, the grammar's bitmask in chain order)
    beside plain requests' trees: every text equals target-only's, and the grammar changes
    every constrained request's text."""
    check_structured_outputs_beside_trees(engines)
