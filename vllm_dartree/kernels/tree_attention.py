"""Tree verification attention over a paged KV cache: a Triton kernel and its torch twin.

Layout (vLLM's GPU FlashAttention / Triton backends): ``key_cache`` and ``value_cache`` are
``[num_blocks, block_size, num_kv_heads, head_size]``; ``block_table [R, max_blocks]`` maps
a request's token position p to slot ``block_table[r, p // block_size] * block_size +
p % block_size``.

Request r verifies ``num_rows[r]`` rows (root + scheduled nodes, at most 1 + B) whose
queries sit at ``query[root_row[r] + i]``. Its committed prefix is positions ``0 ..
base[r] - 1`` (visible to every row) and verify row i wrote its key at position
``base[r] + i``. Row i sees tree column j iff bit ``j % 64`` of word ``j // 64`` of
``ancestor_bits[r, i]`` is set (``vllm_dartree.tree.packed_ancestor_mask``) and
``j < num_rows[r]``. Rows ``i >= num_rows[r]`` are padding: their output rows are not
written.

Kernel: one program per (request, block of rows, kv head[, KV split]). The query tile holds
BLOCK_R rows x the GROUP query heads of that kv head (GQA: K/V tiles are loaded once for the
whole group). Online softmax (base-2) runs over prefix tiles (block-table gather, visibility
= position < base) then over the tree tiles (visibility from the packed mask). With
``num_splits > 1`` the prefix is cut into ``num_splits`` chunks (flash-decoding) so long
contexts fill the GPU even for one request; the last split also does the tree part, each
split writes (acc, max, sum) and a second kernel merges them.
"""

from __future__ import annotations

import functools
import math

import torch

from vllm_dartree.kernels.launch import LazyKernel, require_launchable, use_triton
from vllm_dartree.tree.types import verify_visibility

tl = None  # bound by LazyKernel at the first launch

LOG2E = 1.4426950408889634
WORD_BITS = 64
MAX_TREE_ROWS = 1 + 128


