"""Batched draft-tree tensors and the masks/positions the verifier needs.

A tree of request r has a root (node 0, the last committed token, not stored) and B drafted
nodes stored in columns 0..B-1 (column j is node j+1). Nodes are in topological order:
``parents[r, j] < j + 1``. Trees with fewer than B real nodes are padded with dummy nodes
(token = root token, parent = root, depth 1, ``valid = False``) so every shape is static.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

WORD_BITS = 64


@dataclass
class DraftTree:
    """Draft trees of R requests, each padded to B nodes (root excluded)."""

    tokens: torch.Tensor  # [R, B] int64 drafted token per node
    parents: torch.Tensor  # [R, B] int64 parent node index in 0..B (root = 0)
    depths: torch.Tensor  # [R, B] int64 depth 1..D
    num_nodes: torch.Tensor  # [R] int64 number of real (valid) nodes
    valid: torch.Tensor  # [R, B] bool real node (False = padding)
    scores: torch.Tensor  # [R, B] float32 path log-prob score (debug / plots)
    # Static upper bound on node depth (the drafter's number of depths D); fixes the shape
    # of acceptance outputs without a host sync. None means "use B".
    max_depth: int | None = None

    @property
    def num_requests(self) -> int:
        return self.tokens.shape[0]

    @property
    def budget(self) -> int:
        return self.tokens.shape[1]

    @property
    def depth_limit(self) -> int:
        return self.budget if self.max_depth is None else self.max_depth

    def parents_with_root(self) -> torch.Tensor:
        """[R, 1+B] parent of every node including the root (the root is its own parent)."""
        root = torch.zeros_like(self.parents[:, :1])
        return torch.cat([root, self.parents], dim=1)


def chain_tree(tokens: torch.Tensor) -> DraftTree:
    """A chain over ``tokens`` [R, B]: node j's parent is node j-1 (drafts that come from no
    tree, e.g. vLLM's own draft tokens, verify as this)."""
    num_requests, budget = tokens.shape
    device = tokens.device
    index = torch.arange(budget, device=device).expand(num_requests, budget)
    return DraftTree(
        tokens=tokens.to(torch.int64),
        parents=index.clone(),
        depths=index + 1,
        num_nodes=torch.full((num_requests,), budget, dtype=torch.int64, device=device),
        valid=torch.ones(num_requests, budget, dtype=torch.bool, device=device),
        scores=torch.zeros(num_requests, budget, device=device),
        max_depth=budget,
    )


def stack_trees(trees: list[DraftTree]) -> DraftTree:
    """Concatenate trees of the same budget along the request axis."""
    return DraftTree(
        tokens=torch.cat([t.tokens for t in trees]),
        parents=torch.cat([t.parents for t in trees]),
        depths=torch.cat([t.depths for t in trees]),
        num_nodes=torch.cat([t.num_nodes for t in trees]),
        valid=torch.cat([t.valid for t in trees]),
        scores=torch.cat([t.scores for t in trees]),
        max_depth=max(t.depth_limit for t in trees),
    )


def where_requests(mask: torch.Tensor, chosen: DraftTree, other: DraftTree) -> DraftTree:
    """Per request ``r``: ``chosen``'s tree where ``mask[r]`` (bool [R]), else ``other``'s
    (both of the same budget)."""
    if chosen.budget != other.budget:
        raise ValueError(f"trees of budgets {chosen.budget} and {other.budget}")
    rows = mask.view(-1, 1)
    fields = ("tokens", "parents", "depths", "valid", "scores")
    merged = {f: torch.where(rows, getattr(chosen, f), getattr(other, f)) for f in fields}
    return DraftTree(**merged, num_nodes=torch.where(mask, chosen.num_nodes, other.num_nodes),
                     max_depth=max(chosen.depth_limit, other.depth_limit))


def select_requests(tree: DraftTree, index: torch.Tensor) -> DraftTree:
    """The trees of requests ``index`` [T] (a gather: any order, repeats allowed)."""
    return DraftTree(tree.tokens[index], tree.parents[index], tree.depths[index],
                     tree.num_nodes[index], tree.valid[index], tree.scores[index],
                     tree.max_depth)


def truncate(tree: DraftTree, num_drafts: torch.Tensor) -> DraftTree:
    """Keep the first ``num_drafts[r]`` nodes of each tree (a topological prefix is still a
    tree); the others become dummies (parent root, depth 1, invalid)."""
    scheduled = torch.arange(tree.budget, device=num_drafts.device) < num_drafts.unsqueeze(1)
    valid = tree.valid & scheduled
    return DraftTree(
        tokens=tree.tokens,
        parents=torch.where(valid, tree.parents, torch.zeros_like(tree.parents)),
        depths=torch.where(valid, tree.depths, torch.ones_like(tree.depths)),
        num_nodes=valid.sum(dim=1),
        valid=valid,
        scores=tree.scores,
        max_depth=tree.max_depth,
    )


