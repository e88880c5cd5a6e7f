"""The Gated-DeltaNet tree recurrence (verify outputs from the committed state): a Triton
kernel and its torch twin, ``vllm_dartree.tree.gdn.tree_gated_delta_rule``.

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
from vllm_dartree.tree.gdn import tree_gated_delta_rule

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
