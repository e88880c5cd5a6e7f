"""KV compaction after tree acceptance: a Triton kernel and its torch twin.

``caches`` is a list of C tensors of one layer group, all with the same shape, strides and
dtype, in vLLM's GPU layout ``[num_blocks, block_size, num_kv_heads, head_size]``: for the
FlashAttention backend pass the key and the value cache of every layer
(``split_kv_caches``). Every cache copies slot ``src[p]`` to slot ``dst[p]`` (slot = block *
block_size + offset) with the semantics "every source is read before any destination is
written": sources and destinations may overlap (``vllm_dartree.step.verify_plan.
compaction_pairs``: a node moved to path position d may sit where a deeper path node will
land). Destinations must be distinct.

Kernel: one launch for the whole group (more only when the scratch would exceed
``max_scratch_bytes``, then one per slice of caches). A table of the caches' data pointers (int64) lets
program (c, e) find cache c; the program owns elements [e * BLOCK_E, (e + 1) * BLOCK_E) of a
slot (heads x head_size, flattened) for every pair: it copies all their sources to a scratch
buffer, waits at a CTA barrier, then writes the destinations. No other program touches those
elements, so the barrier is all the ordering needed. The copy moves bits (integer view), so
any cache dtype of 1, 2, 4 or 8 bytes works.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from vllm_dartree.kernels import launch
from vllm_dartree.kernels.launch import LazyKernel, require_launchable, use_triton

tl = None  # bound by LazyKernel at the first launch

_INT_OF_SIZE = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def split_kv_caches(layer_caches: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """FlashAttention per-layer caches ``[2, num_blocks, block_size, kv_heads, D]`` -> the
    key caches of all layers followed by their value caches."""
    return [kv[0] for kv in layer_caches] + [kv[1] for kv in layer_caches]


def cache_pointer_table(caches: Sequence[torch.Tensor]) -> torch.Tensor:
    """int64 [C] data pointers of the caches, after checking that they form a group (build it
    once per engine and pass it in: it saves the per-call checks and a host-to-device copy)."""
    _check_caches(caches)
    return torch.tensor([c.data_ptr() for c in caches], dtype=torch.int64,
                        device=caches[0].device)


# ------------------------------------------------------------------------------ torch twin
def copy_kv_slots_torch(caches: Sequence[torch.Tensor], src: torch.Tensor, dst: torch.Tensor
                        ) -> None:
    """Torch twin: advanced indexing gathers a copy of all sources before the scatter."""
    _check_args(caches, src, dst)
    if src.numel() == 0:
        return
    block_size = caches[0].shape[1]
    src, dst = src.to(torch.int64), dst.to(torch.int64)
    for cache in caches:
        values = cache[src // block_size, src % block_size]  # [P, kv_heads, D], a copy
        cache[dst // block_size, dst % block_size] = values


# ---------------------------------------------------------------------------------- kernel
def _copy_slots(
    ptrs_ptr, src_ptr, dst_ptr, scratch_ptr,
    num_pairs, block_size, slot_elems, head_size,
    stride_b, stride_s, stride_h, stride_d,
    DTYPE: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_E: tl.constexpr,
):
    cache_index = tl.program_id(0)
    elem_block = tl.program_id(1)
    cache = tl.load(ptrs_ptr + cache_index).to(tl.pointer_type(DTYPE))
    offs_e = elem_block * BLOCK_E + tl.arange(0, BLOCK_E)
    in_e = offs_e < slot_elems
    elem_off = (offs_e // head_size).to(tl.int64) * stride_h + (offs_e % head_size) * stride_d
    # Scratch [C, P, slot_elems]: this program's columns of every pair.
    scratch = scratch_ptr + cache_index.to(tl.int64) * num_pairs * slot_elems + offs_e
    for start in range(0, num_pairs, BLOCK_P):
        offs_p = start + tl.arange(0, BLOCK_P)
        mask = (offs_p < num_pairs)[:, None] & in_e[None, :]
        slot = tl.load(src_ptr + offs_p, mask=offs_p < num_pairs, other=0).to(tl.int64)
        at = (slot // block_size) * stride_b + (slot % block_size) * stride_s
        values = tl.load(cache + at[:, None] + elem_off[None, :], mask=mask)
        tl.store(scratch + offs_p[:, None].to(tl.int64) * slot_elems, values, mask=mask)
    tl.debug_barrier()  # every source of this program's columns is read before any write
    for start in range(0, num_pairs, BLOCK_P):
        offs_p = start + tl.arange(0, BLOCK_P)
        mask = (offs_p < num_pairs)[:, None] & in_e[None, :]
        slot = tl.load(dst_ptr + offs_p, mask=offs_p < num_pairs, other=0).to(tl.int64)
        at = (slot // block_size) * stride_b + (slot % block_size) * stride_s
        values = tl.load(scratch + offs_p[:, None].to(tl.int64) * slot_elems, mask=mask)
        tl.store(cache + at[:, None] + elem_off[None, :], values, mask=mask)


_copy_slots_kernel = LazyKernel(_copy_slots)


def copy_kv_slots_launch(caches: Sequence[torch.Tensor], src: torch.Tensor, dst: torch.Tensor,
                         ptrs: torch.Tensor | None = None, *, block_p: int = 16,
                         block_e: int = 256) -> tuple:
    """(python function, grid, kwargs) of the launch (launcher and ahead-of-time check)."""
    if not launch.load_triton():
        raise RuntimeError("triton is not installed")
    first = caches[0]
    kv_heads, head_size = first.shape[2], first.shape[3]
    slot_elems = kv_heads * head_size
    int_dtype = _INT_OF_SIZE[first.element_size()]
    ptrs = cache_pointer_table(caches) if ptrs is None else ptrs
    scratch = torch.empty(len(caches) * src.numel() * slot_elems, dtype=int_dtype,
                          device=first.device)
    block_e = min(block_e, 1 << (slot_elems - 1).bit_length())
    kwargs = dict(
        ptrs_ptr=ptrs, src_ptr=src, dst_ptr=dst, scratch_ptr=scratch, num_pairs=src.numel(),
        block_size=first.shape[1], slot_elems=slot_elems, head_size=head_size,
        stride_b=first.stride(0), stride_s=first.stride(1), stride_h=first.stride(2),
        stride_d=first.stride(3), DTYPE=getattr(launch.tl, str(int_dtype).removeprefix("torch.")),
        BLOCK_P=block_p, BLOCK_E=block_e, num_warps=4,
    )
    return _copy_slots, (len(caches), math.ceil(slot_elems / block_e)), kwargs


def copy_kv_slots_triton(caches: Sequence[torch.Tensor], src: torch.Tensor, dst: torch.Tensor,
                         ptrs: torch.Tensor | None = None, *, block_p: int = 16,
                         block_e: int = 256, max_scratch_bytes: int = 256 << 20) -> None:
    """Triton kernel (CUDA, or CPU tensors under TRITON_INTERPRET=1): one launch for all caches
    while their scratch (pairs x slot bytes x caches) fits in ``max_scratch_bytes``.

    ``ptrs`` is ``cache_pointer_table(caches)`` (built here when not given).
    """
    _check_args(caches, src, dst, every_cache=ptrs is None)  # a table vouches for the group
    require_launchable(caches[0], "KV compaction")
    if src.numel() == 0:
        return
    src, dst = src.contiguous(), dst.contiguous()
    ptrs = cache_pointer_table(caches) if ptrs is None else ptrs
    slot_bytes = caches[0].shape[2] * caches[0].shape[3] * caches[0].element_size()
    per_launch = max(1, max_scratch_bytes // (src.numel() * slot_bytes))
    for first in range(0, len(caches), per_launch):
        part = slice(first, first + per_launch)
        fn, grid, kwargs = copy_kv_slots_launch(caches[part], src, dst, ptrs[part],
                                                block_p=block_p, block_e=block_e)
        _copy_slots_kernel[grid](**kwargs)


def copy_kv_slots(caches: Sequence[torch.Tensor], src: torch.Tensor, dst: torch.Tensor,
                  ptrs: torch.Tensor | None = None) -> None:
    """Dispatch (``kernels.launch.use_triton``): the kernel on CUDA or under the interpreter,
    else the torch twin."""
    if not caches:
        return
    if use_triton(caches[0], "KV compaction"):
        copy_kv_slots_triton(caches, src, dst, ptrs)
    else:
        copy_kv_slots_torch(caches, src, dst)


def _check_args(caches: Sequence[torch.Tensor], src: torch.Tensor, dst: torch.Tensor,
                every_cache: bool = True) -> None:
    if src.dim() != 1 or src.shape != dst.shape:
        raise ValueError(f"src and dst must be [P] slot indices, got {list(src.shape)} and "
                         f"{list(dst.shape)}")
    _check_caches(caches if every_cache else caches[:1])


def _check_caches(caches: Sequence[torch.Tensor]) -> None:
    if not caches:
        raise ValueError("caches is empty")
    first = caches[0]
    if first.dim() != 4:
        raise ValueError("caches must be [num_blocks, block_size, kv_heads, head_size], got "
                         f"shape {list(first.shape)}")
    for cache in caches:
        if (cache.shape != first.shape or cache.stride() != first.stride()
                or cache.dtype != first.dtype or cache.device != first.device):
            raise ValueError("all caches of a group need the same shape, strides, dtype and "
                             "device")
    if first.element_size() not in _INT_OF_SIZE:
        raise ValueError(f"unsupported cache element size {first.element_size()}")
