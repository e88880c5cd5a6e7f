"""Per-engine state that carries one step's tree from the drafter to verification and back.

drafter (``propose``) -> :class:`ProposedTrees` -> verify layout (:class:`VerifyStep`, depth
positions + ancestor mask for the target forward) -> acceptance (:class:`AcceptedPaths`, the
tree sampler) -> KV compaction -> drafter context (rows of the accepted path first).

Nothing here imports vLLM: the runner patches translate vLLM's objects into these tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vllm_dartree.tree import DraftTree, ancestor_mask


@dataclass
class ProposedTrees:
    """Trees the drafter proposed at the end of a step, for the requests' next verify."""

    row_of_request: dict[str, int]  # req_id -> row of ``tree``
    tree: DraftTree  # [R, B]


@dataclass
class VerifyStep:
    """Layout of the requests verified with drafts in this forward (T of them, batch order)."""

    batch_index: torch.Tensor  # [T] index of the request in the engine batch
    root_row: torch.Tensor  # [T] flattened-token row of the root (the last committed token)
    num_drafts: torch.Tensor  # [T] draft rows scheduled after the root (<= B)
    tree: DraftTree  # [T, B]; columns >= num_drafts are marked invalid
    ancestors: torch.Tensor  # bool [T, 1+B, 1+B] (rows/cols past num_drafts: self only)
    node_rows: torch.Tensor  # [T, B] flattened row of each node (clamped for padding)
    node_in_batch: torch.Tensor  # bool [T, B] node was scheduled (column < num_drafts)

    @property
    def num_requests(self) -> int:
        return int(self.batch_index.shape[0])


@dataclass
class AcceptedPaths:
    """Acceptance of one verify step, for KV compaction and the drafter's context."""

    verify: VerifyStep
    accepted_nodes: torch.Tensor  # [T, D+1] node indices on the path, root first, -1 pad
    num_accepted: torch.Tensor  # [T] path length including the root


def chain_tree(tokens: torch.Tensor) -> DraftTree:
    """A chain over ``tokens`` [R, B]: node j's parent is node j-1 (used for non-tree drafts)."""
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


def stack_trees(trees: list[DraftTree], max_depth: int) -> DraftTree:
    """Concatenate per-request trees (same B) along the request axis."""
    return DraftTree(
        tokens=torch.cat([t.tokens for t in trees]),
        parents=torch.cat([t.parents for t in trees]),
        depths=torch.cat([t.depths for t in trees]),
        num_nodes=torch.cat([t.num_nodes for t in trees]),
        valid=torch.cat([t.valid for t in trees]),
        scores=torch.cat([t.scores for t in trees]),
        max_depth=max_depth,
    )


def row_of(tree: DraftTree, row: int) -> DraftTree:
    sl = slice(row, row + 1)
    return DraftTree(tree.tokens[sl], tree.parents[sl], tree.depths[sl], tree.num_nodes[sl],
                     tree.valid[sl], tree.scores[sl], tree.max_depth)


def truncate(tree: DraftTree, num_drafts: torch.Tensor) -> DraftTree:
    """Keep the first ``num_drafts[r]`` nodes (a topological prefix is still a tree)."""
    budget = tree.budget
    scheduled = torch.arange(budget, device=num_drafts.device) < num_drafts.unsqueeze(1)
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


def build_verify_step(
    trees: list[DraftTree], batch_index: list[int], root_row: list[int], num_drafts: list[int],
    device: torch.device,
) -> VerifyStep:
    """Assemble the verify layout from per-request trees (already padded to B)."""
    max_depth = max(t.depth_limit for t in trees)
    drafts = torch.tensor(num_drafts, dtype=torch.int64, device=device)
    tree = truncate(stack_trees(trees, max_depth), drafts)
    roots = torch.tensor(root_row, dtype=torch.int64, device=device)
    budget = tree.budget
    columns = torch.arange(budget, device=device)
    node_in_batch = columns < drafts.unsqueeze(1)
    node_rows = roots.unsqueeze(1) + 1 + torch.minimum(columns, (drafts - 1).clamp(min=0)
                                                       .unsqueeze(1))
    return VerifyStep(
        batch_index=torch.tensor(batch_index, dtype=torch.int64, device=device),
        root_row=roots,
        num_drafts=drafts,
        tree=tree,
        ancestors=ancestor_mask(tree),
        node_rows=node_rows,
        node_in_batch=node_in_batch,
    )


