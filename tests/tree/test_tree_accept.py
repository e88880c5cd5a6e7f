"""Sampling at every node and the acceptance walk."""

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from vllm_dartree.tree import DominoHead, accept_tree, build_tree, sample_every_node
from vllm_dartree.tree.types import padded_tree

ROOT_TOKEN = 2


def hand_tree(num_requests=1, budget=7):
    """root -> 5 (node 1) -> {9 (node 3) -> 9 (node 5), 3 (node 4)}; root -> 7 (node 2).
    Columns beyond the 5 real nodes are padding (token = root token 2, parent 0)."""
    tokens = torch.tensor([[5, 7, 9, 3, 9]])
    parents = torch.tensor([[0, 0, 1, 1, 3]])
    depths = torch.tensor([[1, 1, 2, 2, 3]])
    valid = torch.ones(1, 5, dtype=torch.bool)
    root = torch.full((num_requests,), ROOT_TOKEN)
    expand = [t.expand(num_requests, -1) for t in (tokens, parents, depths, valid)]
    return padded_tree(*expand, torch.zeros(num_requests, 5), root, budget, 3)


def choices(*values, budget=7, fill=0):
    row = list(values) + [fill] * (1 + budget - len(values))
    return torch.tensor([row])


def test_walk_follows_target_and_stops_at_first_miss():
    tree = hand_tree()
    # target: root -> 5 (node 1), node 1 -> 3 (node 4), node 4 -> 8 (bonus)
    target = choices(5, 3, 0, 0, 8)
    result = accept_tree(tree, target)
    assert result.accepted_nodes.tolist() == [[0, 1, 4, -1]]
    assert result.num_accepted.tolist() == [3]
    assert result.bonus_token.tolist() == [8]
    assert result.accepted_tokens.tolist() == [[5, 3, 8, -1]]


def test_walk_reaches_deepest_node():
    target = choices(5, 9, 1, 9, 0, 4)
    result = accept_tree(hand_tree(), target)
    assert result.accepted_nodes.tolist() == [[0, 1, 3, 5]]
    assert result.num_accepted.tolist() == [4]
    assert result.accepted_tokens.tolist() == [[5, 9, 9, 4]]
    assert result.bonus_token.tolist() == [4]


def test_padding_is_never_accepted():
    tree = hand_tree()
    assert not tree.valid[0, 5:].any() and (tree.tokens[0, 5:] == ROOT_TOKEN).all()
    # the target picks the root token at the root: only padding nodes carry it
    result = accept_tree(tree, choices(ROOT_TOKEN))
    assert result.accepted_nodes.tolist() == [[0, -1, -1, -1]]
    assert result.num_accepted.tolist() == [1]
    assert result.bonus_token.tolist() == [ROOT_TOKEN]
    assert result.accepted_tokens.tolist() == [[ROOT_TOKEN, -1, -1, -1]]


def naive_walk(tree, target, r):
    node, path = 0, [0]
    while True:
        wanted = int(target[r, node])
        children = [j + 1 for j in range(tree.budget) if tree.valid[r, j]
                    and int(tree.parents[r, j]) == node and int(tree.tokens[r, j]) == wanted]
        if not children:
            return path, wanted
        node = children[0]
        path.append(node)


def test_batched_walk_equals_per_request_and_naive_walk():
    gen = torch.Generator().manual_seed(0)
    num_requests, depths, vocab = 6, 5, 12
    base = torch.randn(num_requests, depths, vocab, generator=gen) * 3
    hidden = torch.randn(num_requests, depths, 8, generator=gen)
    root = torch.randint(0, vocab, (num_requests,), generator=gen)
    head = DominoHead.random(vocab, 8, 6, 4, generator=gen)
    tree = build_tree("pruned", base, hidden, root, head, budget=20, top_k=4, width=5)
    # target follows the tree's best child at most nodes so paths get long
    target = torch.randint(0, vocab, (num_requests, 21), generator=gen)
    for r in range(num_requests):
        for j in range(20):
            parent = int(tree.parents[r, j])
            if tree.valid[r, j] and torch.rand((), generator=gen) < 0.5:
                target[r, parent] = tree.tokens[r, j]
    batched = accept_tree(tree, target)
    for r in range(num_requests):
        single_tree = type(tree)(*(getattr(tree, f)[r : r + 1] for f in
                                   ("tokens", "parents", "depths", "num_nodes", "valid",
                                    "scores")), max_depth=tree.max_depth)
        single = accept_tree(single_tree, target[r : r + 1])
        for field in ("accepted_nodes", "num_accepted", "bonus_token", "accepted_tokens"):
            assert torch.equal(getattr(batched, field)[r], getattr(single, field)[0])
        path, bonus = naive_walk(tree, target, r)
        n = len(path)
        assert batched.accepted_nodes[r].tolist() == path + [-1] * (depths + 1 - n)
        assert int(batched.bonus_token[r]) == bonus
        tokens = [int(tree.tokens[r, node - 1]) for node in path[1:]] + [bonus]
        assert batched.accepted_tokens[r, :n].tolist() == tokens
    assert batched.num_accepted.max() > 2


