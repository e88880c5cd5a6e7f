"""Tree verification in vLLM's CPU attention backend (torch path).

Once dartree is active, ``AttentionBackendEnum.CPU_ATTN`` in vLLM's backend registry names
:class:`TreeCPUAttentionBackend` (``activation.CpuTreeAttention``, vLLM 0.32/0.33). Every
row is computed by the stock kernel first; while a tree verify plan is active (set around
the target forward only, ``tree_context``), the rows of tree requests are recomputed so that each node attends to the request's committed prefix
plus its own ancestors, which is what the target would see had it decoded that branch.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend, CPUAttentionBackendImpl

from vllm_dartree.integration.refusals import refuse_layer
from vllm_dartree.integration.tree_context import active_plan, step_cached
from vllm_dartree.integration.verify_plan import AcceptedPaths, VerifyPlan, compaction_pairs
from vllm_dartree.tree import verify_visibility


@functools.lru_cache(maxsize=16)
def kv_slot_layout(isa: str, block_size: int, head_size: int, dtype: torch.dtype
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Where the CPU kernels store token ``o``'s key/value element ``d`` inside a block.

    Returns ``key_index[o, d]`` and ``value_index[o, d]`` into the flattened
    ``[block_size * 2 * head_size]`` storage of one (block, kv head). Found by writing coded
    values through vLLM's own cache-write op, so any ISA-specific packing is covered.
    """
    from vllm import _custom_ops as ops

    size = block_size * head_size
    code = torch.arange(size).view(block_size, 1, head_size)
    found = []
    for digit in range(2):  # two base-128 digits keep the codes exact even in bfloat16
        value = ((code // 128**digit) % 128).to(dtype)
        cache = torch.full((1, 1, block_size, 2 * head_size), -1.0, dtype=dtype)
        view = cache.view(1, 1, 2 * block_size, head_size)
        key_cache, value_cache = view.chunk(2, dim=2)
        ops.cpu_attn_reshape_and_cache(value, value, key_cache, value_cache,
                                       torch.arange(block_size), isa, k_scale=1.0,
                                       v_scale=1.0, kv_cache_dtype="auto")
        found.append(cache.view(-1).to(torch.int64))
    decoded = found[0] + 128 * found[1]  # flat storage -> code of the element stored there
    halves = decoded.view(2, size)
    key_index = torch.empty(size, dtype=torch.int64)
    value_index = torch.empty(size, dtype=torch.int64)
    key_index[halves[0]] = torch.arange(size)
    value_index[halves[1]] = torch.arange(size) + size
    return key_index.view(block_size, head_size), value_index.view(block_size, head_size)


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


def copy_kv_slots(kv_cache: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, isa: str
                  ) -> None:
    """Copy every slot in ``src`` to the slot in ``dst`` (all reads happen before writes)."""
    if src.numel() == 0:
        return
    _, _, block_size, two_head = kv_cache.shape
    key_index, value_index = kv_slot_layout(isa, block_size, two_head // 2, kv_cache.dtype)
    both = torch.cat([key_index, value_index], dim=1)  # [bs, 2*hd]: every element of a slot
    flat = kv_cache.view(-1)
    flat[_element_index(kv_cache, dst, both)] = flat[_element_index(kv_cache, src, both)]


@dataclass
class TreeAttentionPlan:
    """Per-step gather indices and visibility, shared by every layer of the forward."""

    seg_rows: torch.Tensor  # [T, 1+B] flattened query row of each verify slot
    scheduled: torch.Tensor  # [T, 1+B] slot was scheduled this step
    slots: torch.Tensor  # [T, L] KV slot of each key position 0..L-1
    visible: torch.Tensor  # [T, 1+B, L] prefix, then ancestors in the tree part


def plan_tree_attention(plan: VerifyPlan, seq_lens: torch.Tensor, block_table: torch.Tensor,
                        block_size: int) -> TreeAttentionPlan:
    size = 1 + plan.tree.budget
    rows_in_segment = torch.arange(size)
    lengths = seq_lens[plan.batch_index].to(torch.int64)  # [T] prefix + 1 + n
    num_rows = 1 + plan.num_drafts
    key_pos = torch.arange(int(lengths.max()))
    pos = torch.minimum(key_pos.unsqueeze(0), (lengths - 1).unsqueeze(1))  # [T, L]
    tables = block_table[plan.batch_index].to(torch.int64)
    slots = tables.gather(1, pos // block_size) * block_size + pos % block_size
    return TreeAttentionPlan(
        seg_rows=plan.root_row.unsqueeze(1) + rows_in_segment,
        scheduled=rows_in_segment < num_rows.unsqueeze(1),
        slots=slots,
        visible=verify_visibility(plan.ancestors, lengths - num_rows, num_rows, key_pos.numel()),
    )


def tree_attention(query: torch.Tensor, kv_cache: torch.Tensor, isa: str,
                   plan: TreeAttentionPlan, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of every verify row over prefix + ancestors.

    Returns (rows [M], out [M, heads, head_size]) for the M scheduled verify rows.
    """
    num_req, max_len = plan.slots.shape
    keys, values = gather_kv(kv_cache, plan.slots.view(-1), isa)
    keys = keys.view(num_req, max_len, *keys.shape[1:]).transpose(1, 2)  # [T, kvh, L, D]
    values = values.view(num_req, max_len, *values.shape[1:]).transpose(1, 2)
    q = query[plan.seg_rows.clamp(max=query.shape[0] - 1)].transpose(1, 2)  # [T, H, 1+B, D]
    out = torch.nn.functional.scaled_dot_product_attention(
        q.float(), keys.float(), values.float(), attn_mask=plan.visible.unsqueeze(1),
        scale=scale, enable_gqa=q.shape[1] != keys.shape[1],
    ).transpose(1, 2)  # [T, 1+B, H, D]
    return plan.seg_rows[plan.scheduled], out[plan.scheduled].to(query.dtype)


class TreeCPUAttentionImpl(CPUAttentionBackendImpl):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        refuse_layer(self, "CPU")  # before weights load; refusals.py checked the config
        self._tree_unsupported = ["fp8 kv cache"] if self.is_fp8_kv_cache else []

    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output,
                output_scale=None, output_block_scale=None):
        output = super().forward(layer, query, key, value, kv_cache, attn_metadata, output,
                                 output_scale, output_block_scale)
        plan = active_plan()
        if plan is None or attn_metadata is None:
            return output
        if self._tree_unsupported:
            raise NotImplementedError(
                f"dartree tree verification on CPU does not support {self._tree_unsupported}"
            )
        gather = _layer_plan(plan, attn_metadata, kv_cache.shape[2])
        rows, tree_out = tree_attention(
            query.view(query.shape[0], self.num_heads, self.head_size), kv_cache, layer.isa,
            gather, self.scale,
        )
        output.view(output.shape[0], self.num_heads, self.head_size)[rows] = tree_out
        return output


def _layer_plan(plan: VerifyPlan, attn_metadata, block_size: int) -> TreeAttentionPlan:
    """The gather plan for this forward's metadata, computed by the first layer and reused."""
    key = ("cpu", id(plan), id(attn_metadata.block_table), block_size)
    return step_cached(key, lambda: plan_tree_attention(
        plan, attn_metadata.seq_lens, attn_metadata.block_table, block_size))


def move_accepted_kv(accepted: AcceptedPaths,
                     kv_caches: list[tuple[torch.Tensor, str, torch.Tensor]]) -> None:
    """Move each accepted path's KV to the slots right after its root, in every target layer
    (vLLM's CPU layout packs K/V per ISA: copied element by element through it)."""
    for kv_cache, isa, slot_mapping in kv_caches:
        src, dst = compaction_pairs(accepted, slot_mapping)
        copy_kv_slots(kv_cache, src, dst, isa)


class TreeCPUAttentionBackend(CPUAttentionBackend):
    @staticmethod
    def get_impl_cls() -> type[TreeCPUAttentionImpl]:
        return TreeCPUAttentionImpl


