"""Presence, frequency and repetition penalties on tree rows (V2).

vLLM's V2 sampler penalizes a chain's row by its request's output counts plus the drafted
tokens before the row in the chain (``PenaltiesState.apply``: ``input_ids`` read back along
``expanded_local_pos``). A tree row's context is its path, not the rows before it, so while
the tree sampler draws (:func:`tree_paths`) :class:`PenaltiesOnTreePaths` counts each row's
path instead: the row's output counts plus its path tokens (``verify_plan.path_tokens``)
go to vLLM's own penalties kernel as one state row per logits row, with no chain to walk.
The arithmetic on the logits is the kernel's, so a row is penalized exactly as target-only
decoding penalizes the token after that path. Only the rows of requests with penalties are
gathered (their counts are ``[rows, vocab]``).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from vllm_dartree.integration.patching import Runner, VllmPatch
from vllm_dartree.integration.touchpoints import ALL_RELEASES
from vllm_dartree.step.verify_plan import to_device

PATHS_ATTR = "dartree_tree_paths"  # on vLLM's PenaltiesState while the tree sampler draws


@dataclass
class TreePaths:
    """The step's path tokens per logits row (``verify_plan.path_tokens``, padded with the
    vocabulary size) and each batch request's first logits row (host, [num_reqs + 1])."""

    tokens: torch.Tensor
    cu_num_logits: np.ndarray


@contextmanager
def tree_paths(penalties_state: Any, paths: TreePaths) -> Iterator[None]:
    """Penalties count ``paths`` while the block runs (the tree sampler's draw)."""
    setattr(penalties_state, PATHS_ATTR, paths)
    try:
        yield
    finally:
        setattr(penalties_state, PATHS_ATTR, None)


class PenaltiesOnTreePaths(VllmPatch):
    """V2 ``PenaltiesState.apply``: while the tree sampler draws, each row's counts are its
    path's (:func:`apply_on_paths`); every other call is vLLM's."""

    target = "vllm.v1.worker.gpu.sample.penalties:PenaltiesState"
    attribute = "apply"
    releases = ALL_RELEASES
    runner = Runner.V2

    @classmethod
    def replacement(cls, original):
        @functools.wraps(original)
        def apply(self, logits, ctx):
            paths = getattr(self, PATHS_ATTR, None)  # set only where a request has some
            if paths is None:
                return original(self, logits, ctx)
            apply_on_paths(self, logits, ctx, paths)
            return logits

        return apply


def apply_on_paths(state: Any, logits: torch.Tensor, ctx: Any, paths: TreePaths) -> None:
    """Penalize, in place, the logits rows of the batch's requests with penalties: row i
    with its request's output counts plus ``paths.tokens[i]``, through vLLM's
    ``apply_penalties`` with one state row per logits row (local position 0: no chain)."""
    from vllm.v1.worker.gpu.sample.penalties import apply_penalties

    cu = paths.cu_num_logits
    requests = np.flatnonzero(state.use_penalty[ctx.idx_mapping_np])
    rows = to_device(np.concatenate([np.arange(cu[r], cu[r + 1]) for r in requests]),
                     logits.device)
    slots = ctx.expanded_idx_mapping[rows].long()
    vocab = logits.shape[1]
    counts = torch.zeros(rows.shape[0], vocab + 1, dtype=state.output_bin_counts.dtype,
                         device=logits.device)  # the last column takes the padding
    counts[:, :vocab] = state.output_bin_counts[slots]
    path = paths.tokens[rows]
    counts.scatter_add_(1, path, torch.ones_like(path, dtype=counts.dtype))
    penalized = logits[rows]
    own_row = torch.arange(rows.shape[0], dtype=ctx.expanded_idx_mapping.dtype,
                           device=logits.device)
    apply_penalties(penalized, own_row, ctx.input_ids[rows],
                    torch.zeros_like(own_row), state.repetition_penalty.gpu[slots],
                    state.frequency_penalty.gpu[slots], state.presence_penalty.gpu[slots],
                    state.prompt_bin_mask[slots], counts[:, :vocab])
    logits[rows] = penalized
