"""Gated-DeltaNet tree rows as Triton kernels, each beside the name of its torch twin in
``vllm_dartree.tree.gdn``:

- the tree recurrence from the committed state, outputs only (twin
  ``tree_gated_delta_rule``): trees in depth-first preorder, one scratch state per depth;
- the same in an engine's state slots (twin ``tree_delta_rule_in_slots``): flat rows of a
  batch, each row's state stored in the slot vLLM keeps for that row;
- the tree conv over flat rows (twin ``tree_conv_rows``).

Kernel: one program per (request, value head, block of value columns); the delta rule acts
on each value column of the state on its own, so a program owns its ``[K, BV]`` slice for
the whole tree. Rows come in depth-first preorder (how the plugin hands trees over,
``tree.types.depth_first``), so a row's parent is the last row seen one depth up: a stack
with one state slot per depth (slot 0 the committed state, row of depth d reads slot d and
writes slot d + 1) replaces per-row states. Scratch: ``(max_depth + 2)`` states per request
and head, nothing written to the committed state.
"""

from __future__ import annotations

import torch

from vllm_dartree.kernels.launch import LazyKernel, next_power_of_2, require_launchable, use_triton
from vllm_dartree.tree.gdn import tree_conv_rows, tree_delta_rule_in_slots, tree_gated_delta_rule

tl = None  # bound by LazyKernel at the first launch

VALUE_BLOCK = 32  # value columns per program


def _gdn_tree_rows(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, state_ptr, depth_ptr, stack_ptr,
                   out_ptr, rows, heads, slots, K: tl.constexpr, V: tl.constexpr,
                   BK: tl.constexpr, BV: tl.constexpr):
    req = tl.program_id(0)
    head = tl.program_id(1)
    offs_k = tl.arange(0, BK)
    offs_v = tl.program_id(2) * BV + tl.arange(0, BV)
    in_k = offs_k < K
    in_v = offs_v < V
    in_state = in_k[:, None] & in_v[None, :]
    tile = offs_k[:, None] * V + offs_v[None, :]
    stack = stack_ptr + (req * heads + head) * slots * K * V
    committed = tl.load(state_ptr + (req * heads + head) * K * V + tile, mask=in_state, other=0.0)
    tl.store(stack + tile, committed.to(tl.float32), mask=in_state)
    tl.debug_barrier()
    for row in range(rows):
        depth = tl.load(depth_ptr + req * rows + row)
        state = tl.load(stack + depth * K * V + tile, mask=in_state, other=0.0)
        at = (req * rows + row) * heads + head
        k = tl.load(k_ptr + at * K + offs_k, mask=in_k, other=0.0).to(tl.float32)
        q = tl.load(q_ptr + at * K + offs_k, mask=in_k, other=0.0).to(tl.float32)
        v = tl.load(v_ptr + at * V + offs_v, mask=in_v, other=0.0).to(tl.float32)
        decay = tl.exp(tl.load(g_ptr + at).to(tl.float32))
        beta = tl.load(beta_ptr + at).to(tl.float32)
        state = state * decay
        recalled = tl.sum(state * k[:, None], axis=0)
        state = state + k[:, None] * ((v - recalled) * beta)[None, :]
        out = tl.sum(state * q[:, None], axis=0)
        tl.store(out_ptr + at * V + offs_v, out.to(out_ptr.dtype.element_ty), mask=in_v)
        tl.debug_barrier()  # every thread's reads of this slot before it is overwritten
        tl.store(stack + (depth + 1) * K * V + tile, state, mask=in_state)
        tl.debug_barrier()  # the row's state visible to the threads of the next row


_gdn_tree_kernel = LazyKernel(_gdn_tree_rows)