# ----------------------------------------------------------------------------- sampling
def test_greedy_rows_take_argmax():
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(3, 5, 20, generator=gen)
    sampled = sample_every_node(logits, torch.tensor([0.0, 1.0, 1e-6]))
    assert torch.equal(sampled[0], logits[0].argmax(-1))
    assert torch.equal(sampled[2], logits[2].argmax(-1))
    assert sampled.dtype == torch.int64 and sampled.shape == (3, 5)


def test_seeded_generators_make_sampling_reproducible():
    logits = torch.randn(3, 9, 50)
    temperature = torch.tensor([1.0, 0.7, 1.3])

    def draw():
        generators = {0: torch.Generator().manual_seed(11), 2: torch.Generator().manual_seed(12)}
        return sample_every_node(logits, temperature, generators)

    first, second = draw(), draw()
    assert torch.equal(first[0], second[0]) and torch.equal(first[2], second[2])
    torch.manual_seed(5)
    a = sample_every_node(logits, temperature)
    torch.manual_seed(5)
    b = sample_every_node(logits, temperature)
    assert torch.equal(a, b)


def test_temperature_scales_the_sampled_distribution():
    torch.manual_seed(2)
    logits = torch.tensor([0.0, 1.0, 2.0, -1.0])
    trials = 20000
    for temperature in (0.5, 2.0):
        sampled = sample_every_node(logits.expand(trials, 1, 4), torch.full((trials,),
                                                                              temperature))
        counts = torch.bincount(sampled.flatten(), minlength=4).numpy()
        expected = torch.softmax(logits.double() / temperature, 0).numpy() * trials
        assert chisquare(counts, expected).pvalue > 1e-3


def test_tree_sampling_emits_the_target_distribution():
    """T = 1, V = 6. The target is a fixed two-step model: p(t1) from ``first`` and
    p(t2 | t1) from ``second[t1]``. The tree drafts t1 in {1, 3, 4} (children of the root)
    and, under t1 = 1, t2 in {0, 5}. Verify logits at every node are the target's logits for
    that node's context; when t1 is not drafted, t1 is the bonus and t2 comes from a second
    verify step with the root t1. The emitted (t1, t2) must follow p(t1) p(t2 | t1)."""
    torch.manual_seed(1234)
    vocab, trials = 6, 20000
    gen = torch.Generator().manual_seed(3)
    first = torch.randn(vocab, generator=gen) * 0.5
    second = torch.randn(vocab, vocab, generator=gen) * 0.5
    third = torch.randn(vocab, generator=gen)  # target logits two steps deep (unused by t1,t2)
    tokens = torch.tensor([[1, 3, 4, 0, 5]])
    parents = torch.tensor([[0, 0, 0, 1, 1]])
    depths = torch.tensor([[1, 1, 1, 2, 2]])
    root = torch.full((trials,), 2)
    tree = padded_tree(tokens.expand(trials, -1), parents.expand(trials, -1),
                       depths.expand(trials, -1), torch.ones(trials, 5, dtype=torch.bool),
                       torch.zeros(trials, 5), root, 7, 2)
    node_logits = torch.stack([first, second[1], second[3], second[4], third, third,
                               third, third])  # root, nodes 1..5, two padding nodes
    target = sample_every_node(node_logits.expand(trials, -1, -1), torch.ones(trials))
    result = accept_tree(tree, target)
    t1 = result.accepted_tokens[:, 0]
    t2 = result.accepted_tokens[:, 1]
    missing = result.num_accepted == 1  # t1 was the bonus: run one more verify step
    next_step = sample_every_node(second[t1].unsqueeze(1), torch.ones(trials))[:, 0]
    t2 = torch.where(missing, next_step, t2)
    counts = torch.bincount(t1 * vocab + t2, minlength=vocab * vocab).double().numpy()
    joint = torch.softmax(first.double(), 0).unsqueeze(1) * torch.softmax(second.double(), 1)
    expected = joint.flatten().numpy() * trials
    assert expected.min() > 5  # chi-square validity
    assert np.isclose(expected.sum(), trials)
    assert chisquare(counts, expected).pvalue > 1e-3
    # sanity: the walk accepted drafted children a fair share of the time
    assert (~missing).float().mean() > 0.3


@pytest.mark.parametrize("budget", [1, 64])
def test_accept_on_built_chain_greedy(budget):
    gen = torch.Generator().manual_seed(4)
    base = torch.randn(2, 16, 30, generator=gen)
    root = torch.tensor([1, 2])
    tree = build_tree("chain", base, None, root, None, budget=budget)
    # the target agrees with the chain everywhere: accept min(16, budget) drafts + bonus
    target = torch.cat([tree.tokens, torch.full((2, 1), 7)], 1)
    target[:, min(16, budget)] = 7
    result = accept_tree(tree, target)
    n = min(16, budget)
    assert result.num_accepted.tolist() == [n + 1] * 2
    assert result.accepted_tokens[:, :n].tolist() == tree.tokens[:, :n].tolist()
    assert result.bonus_token.tolist() == [7, 7]
    assert result.accepted_nodes.shape == (2, 17)
