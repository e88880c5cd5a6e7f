"""A drafter's candidate lattice: K candidates per depth and a score for every transition.

vLLM's DFlash2 and LiLiCorr drafters do not rescore the vocabulary along a branch; their
head scores a lattice once per step. Per request and depth d the drafter names K candidate
tokens (``ids [R, D, K]``, distinct within a depth) and scores each candidate j of depth d
after each candidate i of depth d - 1 (``transitions [R, D, K, K]``, row i, column j). Depth
1 follows the root, so its K rows are alike (vLLM's selector walk reads row 0).

vLLM walks one chain through it: at each depth the best column of the previous pick's row
(``_selector_walk_kernel``). A tree over the same lattice gives every node the children of
its own row: a node's children are the next depth's candidates, their log-probs the
log-softmax of the node's row. The builders in :mod:`~vllm_dartree.tree.build` take a
lattice in place of the top-K of the base logits plus a correction head; the chain they
build is vLLM's greedy walk (ties to the lower column, as ``tl.argmax``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Lattice:
    ids: torch.Tensor  # [R, D, K] candidate token ids per depth, as the drafter ranks them
    transitions: torch.Tensor  # [R, D, K, K] score of column j at depth d after row i

    def __post_init__(self) -> None:
        num_requests, num_depths, top_k = self.ids.shape
        expected = (num_requests, num_depths, top_k, top_k)
        if tuple(self.transitions.shape) != expected:
            raise ValueError(f"lattice transitions must be [R, D, K, K] = {list(expected)}, "
                             f"got {list(self.transitions.shape)}")

    @property
    def top_k(self) -> int:
        return self.ids.shape[-1]

    @property
    def num_depths(self) -> int:
        return self.ids.shape[1]


def row_logprobs(transitions: torch.Tensor, parent_slots: torch.Tensor) -> torch.Tensor:
    """Each parent's children log-probs: ``transitions [R, K, K]`` of one depth and the
    parents' candidate slots at the depth before ``[R, N]`` -> [R, N, K], the log-softmax of
    each parent's row (float32)."""
    top_k = transitions.shape[-1]
    rows = transitions.gather(1, parent_slots.unsqueeze(-1).expand(-1, -1, top_k))
    return torch.log_softmax(rows.float(), dim=-1)