def gdn_tree_launch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                    beta: torch.Tensor, initial_state: torch.Tensor, depths: torch.Tensor,
                    max_depth: int) -> tuple:
    """(python function, grid, kwargs) of the launch (launcher and ahead-of-time check); the
    kwargs hold the output ``out_ptr``."""
    num_requests, rows, heads, key_dim = q.shape
    value_dim = v.shape[-1]
    slots = max_depth + 2
    q, k, v, g, beta = (t.contiguous() for t in (q, k, v, g, beta))
    stack = torch.empty(num_requests, heads, slots, key_dim, value_dim, dtype=torch.float32,
                        device=q.device)
    out = torch.empty(num_requests, rows, heads, value_dim, dtype=v.dtype, device=q.device)
    block_v = min(VALUE_BLOCK, next_power_of_2(value_dim))
    kwargs = dict(q_ptr=q, k_ptr=k, v_ptr=v, g_ptr=g, beta_ptr=beta,
                  state_ptr=initial_state.contiguous().float(),
                  depth_ptr=depths.to(torch.int64).contiguous(), stack_ptr=stack, out_ptr=out,
                  rows=rows, heads=heads, slots=slots, K=key_dim, V=value_dim,
                  BK=next_power_of_2(key_dim), BV=block_v)
    return _gdn_tree_rows, (num_requests, heads, -(-value_dim // block_v)), kwargs


def tree_gated_delta_rule_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                 g: torch.Tensor, beta: torch.Tensor,
                                 initial_state: torch.Tensor, depths: torch.Tensor,
                                 max_depth: int) -> torch.Tensor:
    """Triton kernel (CUDA, or CPU tensors under TRITON_INTERPRET=1). Shapes as the twin's;
    ``depths`` [R, T] int (root 0) of rows in depth-first preorder, all <= ``max_depth``."""
    require_launchable(q, "GDN tree recurrence")
    _, grid, kwargs = gdn_tree_launch(q, k, v, g, beta, initial_state, depths, max_depth)
    if q.shape[0] and q.shape[1]:
        _gdn_tree_kernel[grid](**kwargs)
    return kwargs["out_ptr"]


def gdn_tree_outputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                     beta: torch.Tensor, initial_state: torch.Tensor, parents: torch.Tensor,
                     depths: torch.Tensor, max_depth: int) -> torch.Tensor:
    """Dispatch (``kernels.launch.use_triton``): the kernel on CUDA or under the interpreter
    (it reads ``depths``), else the torch twin (it reads ``parents``); both describe the same
    preorder rows."""
    if use_triton(q, "GDN tree recurrence"):
        return tree_gated_delta_rule_triton(q, k, v, g, beta, initial_state, depths, max_depth)
    return tree_gated_delta_rule(q, k, v, g, beta, initial_state, parents)


