"""Trees over a drafter's candidate lattice (DFlash2, LiLiCorr) against per-request Python
references: the chain is vLLM's greedy selector walk, the trees grow each node's own row."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_tree_build import assert_same_paths, check_invariants, node_paths

from vllm_dartree.tree import build_tree
from vllm_dartree.tree.build import capacity_limited, fixed_quotas
from vllm_dartree.tree.lattice import Lattice

SETTINGS = settings(max_examples=40, deadline=None)


def make_lattice(seed, num_requests, depths, top_k, vocab=40, *, integer=False):
    """Distinct candidates per depth; depth 1's rows alike (they all follow the root)."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.stack([torch.randperm(vocab, generator=gen)[:top_k]
                                    for _ in range(depths)]) for _ in range(num_requests)])
    transitions = torch.randn(num_requests, depths, top_k, top_k, generator=gen) * 2.0
    if integer:  # many exact ties
        transitions = transitions.round()
    transitions[:, 0] = transitions[:, 0, :1].expand(-1, top_k, -1)
    base = torch.randn(num_requests, depths, vocab, generator=gen)
    roots = torch.randint(0, vocab, (num_requests,), generator=gen)
    return Lattice(ids, transitions), base, roots


def vllm_greedy_walk(lattice: Lattice, r: int) -> list[int]:
    """vLLM's ``_selector_walk_kernel`` at temperature 0: from row 0, the first best column
    of the previous pick's row, depth by depth."""
    previous, tokens = 0, []
    for depth in range(lattice.num_depths):
        row = lattice.transitions[r, depth, previous]
        previous = int(torch.argmax(row))  # torch.argmax: the first maximum, as tl.argmax
        tokens.append(int(lattice.ids[r, depth, previous]))
    return tokens


def ref_lattice_tree(lattice: Lattice, r, quota_of_depth, budget, depth_bonus):
    """DARTree over a lattice, one request: per depth the best ``quota`` (parent, column)
    pairs, each parent scoring the columns with its own row."""
    frontier = [((), torch.tensor(0.0), 0)]  # (path, score, the parent's column)
    nodes, remaining = [], budget
    for depth in range(1, lattice.num_depths + 1):
        quota = quota_of_depth(depth, remaining)
        pairs = []
        for p, (_, score, column) in enumerate(frontier):
            logprobs = torch.log_softmax(lattice.transitions[r, depth - 1, column], 0)
            pairs += [(score + logprobs[c], p, c) for c in range(lattice.top_k)]
        pairs.sort(key=lambda pair: (-float(pair[0]), pair[1], pair[2]))
        next_frontier = []
        for score, p, c in pairs[:quota]:
            path = frontier[p][0] + (int(lattice.ids[r, depth - 1, c]),)
            nodes.append((path, score, depth))
            next_frontier.append((path, score, c))
        remaining -= len(next_frontier)
        frontier = next_frontier
    order = sorted(range(len(nodes)),
                   key=lambda i: (-float(nodes[i][1] + depth_bonus * nodes[i][2]), i))
    return {nodes[i][0]: float(nodes[i][1]) for i in order[:budget]}


@pytest.mark.parametrize("integer", [False, True])
def test_chain_is_vllms_greedy_selector_walk(integer):
    for seed in range(6):
        lattice, base, roots = make_lattice(seed, 3, 7, 4, integer=integer)
        tree = build_tree("chain", base, None, roots, None, budget=16, lattice=lattice)
        for r in range(3):
            assert tree.tokens[r, :7].tolist() == vllm_greedy_walk(lattice, r)
        assert tree.parents[0, :7].tolist() == list(range(7))


def test_a_node_reads_its_own_row():
    """The defect this guards against: every parent scored by row 0 (the depth's marginal).
    Row i here prefers column (i + 1) mod K, so the chain zigzags; row 0 alone would not."""
    top_k, depths = 4, 5
    ids = torch.arange(depths * top_k).view(1, depths, top_k)
    transitions = torch.zeros(1, depths, top_k, top_k)
    for i in range(top_k):
        transitions[0, :, i, (i + 1) % top_k] = 3.0
    lattice = Lattice(ids, transitions)
    tree = build_tree("chain", torch.zeros(1, depths, 40), None, torch.zeros(1).long(), None,
                      budget=8, lattice=lattice)
    assert tree.tokens[0, :depths].tolist() == [1, 6, 11, 12, 17]
    assert vllm_greedy_walk(lattice, 0) == [1, 6, 11, 12, 17]