def ancestor_mask(tree: DraftTree) -> torch.Tensor:
    """bool [R, 1+B, 1+B]: row i may attend column j iff j is i or an ancestor of i.

    Pointer doubling: before round k ``visible`` holds the ancestors at distance < 2^k and
    ``jump`` the 2^k-th ancestor; after ceil(log2(1+B)) rounds every ancestor (depth <= B)
    is covered.
    The root is its own parent, so jumps past the root stay at the root.
    """
    num_requests, budget = tree.parents.shape
    size = 1 + budget
    jump = tree.parents_with_root()
    eye = torch.eye(size, dtype=torch.bool, device=jump.device)
    visible = eye.expand(num_requests, size, size).clone()
    for _ in range(math.ceil(math.log2(size))):
        # Ancestors at distance 2^k .. 2^(k+1)-1 are the visible set of the 2^k-th ancestor.
        visible |= torch.gather(visible, 1, jump.unsqueeze(-1).expand(-1, -1, size))
        jump = torch.gather(jump, 1, jump)
    return visible


def depth_first(tree: DraftTree) -> DraftTree:
    """The same trees with their nodes in depth-first preorder (siblings by column).

    Builders emit nodes depth by depth, best first within a depth, so a node's first child
    is its best one. In preorder that best branch from the root sits in consecutive columns
    (0, 1, ..., d-1 at depths 1..d), where the target's own causal attention is already
    exact: the attention backends recompute only the rows after it (:func:`causal_rows`),
    and accepting along it moves no KV. Padding (parent root, highest columns) stays last.

    Preorder index of node u, counted with the root as 0: its depth (the ancestors before
    it) plus, for u and each of its ancestors, the sizes of the subtrees of its earlier
    siblings. Small matrix products over the ancestor mask: no sort, no host sync.
    """
    size = 1 + tree.budget
    device = tree.parents.device
    ancestors = ancestor_mask(tree).to(torch.float32)  # [R, i, j]: j is i or above i
    subtree_size = ancestors.sum(dim=1)  # [R, 1+B] nodes at or below j
    parents = tree.parents_with_root()
    column = torch.arange(size, device=device)
    non_root = column > 0
    earlier_sibling = ((parents.unsqueeze(2) == parents.unsqueeze(1))
                       & (column.view(1, 1, -1) < column.view(1, -1, 1))
                       & non_root.view(1, 1, -1) & non_root.view(1, -1, 1))  # [R, a, s]
    before = torch.bmm(earlier_sibling.to(torch.float32), subtree_size.unsqueeze(2))
    depth = torch.cat([torch.zeros_like(tree.depths[:, :1]), tree.depths], dim=1)
    rank = depth + torch.bmm(ancestors, before).squeeze(2).round().to(torch.int64)
    node_at = torch.empty_like(tree.parents)  # new column -> old column
    node_at.scatter_(1, rank[:, 1:] - 1, torch.arange(tree.budget, device=device)
                     .expand_as(node_at).contiguous())
    return reorder(tree, node_at)


def reorder(tree: DraftTree, order: torch.Tensor) -> DraftTree:
    """The tree with new column j holding old column ``order[:, j]`` (a topological order)."""
    num_requests, budget = order.shape
    new_index = torch.zeros(num_requests, 1 + budget, dtype=torch.int64, device=order.device)
    new_index.scatter_(1, order + 1, torch.arange(1, budget + 1, device=order.device)
                       .expand_as(order).contiguous())
    return DraftTree(
        tokens=tree.tokens.gather(1, order),
        parents=new_index.gather(1, tree.parents.gather(1, order)),
        depths=tree.depths.gather(1, order),
        num_nodes=tree.num_nodes,
        valid=tree.valid.gather(1, order),
        scores=tree.scores.gather(1, order),
        max_depth=tree.max_depth,
    )


def causal_rows(tree: DraftTree) -> torch.Tensor:
    """[R] leading nodes whose ancestors are exactly the nodes before them (node j at depth
    j + 1): verified in this order, causal attention is already the tree attention there."""
    column_depth = torch.arange(1, tree.budget + 1, device=tree.depths.device)
    on_chain = (tree.depths == column_depth) & tree.valid
    return on_chain.to(torch.int64).cumprod(dim=1).sum(dim=1)


