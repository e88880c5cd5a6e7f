"""Which nodes to verify, given each node's acceptance p and the step-time curve T(n):

    E(n) = R + P_n          P_n: sum of the n largest p_u over the batch
    n*   = argmax_{0 <= n <= R * B} E(n) / T(n)

A step emits one bonus token per request plus one per accepted node, and the nodes of one
depth of a tree are disjoint events, so E(n) is the expected number of tokens. p never grows
along a path and ties go to the shallower node, so every request's share of the top n is a
subtree (Lemma 1 of the paper for the path score); n* = 0 means plain decoding for the step.

Each request's nodes are put in priority order (:func:`priority_order`), so that any prefix
of columns is a subtree: the chosen count of a request is just how many of its columns vLLM
schedules. That order depends only on the drafter's output and the observed acceptance,
never on timings, so every tensor-parallel rank builds the same trees; only the counts
(rank 0's, which the scheduler uses) come from the clock.
"""

from __future__ import annotations

import torch

from vllm_dartree.tree.types import DraftTree, reorder


def priority_order(tree: DraftTree, acceptance: torch.Tensor) -> tuple[DraftTree, torch.Tensor]:
    """Each request's nodes sorted by (acceptance desc, depth asc); padding last.

    Every prefix of the new columns is ancestor-closed: an ancestor never has a lower
    acceptance than its descendant and wins ties by depth. Returns the reordered tree and
    its acceptance [R, B] in the new order.
    """
    key = torch.where(tree.valid, acceptance, torch.full_like(acceptance, -1.0))
    by_depth = tree.depths.argsort(dim=1, stable=True)
    order = by_depth.gather(1, key.gather(1, by_depth).argsort(dim=1, descending=True,
                                                                  stable=True))
    return reorder(tree, order), acceptance.gather(1, order)


def best_node_count(acceptance: torch.Tensor, step_ms: torch.Tensor) -> torch.Tensor:
    """n* = argmax_n (R + P_n) / step_ms[n] over n = 0 .. R*B (0-dim int64 tensor).

    ``acceptance`` [R, B] per node, ``step_ms`` [R*B + 1] predicted step time with n nodes.
    """
    num_requests = acceptance.shape[0]
    best_first = acceptance.flatten().sort(descending=True).values
    expected = num_requests + torch.cat([best_first.new_zeros(1), best_first.cumsum(0)])
    return (expected / step_ms).argmax()


def counts_of_top(acceptance: torch.Tensor, total: torch.Tensor,
                  valid: torch.Tensor | None = None) -> torch.Tensor:
    """[R] how many of each request's (priority-ordered) nodes are among the batch's
    ``total`` best. Ties across requests go to the lower request index, so the counts add
    up to ``total`` exactly; padding columns (``valid`` False, sorted last) never count."""
    num_requests, budget = acceptance.shape
    flat = acceptance.flatten()
    rank = torch.empty_like(flat, dtype=torch.int64)
    rank[flat.argsort(descending=True, stable=True)] = torch.arange(flat.numel(),
                                                                    device=flat.device)
    chosen = rank.view(num_requests, budget) < total
    return (chosen if valid is None else chosen & valid).sum(dim=1)