# ------------------------------------------------------------------------------ torch twin
def unpack_bits(bits: torch.Tensor, size: int) -> torch.Tensor:
    """int64 [..., words] -> bool [..., size]: bit j % 64 of word j // 64."""
    cols = torch.arange(size, device=bits.device)
    words = bits[..., cols // WORD_BITS]
    return ((words >> (cols % WORD_BITS)) & 1).bool()


def tree_attention_torch(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: torch.Tensor,
    base: torch.Tensor,
    ancestor_bits: torch.Tensor,
    num_rows: torch.Tensor,
    root_row: torch.Tensor,
    scale: float,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Torch twin: gather each request's keys through its block table, SDPA with a bool mask.

    Mirrors ``vllm_dartree.integration.cpu_attention.tree_attention`` for the GPU layout.
    Computes in float32; writes the scheduled rows of ``out`` (zeros when not given).
    """
    _check_args(query, key_cache, value_cache, block_table, base, ancestor_bits, num_rows,
                root_row, out)
    out = torch.zeros_like(query) if out is None else out
    num_requests, size, _ = ancestor_bits.shape
    if num_requests == 0:
        return out
    device = query.device
    block_size = key_cache.shape[1]
    base, num_rows = base.to(torch.int64), num_rows.to(torch.int64)
    lengths = base + num_rows
    max_len = max(int(lengths.max()), 1)
    key_pos = torch.arange(max_len, device=device)
    pos = torch.minimum(key_pos.unsqueeze(0), (lengths - 1).clamp(min=0).unsqueeze(1))
    blocks = block_table.to(torch.int64).gather(1, pos // block_size)  # [R, L]
    keys = key_cache[blocks, pos % block_size].transpose(1, 2)  # [R, kvh, L, D]
    values = value_cache[blocks, pos % block_size].transpose(1, 2)
    # Visible: the committed prefix, then the tree columns by the mask (one definition,
    # shared with the CPU backend: vllm_dartree.tree.verify_visibility).
    rows = torch.arange(size, device=device)
    scheduled = rows.unsqueeze(0) < num_rows.unsqueeze(1)  # [R, 1+B]
    visible = verify_visibility(unpack_bits(ancestor_bits, size), base, num_rows, max_len)
    visible = visible | ~scheduled.unsqueeze(2)  # padding rows: anything finite, never stored
    seg_rows = (root_row.to(torch.int64).unsqueeze(1) + rows).clamp(0, query.shape[0] - 1)
    q = query[seg_rows].transpose(1, 2)  # [R, H, 1+B, D]
    heads, kv_heads = q.shape[1], keys.shape[1]
    result = torch.nn.functional.scaled_dot_product_attention(
        q.float(), keys.float(), values.float(), attn_mask=visible.unsqueeze(1), scale=scale,
        enable_gqa=heads != kv_heads,
    ).transpose(1, 2)  # [R, 1+B, H, D]
    out[seg_rows[scheduled]] = result[scheduled].to(out.dtype)
    return out


# --------------------------------------------------------------------------------- kernels
def _tree_attention_fwd(
    q_ptr, k_ptr, v_ptr, out_ptr, table_ptr, base_ptr, rows_ptr, root_ptr, bits_ptr,
    acc_ptr, ml_ptr,
    scale_log2, row_blocks, block_size, num_splits,
    stride_qt, stride_qh, stride_ot, stride_oh,
    stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
    stride_tr, stride_mr, stride_mi,
    GROUP: tl.constexpr, GROUP_P: tl.constexpr, BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr, HEAD: tl.constexpr, SPLIT_KV: tl.constexpr,
    PRECISION: tl.constexpr,
):
    req = tl.program_id(0) // row_blocks
    row0 = (tl.program_id(0) % row_blocks) * BLOCK_R
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    n_rows = tl.load(rows_ptr + req).to(tl.int32)
    if row0 >= n_rows:  # a block of padding rows only
        return
    base = tl.load(base_ptr + req).to(tl.int32)
    root = tl.load(root_ptr + req).to(tl.int64)

    # Query tile: entry m is (row row0 + m // GROUP_P, query head kvh * GROUP + m % GROUP_P).
    offs_m = tl.arange(0, BLOCK_R * GROUP_P)
    row = row0 + offs_m // GROUP_P
    head = kvh * GROUP + offs_m % GROUP_P
    valid_m = (row < n_rows) & (offs_m % GROUP_P < GROUP)
    offs_d = tl.arange(0, HEAD)
    q_rows = (root + row) * stride_qt + head * stride_qh
    q = tl.load(q_ptr + q_rows[:, None] + offs_d[None, :], mask=valid_m[:, None], other=0.0)

    # Finite "minus infinity" for the running max (kernels cannot read module globals): an
    # all-masked tile then gives p = exp2(-inf - m) = 0 and alpha = exp2(m - m) = 1 instead
    # of NaNs from (-inf) - (-inf).
    m_i = tl.full([BLOCK_R * GROUP_P], -1.0e30, tl.float32)
    l_i = tl.zeros([BLOCK_R * GROUP_P], tl.float32)
    acc = tl.zeros([BLOCK_R * GROUP_P, HEAD], tl.float32)
    # This split's prefix chunk (whole tiles, so splits never share a tile).
    chunk = tl.cdiv(tl.cdiv(base, num_splits), BLOCK_N) * BLOCK_N
    for phase in tl.static_range(2):
        if phase == 0:
            lo = split * chunk
            hi = tl.minimum(lo + chunk, base)
        else:  # the tree keys, done by the last split
            lo = base
            hi = tl.where(split == num_splits - 1, base + n_rows, base)
        for start in range(lo, hi, BLOCK_N):
            pos = start + tl.arange(0, BLOCK_N)
            in_k = pos < hi
            blk = tl.load(table_ptr + req * stride_tr + pos // block_size, mask=in_k, other=0)
            blk = blk.to(tl.int64)
            off = pos % block_size
            k_rows = blk * stride_kb + off * stride_ks + kvh * stride_kh
            v_rows = blk * stride_vb + off * stride_vs + kvh * stride_vh
            k = tl.load(k_ptr + k_rows[:, None] + offs_d[None, :], mask=in_k[:, None],
                        other=0.0)
            qk = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale_log2
            if phase == 0:
                visible = valid_m[:, None] & in_k[None, :]
            else:
                col = pos - base
                word_ptr = bits_ptr + req * stride_mr + row[:, None] * stride_mi
                words = tl.load(word_ptr + (col // 64)[None, :],
                                mask=valid_m[:, None] & in_k[None, :], other=0)
                bit = (words >> (col % 64).to(tl.int64)[None, :]) & 1
                visible = (bit != 0) & valid_m[:, None] & in_k[None, :]
            qk = tl.where(visible, qk, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(qk - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(v_ptr + v_rows[:, None] + offs_d[None, :], mask=in_k[:, None],
                        other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
            m_i = m_new

    if not SPLIT_KV:
        # A scheduled row always sees itself, so l_i > 0; the guard only avoids 0/0 on
        # masked-out tile entries.
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        o_rows = (root + row) * stride_ot + head * stride_oh
        tl.store(out_ptr + o_rows[:, None] + offs_d[None, :], out.to(out_ptr.dtype.element_ty),
                 mask=valid_m[:, None])
    else:
        # Partials [R, padded rows, H, splits, HEAD] and (max, sum) [R, padded rows, H, splits,
        # 2], merged by _merge_splits.
        heads = tl.num_programs(1) * GROUP
        part = ((req * (row_blocks * BLOCK_R) + row) * heads + head) * num_splits + split
        part = part.to(tl.int64)
        tl.store(acc_ptr + part[:, None] * HEAD + offs_d[None, :], acc, mask=valid_m[:, None])
        tl.store(ml_ptr + part * 2, m_i, mask=valid_m)
        tl.store(ml_ptr + part * 2 + 1, l_i, mask=valid_m)


def _merge_splits(
    out_ptr, acc_ptr, ml_ptr, rows_ptr, root_ptr,
    tree_rows, padded_rows, heads, stride_ot, stride_oh,
    NUM_SPLITS: tl.constexpr, SPLITS_P: tl.constexpr, BLOCK_H: tl.constexpr,
    HEAD: tl.constexpr,
):
    """One program per (request, row, block of heads): [BLOCK_H, splits, HEAD] partials."""
    req = tl.program_id(0) // tree_rows
    row = tl.program_id(0) % tree_rows
    if row >= tl.load(rows_ptr + req):
        return
    offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    offs_s = tl.arange(0, SPLITS_P)
    mask = (offs_h < heads)[:, None] & (offs_s < NUM_SPLITS)[None, :]
    part = ((req * padded_rows + row) * heads + offs_h[:, None]) * NUM_SPLITS + offs_s[None, :]
    part = part.to(tl.int64)  # [BLOCK_H, SPLITS_P]
    m = tl.load(ml_ptr + part * 2, mask=mask, other=-1.0e30)
    l_s = tl.load(ml_ptr + part * 2 + 1, mask=mask, other=0.0)
    weight = tl.exp2(m - tl.max(m, 1)[:, None])  # splits that saw no key: exp2(-1e30 - max) = 0
    offs_d = tl.arange(0, HEAD)
    acc = tl.load(acc_ptr + part[:, :, None] * HEAD + offs_d[None, None, :],
                  mask=mask[:, :, None], other=0.0)
    total = tl.sum(weight * l_s, 1)
    out = tl.sum(weight[:, :, None] * acc, 1) / tl.where(total > 0, total, 1.0)[:, None]
    root = tl.load(root_ptr + req).to(tl.int64)
    o_ptr = out_ptr + (root + row) * stride_ot + offs_h[:, None] * stride_oh + offs_d[None, :]
    tl.store(o_ptr, out.to(out_ptr.dtype.element_ty), mask=(offs_h < heads)[:, None])


_KERNELS = {fn: LazyKernel(fn) for fn in (_tree_attention_fwd, _merge_splits)}


# ------------------------------------------------------------------------------- launchers
def choose_num_splits(num_requests: int, row_blocks: int, kv_heads: int, max_prefix: int,
                      num_sms: int = 132, min_keys_per_split: int = 512) -> int:
    """Enough KV splits to give every SM a program, but at least ``min_keys_per_split``
    prefix keys per split (a split costs a partial write and a merge)."""
    programs = max(num_requests * row_blocks * kv_heads, 1)
    wanted = math.ceil(num_sms / programs)
    return max(1, min(wanted, max_prefix // min_keys_per_split, 64))


@functools.lru_cache(maxsize=8)
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def auto_num_splits(query: torch.Tensor, key_cache: torch.Tensor, ancestor_bits: torch.Tensor,
                    max_prefix: int) -> int:
    """``choose_num_splits`` for these tensors (1 off CUDA: nothing to fill there)."""
    if not query.is_cuda or max_prefix <= 0:
        return 1
    heads, kv_heads = query.shape[1], key_cache.shape[2]
    num_requests, size, _ = ancestor_bits.shape
    row_blocks = math.ceil(size / default_block_r(heads // kv_heads))
    return choose_num_splits(num_requests, row_blocks, kv_heads, max_prefix,
                             num_sms=_num_sms(query.device.index or 0))


def default_block_r(group: int) -> int:
    """Rows per program: about 64 query vectors (rows x heads of the group) per tile."""
    group_p = 1 << (group - 1).bit_length()
    return max(64 // group_p, 1)


def tree_attention_launches(
    query, key_cache, value_cache, block_table, base, ancestor_bits, num_rows, root_row,
    scale, out, *, num_splits: int = 1, block_r: int | None = None, block_n: int | None = None,
    num_warps: int = 4,
) -> list[tuple]:
    """The kernel launches as (python function, grid, kwargs) (used by the launcher and by the
    ahead-of-time compile check). Allocates the split scratch when ``num_splits > 1``."""
    num_requests, size, _ = ancestor_bits.shape
    heads, head_size = query.shape[1], query.shape[2]
    kv_heads = key_cache.shape[2]
    group = heads // kv_heads
    group_p = 1 << (group - 1).bit_length()
    block_r = default_block_r(group) if block_r is None else block_r
    fp32 = query.dtype == torch.float32
    block_n = (32 if fp32 else 64) if block_n is None else block_n
    if block_r * group_p < 16 or block_n < 16:
        raise ValueError("tl.dot needs at least 16 query vectors and 16 keys per tile")
    row_blocks = math.ceil(size / block_r)
    device = query.device
    if num_splits > 1:
        parts = num_requests * row_blocks * block_r * heads * num_splits
        acc = torch.empty(parts, head_size, dtype=torch.float32, device=device)
        ml = torch.empty(parts, 2, dtype=torch.float32, device=device)
    else:
        acc = ml = torch.empty(1, dtype=torch.float32, device=device)
    # fp32 caches (tests, checks): 3xTF32 keeps ~fp32 accuracy on tensor cores ("ieee" would
    # unroll FMA loops and take minutes to compile at head 128); fp32 tiles are twice as big,
    # so half-width key tiles and two stages keep the shared memory (about 144 KiB at head
    # 128) under the 227 KiB of an H100/H200.
    precision = "tf32x3" if fp32 else "tf32"
    fwd = dict(
        q_ptr=query, k_ptr=key_cache, v_ptr=value_cache, out_ptr=out, table_ptr=block_table,
        base_ptr=base, rows_ptr=num_rows, root_ptr=root_row, bits_ptr=ancestor_bits,
        acc_ptr=acc, ml_ptr=ml, scale_log2=float(scale) * LOG2E, row_blocks=row_blocks,
        block_size=key_cache.shape[1], num_splits=num_splits,
        stride_qt=query.stride(0), stride_qh=query.stride(1),
        stride_ot=out.stride(0), stride_oh=out.stride(1),
        stride_kb=key_cache.stride(0), stride_ks=key_cache.stride(1),
        stride_kh=key_cache.stride(2), stride_vb=value_cache.stride(0),
        stride_vs=value_cache.stride(1), stride_vh=value_cache.stride(2),
        stride_tr=block_table.stride(0), stride_mr=ancestor_bits.stride(0),
        stride_mi=ancestor_bits.stride(1),
        GROUP=group, GROUP_P=group_p, BLOCK_R=block_r, BLOCK_N=block_n, HEAD=head_size,
        SPLIT_KV=num_splits > 1, PRECISION=precision, num_warps=num_warps,
        num_stages=2 if fp32 else 3,
    )
    launches = [(_tree_attention_fwd, (num_requests * row_blocks, kv_heads, num_splits), fwd)]
    if num_splits > 1:
        splits_p = max(2, 1 << (num_splits - 1).bit_length())
        # About 4096 partial values per program (32 per thread of 4 warps).
        block_h = min(1 << (heads - 1).bit_length(), max(1, 4096 // (splits_p * head_size)))
        merge = dict(
            out_ptr=out, acc_ptr=acc, ml_ptr=ml, rows_ptr=num_rows, root_ptr=root_row,
            tree_rows=size, padded_rows=row_blocks * block_r, heads=heads,
            stride_ot=out.stride(0), stride_oh=out.stride(1), NUM_SPLITS=num_splits,
            SPLITS_P=splits_p, BLOCK_H=block_h, HEAD=head_size, num_warps=4,
        )
        grid = (num_requests * size, math.ceil(heads / block_h))
        launches.append((_merge_splits, grid, merge))
    return launches


def tree_attention_triton(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: torch.Tensor,
    base: torch.Tensor,
    ancestor_bits: torch.Tensor,
    num_rows: torch.Tensor,
    root_row: torch.Tensor,
    scale: float,
    out: torch.Tensor | None = None,
    *,
    num_splits: int = 1,
    block_r: int | None = None,
    block_n: int | None = None,
) -> torch.Tensor:
    """Triton kernel (CUDA, or CPU tensors under TRITON_INTERPRET=1); same contract as the
    twin, computing in float32 with inputs in the cache dtype."""
    _check_args(query, key_cache, value_cache, block_table, base, ancestor_bits, num_rows,
                root_row, out)
    require_launchable(query, "tree attention")
    if num_splits < 1:
        raise ValueError(f"num_splits must be >= 1, got {num_splits}")
    out = torch.zeros_like(query) if out is None else out
    if ancestor_bits.shape[0] == 0:
        return out
    ancestor_bits = ancestor_bits.contiguous()
    launches = tree_attention_launches(query, key_cache, value_cache, block_table, base,
                                       ancestor_bits, num_rows, root_row, scale, out,
                                       num_splits=num_splits, block_r=block_r,
                                       block_n=block_n)
    for fn, grid, kwargs in launches:
        _KERNELS[fn][grid](**kwargs)
    return out


def tree_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: torch.Tensor,
    base: torch.Tensor,
    ancestor_bits: torch.Tensor,
    num_rows: torch.Tensor,
    root_row: torch.Tensor,
    scale: float,
    out: torch.Tensor | None = None,
    *,
    num_splits: int | None = None,
    max_prefix: int | None = None,
) -> torch.Tensor:
    """Dispatch (``kernels.launch.use_triton``): the kernel on CUDA or under the interpreter,
    else the torch twin.

    ``num_splits`` None picks the KV split count from ``max_prefix`` (a host-side bound on
    ``base``, e.g. vLLM's max_seq_len; no split without it) and the GPU's SM count.
    """
    args = (query, key_cache, value_cache, block_table, base, ancestor_bits, num_rows,
            root_row, scale, out)
    if num_splits is None:
        num_splits = auto_num_splits(query, key_cache, ancestor_bits, max_prefix or 0)
    if use_triton(query, "tree attention"):
        return tree_attention_triton(*args, num_splits=num_splits)
    return tree_attention_torch(*args)


def _check_args(query, key_cache, value_cache, block_table, base, ancestor_bits, num_rows,
                root_row, out) -> None:
    if query.dim() != 3:
        raise ValueError(f"query must be [T, H, D], got shape {list(query.shape)}")
    if key_cache.dim() != 4 or key_cache.shape != value_cache.shape:
        raise ValueError("key_cache and value_cache must both be [num_blocks, block_size, "
                         f"kv_heads, D], got {list(key_cache.shape)} and "
                         f"{list(value_cache.shape)}")
    heads, head_size = query.shape[1:]
    kv_heads = key_cache.shape[2]
    if key_cache.shape[3] != head_size or heads % kv_heads:
        raise ValueError(f"query heads {heads} x {head_size} do not fit kv cache heads "
                         f"{kv_heads} x {key_cache.shape[3]}")
    if head_size & (head_size - 1) or head_size < 16:
        raise ValueError(f"head_size must be a power of two >= 16, got {head_size}")
    for name, t in (("query", query), ("key_cache", key_cache), ("value_cache", value_cache)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in its last dimension")
    if out is not None and (out.shape != query.shape or out.stride(-1) != 1):
        raise ValueError("out must have the query's shape and a contiguous last dimension")
    if ancestor_bits.dim() != 3 or ancestor_bits.dtype != torch.int64:
        raise ValueError("ancestor_bits must be int64 [R, 1+B, words]")
    num_requests, size, words = ancestor_bits.shape
    if size > MAX_TREE_ROWS or words != math.ceil(size / WORD_BITS):
        raise ValueError(f"ancestor_bits must be [R, 1+B, ceil((1+B)/64)] with B <= "
                         f"{MAX_TREE_ROWS - 1}, got {list(ancestor_bits.shape)}")
    for name, t in (("base", base), ("num_rows", num_rows), ("root_row", root_row)):
        if t.shape != (num_requests,):
            raise ValueError(f"{name} must be [R] = [{num_requests}], got {list(t.shape)}")
    if block_table.dim() != 2 or block_table.shape[0] != num_requests:
        raise ValueError(f"block_table must be [R, max_blocks], got {list(block_table.shape)}")
    if block_table.stride(1) != 1:
        raise ValueError("block_table must be contiguous in its last dimension")
