"""Tree verification in vLLM's CPU attention backend (torch path).

Once dartree is active, ``AttentionBackendEnum.CPU_ATTN`` in vLLM's backend registry names
:class:`TreeCPUAttentionBackend` (``activation.CpuTreeAttention``, vLLM 0.32/0.33). Every
row is computed by the stock kernel first; while a tree verify plan is active (set around
the target forward only, ``tree_context``), the rows of tree requests are recomputed so that
each node attends to the request's committed prefix plus its own ancestors, which is what
the target would see had it decoded that branch. A forward whose every token is a tree row
(batch-1 decoding, or a decode batch of tree requests) skips the stock kernel and computes
every row here.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend, CPUAttentionBackendImpl
from vllm.v1.kv_cache_interface import is_quantized_kv_cache

from vllm_dartree.integration.refusals import refuse_layer
from vllm_dartree.kernels import cpu_kv_pages
from vllm_dartree.step.profile import StepProfile
from vllm_dartree.step.tree_context import plan_for, step_cached
from vllm_dartree.step.verify_plan import AcceptedPaths, VerifyPlan, compaction_pairs
from vllm_dartree.tree import verify_visibility


@functools.lru_cache(maxsize=16)
def kv_slot_layout(isa: str, block_size: int, head_size: int, dtype: torch.dtype
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Where the CPU kernels store token ``o``'s key/value element ``d`` inside a block.

    Returns ``key_index[o, d]`` and ``value_index[o, d]`` into the flattened
    ``[block_size * 2 * head_size]`` storage of one (block, kv head). Found by writing coded
    values through vLLM's own cache-write op, so any ISA-specific packing is covered.
    """
    cache_write = cpu_cache_write()
    size = block_size * head_size
    code = torch.arange(size).view(block_size, 1, head_size)
    found = []
    # Base-128 digits keep the codes exact even in bfloat16; as many as the block needs
    # (hybrid targets' attention blocks are large: 1280 tokens x 32 dims needs three).
    digits = max(1, math.ceil(math.log(size, 128)))
    for digit in range(digits):
        value = ((code // 128**digit) % 128).to(dtype)
        cache = torch.full((1, 1, block_size, 2 * head_size), -1.0, dtype=dtype)
        view = cache.view(1, 1, 2 * block_size, head_size)
        key_cache, value_cache = view.chunk(2, dim=2)
        cache_write(value, value, key_cache, value_cache, torch.arange(block_size), isa,
                    k_scale=1.0, v_scale=1.0, kv_cache_dtype="auto")
        found.append(cache.view(-1).to(torch.int64))
    # flat storage -> code of the element stored there
    decoded = sum(128**digit * part for digit, part in enumerate(found))
    halves = decoded.view(2, size)
    key_index = torch.empty(size, dtype=torch.int64)
    value_index = torch.empty(size, dtype=torch.int64)
    key_index[halves[0]] = torch.arange(size)
    value_index[halves[1]] = torch.arange(size) + size
    return key_index.view(block_size, head_size), value_index.view(block_size, head_size)


def cpu_cache_write():
    """vLLM's CPU cache-write op (``vllm._cpu_ops`` from 0.34, ``vllm._custom_ops`` before)."""
    try:
        from vllm._cpu_ops import cpu_attn_reshape_and_cache
    except ImportError:
        from vllm._custom_ops import cpu_attn_reshape_and_cache
    return cpu_attn_reshape_and_cache


def _element_index(kv_cache: torch.Tensor, slots: torch.Tensor, within_block: torch.Tensor
                   ) -> torch.Tensor:
    """Flat indices [N, kv_heads, E] of the elements ``within_block[offset]`` of each slot."""
    _, num_kv_heads, block_size, two_head = kv_cache.shape
    per_head = block_size * two_head
    heads = torch.arange(num_kv_heads).view(1, -1, 1)
    start = ((slots // block_size).view(-1, 1, 1) * num_kv_heads + heads) * per_head
    return start + within_block[slots % block_size].unsqueeze(1)


def gather_kv(kv_cache: torch.Tensor, slots: torch.Tensor, isa: str
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values [N, kv_heads, head_size] stored at ``slots`` [N]."""
    _, _, block_size, two_head = kv_cache.shape
    key_index, value_index = kv_slot_layout(isa, block_size, two_head // 2, kv_cache.dtype)
    flat = kv_cache.view(-1)  # index single elements: no per-slot copy of whole blocks
    return (flat[_element_index(kv_cache, slots, key_index)],
            flat[_element_index(kv_cache, slots, value_index)])


@functools.lru_cache(maxsize=16)
def packs_transposed_keys(isa: str, block_size: int, head_size: int, dtype: torch.dtype
                          ) -> bool:
    """Whether vLLM stores one (block, kv head) as ``[K^T: head x block | V: block x head]``
    for this ISA and dtype (read off vLLM's own cache write): then whole blocks can be
    gathered and copied through strided views instead of element by element."""
    key_index, value_index = kv_slot_layout(isa, block_size, head_size, dtype)
    slot = torch.arange(block_size).unsqueeze(1)
    dim = torch.arange(head_size).unsqueeze(0)
    return (torch.equal(key_index, dim * block_size + slot)
            and torch.equal(value_index, block_size * head_size + slot * head_size + dim))


def block_views(kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Views of a transposed-key page: keys ``[blocks, kv_heads, head, block]`` and values
    ``[blocks, kv_heads, block, head]`` (see :func:`packs_transposed_keys`)."""
    blocks, kv_heads, block_size, two_head = kv_cache.shape
    head = two_head // 2
    halves = kv_cache.view(blocks, kv_heads, 2, block_size * head)
    return (halves[:, :, 0].view(blocks, kv_heads, head, block_size),
            halves[:, :, 1].view(blocks, kv_heads, block_size, head))


def fast_layout(kv_cache: torch.Tensor, isa: str) -> bool:
    _, _, block_size, two_head = kv_cache.shape
    return kv_cache.is_contiguous() and packs_transposed_keys(isa, block_size, two_head // 2,
                                                              kv_cache.dtype)


def copy_kv_slots(kv_cache: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, isa: str
                  ) -> None:
    """Copy every slot in ``src`` to the slot in ``dst`` (all reads happen before writes)."""
    if src.numel() == 0:
        return
    _, _, block_size, two_head = kv_cache.shape
    if fast_layout(kv_cache, isa):
        keys, values = block_views(kv_cache)
        src_block, src_slot, dst_block, dst_slot = (src // block_size, src % block_size,
                                                    dst // block_size, dst % block_size)
        moved_keys, moved_values = keys[src_block, :, :, src_slot], values[src_block, :, src_slot]
        keys[dst_block, :, :, dst_slot] = moved_keys
        values[dst_block, :, dst_slot] = moved_values
        return
    key_index, value_index = kv_slot_layout(isa, block_size, two_head // 2, kv_cache.dtype)
    both = torch.cat([key_index, value_index], dim=1)  # [bs, 2*hd]: every element of a slot
    flat = kv_cache.view(-1)
    flat[_element_index(kv_cache, dst, both)] = flat[_element_index(kv_cache, src, both)]


@dataclass
class TreeAttentionPlan:
    """Per-step gather indices and visibility, shared by every layer of the forward.

    With ``all_rows`` false only the Q rows per request after its causal prefix
    (``VerifyPlan.causal_rows``) are computed here: the stock kernel's causal answer is
    already exact for the others. With ``all_rows`` every verify row is (root included).
    """

    seg_rows: torch.Tensor  # [T, Q] query row of each recomputed slot (padding: a real row)
    out_rows: torch.Tensor  # [M] query rows of the recomputed slots
    out_slots: torch.Tensor  # [M] their index in the flattened [T * Q] slots
    blocks: torch.Tensor  # [T, nblk] the requests' KV blocks (padded with a real block)
    recomputed: torch.Tensor  # bool [T, Q] slots whose row is written (not padding)
    bias: torch.Tensor  # float [T, Q, L]: 0 visible, -inf hidden (L: longest prefix + tree)
    lengths: torch.Tensor  # [T] each request's prefix + tree length
    block_size: int
    dense: bool  # host: the slots are the forward's rows 0..T*Q-1 in order, none padding

    @property
    def empty(self) -> bool:
        return self.out_rows.numel() == 0

    @property
    def visible(self) -> torch.Tensor:
        """bool [T, Q, L]: prefix, then ancestors in the tree part (the element path's
        attention mask; the kernel reads ``bias``)."""
        return self.bias.isfinite()

    @property
    def slots(self) -> torch.Tensor:
        """[T, L] KV slot of each key position 0..L-1 (the element-gather path's index;
        positions past a request's length repeat its last slot)."""
        max_len = self.bias.shape[-1]
        pos = torch.minimum(torch.arange(max_len).unsqueeze(0), (self.lengths - 1).unsqueeze(1))
        block = self.blocks.gather(1, pos // self.block_size)
        return block * self.block_size + pos % self.block_size


def plan_tree_attention(plan: VerifyPlan, seq_lens: torch.Tensor, block_table: torch.Tensor,
                        block_size: int, all_rows: bool = False) -> TreeAttentionPlan:
    lengths = seq_lens[plan.batch_index].to(torch.int64)  # [T] prefix + 1 + n
    num_rows = 1 + plan.num_drafts
    if all_rows:
        first = torch.zeros_like(num_rows)
    else:  # the first row after the causal prefix
        first = 1 + torch.minimum(plan.causal_rows, plan.num_drafts)
    count = num_rows - first  # [T] rows to recompute
    width = int(count.max())  # a host read is free on a CPU
    slot = torch.arange(width)
    # Padding slots repeat a real row of the request; they are never written back.
    rows = torch.minimum(first.unsqueeze(1) + slot, (num_rows - 1).unsqueeze(1))  # [T, Q]
    recomputed = slot < count.unsqueeze(1)
    max_len = int(lengths.max())
    num_blocks = -(-max_len // block_size)
    visible = verify_visibility(plan.ancestors, lengths - num_rows, num_rows, max_len)
    visible = visible.gather(1, rows.unsqueeze(2).expand(-1, -1, max_len))
    tables = block_table[plan.batch_index, :num_blocks].to(torch.int64)
    used = torch.arange(num_blocks) * block_size < lengths.unsqueeze(1)
    seg_rows = plan.root_row.unsqueeze(1) + rows
    # A batch of equal trees verified alone (batch-1 decoding included) reads its queries
    # and writes its rows through views: no row gather or scatter in any layer.
    dense = bool(recomputed.all()) and torch.equal(seg_rows.view(-1),
                                                   torch.arange(seg_rows.numel()))
    return TreeAttentionPlan(
        seg_rows=seg_rows,
        out_rows=seg_rows[recomputed],
        out_slots=torch.arange(recomputed.numel()).view_as(recomputed)[recomputed],
        blocks=torch.where(used, tables, tables[:, :1]),
        recomputed=recomputed,
        bias=torch.zeros(visible.shape).masked_fill_(~visible, float("-inf")),
        lengths=lengths,
        block_size=block_size,
        dense=dense,
    )


def tree_attention(query: torch.Tensor, kv_cache: torch.Tensor, isa: str,
                   plan: TreeAttentionPlan, scale: float, output: torch.Tensor) -> None:
    """Attention of every recomputed verify row over prefix + ancestors, written into
    ``output`` [N, heads, head_size] at ``plan.out_rows`` (no other row is touched).

    Where vLLM stores keys transposed (``[K^T | V]`` per block and kv head) and everything
    is float32, the C++ kernel reads the pages in place (``kernels.cpu_kv_pages``);
    without a compiler, or in other dtypes, the torch twin copies whole blocks
    (:func:`tree_attention_by_blocks`); any other page layout is gathered element by
    element (:func:`tree_attention_by_elements`).
    """
    if not fast_layout(kv_cache, isa):
        tree_attention_by_elements(query, kv_cache, isa, plan, scale, output)
    elif cpu_kv_pages.supports(query, kv_cache, output) and cpu_kv_pages.load():
        tree_attention_in_pages(query, kv_cache, plan, scale, output)
    else:
        tree_attention_by_blocks(query, kv_cache, plan, scale, output)


def tree_attention_in_pages(query: torch.Tensor, kv_cache: torch.Tensor,
                            plan: TreeAttentionPlan, scale: float, output: torch.Tensor
                            ) -> None:
    """:func:`tree_attention` by the C++ kernel (float32, transposed-key pages)."""
    cpu_kv_pages.tree_attention(query, kv_cache, plan.blocks, plan.seg_rows,
                                plan.recomputed, plan.bias, scale, output)


def tree_attention_by_blocks(query: torch.Tensor, kv_cache: torch.Tensor,
                             plan: TreeAttentionPlan, scale: float, output: torch.Tensor
                             ) -> None:
    """The kernel's torch twin: the request's blocks are copied whole, the keys stay
    transposed (what ``Q K^T`` multiplies by), and attention is two batched matmuls around
    a softmax, one batch entry per (request, kv head) holding that head's query heads."""
    keys, values = block_views(kv_cache)
    num_req, num_blocks = plan.blocks.shape
    _, kv_heads, head, block = keys.shape
    length = plan.bias.shape[-1]  # the longest request's prefix + tree, not whole blocks
    index = plan.blocks.view(-1)
    k = (keys.index_select(0, index).view(num_req, num_blocks, kv_heads, head, block)
         .permute(0, 2, 3, 1, 4).reshape(num_req * kv_heads, head, num_blocks * block))
    v = (values.index_select(0, index).view(num_req, num_blocks, kv_heads, block, head)
         .transpose(1, 2).reshape(num_req * kv_heads, num_blocks * block, head))
    q = _tree_queries(query, plan)  # [T, heads, Q, D]; heads h and kv head h // group
    group = q.shape[1] // kv_heads
    grouped = q.reshape(num_req * kv_heads, -1, head).float()
    bias = plan.bias.unsqueeze(1).expand(-1, kv_heads * group, -1, -1).reshape(
        num_req * kv_heads, group * plan.bias.shape[1], length)  # rows (g, q) per kv head
    scores = torch.baddbmm(bias, grouped, k[..., :length].float(), alpha=scale)
    out = torch.bmm(scores.softmax(dim=-1), v[:, :length].float())
    _write_rows(output, out.view(q.shape), plan)


def tree_attention_by_elements(query: torch.Tensor, kv_cache: torch.Tensor, isa: str,
                               plan: TreeAttentionPlan, scale: float, output: torch.Tensor
                               ) -> None:
    """:func:`tree_attention` for any page layout: keys and values gathered element by
    element through the layout vLLM's cache write reveals (also the fast path's twin)."""
    slots = plan.slots
    num_req, max_len = slots.shape
    keys, values = gather_kv(kv_cache, slots.view(-1), isa)
    keys = keys.view(num_req, max_len, *keys.shape[1:]).transpose(1, 2)  # [T, kvh, L, D]
    values = values.view(num_req, max_len, *values.shape[1:]).transpose(1, 2)
    q = _tree_queries(query, plan)
    out = torch.nn.functional.scaled_dot_product_attention(
        q.float(), keys.float(), values.float(), attn_mask=plan.visible.unsqueeze(1),
        scale=scale, enable_gqa=q.shape[1] != keys.shape[1],
    )
    _write_rows(output, out, plan)


def _tree_queries(query: torch.Tensor, plan: TreeAttentionPlan) -> torch.Tensor:
    """The queries of the plan's slots, [T, heads, Q, head_size]."""
    if plan.dense:
        return query[: plan.seg_rows.numel()].view(*plan.seg_rows.shape,
                                                    *query.shape[1:]).transpose(1, 2)
    return query[plan.seg_rows].transpose(1, 2)


def _write_rows(output: torch.Tensor, out: torch.Tensor, plan: TreeAttentionPlan) -> None:
    """Store ``out`` [T, heads, Q, head_size] at the recomputed rows (padding slots dropped)."""
    out = out.transpose(1, 2)  # [T, Q, H, D]
    if plan.dense:
        output[: plan.seg_rows.numel()].view_as(out).copy_(out)
    else:
        flat = out.reshape(-1, *out.shape[2:])
        output[plan.out_rows] = flat[plan.out_slots].to(output.dtype)


class TreeCPUAttentionImpl(CPUAttentionBackendImpl):
    @staticmethod
    def new_kv_mover():
        """The KV compaction of this backend's pages (``kv_mover.KvMover``)."""
        return move_accepted_kv

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        refuse_layer(self, "CPU")  # before weights load; refusals.py checked the config
        quantized = is_quantized_kv_cache(self.kv_cache_dtype)
        self._tree_unsupported = ["fp8 kv cache"] if quantized else []
        # Built (or found in the cache) at engine start, not mid-step: tree attention (float32)
        # and KV compaction (any dtype) use it.
        cpu_kv_pages.load()

    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output,
                output_scale=None, output_block_scale=None):
        plan = plan_for(attn_metadata)
        if plan is None or attn_metadata is None:
            return super().forward(layer, query, key, value, kv_cache, attn_metadata, output,
                                   output_scale, output_block_scale)
        # When every token of the forward is a tree row (a decode batch whose requests all
        # verify trees), the tree path computes every row and the stock kernel is skipped:
        # it would only read the prefix K/V once more for rows computed here anyway. vLLM
        # writes this step's K/V outside ``forward`` (``do_kv_cache_update``); a backend
        # whose forward writes it must not be skipped.
        all_rows = (not plan.chains
                    and not TreeCPUAttentionBackend.forward_includes_kv_cache_update
                    and plan.num_verify_rows == attn_metadata.num_actual_tokens)
        if not all_rows:
            with StepProfile.phase("stock_attention"):
                output = super().forward(layer, query, key, value, kv_cache, attn_metadata,
                                         output, output_scale, output_block_scale)
        if plan.chains:  # causal attention is already exact for chains
            return output
        if self._tree_unsupported:
            raise NotImplementedError(
                f"dartree tree verification on CPU does not support {self._tree_unsupported}"
            )
        with StepProfile.phase("tree_attention"):
            gather = _layer_plan(plan, attn_metadata, kv_cache.shape[2], all_rows)
            if gather.empty:  # every verified row is on its request's causal prefix
                return output
            tree_attention(query.view(query.shape[0], self.num_heads, self.head_size),
                           kv_cache, layer.isa, gather, self.scale,
                           output.view(output.shape[0], self.num_heads, self.head_size))
        return output


def _layer_plan(plan: VerifyPlan, attn_metadata, block_size: int, all_rows: bool
                ) -> TreeAttentionPlan:
    """The gather plan for this forward's metadata, computed by the first layer and reused."""
    key = ("cpu", id(plan), id(attn_metadata.block_table), block_size, all_rows)
    return step_cached(key, lambda: plan_tree_attention(
        plan, attn_metadata.seq_lens, attn_metadata.block_table, block_size, all_rows))


def move_accepted_kv(accepted: AcceptedPaths,
                     kv_caches: list[tuple[torch.Tensor, str, torch.Tensor]]) -> None:
    """Move each accepted path's KV to the slots right after its root, in every target layer.

    The pairs are computed once per slot mapping (one per KV-cache group, shared by its
    layers); on a CPU a host check is free, so pairs that move nothing are dropped and a
    step whose paths are their trees' first branches touches no layer. Transposed-key pages
    move in one C++ call for all layers (``kernels.cpu_kv_pages.move_slots``); other
    layouts, or no compiler, copy layer by layer (:func:`copy_kv_slots`)."""
    groups: dict[int, tuple[torch.Tensor, torch.Tensor, list]] = {}
    for kv_cache, isa, slot_mapping in kv_caches:
        if id(slot_mapping) not in groups:
            src, dst = compaction_pairs(accepted, slot_mapping)
            moving = src != dst
            groups[id(slot_mapping)] = (src[moving], dst[moving], [])
        groups[id(slot_mapping)][2].append((kv_cache, isa))
    for src, dst, layers in groups.values():
        if src.numel() == 0:
            continue
        in_pages = [kv for kv, isa in layers if fast_layout(kv, isa)]
        if len(in_pages) == len(layers) and cpu_kv_pages.load():
            cpu_kv_pages.move_slots(in_pages, src, dst)
            continue
        for kv_cache, isa in layers:
            copy_kv_slots(kv_cache, src, dst, isa)


class TreeCPUAttentionBackend(CPUAttentionBackend):
    @staticmethod
    def get_impl_cls() -> type[TreeCPUAttentionImpl]:
        return TreeCPUAttentionImpl


