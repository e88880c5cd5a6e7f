"""Tree builders against straightforward per-request Python references."""

import heapq
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_dartree.kernels.topb import select_top_b
from vllm_dartree.tree import VARIANTS, DominoHead, build_tree, stable_topk
from vllm_dartree.tree.build import (
    capacity_limited,
    fixed_quotas,
    grow_supertree,
    node_priority,
    prepare_candidates,
)

SETTINGS = settings(max_examples=40, deadline=None)
HIDDEN, STATE, PROJ = 8, 6, 4


def make_inputs(seed, num_requests, depths, vocab, *, prefix=1, scale=2.0, with_head=True):
    gen = torch.Generator().manual_seed(seed)
    base = torch.randn(num_requests, depths, vocab, generator=gen) * scale
    hidden = torch.randn(num_requests, depths, HIDDEN, generator=gen)
    root = torch.randint(0, vocab, (num_requests,), generator=gen)
    head = DominoHead.random(vocab, HIDDEN, STATE, PROJ, pure_draft_prefix_len=prefix,
                             generator=gen, scale=2.0) if with_head else None
    return base, hidden, root, head


# ------------------------------------------------------------------------------ helpers
def node_paths(tree, r):
    """{token path from the root: score} of the valid nodes of request r."""
    paths = {}
    for j in range(tree.budget):
        if not tree.valid[r, j]:
            continue
        parent = int(tree.parents[r, j])
        prefix = () if parent == 0 else node_path(tree, r, parent)
        paths[prefix + (int(tree.tokens[r, j]),)] = float(tree.scores[r, j])
    return paths


def node_path(tree, r, node):
    path = []
    while node != 0:
        path.append(int(tree.tokens[r, node - 1]))
        node = int(tree.parents[r, node - 1])
    return tuple(reversed(path))


def assert_same_paths(got, expected, atol=1e-4):
    assert sorted(got) == sorted(expected)
    for path, score in expected.items():
        assert got[path] == pytest.approx(score, abs=atol)


def check_invariants(tree, root, budget, depths, expected_nodes):
    num_requests = root.shape[0]
    for field in (tree.tokens, tree.parents, tree.depths, tree.valid, tree.scores):
        assert field.shape == (num_requests, budget)
    assert tree.tokens.dtype == tree.parents.dtype == tree.depths.dtype == torch.int64
    assert tree.valid.dtype == torch.bool and tree.scores.dtype == torch.float32
    assert tree.num_nodes.tolist() == [expected_nodes] * num_requests
    assert torch.equal(tree.num_nodes, tree.valid.sum(1))
    columns = torch.arange(budget)
    # real nodes first, then padding
    assert torch.equal(tree.valid, columns < tree.num_nodes.unsqueeze(1))
    assert (tree.parents <= columns).all()  # parent index < own index (column j = node j+1)
    parent_depth = torch.cat([torch.zeros(num_requests, 1, dtype=torch.int64), tree.depths], 1)
    parent_depth = parent_depth.gather(1, tree.parents)
    parent_valid = torch.cat([torch.ones(num_requests, 1, dtype=torch.bool), tree.valid], 1)
    assert (parent_valid.gather(1, tree.parents) | ~tree.valid).all()
    real = tree.valid
    assert torch.equal(tree.depths[real], (parent_depth + 1)[real])
    assert (tree.depths[real] <= depths).all() and (tree.depths >= 1).all()
    dummy = ~tree.valid
    assert torch.equal(tree.tokens[dummy], root.unsqueeze(1).expand(-1, budget)[dummy])
    assert (tree.parents[dummy] == 0).all() and (tree.depths[dummy] == 1).all()
    for r in range(num_requests):  # siblings carry distinct tokens
        pairs = {(int(p), int(t)) for p, t, v in
                 zip(tree.parents[r], tree.tokens[r], tree.valid[r]) if v}
        assert len(pairs) == int(tree.num_nodes[r])
    assert tree.max_depth == depths


