"""The layout of one tree verify step, and the index arithmetic built on it.

vLLM lays a step's tokens out flat: each request's rows follow each other, and a request
with n drafts has ``[root, draft 1, ..., draft n]`` as its last n + 1 rows (the root is the
last committed token); its logits rows are the same n + 1 rows, packed request after
request. A :class:`VerifyPlan` says where every tree node of every verified request sits
in both, built once per step on the host (from vLLM's host-side metadata) and copied to the
device in one transfer. Everything after that (:func:`depth_position_values`,
:func:`accepted_row_order`, :func:`compaction_pairs`) is device arithmetic without a host
sync: padded columns are written with values that make their duplicate writes identical,
or sent to a scratch row, instead of being selected with boolean masks.

No vLLM import: each runner's glue (V1: ``integration/v1/runner.py``; V2:
``integration/v2/model_state.py``) translates vLLM's objects into these arguments.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from vllm_dartree.tree import (
    DraftTree,
    ancestor_mask,
    causal_rows,
    chain_tree,
    select_requests,
    stack_trees,
    truncate,
    where_requests,
)


@dataclass
class Proposal:
    """The trees the drafter proposed in step ``step_index`` for the requests' next
    verify."""

    step_index: int
    row_of_request: dict[str, int]  # req_id -> row of ``tree``
    tree: DraftTree  # [R, B]
    chains: bool = False  # every tree is a chain (node j's parent is node j - 1)


@dataclass
class VerifyPlan:
    """Where the T requests verified with drafts this step sit (batch order)."""

    step_index: int
    req_ids: list[str]  # [T] host
    num_logit_rows: int  # host: rows of the step's logits (sum over requests of n + 1)
    num_verify_rows: int  # host: token rows of the T verified requests (sum of n + 1)
    logit_starts: list[int]  # [R] host: first logits row of every request of the batch
    batch_index: torch.Tensor  # [T] position of the request in vLLM's batch
    root_row: torch.Tensor  # [T] flattened token row of the root
    num_drafts: torch.Tensor  # [T] draft rows scheduled after the root (<= B)
    first_logit_row: torch.Tensor  # [R] first logits row of every request of the batch
    request_of_logit_row: torch.Tensor  # [num_logit_rows] batch position of each logits row
    node_logit_rows: torch.Tensor  # [T, 1+B] logits row of root and nodes (padding clamped)
    node_rows: torch.Tensor  # [T, B] flattened token row of each node (padding clamped)
    node_in_batch: torch.Tensor  # bool [T, B] column < num_drafts
    tree: DraftTree  # [T, B]; columns >= num_drafts are invalid dummies
    ancestors: torch.Tensor  # bool [T, 1+B, 1+B]
    # [T] leading nodes the target's causal attention already verifies exactly (a
    # depth-first tree's best branch; every node of a chain): backends recompute the rest.
    causal_rows: torch.Tensor
    # Every tree is a chain: the target's causal attention is already exact for it, and
    # the backends skip the tree recompute.
    chains: bool = False

    @property
    def num_requests(self) -> int:
        return len(self.req_ids)


@dataclass
class AcceptedPaths:
    """The accepted path of each verified request, for compaction and the next context."""

    plan: VerifyPlan
    accepted_nodes: torch.Tensor  # [T, D+1] node indices on the path, root first, -1 pad
    num_accepted: torch.Tensor  # [T] path length including the root


def build_plan(step_index: int, req_ids: list[str], num_drafts: list[int],
               num_scheduled: np.ndarray, proposal: Proposal | None,
               chain_drafts: dict[str, list[int]], budget: int, device: torch.device,
               chain_rows: list[bool] | None = None) -> VerifyPlan | None:
    """The plan of a step, or None when no request has drafts.

    ``req_ids``/``num_drafts`` are vLLM's batch (order and draft rows per request),
    ``num_scheduled`` the tokens scheduled per request; drafts of a request the proposal has
    no tree for verify as a chain over ``chain_drafts[req_id]`` (e.g. after a preemption).
    A request of ``chain_rows`` (batch order) verifies every scheduled row as a chain node,
    whatever the proposal's tree: vLLM's chain machinery reads its rows in that order.
    """
    drafts = np.asarray(num_drafts, dtype=np.int64)
    verified = np.flatnonzero(drafts > 0)
    if verified.size == 0:
        return None
    ends = np.cumsum(np.asarray(num_scheduled, dtype=np.int64)[: drafts.size])
    logit_starts = np.cumsum(drafts + 1) - (drafts + 1)
    n = drafts[verified]
    columns = np.arange(budget)
    clamped = np.minimum(columns[None, :], (n - 1)[:, None])
    host = {
        "batch_index": verified,
        "root_row": ends[verified] - n - 1,
        "num_drafts": n,
        "first_logit_row": logit_starts,
        "request_of_logit_row": np.repeat(np.arange(drafts.size), drafts + 1),
        "node_logit_rows": logit_starts[verified][:, None]
        + np.concatenate([np.zeros((n.size, 1), np.int64), 1 + clamped], axis=1),
        "node_rows": (ends[verified] - n)[:, None] + clamped,
    }
    dev = {k: to_device(v, device) for k, v in host.items()}
    ids = [req_ids[i] for i in verified]
    tree = gather_trees(ids, proposal, chain_drafts, budget, device)
    if chain_rows is not None and any(chain_rows[i] for i in verified):
        mask = to_device(np.asarray(chain_rows)[verified], device).bool()
        tree = where_requests(mask, chain_tree(tree.tokens), tree)
    tree = truncate(tree, dev["num_drafts"])
    # Requests the proposal has no tree for verify as chains.
    chains = proposal is None or proposal.chains
    return VerifyPlan(
        step_index=step_index, req_ids=ids, num_logit_rows=int(drafts.sum() + drafts.size),
        num_verify_rows=int(n.sum() + n.size),
        logit_starts=logit_starts.tolist(), **dev,
        node_in_batch=torch.arange(budget, device=device) < dev["num_drafts"].unsqueeze(1),
        tree=tree, ancestors=ancestor_mask(tree), causal_rows=causal_rows(tree), chains=chains,
    )


def to_device(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """Host array -> int64 tensor on ``device`` (pinned and non-blocking on a GPU)."""
    tensor = torch.from_numpy(np.ascontiguousarray(array, dtype=np.int64))
    if device.type == "cpu":
        return tensor
    return tensor.pin_memory().to(device, non_blocking=True)


def gather_trees(req_ids: list[str], proposal: Proposal | None,
                 chain_drafts: dict[str, list[int]], budget: int,
                 device: torch.device) -> DraftTree:
    """The proposal's trees of ``req_ids`` (one gather), with chains for requests it lacks."""
    rows = [None if proposal is None else proposal.row_of_request.get(r) for r in req_ids]
    if all(row is not None for row in rows):
        return select_requests(proposal.tree, to_device(np.asarray(rows), device))
    # Rare (drafts vLLM kept across a preemption): assemble request by request.
    trees = []
    for req_id, row in zip(req_ids, rows):
        if row is None:
            tokens = (list(chain_drafts.get(req_id, [])) + [0] * budget)[:budget]
            trees.append(chain_tree(to_device(np.asarray([tokens]), device)))
        else:
            trees.append(select_requests(proposal.tree, to_device(np.asarray([row]), device)))
    return stack_trees(trees)


