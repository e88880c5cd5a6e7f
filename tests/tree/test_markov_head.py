"""DSpark's Markov head in the tree core: the chain is DSpark's own chain, trees are right.

``dspark_chain`` is an independent re-statement of vLLM's DSpark sampler at T=0
(vLLM 0.32/0.33 ``v1/worker/gpu/spec_decode/dspark/speculator.py``
``DSparkSpeculator._sample_sequential`` and ``_sample_sequential_topk``, weights as in
``model_executor/models/qwen3_dspark.py``): base logits in the draft vocabulary, ``prev``
starts at the anchor (the root), each slot adds ``scale * markov_w2 . markov_w1[prev]``
(only to the top-k base entries when ``dspark_draft_topk`` is set), takes the argmax, maps
it to a target id with ``d2t`` and feeds it back as ``prev``.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_tree_build import (
    assert_batched_equals_per_request,
    check_invariants,
    expected_count,
    node_paths,
)

from vllm_dartree.tree import CorrectionHead, MarkovHead, build_tree
from vllm_dartree.tree.graphs import CorrectionGraphs

SETTINGS = settings(max_examples=30, deadline=None)
RANK = 6


def dspark_chain(base_draft: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor,
                 anchor: torch.Tensor, *, scale: float = 1.0, d2t: torch.Tensor | None = None,
                 topk: int | None = None) -> torch.Tensor:
    """[R, N, V'] draft-vocabulary base logits -> [R, N] greedy DSpark draft (target ids)."""
    prev, drafted = anchor, []
    for i in range(base_draft.shape[1]):
        embed = w1[prev]  # [R, r]
        if topk is None:
            logits = base_draft[:, i] + scale * (embed @ w2.T)
        else:
            values, index = base_draft[:, i].topk(topk, dim=-1)
            corrected = values + scale * torch.einsum("rkd,rd->rk", w2[index], embed)
            logits = torch.full_like(base_draft[:, i], float("-inf")).scatter(1, index, corrected)
        draft_ids = logits.argmax(dim=-1)
        prev = draft_ids if d2t is None else draft_ids + d2t[draft_ids]
        drafted.append(prev)
    return torch.stack(drafted, dim=1)


def to_target_vocab(base_draft: torch.Tensor, d2t: torch.Tensor | None, vocab: int):
    """What vLLM's DFlash compute_logits hands the tree core: -inf off the draft vocab."""
    if d2t is None:
        return base_draft
    targets = torch.arange(base_draft.shape[-1]) + d2t
    full = base_draft.new_full((*base_draft.shape[:-1], vocab), float("-inf"))
    full[..., targets] = base_draft
    return full


def make_case(seed: int, requests: int, depths: int, vocab: int, draft_vocab: int | None = None,
              scale: float = 1.0):
    """A random head (reduced draft vocabulary: a random subset of the target ids, with its
    d2t), draft-vocabulary base logits, roots and (unread) hidden states."""
    gen = torch.Generator().manual_seed(seed)
    head = MarkovHead.random(vocab, RANK, generator=gen, scale=scale)
    d2t = None
    if draft_vocab is not None:
        kept = torch.randperm(vocab, generator=gen)[:draft_vocab].sort().values
        d2t = kept - torch.arange(draft_vocab)  # draft id i is target id i + d2t[i]
        head = MarkovHead(markov_w1=head.markov_w1, markov_w2=head.markov_w2[kept],
                          scale=scale,
                          draft_row_of_target=MarkovHead.draft_rows_from_d2t(d2t, vocab))
    base_draft = torch.randn(requests, depths, head.markov_w2.shape[0], generator=gen) * 2
    root = torch.randint(0, vocab, (requests,), generator=gen)
    hidden = torch.randn(requests, depths, 3, generator=gen)  # read by no Markov step
    return head, base_draft, d2t, root, hidden


def test_the_markov_head_is_a_correction_head():
    head = MarkovHead.random(10, RANK)
    assert isinstance(head, CorrectionHead)
    assert head.hidden_size is None and all(head.corrects_depth(d) for d in (1, 2, 7))


@SETTINGS
@given(seed=st.integers(0, 10**6), requests=st.integers(1, 3), depths=st.integers(1, 7),
       vocab=st.integers(8, 40), reduced=st.booleans(), scale=st.sampled_from([1.0, 0.5]))
def test_chain_is_dspark_greedy_chain(seed, requests, depths, vocab, reduced, scale):
    """K = V': the chain is DSpark's dense chain token for token (with d2t and logit_scale)."""
    draft_vocab = vocab - 3 if reduced else None
    head, base_draft, d2t, root, hidden = make_case(seed, requests, depths, vocab, draft_vocab,
                                                    scale)
    expected = dspark_chain(base_draft, head.markov_w1, head.markov_w2, root, scale=scale,
                            d2t=d2t)
    tree = build_tree("chain", to_target_vocab(base_draft, d2t, vocab), hidden, root, head,
                      budget=depths, top_k=base_draft.shape[-1])
    assert torch.equal(tree.tokens, expected)
    assert torch.equal(tree.parents, torch.arange(depths).expand(requests, depths))


@SETTINGS
@given(seed=st.integers(0, 10**6), depths=st.integers(1, 7), vocab=st.integers(8, 40),
       top_k=st.integers(1, 6))
def test_chain_with_k_candidates_is_dspark_topk_chain(seed, depths, vocab, top_k):
    """K < V: the chain is DSpark's candidate-restricted chain (dspark_draft_topk = K)."""
    head, base_draft, _, root, hidden = make_case(seed, 2, depths, vocab)
    expected = dspark_chain(base_draft, head.markov_w1, head.markov_w2, root, topk=top_k)
    tree = build_tree("chain", base_draft, hidden, root, head, budget=depths, top_k=top_k)
    assert torch.equal(tree.tokens, expected)


def ref_markov_dartree(base, root, head, top_k, quota_of_depth, budget, depth_bonus):
    """One request, Python loops: parent x candidate with the full-vocabulary bias."""
    frontier = [((), torch.tensor(0.0), int(root))]  # (path, score, last token)
    nodes, remaining = [], budget
    for depth in range(1, base.shape[0] + 1):
        values, ids = torch.sort(base[depth - 1], descending=True, stable=True)
        values, ids = values[:top_k], ids[:top_k]
        pairs = []
        for p, (_, score, last) in enumerate(frontier):
            logits = values + head.full_bias(torch.tensor(last))[ids]
            logprobs = logits - torch.logsumexp(logits, 0)
            pairs += [(score + logprobs[c], p, c) for c in range(top_k)]
        pairs.sort(key=lambda pair: (-float(pair[0]), pair[1], pair[2]))
        next_frontier = []
        for score, p, c in pairs[:quota_of_depth(depth, remaining)]:
            token = int(ids[c])
            nodes.append((frontier[p][0] + (token,), score, depth))
            next_frontier.append((frontier[p][0] + (token,), score, token))
        remaining -= len(next_frontier)
        frontier = next_frontier
    order = sorted(range(len(nodes)),
                   key=lambda i: (-float(nodes[i][1] + depth_bonus * nodes[i][2]), i))
    return {nodes[i][0]: float(nodes[i][1]) for i in order[:budget]}


def assert_prefix_closed(tree, r):
    paths = set(node_paths(tree, r))
    assert all(path[:-1] in paths for path in paths if len(path) > 1)


@SETTINGS
@given(seed=st.integers(0, 10**6), depths=st.integers(1, 6), vocab=st.integers(8, 30),
       top_k=st.integers(1, 6), budget=st.integers(1, 20), width=st.integers(1, 5),
       depth_bonus=st.sampled_from([0.0, -0.2, -1.0]))
def test_pruned_matches_reference_and_is_prefix_closed(seed, depths, vocab, top_k, budget,
                                                       width, depth_bonus):
    head, base, _, root, hidden = make_case(seed, 2, depths, vocab)
    tree = build_tree("pruned", base, hidden, root, head, budget=budget, top_k=top_k,
                      width=width, depth_bonus=depth_bonus)
    check_invariants(tree, root, budget, depths,
                     expected_count("pruned", budget, depths, vocab, top_k, width))
    for r in range(2):
        expected = ref_markov_dartree(base[r], root[r], head, top_k,
                                      lambda depth, remaining: width, budget, depth_bonus)
        got = node_paths(tree, r)
        assert sorted(got) == sorted(expected)
        for path, score in expected.items():
            assert got[path] == pytest.approx(score, abs=1e-4)
        assert_prefix_closed(tree, r)


@SETTINGS
@given(seed=st.integers(0, 10**6), depths=st.integers(1, 6), vocab=st.integers(8, 30),
       top_k=st.integers(1, 6), budget=st.integers(1, 24))
def test_fixed_matches_reference_and_is_prefix_closed(seed, depths, vocab, top_k, budget):
    head, base, _, root, hidden = make_case(seed, 2, depths, vocab)
    tree = build_tree("fixed", base, hidden, root, head, budget=budget, top_k=top_k)

    def quota(depth, remaining):
        return math.ceil(remaining / (depths - depth + 1))

    for r in range(2):
        expected = ref_markov_dartree(base[r], root[r], head, top_k, quota, budget, 0.0)
        assert sorted(node_paths(tree, r)) == sorted(expected)
        assert_prefix_closed(tree, r)


@pytest.mark.parametrize("variant", ["chain", "fixed", "pruned", "sequential"])
def test_batched_equals_per_request(variant):
    head, base_draft, d2t, root, hidden = make_case(5, 3, 7, 40, draft_vocab=33)
    base = to_target_vocab(base_draft, d2t, 40)
    assert_batched_equals_per_request(variant, base, hidden, root, head, budget=16, top_k=8,
                                      width=4, depth_bonus=-0.2)


@pytest.mark.parametrize("variant", ["chain", "fixed", "pruned"])
def test_padded_fixed_shape_steps_build_the_same_trees(variant):
    """CorrectionGraphs (padded buffers; CUDA graphs on a GPU) with a Markov head: its empty
    per-depth context is a zero-width buffer, and the trees are unchanged."""
    head, base, _, root, hidden = make_case(9, 3, 7, 40)
    kwargs = dict(budget=16, top_k=8, width=4, depth_bonus=-0.2)
    direct = build_tree(variant, base, hidden, root, head, **kwargs)
    graphs = CorrectionGraphs(head, capture=False)
    stepped = build_tree(variant, base, hidden, root, head, graphs=graphs, **kwargs)
    for name in ("tokens", "parents", "depths", "valid"):
        assert torch.equal(getattr(direct, name), getattr(stepped, name)), name
    torch.testing.assert_close(direct.scores, stepped.scores)


def test_the_first_depth_is_corrected_by_the_root():
    """Depth 1 reads markov_w1[root]: two roots with a bias that flips the base argmax give
    different first tokens (Domino's released heads leave depth 1 uncorrected)."""
    vocab = 4
    w1 = torch.eye(vocab, 2)  # token 0 -> e0, token 1 -> e1
    w2 = torch.tensor([[0.0, 0.0], [0.0, 0.0], [10.0, 0.0], [0.0, 10.0]])
    head = MarkovHead(markov_w1=w1, markov_w2=w2)
    base = torch.tensor([[[5.0, 0.0, 0.0, 0.0]]]).expand(2, 1, vocab)
    tree = build_tree("chain", base, torch.zeros(2, 1, 1), torch.tensor([0, 1]), head,
                      budget=1, top_k=vocab)
    assert tree.tokens[:, 0].tolist() == [2, 3]


def test_head_rejects_mismatched_weights():
    with pytest.raises(ValueError, match="markov_w2 must be"):
        MarkovHead(markov_w1=torch.zeros(10, 4), markov_w2=torch.zeros(10, 3))
    with pytest.raises(ValueError, match="needs draft_row_of_target"):
        MarkovHead(markov_w1=torch.zeros(10, 4), markov_w2=torch.zeros(8, 4))