def expected_count(variant, budget, depths, vocab, top_k, width):
    if variant == "chain":
        return min(depths, budget)
    if variant == "fixed":
        return sum(fixed_quotas(budget, depths, top_k))
    if variant == "pruned":
        return min(budget, sum(capacity_limited([width] * depths, top_k)))
    branching = min(budget, vocab) if variant == "ddtree" else top_k
    return min(budget, sum(branching**d for d in range(1, depths + 1)))


def ref_candidates(base_row, top_k):
    values, ids = torch.sort(base_row, descending=True, stable=True)
    return values[:top_k], ids[:top_k]


# ---------------------------------------------------------------------------- invariants
@SETTINGS
@given(seed=st.integers(0, 10**6), num_requests=st.integers(1, 3), depths=st.integers(1, 5),
       vocab=st.integers(4, 30), top_k=st.integers(1, 8), budget=st.integers(1, 20),
       width=st.integers(1, 5), prefix=st.integers(0, 2), with_head=st.booleans())
def test_invariants_of_every_variant(seed, num_requests, depths, vocab, top_k, budget, width,
                                     prefix, with_head):
    top_k = min(top_k, vocab)
    base, hidden, root, head = make_inputs(seed, num_requests, depths, vocab, prefix=prefix,
                                           with_head=with_head)
    for variant in VARIANTS:
        tree = build_tree(variant, base, hidden, root, head, budget=budget, top_k=top_k,
                          width=width, depth_bonus=-0.2)
        check_invariants(tree, root, budget, depths,
                         expected_count(variant, budget, depths, vocab, top_k, width))


def test_fixed_quotas_per_depth():
    assert fixed_quotas(64, 16, 64) == [4] * 16
    assert sum(fixed_quotas(50, 16, 64)) == 50
    assert fixed_quotas(50, 16, 64) == [4, 4, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3]
    assert fixed_quotas(4, 16, 64) == [1, 1, 1, 1] + [0] * 12
    assert fixed_quotas(64, 4, 2) == [2, 4, 8, 16]  # frontier capacity limits early depths
    base, hidden, root, head = make_inputs(0, 2, 16, 100)
    tree = build_tree("fixed", base, hidden, root, head, budget=64, top_k=64)
    per_depth = torch.stack([(tree.depths == d).sum(1) for d in range(1, 17)], 1)
    assert (per_depth == 4).all()


# ------------------------------------------------------------------------------- DARTree
def ref_dartree(base, hidden, root, head, top_k, quota_of_depth, budget, depth_bonus):
    """Per-request reference: Python loops over parents and candidates, full_bias."""
    depths = base.shape[0]
    state = head.root_state(root.view(1))[0] if head is not None else None
    frontier = [((), torch.tensor(0.0), state)]  # (path, score, GRU state)
    nodes = []  # (path, score, depth)
    remaining = budget
    for depth in range(1, depths + 1):
        quota = quota_of_depth(depth, remaining)
        values, ids = ref_candidates(base[depth - 1], top_k)
        pairs = []
        for p, (_, score, state) in enumerate(frontier):
            logits = values.clone()
            if head is not None and depth - 1 >= head.pure_draft_prefix_len:
                logits = logits + head.full_bias(hidden[depth - 1], state)[ids]
            logprobs = logits - torch.logsumexp(logits, 0)
            pairs += [(score + logprobs[c], p, c) for c in range(top_k)]
        pairs.sort(key=lambda pair: (-float(pair[0]), pair[1], pair[2]))
        next_frontier = []
        for score, p, c in pairs[:quota]:
            path, _, parent_state = frontier[p]
            token = int(ids[c])
            child_state = None
            if head is not None:
                child_state = head.gru_step(head.embed[token], parent_state)
            nodes.append((path + (token,), score, depth))
            next_frontier.append((path + (token,), score, child_state))
        remaining -= len(next_frontier)
        frontier = next_frontier
    order = sorted(range(len(nodes)),
                   key=lambda i: (-float(nodes[i][1] + depth_bonus * nodes[i][2]), i))
    return {nodes[i][0]: float(nodes[i][1]) for i in order[:budget]}