def depth_position_values(plan: VerifyPlan, positions: torch.Tensor) -> torch.Tensor:
    """[..., T, B] positions to write at ``plan.node_rows``: root position + node depth, for
    1-D positions ([N]) and M-RoPE's per-axis ones ([axes, N]) alike.

    A chain of text tokens advances every M-RoPE axis by one per token (text rows have equal
    components, offset by the request's image delta), so each axis of a node at depth d is
    the root's value on that axis + d: what the chain through that node would have had.
    Padded columns repeat the last scheduled node's row and value, so their duplicate
    writes are identical.
    """
    base = positions[..., plan.root_row].to(torch.int64).unsqueeze(-1)
    last = (plan.num_drafts - 1).clamp(min=0).unsqueeze(1)
    column = torch.minimum(torch.arange(plan.tree.budget, device=last.device), last)
    return (base + plan.tree.depths.gather(1, column)).to(positions.dtype)


def set_depth_positions(positions: torch.Tensor, plan: VerifyPlan | None) -> torch.Tensor:
    """The tree rows of ``positions`` ([N] or [axes, N]) set to root + depth, in place."""
    if plan is not None:
        positions[..., plan.node_rows] = depth_position_values(plan, positions)
    return positions


def write_depth_positions(buffer: torch.Tensor, sequential: torch.Tensor,
                          plan: VerifyPlan | None) -> torch.Tensor:
    """The step's positions in ``buffer[:n]`` (``n`` = len(sequential)): vLLM's sequential
    ones, the tree rows at root + depth. V2's target forward (and the graphs captured for
    it) reads this one persistent buffer; ``sequential`` stays untouched."""
    positions = buffer[: sequential.shape[0]]
    positions.copy_(sequential)
    return set_depth_positions(positions, plan)