# ---- the recurrence in an engine's state slots ------------------------------------------
def _delta_rule_in_slots(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, state_ptr, starts_ptr,
                         row_slot_ptr, parent_slot_ptr, out_ptr, heads, stride_slot,
                         K: tl.constexpr, V: tl.constexpr, BH: tl.constexpr, BK: tl.constexpr,
                         BV: tl.constexpr):
    # One program per (request, block of value heads, block of value columns): the delta
    # rule acts on each value column of each head on its own, so the program owns that
    # slice of every slot for all of the request's rows.
    req = tl.program_id(0)
    offs_h = tl.program_id(1) * BH + tl.arange(0, BH)
    offs_k = tl.arange(0, BK)
    offs_v = tl.program_id(2) * BV + tl.arange(0, BV)
    in_h = offs_h < heads
    in_k = offs_k < K
    in_v = offs_v < V
    in_hk = in_h[:, None] & in_k[None, :]
    in_hv = in_h[:, None] & in_v[None, :]
    in_state = in_hk[:, :, None] & in_v[None, None, :]
    # [BH, BK, BV] of the [heads, V, K] slot layout
    tile = (offs_h[:, None, None] * V * K + offs_v[None, None, :] * K
            + offs_k[None, :, None])
    start = tl.load(starts_ptr + req)
    end = tl.load(starts_ptr + req + 1)
    for row in range(start, end):
        parent = tl.load(parent_slot_ptr + row).to(tl.int64)
        state = tl.load(state_ptr + parent * stride_slot + tile, mask=in_state,
                        other=0.0).to(tl.float32)
        at = row * heads + offs_h  # [BH]
        k = tl.load(k_ptr + at[:, None] * K + offs_k[None, :], mask=in_hk,
                    other=0.0).to(tl.float32)
        q = tl.load(q_ptr + at[:, None] * K + offs_k[None, :], mask=in_hk,
                    other=0.0).to(tl.float32)
        v = tl.load(v_ptr + at[:, None] * V + offs_v[None, :], mask=in_hv,
                    other=0.0).to(tl.float32)
        decay = tl.exp(tl.load(g_ptr + at, mask=in_h, other=0.0).to(tl.float32))
        beta = tl.load(beta_ptr + at, mask=in_h, other=0.0).to(tl.float32)
        state = state * decay[:, None, None]
        recalled = tl.sum(state * k[:, :, None], axis=1)  # [BH, BV]
        state = state + k[:, :, None] * ((v - recalled) * beta[:, None])[:, None, :]
        out = tl.sum(state * q[:, :, None], axis=1)
        tl.store(out_ptr + at[:, None] * V + offs_v[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=in_hv)
        tl.debug_barrier()  # every thread's reads of the parent slot before any write
        slot = tl.load(row_slot_ptr + row).to(tl.int64)
        tl.store(state_ptr + slot * stride_slot + tile,
                 state.to(state_ptr.dtype.element_ty), mask=in_state)
        tl.debug_barrier()  # the row's state visible to the threads of its children


_delta_rule_in_slots_kernel = LazyKernel(_delta_rule_in_slots)


def delta_rule_in_slots_launch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                               g: torch.Tensor, beta: torch.Tensor, state: torch.Tensor,
                               row_slot: torch.Tensor, parent_slot: torch.Tensor,
                               request_starts: torch.Tensor, heads_per_program: int = 1
                               ) -> tuple:
    """(python function, grid, kwargs) of the launch (launcher and ahead-of-time check); the
    kwargs hold the output ``out_ptr``."""
    rows, heads, key_dim = q.shape
    value_dim = v.shape[-1]
    if not state[0].is_contiguous():
        raise ValueError("the state slots must hold contiguous [H, V, K] heads")
    out = torch.empty(rows, heads, value_dim, dtype=v.dtype, device=v.device)
    block_v = min(VALUE_BLOCK, next_power_of_2(value_dim))
    grid = (request_starts.numel() - 1, -(-heads // heads_per_program),
            -(-value_dim // block_v))
    kwargs = dict(q_ptr=q.contiguous(), k_ptr=k.contiguous(), v_ptr=v.contiguous(),
                  g_ptr=g.contiguous(), beta_ptr=beta.contiguous(), state_ptr=state,
                  starts_ptr=request_starts.contiguous(), row_slot_ptr=row_slot.contiguous(),
                  parent_slot_ptr=parent_slot.contiguous(), out_ptr=out, heads=heads,
                  stride_slot=state.stride(0), K=key_dim, V=value_dim, BH=heads_per_program,
                  BK=next_power_of_2(key_dim), BV=block_v)
    return _delta_rule_in_slots, grid, kwargs


def delta_rule_in_slots_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                               g: torch.Tensor, beta: torch.Tensor, state: torch.Tensor,
                               row_slot: torch.Tensor, parent_slot: torch.Tensor,
                               request_starts: torch.Tensor, heads_per_program: int = 1
                               ) -> torch.Tensor:
    """Triton kernel (CUDA, or CPU tensors under TRITON_INTERPRET=1). Shapes as the twin's
    (``tree_delta_rule_in_slots``); ``request_starts`` [S + 1]: request s owns rows
    ``request_starts[s]:request_starts[s + 1]`` (a slot is written by one request only).
    ``heads_per_program`` (a power of two) only tiles the work differently."""
    require_launchable(q, "GDN tree recurrence in slots")
    _, grid, kwargs = delta_rule_in_slots_launch(q, k, v, g, beta, state, row_slot,
                                                 parent_slot, request_starts,
                                                 heads_per_program)
    if q.shape[0] and grid[0]:
        _delta_rule_in_slots_kernel[grid](**kwargs)
    return kwargs["out_ptr"]


def delta_rule_in_slots(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                        beta: torch.Tensor, state: torch.Tensor, row_slot: torch.Tensor,
                        parent_slot: torch.Tensor, request_starts: torch.Tensor
                        ) -> torch.Tensor:
    """Dispatch (``kernels.launch.use_triton``): the kernel on CUDA (a head per program) or
    under the interpreter (every head in one program: the interpreter's cost is per
    operation), else the torch twin."""
    if use_triton(q, "GDN tree recurrence in slots"):
        per_program = 1 if q.is_cuda else next_power_of_2(q.shape[1])
        return delta_rule_in_slots_triton(q, k, v, g, beta, state, row_slot, parent_slot,
                                          request_starts, per_program)
    return tree_delta_rule_in_slots(q, k, v, g, beta, state, row_slot, parent_slot)


# ---- the tree conv over flat rows --------------------------------------------------------
def _tree_conv_rows(x_ptr, state_ptr, window_slot_ptr, window_start_ptr, request_ptr,
                    sources_ptr, weight_ptr, bias_ptr, out_ptr, rows, channels, stride_xr,
                    stride_ss, stride_sc, stride_sl, stride_or, HAS_BIAS: tl.constexpr,
                    SILU: tl.constexpr, W: tl.constexpr, BR: tl.constexpr,
                    BC: tl.constexpr):
    # One program per (block of rows, block of channels): each row's W inputs along its
    # own path, from the batch's rows or its request's committed window.
    offs_r = tl.program_id(0) * BR + tl.arange(0, BR)
    offs_c = tl.program_id(1) * BC + tl.arange(0, BC)
    in_r = offs_r < rows
    in_c = offs_c < channels
    in_rc = in_r[:, None] & in_c[None, :]
    req = tl.load(request_ptr + offs_r, mask=in_r, other=0)
    slot = tl.load(window_slot_ptr + req, mask=in_r, other=0).to(tl.int64)
    start = tl.load(window_start_ptr + req, mask=in_r, other=0).to(tl.int64)
    acc = tl.zeros([BR, BC], dtype=tl.float32)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_c, mask=in_c, other=0.0).to(tl.float32)[None, :]
    for w in range(W):  # newest first: weight column W - 1 - w
        source = tl.load(sources_ptr + offs_r * W + w, mask=in_r, other=0).to(tl.int64)
        # Both reads are in bounds whichever the source is; the source picks one.
        from_row = tl.load(x_ptr + tl.maximum(source, 0)[:, None] * stride_xr
                           + offs_c[None, :], mask=in_rc, other=0.0).to(tl.float32)
        column = start + tl.maximum(-1 - source, 0)
        from_window = tl.load(state_ptr + (slot * stride_ss + column * stride_sl)[:, None]
                              + offs_c[None, :] * stride_sc, mask=in_rc,
                              other=0.0).to(tl.float32)
        weight = tl.load(weight_ptr + offs_c * W + (W - 1 - w), mask=in_c,
                         other=0.0).to(tl.float32)
        acc += tl.where((source >= 0)[:, None], from_row, from_window) * weight[None, :]
    if SILU:
        acc = acc / (1.0 + tl.exp(-acc))
    tl.store(out_ptr + offs_r[:, None] * stride_or + offs_c[None, :],
             acc.to(out_ptr.dtype.element_ty), mask=in_rc)


_tree_conv_rows_kernel = LazyKernel(_tree_conv_rows)


def tree_conv_rows_launch(x: torch.Tensor, conv_state: torch.Tensor, window_slot: torch.Tensor,
                          window_start: torch.Tensor, row_request: torch.Tensor,
                          sources: torch.Tensor, weight: torch.Tensor,
                          bias: torch.Tensor | None, activation: str | None = "silu",
                          block_rows: int = 16, block_channels: int = 128) -> tuple:
    """(python function, grid, kwargs) of the launch; the kwargs hold the output."""
    if activation not in ("silu", None):
        raise ValueError(f"activation={activation!r}: 'silu' or None")
    rows, channels = x.shape
    x = x if x.stride(-1) == 1 else x.contiguous()
    out = torch.empty_like(x)
    grid = (-(-rows // block_rows), -(-channels // block_channels))
    kwargs = dict(
        x_ptr=x, state_ptr=conv_state, window_slot_ptr=window_slot.contiguous(),
        window_start_ptr=window_start.contiguous(), request_ptr=row_request.contiguous(),
        sources_ptr=sources.contiguous(), weight_ptr=weight.contiguous(),
        bias_ptr=weight if bias is None else bias.contiguous(), out_ptr=out, rows=rows,
        channels=channels, stride_xr=x.stride(0), stride_ss=conv_state.stride(0),
        stride_sc=conv_state.stride(1), stride_sl=conv_state.stride(2),
        stride_or=out.stride(0), HAS_BIAS=bias is not None, SILU=activation == "silu",
        W=weight.shape[-1], BR=block_rows, BC=block_channels)
    return _tree_conv_rows, grid, kwargs


def tree_conv_rows_triton(x: torch.Tensor, conv_state: torch.Tensor, window_slot: torch.Tensor,
                          window_start: torch.Tensor, row_request: torch.Tensor,
                          sources: torch.Tensor, weight: torch.Tensor,
                          bias: torch.Tensor | None, activation: str | None = "silu",
                          block_rows: int = 16, block_channels: int = 128) -> torch.Tensor:
    """Triton kernel (CUDA, or CPU tensors under TRITON_INTERPRET=1); arguments as the
    twin's (``tree_conv_rows``); the blocks (powers of two) only tile the work."""
    require_launchable(x, "GDN tree conv")
    _, grid, kwargs = tree_conv_rows_launch(x, conv_state, window_slot, window_start,
                                            row_request, sources, weight, bias, activation,
                                            block_rows, block_channels)
    if x.shape[0]:
        _tree_conv_rows_kernel[grid](**kwargs)
    return kwargs["out_ptr"]


def tree_conv_outputs(x: torch.Tensor, conv_state: torch.Tensor, window_slot: torch.Tensor,
                      window_start: torch.Tensor, row_request: torch.Tensor,
                      sources: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                      activation: str | None = "silu") -> torch.Tensor:
    """Dispatch (``kernels.launch.use_triton``): the kernel on CUDA (16 rows x 128
    channels a program) or under the interpreter (whole rows, 64 a program: its cost is
    per operation), else the torch twin."""
    if use_triton(x, "GDN tree conv"):
        blocks = ({} if x.is_cuda else
                  {"block_rows": 64, "block_channels": next_power_of_2(x.shape[1])})
        return tree_conv_rows_triton(x, conv_state, window_slot, window_start, row_request,
                                     sources, weight, bias, activation, **blocks)
    return tree_conv_rows(x, conv_state, window_slot, window_start, row_request, sources,
                          weight, bias, activation)