@SETTINGS
@given(seed=st.integers(0, 10**6), depths=st.integers(1, 5), vocab=st.integers(6, 30),
       top_k=st.integers(1, 8), budget=st.integers(1, 16), width=st.integers(1, 5),
       prefix=st.integers(0, 2), with_head=st.booleans(),
       depth_bonus=st.sampled_from([0.0, -0.2, -1.0]))
def test_pruned_matches_reference(seed, depths, vocab, top_k, budget, width, prefix,
                                  with_head, depth_bonus):
    top_k = min(top_k, vocab)
    base, hidden, root, head = make_inputs(seed, 2, depths, vocab, prefix=prefix,
                                           with_head=with_head)
    tree = build_tree("pruned", base, hidden, root, head, budget=budget, top_k=top_k,
                      width=width, depth_bonus=depth_bonus)
    for r in range(2):
        expected = ref_dartree(base[r], hidden[r], root[r], head, top_k,
                               lambda depth, remaining: width, budget, depth_bonus)
        assert_same_paths(node_paths(tree, r), expected)


@SETTINGS
@given(seed=st.integers(0, 10**6), depths=st.integers(1, 6), vocab=st.integers(6, 30),
       top_k=st.integers(1, 8), budget=st.integers(1, 24), prefix=st.integers(0, 2))
def test_fixed_matches_reference(seed, depths, vocab, top_k, budget, prefix):
    top_k = min(top_k, vocab)
    base, hidden, root, head = make_inputs(seed, 2, depths, vocab, prefix=prefix)
    tree = build_tree("fixed", base, hidden, root, head, budget=budget, top_k=top_k)

    def quota(depth, remaining):
        return math.ceil(remaining / (depths - depth + 1))

    for r in range(2):
        expected = ref_dartree(base[r], hidden[r], root[r], head, top_k, quota, budget, 0.0)
        assert_same_paths(node_paths(tree, r), expected)


def test_pruned_at_paper_shapes_matches_reference():
    base, hidden, root, head = make_inputs(7, 1, 16, 300)
    expected = ref_dartree(base[0], hidden[0], root[0], head, 64, lambda d, rem: 12, 64, -0.2)
    for variant_head in (head, head.with_input_gate_table()):  # both GRU input paths
        tree = build_tree("pruned", base, hidden, root, variant_head, budget=64, top_k=64,
                          width=12)
        assert_same_paths(node_paths(tree, 0), expected)


def test_sequential_equals_pruned_with_width_budget():
    # With width = budget the supertree contains the exact best-first tree (any node of the
    # best-first top-B has fewer than B better nodes at its depth), so the two agree.
    for seed in range(4):
        base, hidden, root, head = make_inputs(seed, 2, 5, 30)
        kwargs = dict(budget=12, top_k=6, depth_bonus=-0.3)
        sequential = build_tree("sequential", base, hidden, root, head, **kwargs)
        pruned = build_tree("pruned", base, hidden, root, head, width=12, **kwargs)
        for r in range(2):
            assert_same_paths(node_paths(sequential, r), node_paths(pruned, r))


# ---------------------------------------------------------------------------- Lemma 1
def heap_best_first(parents, priority, budget):
    """Best-first over a given tree (parents[i] = node index of node i+1's parent)."""
    children = {}
    for i, parent in enumerate(parents):
        children.setdefault(parent, []).append(i + 1)
    heap = [(-priority[c - 1], c) for c in children.get(0, [])]
    heapq.heapify(heap)
    kept = []
    while heap and len(kept) < budget:
        _, node = heapq.heappop(heap)
        kept.append(node)
        for child in children.get(node, []):
            heapq.heappush(heap, (-priority[child - 1], child))
    return sorted(kept)


