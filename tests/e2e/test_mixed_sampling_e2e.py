"""A batch of mixed sampling parameters on a dartree engine (V1 runner): the requests whose
sampling reads the drafted prefix (penalties, allowed token ids, logprobs) verify as chains
of their own, through vLLM's rejection sampler, in the same step as the other requests'
trees; every request decodes as it does target-only, and the plain requests keep the
acceptance they have in a batch of their own."""

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
VARIANTS = [("pruned-cpu-defaults", {}), ("fixed", {"tree": "fixed", "top_k": 32})]


@pytest.fixture(scope="module")
def target_only(engines, pair):
    llm = engines.get(model=str(pair[0]), **ENGINE)
    out = generate(llm, EVERY)
    check_parameters_change_tokens(out, generate(llm, EVERY, mixed=False))
    return out


@pytest.mark.parametrize(("name", "settings"), VARIANTS, ids=[v[0] for v in VARIANTS])
def test_mixed_batch_matches_target_only_request_by_request(engines, pair, target_only,
                                                            name, settings):
    llm = engines.get(model=str(pair[0]), **ENGINE, speculative_config={
        "method": "dartree", "model": str(pair[1]), **settings})
    out, mixed_acceptance = tree_acceptance(llm, EVERY, mixed=True)
    # V1 draws seeded requests in tree order: the same distribution, other tokens.
    for i in EVERY:
        if i not in SEEDED:
            assert out[i][0] == target_only[i][0], (i, READERS.get(i))
    logprobs = next(i for i, keys in READERS.items() if "logprobs" in keys)
    check_logprobs(target_only[logprobs][1], out[logprobs][1])
    _, alone = tree_acceptance(llm, PLAIN, mixed=False)
    for i in PLAIN:
        assert mixed_acceptance[i] >= 0.95 * alone[i], (i, mixed_acceptance[i], alone[i])
    assert sum(alone.values()) / len(alone) > 1.5  # drafts are accepted


def test_mixed_batch_at_tp2_matches_target_only(engines, pair, target_only,
                                                one_core_per_rank):
    """The mixed batch at TP=2 (mp executor), against TP=1 target-only."""
    llm = engines.get(model=str(pair[0]), **ENGINE, tensor_parallel_size=2,
                      distributed_executor_backend="mp", speculative_config={
                          "method": "dartree", "model": str(pair[1])})
    out = generate(llm, EVERY)
    for i in EVERY:
        if i not in SEEDED:
            assert out[i][0] == target_only[i][0], (i, READERS.get(i))
    logprobs = next(i for i, keys in READERS.items() if "logprobs" in keys)
    check_logprobs(target_only[logprobs][1], out[logprobs][1])


def test_structured_outputs_beside_trees_match_target_only(engines):
    """Regex and choice requests (their drafts chains, the grammar's bitmask in chain order)
    beside plain requests' trees: every text equals target-only's, and the grammar changes
    every constrained request's text."""
    check_structured_outputs_beside_trees(engines)
