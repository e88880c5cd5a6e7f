"""A drafter really trained for its target: deep paths accepted, KV compaction moving rows,
and the output still identical to the target alone."""

from __future__ import annotations

import json

import pytest

from vllm_dartree.harness.engine import generate_ids, spec_decode_counters
from vllm_dartree.models.tiny import random_prompts

pytestmark = pytest.mark.e2e

BATCH = {"max_num_seqs": 16, "max_num_batched_tokens": 2048}
# The paper's B = 64, W = 12 (K capped at the pair's 32-token vocabulary).
PAPER = {"num_speculative_tokens": 64, "top_k": 32}
PAPER_SETTINGS = {"pruned": PAPER | {"width": 12}, "fixed": PAPER | {"tree": "fixed"},
                  "domino": PAPER | {"tree": "chain"},
                  "dflash": {"tree": "chain", "correction": False, "num_speculative_tokens": 64}}


@pytest.fixture(scope="module")
def prompts(pair):
    vocab = json.loads((pair[0] / "config.json").read_text())["vocab_size"]
    return random_prompts(16, vocab, seed=11)


def greedy(max_tokens=64):
    from vllm import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


@pytest.fixture(scope="module")
def baseline(engines, pair, prompts):
    return generate_ids(engines.get(model=str(pair[0]), **BATCH), prompts, greedy())


def _mean_acceptance(llm) -> float:
    counters = spec_decode_counters(llm)
    return 1 + counters["num_accepted_tokens"] / counters["num_drafts"]


@pytest.fixture(scope="module")
def measured(engines, pair, prompts, baseline):
    """Mean acceptance per variant, each run checked against target-only output."""
    import torch

    from vllm_dartree.integration.verifier import TreeVerifier

    moved = []

    def counting(accepted):  # count KV rows compaction actually moves
        nodes = accepted.accepted_nodes[:, 1:]
        depth = torch.arange(1, nodes.shape[1] + 1)
        moved.append(int(((nodes >= 0) & (nodes != depth)).sum()))

    results = {}
    with TreeVerifier.observing(counting):
        for name, settings in PAPER_SETTINGS.items():
            moved.clear()
            llm = engines.get(model=str(pair[0]), **BATCH, speculative_config={
                "method": "dartree", "model": str(pair[1]), **settings})
            results[name] = (generate_ids(llm, prompts, greedy()), _mean_acceptance(llm),
                             sum(moved))
    return results


def test_trained_pair_is_lossless(measured, baseline):
    for name, (output, _, _) in measured.items():
        assert output == baseline, name


def test_deep_paths_are_accepted_and_compaction_moves_rows(measured):
    _, pruned_acceptance, pruned_moved = measured["pruned"]
    assert pruned_acceptance > 2.0
    assert pruned_moved > 0  # accepted paths left the first branch: rows really moved


def test_trees_beat_chains_on_the_trained_pair(measured):
    acceptance = {name: value for name, (_, value, _) in measured.items()}
    assert acceptance["pruned"] > acceptance["domino"] > acceptance["dflash"], acceptance
    assert acceptance["fixed"] > acceptance["domino"], acceptance