@SETTINGS
@given(seed=st.integers(0, 10**6), depths=st.integers(1, 6), top_k=st.integers(1, 6),
       width=st.integers(1, 6), budget=st.integers(1, 30),
       depth_bonus=st.sampled_from([0.0, -0.2, -1.5]), quantised=st.booleans())
def test_lemma1_top_b_equals_best_first_and_is_prefix_closed(seed, depths, top_k, width, budget,
                                                              depth_bonus, quantised):
    base, hidden, root, head = make_inputs(seed, 2, depths, 12)
    if quantised:  # integer logits without correction: many exact score ties
        base, head = base.round(), None
    candidates = prepare_candidates(base, hidden, head, top_k)
    supertree = grow_supertree(candidates, head, root, capacity_limited([width] * depths, top_k))
    size = supertree.tokens.shape[1]
    keep = min(budget, size)
    priority = node_priority(supertree.scores, supertree.depths, depth_bonus)
    kept = select_top_b(priority, keep)
    for r in range(2):
        top_b = [int(k) + 1 for k in kept[r]]
        assert top_b == heap_best_first(supertree.parents[r].tolist(), priority[r].tolist(),
                                        keep)
        kept_nodes = set(top_b) | {0}
        assert all(int(supertree.parents[r, node - 1]) in kept_nodes for node in top_b)


# --------------------------------------------------------------------------------- chain
def test_chain_with_head_is_corrected_greedy_chain():
    for prefix in (0, 1, 2):
        base, hidden, root, head = make_inputs(prefix, 3, 8, 60, prefix=prefix)
        tree = build_tree("chain", base, hidden, root, head, budget=64, top_k=10)
        for r in range(3):
            state = head.root_state(root[r : r + 1])[0]
            expected = []
            for depth in range(1, 9):
                values, ids = ref_candidates(base[r, depth - 1], 10)
                logits = values
                if depth - 1 >= prefix:
                    logits = values + head.full_bias(hidden[r, depth - 1], state)[ids]
                token = int(ids[int(torch.argmax(logits))])
                expected.append(token)
                state = head.gru_step(head.embed[token], state)
            assert tree.tokens[r, :8].tolist() == expected
        assert tree.parents[0, :8].tolist() == list(range(8))


def test_chain_without_head_is_argmax_and_respects_budget():
    base, hidden, root, _ = make_inputs(1, 2, 6, 50)
    tree = build_tree("chain", base, None, root, None, budget=4)
    assert torch.equal(tree.tokens, base[:, :4].argmax(-1))
    assert tree.num_nodes.tolist() == [4, 4]
    tree = build_tree("chain", base, None, root, None, budget=10)
    assert torch.equal(tree.tokens[:, :6], base.argmax(-1)) and tree.num_nodes.tolist() == [6, 6]


# -------------------------------------------------------------------------------- DDTree
def ref_ddtree(base_row, budget):
    """heapq over rank tuples, float32 arithmetic, insertion counter for ties."""
    depths, vocab = base_row.shape
    ranks = min(budget, vocab)
    logprobs = torch.log_softmax(base_row.float(), dim=-1)
    values, ids = torch.sort(logprobs, dim=-1, descending=True, stable=True)
    values, ids = values[:, :ranks].numpy(), ids[:, :ranks].numpy()
    counter = 0
    heap = [(-values[0, 0], counter, 1, 0, 0, np.float32(0.0))]
    nodes = []  # (token, parent, depth, priority)
    while heap and len(nodes) < budget:
        neg, _, depth, rank, parent, parent_priority = heapq.heappop(heap)
        nodes.append((int(ids[depth - 1, rank]), parent, depth, float(-neg)))
        index = len(nodes)
        if rank + 1 < ranks:
            counter += 1
            prio = np.float32(parent_priority + values[depth - 1, rank + 1])
            heapq.heappush(heap, (-prio, counter, depth, rank + 1, parent, parent_priority))
        if depth < depths:
            counter += 1
            prio = np.float32(-neg + values[depth, 0])
            heapq.heappush(heap, (-prio, counter, depth + 1, 0, index, np.float32(-neg)))
    return nodes