def depth_positions(step: VerifyStep, positions: torch.Tensor) -> torch.Tensor:
    """Positions of the scheduled node rows under the tree: root position + depth."""
    base = positions[step.root_row].to(torch.int64).unsqueeze(1)
    return (base + step.tree.depths)[step.node_in_batch].to(positions.dtype)


def accepted_row_order(accepted: AcceptedPaths, num_tokens: int) -> torch.Tensor:
    """A permutation of the step's token rows putting each path's rows first, in path order.

    Rows of a request's verify segment are [root, node 1, ..., node n]; the accepted nodes
    move to the front of that segment (root stays first), the others keep their order behind
    them. Rows outside verify segments are unchanged.
    """
    step = accepted.verify
    device = step.root_row.device
    order = torch.arange(num_tokens, device=device)
    size = 1 + step.tree.budget
    nodes = accepted.accepted_nodes  # [T, D+1], -1 padded
    # Rank of each node on the path (size = not on the path); padding goes to a spare column.
    path_rank = torch.full((step.num_requests, size + 1), size, dtype=torch.int64, device=device)
    path_rank.scatter_(1, torch.where(nodes >= 0, nodes, size),
                       torch.arange(nodes.shape[1], device=device).expand_as(nodes))
    path_rank = path_rank[:, :size]
    on_path = path_rank < size
    scheduled = torch.arange(size, device=device) <= step.num_drafts.unsqueeze(1)
    # Sort key: path nodes by path position, then the rest by node index.
    key = torch.where(on_path, path_rank, size + torch.arange(size, device=device))
    key = torch.where(scheduled, key, 3 * size)  # unscheduled columns sort last (dropped)
    sorted_nodes = key.argsort(dim=1, stable=True)  # [T, 1+B] node index per new slot
    rows = step.root_row.unsqueeze(1) + sorted_nodes
    dest = step.root_row.unsqueeze(1) + torch.arange(size, device=device)
    order[dest[scheduled]] = rows[scheduled]
    return order


def compaction_pairs(accepted: AcceptedPaths, slot_mapping: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """KV slots to copy so the accepted path occupies consecutive slots after the root.

    Path position d (1..a) holds node ``accepted_nodes[d]`` whose KV sits at the slot of its
    verify row; it moves to the slot of row root + d. Pairs where source == destination
    (the chain prefix) are dropped.
    """
    step = accepted.verify
    nodes = accepted.accepted_nodes[:, 1:]  # [T, D]
    depth = torch.arange(1, nodes.shape[1] + 1, device=nodes.device)
    moved = (nodes >= 0) & (nodes != depth)
    src_rows = step.root_row.unsqueeze(1) + nodes.clamp(min=0)
    dst_rows = step.root_row.unsqueeze(1) + depth
    return slot_mapping[src_rows[moved]], slot_mapping[dst_rows[moved]]


def needs_chain_verification(sampling_params) -> bool:
    """Requests whose sampling reads the drafted prefix (or needs per-token logprobs) are
    verified as chains: vLLM's own chain machinery then handles them exactly."""
    sp = sampling_params
    if sp is None:
        return False
    return bool(
        sp.presence_penalty or sp.frequency_penalty or sp.repetition_penalty != 1.0
        or sp.bad_words or sp.allowed_token_ids or sp.logit_bias or sp.min_tokens
        or sp.min_p or sp.logprobs is not None or sp.structured_outputs is not None
        or getattr(sp, "thinking_token_budget", None)
    )


def batch_needs_chain(runner, req_ids) -> bool:
    return any(
        needs_chain_verification(getattr(runner.requests.get(r), "sampling_params", None))
        for r in req_ids
    )