@SETTINGS
@given(seed=st.integers(0, 10**6), depths=st.integers(1, 5), top_k=st.integers(1, 6),
       budget=st.integers(1, 20), width=st.integers(1, 6),
       depth_bonus=st.sampled_from([0.0, -0.2, -1.0]), integer=st.booleans())
def test_pruned_over_a_lattice_matches_reference(seed, depths, top_k, budget, width,
                                                 depth_bonus, integer):
    lattice, base, roots = make_lattice(seed, 2, depths, top_k, integer=integer)
    tree = build_tree("pruned", base, None, roots, None, budget=budget, width=width,
                      depth_bonus=depth_bonus, lattice=lattice)
    size = min(budget, sum(capacity_limited([width] * depths, top_k)))
    check_invariants(tree, roots, budget, depths, size)
    for r in range(2):
        expected = ref_lattice_tree(lattice, r, lambda depth, remaining: width, budget,
                                    depth_bonus)
        assert_same_paths(node_paths(tree, r), expected)


@SETTINGS
@given(seed=st.integers(0, 10**6), depths=st.integers(1, 6), top_k=st.integers(1, 6),
       budget=st.integers(1, 24))
def test_fixed_over_a_lattice_matches_reference(seed, depths, top_k, budget):
    lattice, base, roots = make_lattice(seed, 2, depths, top_k)
    tree = build_tree("fixed", base, None, roots, None, budget=budget, lattice=lattice)
    check_invariants(tree, roots, budget, depths, sum(fixed_quotas(budget, depths, top_k)))
    for r in range(2):
        expected = ref_lattice_tree(
            lattice, r, lambda depth, remaining: math.ceil(remaining / (depths - depth + 1)),
            budget, 0.0)
        assert_same_paths(node_paths(tree, r), expected)


def test_sequential_over_a_lattice_equals_pruned_with_width_budget():
    for seed in range(4):
        lattice, base, roots = make_lattice(seed, 2, 5, 4)
        kwargs = dict(budget=12, depth_bonus=-0.3, lattice=lattice)
        sequential = build_tree("sequential", base, None, roots, None, **kwargs)
        pruned = build_tree("pruned", base, None, roots, None, width=12, **kwargs)
        for r in range(2):
            assert_same_paths(node_paths(sequential, r), node_paths(pruned, r))


@pytest.mark.parametrize("variant", ["chain", "fixed", "pruned", "sequential"])
def test_trees_over_a_lattice_read_no_base_logits(variant):
    lattice, base, roots = make_lattice(5, 2, 4, 3)
    kwargs = dict(budget=10, width=3, lattice=lattice)
    assert torch.equal(build_tree(variant, None, None, roots, None, **kwargs).tokens,
                       build_tree(variant, base, None, roots, None, **kwargs).tokens)
    with pytest.raises(ValueError, match="'ddtree' reads base_logits"):
        build_tree("ddtree", None, None, roots, None, **kwargs)
    with pytest.raises(ValueError, match="base_logits is required"):
        build_tree(variant, None, None, roots, None, budget=10, width=3)


def test_ddtree_reads_the_base_logits_not_the_lattice():
    lattice, base, roots = make_lattice(3, 2, 4, 4)
    with_lattice = build_tree("ddtree", base, None, roots, None, budget=10, lattice=lattice)
    without = build_tree("ddtree", base, None, roots, None, budget=10)
    assert torch.equal(with_lattice.tokens, without.tokens)


def test_lattice_arguments_are_checked():
    lattice, base, roots = make_lattice(0, 2, 4, 3)
    with pytest.raises(ValueError, match="not both"):
        build_tree("pruned", base, torch.zeros(2, 4, 8), roots, object(), lattice=lattice)
    with pytest.raises(ValueError, match="R and D"):
        build_tree("pruned", base[:, :3], None, roots, None, lattice=lattice)
    with pytest.raises(ValueError, match=r"\[R, D, K, K\]"):
        Lattice(lattice.ids, lattice.transitions[..., :2])