@SETTINGS
@given(seed=st.integers(0, 10**6), depths=st.integers(1, 6), vocab=st.integers(2, 30),
       budget=st.integers(1, 40), quantised=st.booleans())
def test_ddtree_matches_heapq_reference(seed, depths, vocab, budget, quantised):
    base, _, root, _ = make_inputs(seed, 3, depths, vocab, with_head=False)
    if quantised:
        base = base.round()
    tree = build_tree("ddtree", base, None, root, None, budget=budget)
    for r in range(3):
        nodes = ref_ddtree(base[r], budget)
        count = len(nodes)
        assert int(tree.num_nodes[r]) == count
        assert tree.tokens[r, :count].tolist() == [n[0] for n in nodes]
        assert tree.parents[r, :count].tolist() == [n[1] for n in nodes]
        assert tree.depths[r, :count].tolist() == [n[2] for n in nodes]
        assert tree.scores[r, :count].tolist() == pytest.approx([n[3] for n in nodes])


def test_ddtree_large_vocab_uses_threshold_topk():
    base, _, root, _ = make_inputs(3, 2, 4, 6000, with_head=False)
    tree = build_tree("ddtree", base, None, root, None, budget=32)
    for r in range(2):
        nodes = ref_ddtree(base[r], 32)
        assert tree.tokens[r].tolist() == [n[0] for n in nodes]
        assert tree.parents[r].tolist() == [n[1] for n in nodes]


# ------------------------------------------------------------------------ batching, misc
@pytest.mark.parametrize("variant", ["chain", "ddtree", "fixed", "pruned"])
def test_batched_equals_per_request(variant):
    base, hidden, root, head = make_inputs(11, 3, 6, 40)
    assert_batched_equals_per_request(variant, base, hidden, root, head,
                                      budget=16, top_k=8, width=4)


def assert_batched_equals_per_request(variant, base, hidden, root, head, **kwargs) -> None:
    """Building every request's tree in one batch gives each request's own tree."""
    batched = build_tree(variant, base, hidden, root, head, **kwargs)
    for r in range(base.shape[0]):
        single = build_tree(variant, base[r : r + 1], hidden[r : r + 1], root[r : r + 1], head,
                            **kwargs)
        for name in ("tokens", "parents", "depths", "valid", "num_nodes"):
            assert torch.equal(getattr(batched, name)[r], getattr(single, name)[0]), name
        torch.testing.assert_close(batched.scores[r], single.scores[0])


def test_deterministic_tie_breaking_with_all_equal_logits():
    base = torch.zeros(1, 3, 10)
    root = torch.tensor([4])
    tree = build_tree("pruned", base, None, root, None, budget=5, top_k=3, width=2,
                      depth_bonus=0.0)
    # candidates are tokens 0, 1, 2 (lowest ids); every score ties, so the lowest
    # (parent, candidate) index and then ancestors win.
    assert tree.tokens[0].tolist() == [0, 1, 0, 1, 0]
    assert tree.parents[0].tolist() == [0, 0, 1, 1, 3]


