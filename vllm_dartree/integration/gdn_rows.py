"""Tree rows in a hybrid target's Gated-DeltaNet layers, whichever GDN path runs them
(vLLM's C++ CPU ops, ``cpu_gdn``; its Triton ops, ``gpu_gdn``): the state-slot layout both
paths share, and the commit after acceptance.

vLLM keeps one GDN state slot per verified row of a speculative request
(``spec_state_indices`` [requests, N + 1]; its conv window lives in the first slot's buffer
``[C, W - 1 + N]``). A step starts from column ``num_accepted - 1`` (the recurrent state in
that slot, the conv window at that offset). A tree step reads the same way and writes what a
chain would: row ``t``'s state into slot ``t``, and the window ``window[1:]`` followed by the
rows' conv inputs in row order. After acceptance :func:`commit_accepted_paths` moves the
accepted path where a chain of its tokens would have left it: the last accepted row's state
into column ``a - 1``, the path's conv inputs into the columns the next step reads at
``num_accepted - 1 = a - 1``. vLLM's next step then reads exactly what that chain left.

:func:`tree_rows` lays one step out per GDN metadata object (all layers of a KV-cache group
share it): per row, its request, its conv sources (its own path, newest first), the slot it
writes and the slot its parent's state is in. Device arithmetic over vLLM's metadata; the
one host read is the speculative requests' batch positions (vLLM keeps them on the host).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from vllm_dartree.step.tree_context import plan_for, step_cached
from vllm_dartree.step.verify_plan import AcceptedPaths, VerifyPlan
from vllm_dartree.tree.gdn import conv_ancestors


@dataclass
class GdnTreeRows:
    """Where the speculative rows of one GDN metadata object read and write (S requests, N
    rows)."""

    request_starts: torch.Tensor  # [S + 1] first row of each request
    row_request: torch.Tensor  # [N]
    sources: torch.Tensor  # [N, W] conv inputs, newest first: row, or -1 - committed column
    row_slot: torch.Tensor  # [N] the state slot each row writes (its column)
    parent_slot: torch.Tensor  # [N] the slot its parent's state is in (a root: the committed)
    window_slot: torch.Tensor  # [S] the slot whose buffer holds the request's conv window
    window_start: torch.Tensor  # [S] the window's first column (num_accepted - 1)


def verifies_trees(attn_metadata: Any) -> bool:
    """Whether a GDN layer given ``attn_metadata`` verifies tree rows this step."""
    plan = plan_for(attn_metadata)
    return plan is not None and not plan.chains and attn_metadata.num_spec_decodes > 0


def tree_rows_of(attn_metadata: Any, num_rows: int, width: int) -> GdnTreeRows:
    """This step's layout for a GDN layer given ``attn_metadata`` (which
    :func:`verifies_trees`), computed by the first layer of the forward, reused by the
    others."""
    plan = plan_for(attn_metadata)
    return step_cached(("gdn", id(plan), id(attn_metadata), num_rows, width),
                       lambda: tree_rows(plan, attn_metadata, num_rows, width))


def _trees_of_requests(plan: VerifyPlan, meta: Any) -> torch.Tensor:
    """bool [S, T]: speculative request s of ``meta`` is the plan's request t (vLLM keeps
    the speculative requests' batch positions on the host)."""
    num_spec = meta.num_spec_decodes
    masks = meta.spec_sequence_masks_cpu
    position = (torch.arange(num_spec) if masks is None
                else torch.nonzero(masks).flatten()[:num_spec])
    device = meta.spec_state_indices_tensor.device
    return position.to(device).unsqueeze(1) == plan.batch_index.to(device).unsqueeze(0)


def tree_rows(plan: VerifyPlan, meta: Any, num_rows: int, width: int) -> GdnTreeRows:
    """The layout of ``plan``'s trees over the ``num_rows`` speculative rows of ``meta``
    (vLLM's ``GDNAttentionMetadata``); requests without a tree verify as chains."""
    num_spec = meta.num_spec_decodes
    starts = meta.spec_query_start_loc[: num_spec + 1].to(torch.int64)
    slots = meta.spec_state_indices_tensor[:num_spec].to(torch.int64)  # [S, 1 + N]
    accepted = meta.num_accepted_tokens[:num_spec].to(torch.int64)
    device = slots.device
    match = _trees_of_requests(plan, meta)
    has_tree = match.any(dim=1)
    tree_of = match.to(torch.int64).argmax(dim=1)
    columns = slots.shape[1]
    chain = (torch.arange(columns, device=device) - 1).clamp(min=0)
    tree_parents = plan.tree.parents_with_root().to(device)[:, :columns]
    if tree_parents.shape[1] < columns:  # the plan's budget below vLLM's: chains beyond
        tree_parents = torch.cat([tree_parents, chain[tree_parents.shape[1]:].expand(
            tree_parents.shape[0], -1)], dim=1)
    parents = torch.where(has_tree.unsqueeze(1), tree_parents[tree_of], chain)  # [S, 1 + N]
    window = conv_ancestors(parents, width)  # [S, 1 + N, W] into [committed, rows]
    row = torch.arange(num_rows, device=device)
    row_request = torch.searchsorted(starts[1:], row, right=True)
    local = row - starts[row_request]
    window = window[row_request, local]
    sources = torch.where(window >= width - 1,
                          starts[row_request].unsqueeze(1) + window - (width - 1), -1 - window)
    parent_column = torch.where(local == 0, accepted[row_request] - 1,
                                parents[row_request, local])
    return GdnTreeRows(
        request_starts=starts, row_request=row_request, sources=sources,
        row_slot=slots[row_request, local], parent_slot=slots[row_request, parent_column],
        window_slot=slots[:, 0], window_start=accepted - 1)