def accepted_row_order(accepted: AcceptedPaths, num_tokens: int,
                       segment_starts: torch.Tensor | None = None) -> torch.Tensor:
    """A permutation of the step's token rows putting each path's rows first, in path order.

    Rows of a request's verify segment are [root, node 1, ..., node n]; the accepted nodes
    move to the front of that segment (root stays first), the others keep their order behind
    them. Rows outside verify segments are unchanged. ``segment_starts`` [T]: each verified
    request's root row when they are not the token rows (``plan.node_logit_rows[:, 0]`` for
    the step's logits rows, with ``num_tokens`` its logits rows).
    """
    plan = accepted.plan
    device = plan.root_row.device
    starts = plan.root_row if segment_starts is None else segment_starts
    size = 1 + plan.tree.budget
    nodes = accepted.accepted_nodes  # [T, D+1], -1 padded
    # Rank of each node on the path (size = not on the path); padding goes to a spare column.
    path_rank = torch.full((plan.num_requests, size + 1), size, dtype=torch.int64, device=device)
    path_rank.scatter_(1, torch.where(nodes >= 0, nodes, size),
                       torch.arange(nodes.shape[1], device=device).expand_as(nodes))
    path_rank = path_rank[:, :size]
    columns = torch.arange(size, device=device)
    scheduled = columns <= plan.num_drafts.unsqueeze(1)
    # Sort key: path nodes by path position, then the rest by node index; unscheduled last.
    key = torch.where(path_rank < size, path_rank, size + columns)
    key = torch.where(scheduled, key, 3 * size)
    sorted_nodes = key.argsort(dim=1, stable=True)  # [T, 1+B] node index per new slot
    rows = starts.unsqueeze(1) + sorted_nodes
    # Unscheduled slots write to a scratch row past the end instead of being masked out.
    dest = torch.where(scheduled, starts.unsqueeze(1) + columns, num_tokens)
    order = torch.arange(num_tokens + 1, device=device)
    order[dest] = torch.where(scheduled, rows, num_tokens)
    return order[:num_tokens]


def compaction_pairs(accepted: AcceptedPaths, slot_mapping: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """KV slots to copy so the accepted path occupies consecutive slots after the root.

    Path position d (1..a) holds node ``accepted_nodes[d]`` whose KV sits at the slot of its
    verify row; it moves to the slot of row root + d. Pairs that move nothing (the chain
    prefix, the padding past the path) copy the root's slot onto itself, which no other pair
    writes: fixed-size outputs [T * D], no host sync.
    """
    plan = accepted.plan
    nodes = accepted.accepted_nodes[:, 1:]  # [T, D]
    depth = torch.arange(1, nodes.shape[1] + 1, device=nodes.device)
    moved = (nodes >= 0) & (nodes != depth)
    root = plan.root_row.unsqueeze(1)
    src_rows = torch.where(moved, root + nodes.clamp(min=0), root)
    dst_rows = torch.where(moved, root + depth, root)
    return slot_mapping[src_rows.flatten()], slot_mapping[dst_rows.flatten()]


def path_tokens(plan: VerifyPlan, pad: int) -> torch.Tensor:
    """int64 [num_logit_rows, B]: at each logits row of a tree node, the drafted tokens on
    the path from the root to that node (the node included, the root excluded: vLLM counts
    the root among the request's output), in node order, ``pad`` elsewhere; rows of roots
    and of requests without drafts are all ``pad``. What a row's sampling sees beyond the
    request's committed output: the row's context in target-only decoding (penalties count
    these tokens). Padded columns of ``node_logit_rows`` repeat the last node's row and
    write its path, so their duplicate writes are identical."""
    tree = plan.tree
    size = 1 + tree.budget
    columns = torch.arange(size, device=tree.tokens.device)
    node = torch.minimum(columns, plan.num_drafts.unsqueeze(1))  # [T, 1+B] as node_logit_rows
    on_path = plan.ancestors.gather(1, node.unsqueeze(-1).expand(-1, -1, size))[:, :, 1:]
    tokens = torch.where(on_path, tree.tokens.unsqueeze(1), pad)  # [T, 1+B, B]
    rows = torch.full((plan.num_logit_rows, tree.budget), pad, dtype=torch.int64,
                      device=tree.tokens.device)
    rows[plan.node_logit_rows] = tokens
    return rows


def verifies_as_chain(sampling_params) -> bool:
    """Whether a request's drafts verify as a chain of its own, on both runners: its
    sampling follows state along the drafted tokens that a tree row does not carry (bad
    words, whose multi-token words match the prefix; a structured output's grammar; a
    thinking budget). vLLM's sampling machinery processes such a chain's rows in chain order;
    its batch-mates keep their trees. Penalties verify on trees: each row counts its own
    path (:func:`path_tokens`)."""
    sp = sampling_params
    if sp is None:
        return False
    return bool(sp.bad_words or sp.structured_outputs is not None
                or getattr(sp, "thinking_token_budget", None))


def verifies_as_chain_on_v1(sampling_params, processed_logprobs: bool = False) -> bool:
    """V1: :func:`verifies_as_chain`, or logprobs in an engine whose logprobs mode is a
    processed one (``processed_logprobs``: V1's tree verifier keeps only the raw logits
    rows; vLLM's rejection sampler gives such a chain's logprobs). Allowed token ids, logit
    bias, min_tokens, penalties, min p and raw logprobs are applied to tree rows
    (``integration/v1/sampling.py``)."""
    sp = sampling_params
    return verifies_as_chain(sp) or (processed_logprobs and sp is not None
                                     and sp.logprobs is not None)


def chain_requests_on_v1(requests: Mapping[str, Any], req_ids: Iterable[str],
                         processed_logprobs: bool = False) -> list[bool]:
    """:func:`verifies_as_chain_on_v1` of each request ``req_ids[i]`` (``requests`` holding
    each request's state, with its ``sampling_params``, by id)."""
    return [verifies_as_chain_on_v1(getattr(requests.get(r), "sampling_params", None),
                                    processed_logprobs) for r in req_ids]