def test_stable_topk_ties_and_large_rows():
    gen = torch.Generator().manual_seed(0)
    for size, k in ((50, 7), (10000, 64), (10000, 1), (5000, 5000)):
        x = torch.randint(0, 5, (3, 2, size), generator=gen).float()
        x[0, 0, :size // 2] = float("-inf")
        values, ids = stable_topk(x, k)
        expected_values, expected_ids = torch.sort(x, dim=-1, descending=True, stable=True)
        assert torch.equal(ids, expected_ids[..., :k])
        assert torch.equal(values, expected_values[..., :k])


def test_argument_validation():
    base, hidden, root, head = make_inputs(0, 2, 3, 10)
    cases = [
        (dict(variant="bogus"), "variant='bogus'"),
        (dict(budget=0), "budget=0"),
        (dict(top_k=0), "top_k=0"),
        (dict(top_k=11), "top_k=11.*V=10"),
        (dict(width=0), "width=0"),
        (dict(variant="pruned", depth_bonus=0.5), "depth_bonus=0.5"),
    ]
    for overrides, message in cases:
        kwargs = dict(variant="pruned", budget=8, top_k=4, width=2, depth_bonus=-0.2)
        kwargs.update(overrides)
        variant = kwargs.pop("variant")
        with pytest.raises(ValueError, match=message):
            build_tree(variant, base, hidden, root, head, **kwargs)
    with pytest.raises(ValueError, match="draft_hidden"):
        build_tree("pruned", base, None, root, head, top_k=4)
    with pytest.raises(ValueError, match="D >= 1"):
        build_tree("chain", base[:, :0], None, root, None)
    with pytest.raises(ValueError, match="root_tokens"):
        build_tree("pruned", base, hidden, root[:1], head, top_k=4)


@pytest.mark.parametrize("variant", ["pruned", "fixed", "ddtree", "chain"])
@pytest.mark.parametrize("budget", [3, 6, 9])
def test_depths_past_the_budget_never_change_a_tree(variant, budget):
    """A tree of B nodes cannot reach depth B + 1, so the proposer drops those depths."""
    gen = torch.Generator().manual_seed(budget)
    depths, vocab = 12, 50
    base = torch.randn(3, depths, vocab, generator=gen) * 2
    hidden = torch.randn(3, depths, 16, generator=gen)
    root = torch.randint(0, vocab, (3,), generator=gen)
    head = DominoHead.random(vocab, 16, 8, 8, generator=gen, scale=2.0)
    settings = dict(budget=budget, top_k=6, width=3)
    head = None if variant == "ddtree" else head
    full = build_tree(variant, base, hidden, root, head, **settings)
    cut = build_tree(variant, base[:, :budget], hidden[:, :budget], root, head, **settings)
    for name in ("tokens", "parents", "depths", "valid", "num_nodes"):
        assert torch.equal(getattr(full, name), getattr(cut, name)), name


@pytest.mark.parametrize("with_head", [True, False])
@pytest.mark.parametrize("variant", VARIANTS)
def test_reduced_vocab_columns_build_the_full_vocab_tree(variant, with_head):
    """Logits over part of the vocabulary plus each column's token id (a reduced draft
    head) give the tree built over the full row with -inf elsewhere, ties included."""
    gen = torch.Generator().manual_seed(5)
    vocab, kept = 60, 25
    base, hidden, root, head = make_inputs(2, 2, 5, vocab, with_head=with_head)
    ids = torch.randperm(vocab, generator=gen)[:kept].sort().values
    reduced = torch.randint(0, 4, (2, 5, kept), generator=gen).float()  # many ties
    full = torch.full((2, 5, vocab), float("-inf"))
    full[..., ids] = reduced
    kwargs = dict(budget=8, top_k=6, width=3)
    expected = build_tree(variant, full, hidden, root, head, **kwargs)
    got = build_tree(variant, reduced, hidden, root, head, vocab_ids=ids, **kwargs)
    for name in ("tokens", "parents", "depths", "valid", "num_nodes"):
        assert torch.equal(getattr(got, name), getattr(expected, name)), name
    torch.testing.assert_close(got.scores, expected.scores)
    with pytest.raises(ValueError, match="vocab_ids must be"):
        build_tree(variant, reduced, hidden, root, head, vocab_ids=ids[:-1], **kwargs)