def shift_conv_windows(conv_state: torch.Tensor, rows: GdnTreeRows, x: torch.Tensor) -> None:
    """Each request's window ``[C, W - 1 + N]`` becomes its committed inputs after the
    oldest, then its rows' inputs in row order (columns past them keep their values): the
    layout a chain leaves, which the next step reads at ``num_accepted - 1``."""
    width_minus_one = rows.sources.shape[1] - 1
    length = conv_state.shape[-1]
    column = torch.arange(length, device=x.device)
    num_rows = (rows.request_starts[1:] - rows.request_starts[:-1]).unsqueeze(1)  # [S, 1]
    from_window = column < width_minus_one - 1
    from_rows = ~from_window & (column < width_minus_one - 1 + num_rows)  # [S, L]
    buffers = conv_state[rows.window_slot]  # [S, C, L], a copy: read before any write
    window = buffers.gather(2, (rows.window_start.unsqueeze(1) + 1 + column).clamp(
        max=length - 1).unsqueeze(1).expand_as(buffers))
    row = (rows.request_starts[:-1].unsqueeze(1) + column - (width_minus_one - 1)).clamp(
        0, x.shape[0] - 1)  # [S, L]
    inputs = x[row].transpose(1, 2).to(buffers.dtype)  # [S, C, L]
    new = torch.where(from_window, window, torch.where(from_rows.unsqueeze(1), inputs, buffers))
    conv_state[rows.window_slot] = new


def state_views(layer: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """(conv buffers [slots, C, W - 1 + N], recurrent states [slots, ...]) of a GDN layer,
    as vLLM's GDN paths view its cache."""
    from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first

    conv, ssm = layer.kv_cache[0], layer.kv_cache[1]
    return (conv if is_conv_state_dim_first() else conv.transpose(-1, -2)), ssm


def gdn_layers(metadata: dict[str, Any], layers: dict[str, Any]) -> list[tuple[Any, Any]]:
    """(layer, metadata) of the target's GDN layers in a step's attention metadata."""
    return [(layers[name], item) for name, item in metadata.items()
            if item is not None and hasattr(item, "spec_state_indices_tensor")
            and name in layers]


def commit_accepted_paths(recorded: list[tuple[Any, Any]], paths: AcceptedPaths) -> None:
    """Move each tree request's accepted path where a chain of its tokens would have left
    it, in every recorded GDN layer (module docstring)."""
    plan = paths.plan
    if not recorded or plan.chains:
        return
    length = paths.num_accepted.to(torch.int64)  # [T] >= 1: the root is always accepted
    nodes = paths.accepted_nodes.to(torch.int64)  # [T, D + 1] rows on the path, -1 padded
    for layer, meta in recorded:
        conv_state, ssm_state = state_views(layer)
        device = conv_state.device
        columns = meta.spec_state_indices_tensor.shape[1]  # 1 + N
        first = conv_state.shape[-1] - columns  # W - 2: where row 0's input sits
        spec_index = _trees_of_requests(plan, meta).to(torch.int64).argmax(dim=0)  # [T]
        slots = meta.spec_state_indices_tensor.to(torch.int64)[spec_index]  # [T, 1 + N]
        count, path = length.to(device), nodes.to(device)
        last = path.gather(1, (count - 1).unsqueeze(1)).squeeze(1)
        ssm_state[slots.gather(1, (count - 1).unsqueeze(1)).squeeze(1)] = (
            ssm_state[slots.gather(1, last.unsqueeze(1)).squeeze(1)])
        # Conv inputs: path position j takes row path[j]'s column (positions past the path
        # read their own column: unchanged).
        position = torch.arange(path.shape[1], device=device)
        source = torch.where(position < count.unsqueeze(1), path, position)
        buffers = conv_state[slots[:, 0]]  # [T, C, L], a copy: read before any write
        buffers[:, :, first:first + path.shape[1]] = buffers.gather(
            2, (first + source).unsqueeze(1).expand(-1, buffers.shape[1], -1))
        conv_state[slots[:, 0]] = buffers