def pack_bool_mask(mask: torch.Tensor) -> torch.Tensor:
    """Pack the last dim of a bool tensor into int64 words (bit j % 64 of word j // 64).

    Bit 63 is the sign bit (two's complement), so a word with bit 63 set is negative.
    """
    size = mask.shape[-1]
    words = math.ceil(size / WORD_BITS)
    pad = words * WORD_BITS - size
    bits = torch.nn.functional.pad(mask.to(torch.int64), (0, pad))
    bits = bits.reshape(*mask.shape[:-1], words, WORD_BITS)
    weights = torch.ones(WORD_BITS, dtype=torch.int64, device=mask.device)
    weights = weights << torch.arange(WORD_BITS, dtype=torch.int64, device=mask.device)
    # Distinct powers of two: the sum equals the bitwise OR (wraps into bit 63 correctly).
    return (bits * weights).sum(dim=-1)


def packed_ancestor_mask(tree: DraftTree) -> torch.Tensor:
    """int64 [R, 1+B, ceil((1+B)/64)]: ``ancestor_mask`` packed into 64-bit words."""
    return pack_bool_mask(ancestor_mask(tree))


def verify_positions(tree: DraftTree, base_position: torch.Tensor) -> torch.Tensor:
    """[R, 1+B] positions of the verify tokens: root at ``base_position``, a node at +depth."""
    base = base_position.to(torch.int64).unsqueeze(1)
    return torch.cat([base, base + tree.depths], dim=1)


def verify_visibility(ancestors: torch.Tensor, base: torch.Tensor, num_rows: torch.Tensor,
                      num_keys: int) -> torch.Tensor:
    """bool [R, 1+B, num_keys]: which key positions each verify row of request r attends.

    Keys are the request's positions 0..num_keys-1. The committed prefix (positions <
    ``base[r]``) is visible to every row; verify row j sits at position ``base[r] + j`` and
    sees tree column i iff ``ancestors[r, j, i]``; positions >= ``base[r] + num_rows[r]``
    (not scheduled) are hidden. ``ancestors`` is bool [R, 1+B, 1+B].
    """
    size = ancestors.shape[-1]
    key_pos = torch.arange(num_keys, device=ancestors.device)
    tree_col = key_pos.unsqueeze(0) - base.to(torch.int64).unsqueeze(1)  # [R, L]
    in_tree = (tree_col >= 0) & (tree_col < num_rows.to(torch.int64).unsqueeze(1))
    by_mask = ancestors.gather(2, tree_col.clamp(0, size - 1).unsqueeze(1)
                               .expand(-1, size, -1))  # [R, 1+B, L]
    return torch.where(in_tree.unsqueeze(1), by_mask, (tree_col < 0).unsqueeze(1))


def verify_tokens(tree: DraftTree, root_tokens: torch.Tensor) -> torch.Tensor:
    """[R, 1+B] verify input ids: the root token followed by every node's token."""
    return torch.cat([root_tokens.to(torch.int64).unsqueeze(1), tree.tokens], dim=1)


def padded_tree(
    tokens: torch.Tensor,
    parents: torch.Tensor,
    depths: torch.Tensor,
    valid: torch.Tensor,
    scores: torch.Tensor,
    root_tokens: torch.Tensor,
    budget: int,
    max_depth: int | None,
) -> DraftTree:
    """Build a DraftTree from [R, n] node tensors (n <= budget), padding to ``budget``.

    Invalid nodes (``valid`` False), whether given or added, become dummy nodes.
    """
    num_requests, count = tokens.shape
    pad = budget - count
    if pad < 0:
        raise ValueError(f"tree has {count} nodes, more than budget={budget}")
    if pad:
        tokens = torch.nn.functional.pad(tokens, (0, pad))
        parents = torch.nn.functional.pad(parents, (0, pad))
        depths = torch.nn.functional.pad(depths, (0, pad), value=1)
        valid = torch.nn.functional.pad(valid, (0, pad), value=False)
        scores = torch.nn.functional.pad(scores, (0, pad), value=float("-inf"))
    root = root_tokens.to(torch.int64).unsqueeze(1).expand(num_requests, budget)
    return DraftTree(
        tokens=torch.where(valid, tokens, root),
        parents=torch.where(valid, parents, torch.zeros_like(parents)),
        depths=torch.where(valid, depths, torch.ones_like(depths)),
        num_nodes=valid.sum(dim=1).to(torch.int64),
        valid=valid,
        scores=torch.where(valid, scores, torch.full_like(scores, float("-inf"))).float(),
        max_depth=max_depth,
    )
