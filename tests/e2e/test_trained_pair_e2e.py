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

    from vllm_dartree.step.verifier import TreeVerifier

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


@pytest.fixture(scope="module")
def near_limit_prompts(pair):
    """Five short requests and one whose 100-token prompt runs into max_model_len 160."""
    vocab = json.loads((pair[0] / "config.json").read_text())["vocab_size"]
    return (random_prompts(5, vocab, seed=42, min_len=4, max_len=10),
            random_prompts(1, vocab, seed=41, min_len=100, max_len=100))


NEAR_LIMIT = {"max_model_len": 160, "max_num_seqs": 8, "max_num_batched_tokens": 512}


def drafter_query_blocks(monkeypatch) -> list[tuple[set[int], set[int], int]]:
    """Record, for every drafter query block the forward writes, (KV blocks its slots write
    to, blocks its request owns, its last position) per request."""
    from vllm_dartree.integration.v1.proposer import DARTreeProposer

    seen = []
    get_slot_mapping = DARTreeProposer._get_slot_mapping

    def recording(self, num_tokens, slot_mapping=None):
        table = self.target_runner.input_batch.block_table[0]
        block = 1 + self.query_slots  # root + masks, the block cut to B's depths
        slots = slot_mapping[:num_tokens].view(-1, block)
        for row, request_slots in enumerate(slots.tolist()):
            owned = set(table.block_table.np[row, : table.num_blocks_per_row[row]].tolist())
            written = {s // table.block_size for s in request_slots if s >= 0}
            seen.append((written, owned, int(self.positions[(row + 1) * block - 1])))
        return get_slot_mapping(self, num_tokens, slot_mapping)

    monkeypatch.setattr(DARTreeProposer, "_get_slot_mapping", recording)
    return seen


@pytest.mark.parametrize("budget", [6, 24])
def test_a_request_near_max_model_len_leaves_the_others_drafting(monkeypatch, engines, pair,
                                                                 near_limit_prompts, budget):
    """The request near the limit gets a tree that fits; the batch keeps drafting, the
    other requests' acceptance is what it is without that request, and no drafter query
    writes K/V outside its own request's blocks (B below the block included)."""
    short, long = near_limit_prompts
    sampling = greedy(max_tokens=120)
    expected = generate_ids(engines.get(model=str(pair[0]), **NEAR_LIMIT), long + short, sampling)
    assert len(long[0]) + len(expected[0]) == 160  # the long request hits the limit
    spec = {"method": "dartree", "model": str(pair[1]), "num_speculative_tokens": budget,
            "width": 4, "top_k": 8}
    queries = drafter_query_blocks(monkeypatch)
    acceptance = {}
    for name, prompts in (("alone", short), ("beside the long one", long + short)):
        llm = engines.get(model=str(pair[0]), **NEAR_LIMIT, speculative_config=spec)
        output = generate_ids(llm, prompts, sampling)
        assert output == (expected[1:] if name == "alone" else expected)
        acceptance[name] = _mean_acceptance(llm)
        engines.close()  # the next run starts from fresh counters
    assert acceptance["beside the long one"] >= 0.9 * acceptance["alone"], acceptance
    assert queries and all(written <= owned for written, owned, _ in queries)
    # Queries reached past the limit (so the cut really happened) and wrote nothing there.
    assert max(position for _, _, position in queries) >= 160
