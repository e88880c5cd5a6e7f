"""DraftTree helpers: ancestor masks (dense and packed), verify positions and tokens,
depth-first order and causal rows."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_dartree.tree.types import (
    DraftTree,
    ancestor_mask,
    causal_rows,
    chain_tree,
    depth_first,
    pack_bool_mask,
    packed_ancestor_mask,
    padded_tree,
    verify_positions,
    verify_tokens,
)

SETTINGS = settings(max_examples=25, deadline=None)


def random_tree(seed: int, num_requests: int, budget: int, vocab: int = 50):
    """(tree, root tokens): random topological trees with a random number of real nodes
    each, then padding."""
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (num_requests, budget), generator=gen)
    real = torch.randint(0, budget + 1, (num_requests,), generator=gen)
    columns = torch.arange(budget)
    # parent of column j is a uniformly random node among 0..j (root or an earlier node)
    parents = (torch.rand(num_requests, budget, generator=gen) * (columns + 1)).long()
    depths = torch.ones(num_requests, budget, dtype=torch.int64)
    for j in range(budget):  # depth = parent depth + 1 (fine in a test helper)
        parent = parents[:, j]
        parent_depth = torch.where(parent == 0, 0, depths.gather(1, (parent - 1).clamp(min=0)
                                                                 .unsqueeze(1)).squeeze(1))
        depths[:, j] = parent_depth + 1
    valid = columns.unsqueeze(0) < real.unsqueeze(1)
    scores = -torch.rand(num_requests, budget, generator=gen)
    root = torch.randint(0, vocab, (num_requests,), generator=gen)
    return padded_tree(tokens, parents, depths, valid, scores, root, budget, None), root


def naive_ancestor_mask(tree: DraftTree) -> torch.Tensor:
    num_requests, budget = tree.parents.shape
    mask = torch.zeros(num_requests, 1 + budget, 1 + budget, dtype=torch.bool)
    for r in range(num_requests):
        for node in range(1 + budget):
            mask[r, node, node] = True
            current = node
            while current != 0:
                current = int(tree.parents[r, current - 1])
                mask[r, node, current] = True
    return mask


def unpack(words: torch.Tensor, size: int) -> torch.Tensor:
    bits = torch.arange(64)
    expanded = (words.unsqueeze(-1) >> bits) & 1  # arithmetic shift keeps bit 63 readable
    return expanded.flatten(-2)[..., :size].bool()


@SETTINGS
@given(seed=st.integers(0, 2**16), num_requests=st.integers(1, 3),
       budget=st.sampled_from([1, 2, 7, 63, 64, 65, 100]))
def test_ancestor_mask_matches_naive_walk_and_packed(seed, num_requests, budget):
    tree, _ = random_tree(seed, num_requests, budget)
    mask = ancestor_mask(tree)
    assert torch.equal(mask, naive_ancestor_mask(tree))
    packed = packed_ancestor_mask(tree)
    assert packed.dtype == torch.int64
    assert packed.shape == (num_requests, 1 + budget, math.ceil((1 + budget) / 64))
    assert torch.equal(unpack(packed, 1 + budget), mask)


def test_dummy_rows_see_root_and_self_only_and_are_unseen():
    tree, _ = random_tree(3, 4, 20)
    mask = ancestor_mask(tree)
    for r in range(4):
        for j in range(20):
            if not tree.valid[r, j]:
                expected = torch.zeros(21, dtype=torch.bool)
                expected[[0, j + 1]] = True
                assert torch.equal(mask[r, j + 1], expected)
                assert mask[r, :, j + 1].sum() == 1  # no other row attends a dummy
        assert torch.equal(mask[r, 0], torch.nn.functional.one_hot(torch.tensor(0), 21).bool())


def test_packed_mask_two_words_and_sign_bit_for_budget_64():
    # chain of 64: the deepest node sees all 65 positions, so word 0 is all ones (-1) and
    # word 1 has bit 0 set (column 64).
    budget = 64
    tree = padded_tree(torch.arange(budget).unsqueeze(0), torch.arange(budget).unsqueeze(0),
                       torch.arange(1, budget + 1).unsqueeze(0),
                       torch.ones(1, budget, dtype=torch.bool), torch.zeros(1, budget),
                       torch.tensor([7]), budget, budget)
    packed = packed_ancestor_mask(tree)
    assert packed.shape == (1, 65, 2)
    assert packed[0, 64, 0] == -1 and packed[0, 64, 1] == 1
    assert packed[0, 63].tolist() == [-1, 0]  # columns 0..63: bit 63 is the sign bit
    assert packed[0, 62].tolist() == [torch.iinfo(torch.int64).max, 0]  # bits 0..62
    assert packed[0, 0].tolist() == [1, 0]


def test_pack_bool_mask_bit_layout():
    mask = torch.zeros(1, 130, dtype=torch.bool)
    mask[0, [0, 63, 64, 129]] = True
    words = pack_bool_mask(mask)
    assert words.tolist() == [[1 - 2**63 + 0, 1, 2]]  # bit0|bit63, bit0, bit1


def test_verify_positions_and_tokens():
    tree, _ = random_tree(5, 2, 10)
    base = torch.tensor([100, 7])
    positions = verify_positions(tree, base)
    assert positions[:, 0].tolist() == [100, 7]
    assert torch.equal(positions[:, 1:], base.unsqueeze(1) + tree.depths)
    root = torch.tensor([11, 12])
    tokens = verify_tokens(tree, root)
    assert tokens[:, 0].tolist() == [11, 12] and torch.equal(tokens[:, 1:], tree.tokens)


def test_padding_invariants_of_padded_tree():
    tree, root = random_tree(9, 3, 12)
    dummy = ~tree.valid
    assert dummy.any()
    assert torch.equal(tree.tokens[dummy], root.unsqueeze(1).expand(3, 12)[dummy])
    assert (tree.parents[dummy] == 0).all() and (tree.depths[dummy] == 1).all()
    assert torch.equal(tree.num_nodes, tree.valid.sum(1))
    # valid nodes form a prefix in this helper
    assert torch.equal(tree.valid, torch.arange(12) < tree.num_nodes.unsqueeze(1))


def test_padded_tree_rejects_too_many_nodes():
    with pytest.raises(ValueError, match="budget=2"):
        padded_tree(torch.zeros(1, 3, dtype=torch.int64), torch.zeros(1, 3, dtype=torch.int64),
                    torch.ones(1, 3, dtype=torch.int64), torch.ones(1, 3, dtype=torch.bool),
                    torch.zeros(1, 3), torch.zeros(1, dtype=torch.int64), 2, None)


def naive_preorder(parents: list[int], num_real: int) -> list[int]:
    """Old columns in depth-first preorder (children by column), real nodes then padding."""
    children = {node: [] for node in range(len(parents) + 1)}
    for column, parent in enumerate(parents[:num_real]):
        children[parent].append(column + 1)
    order: list[int] = []

    def visit(node: int) -> None:
        for child in children[node]:
            order.append(child - 1)
            visit(child)

    visit(0)
    return order + list(range(num_real, len(parents)))


@SETTINGS
@given(seed=st.integers(0, 10_000), num_requests=st.integers(1, 4),
       budget=st.integers(1, 40))
def test_depth_first_is_the_preorder_of_the_same_trees(seed, num_requests, budget):
    tree, _ = random_tree(seed, num_requests, budget)
    ordered = depth_first(tree)
    for r in range(num_requests):
        order = naive_preorder(tree.parents[r].tolist(), int(tree.num_nodes[r]))
        new_index = {old + 1: new + 1 for new, old in enumerate(order)} | {0: 0}
        assert ordered.tokens[r].tolist() == tree.tokens[r, order].tolist()
        assert ordered.depths[r].tolist() == tree.depths[r, order].tolist()
        assert ordered.valid[r].tolist() == tree.valid[r, order].tolist()
        assert ordered.scores[r].tolist() == tree.scores[r, order].tolist()
        assert ordered.parents[r].tolist() == [new_index[int(tree.parents[r, old])]
                                               for old in order]
    assert torch.equal(ordered.num_nodes, tree.num_nodes)
    # Still topological, and the same ancestor relation up to the renumbering.
    assert bool((ordered.parents < torch.arange(1, budget + 1)).all())


def test_depth_first_puts_the_first_branch_first_and_causal_rows_finds_it():
    # BFS order: a, b at depth 1; c, d under a; e under b; f under c; one padding node.
    tree = DraftTree(tokens=torch.tensor([[11, 12, 13, 14, 15, 16, 0]]),
                     parents=torch.tensor([[0, 0, 1, 1, 2, 3, 0]]),
                     depths=torch.tensor([[1, 1, 2, 2, 2, 3, 1]]),
                     num_nodes=torch.tensor([6]),
                     valid=torch.tensor([[True] * 6 + [False]]), scores=torch.zeros(1, 7))
    ordered = depth_first(tree)
    assert ordered.tokens.tolist() == [[11, 13, 16, 14, 12, 15, 0]]  # a c f d b e, padding
    assert ordered.parents.tolist() == [[0, 1, 2, 1, 0, 5, 0]]
    assert causal_rows(tree).tolist() == [1]
    assert causal_rows(ordered).tolist() == [3]  # a, c, f: the rows causal attention gets
    chain = chain_tree(torch.tensor([[5, 6, 7], [1, 2, 3]]))
    assert causal_rows(chain).tolist() == [3, 3]
    assert torch.equal(depth_first(chain).parents, chain.parents)


@SETTINGS
@given(seed=st.integers(0, 10_000), budget=st.integers(1, 24))
def test_causal_rows_see_exactly_the_rows_before_them(seed, budget):
    """Row j (node j - 1) is within causal_rows iff its ancestors are rows 0..j-1."""
    tree, _ = random_tree(seed, 3, budget)
    tree = depth_first(tree)
    mask = ancestor_mask(tree)
    for r, count in enumerate(causal_rows(tree).tolist()):
        causal = [bool(mask[r, j, :j + 1].all()) and tree.valid[r, j - 1].item()
                  for j in range(1, budget + 1)]
        expected = next((j for j, ok in enumerate(causal) if not ok), budget)
        assert count == expected


def test_where_requests_takes_each_request_from_its_tree():
    from vllm_dartree.tree import chain_tree, where_requests

    chains = chain_tree(torch.tensor([[1, 2, 3], [4, 5, 6]]))
    trees = chain_tree(torch.tensor([[7, 8, 9], [10, 11, 12]]))
    trees.parents[:, 2] = 0  # node 3 a sibling of node 1
    trees.depths[:, 2] = 1
    trees.max_depth = 2
    merged = where_requests(torch.tensor([True, False]), chains, trees)
    assert merged.tokens.tolist() == [[1, 2, 3], [10, 11, 12]]
    assert merged.parents.tolist() == [[0, 1, 2], [0, 1, 0]]
    assert merged.depths.tolist() == [[1, 2, 3], [1, 2, 1]]
    assert merged.max_depth == 3
    with pytest.raises(ValueError, match="budgets"):
        where_requests(torch.tensor([True, False]), chains,
                       chain_tree(torch.tensor([[1, 2], [3, 4]])))
