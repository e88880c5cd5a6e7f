"""Top-B selection of supertree nodes: a Triton kernel and its torch twin.

Input ``scores [R, N]`` float32 (padding = -inf), output ``kept [R, B]`` int64: the indices of
the B best entries per row (score descending, ties -> lower index), sorted ascending so the
kept nodes stay in topological order. NaN scores are not supported.

Kernel: one program per row. rank_i = #{j : s_j > s_i or (s_j == s_i and j < i)} (computed in
column chunks), keep rank_i < B, and place index i at the exclusive prefix sum of ``keep``.
"""

from __future__ import annotations

import torch

from vllm_dartree.kernels.launch import (
    LazyKernel,
    next_power_of_2,
    require_launchable,
    use_triton,
)

tl = None  # bound by LazyKernel at the first launch

# Columns compared per inner step; BLOCK_N (the row, padded to a power of two) x CHUNK
# comparisons live in registers at once.
CHUNK = 32
MAX_ROW = 4096


def top_b_torch(scores: torch.Tensor, b: int) -> torch.Tensor:
    """Torch twin: stable descending sort keeps lower indices first among equal scores."""
    _check_args(scores, b)
    order = torch.sort(scores, dim=1, descending=True, stable=True).indices
    return torch.sort(order[:, :b], dim=1).values


def _top_b_rows(scores_ptr, kept_ptr, n, b, stride_s, stride_k, BLOCK_N: tl.constexpr,
                CHUNK_N: tl.constexpr):
    row = tl.program_id(0)
    offs_i = tl.arange(0, BLOCK_N)
    in_row_i = offs_i < n
    s_i = tl.load(scores_ptr + row * stride_s + offs_i, mask=in_row_i, other=float("-inf"))
    rank = tl.zeros([BLOCK_N], dtype=tl.int32)
    for start in range(0, BLOCK_N, CHUNK_N):
        offs_j = start + tl.arange(0, CHUNK_N)
        in_row_j = offs_j < n
        s_j = tl.load(scores_ptr + row * stride_s + offs_j, mask=in_row_j,
                      other=float("-inf"))
        better = (s_j[None, :] > s_i[:, None]) | (
            (s_j[None, :] == s_i[:, None]) & (offs_j[None, :] < offs_i[:, None]))
        better = better & in_row_j[None, :]
        rank += tl.sum(better.to(tl.int32), axis=1)
    keep = (rank < b) & in_row_i
    keep_i32 = keep.to(tl.int32)
    slot = tl.cumsum(keep_i32, axis=0) - keep_i32
    tl.store(kept_ptr + row * stride_k + slot, offs_i.to(tl.int64), mask=keep)


_top_b_kernel = LazyKernel(_top_b_rows)


def top_b_triton(scores: torch.Tensor, b: int) -> torch.Tensor:
    """Triton kernel (CUDA, or CPU tensors under TRITON_INTERPRET=1)."""
    _check_args(scores, b)
    require_launchable(scores, "top-B selection")
    rows, n = scores.shape
    if n > MAX_ROW:
        raise ValueError(f"top_b_triton supports rows of at most {MAX_ROW} entries, got N={n}")
    scores = scores.contiguous().float()
    kept = torch.empty(rows, b, dtype=torch.int64, device=scores.device)
    if rows == 0 or b == 0:
        return kept
    block = max(CHUNK, next_power_of_2(n))
    _top_b_kernel[(rows,)](scores, kept, n, b, scores.stride(0), kept.stride(0), BLOCK_N=block,
                    CHUNK_N=CHUNK)
    return kept


def select_top_b(scores: torch.Tensor, b: int) -> torch.Tensor:
    """Dispatch (``kernels.launch.use_triton``): the kernel on CUDA or under the interpreter,
    else the torch twin."""
    return top_b_triton(scores, b) if use_triton(scores, "top-B selection") else \
        top_b_torch(scores, b)


def _check_args(scores: torch.Tensor, b: int) -> None:
    if scores.dim() != 2:
        raise ValueError(f"scores must be [R, N], got shape {list(scores.shape)}")
    if not 0 <= b <= scores.shape[1]:
        raise ValueError(f"b must be in 0..N={scores.shape[1]}, got b={b}")
