"""Tree verification in vLLM's Triton attention backend (GPU path).

Changes to vLLM (0.32/0.33), made only when dartree is requested on a CUDA platform:

- ``AttentionBackendEnum.TRITON_ATTN`` in vLLM's backend registry names
  (``activation.TritonTreeAttention``)
  :class:`TreeTritonAttentionBackend`, a subclass of
  ``vllm.v1.attention.backends.triton_attn.TritonAttentionBackend``. Its impl (a
  ``TritonAttentionImpl``) runs the stock kernel for every row; while a tree verify step is
  active, the rows of tree requests are recomputed by ``vllm_dartree.kernels.tree_attention`` over
  the paged prefix plus each node's ancestors (packed bitmask) and written over the stock
  rows. Its metadata builder (a ``TritonAttentionMetadataBuilder``) declares no full CUDA
  graph support: a full-graph replay would skip the host-side tree recompute, so vLLM
  falls back to piecewise graphs, which run attention eagerly.
- ``EngineArgs.attention_backend`` is set to ``TRITON_ATTN`` by :func:`select_triton_backend`
  when the user chose no backend (a tree needs this backend's ancestor mask).

KV layout (installed source): a layer's cache is the logical page view
``[num_blocks, num_kv_heads, block_size, 2 * head_size]`` (keys then values in the last
dim, physical strides free); ``kv_cache.transpose(1, 2).split(head_size, -1)`` gives the
``[num_blocks, block_size, num_kv_heads, head_size]`` key and value views that the stock
kernel and ``vllm_dartree.kernels.tree_attention`` both take.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from vllm.v1.attention.backend import AttentionCGSupport, AttentionType
from vllm.v1.attention.backends.triton_attn import (
    TritonAttentionBackend,
    TritonAttentionImpl,
    TritonAttentionMetadataBuilder,
)
from vllm.v1.kv_cache_interface import is_quantized_kv_cache

from vllm_dartree.integration.refusals import refuse_layer
from vllm_dartree.kernels.kv_compaction import cache_pointer_table, copy_kv_slots
from vllm_dartree.kernels.tree_attention import tree_attention
from vllm_dartree.step.tree_context import plan_for, step_cached
from vllm_dartree.step.verify_plan import AcceptedPaths, VerifyPlan, compaction_pairs
from vllm_dartree.tree import pack_bool_mask


@dataclass
class TreeKernelArgs:
    """Per-step arguments of ``vllm_dartree.kernels.tree_attention`` shared by every layer."""

    block_table: torch.Tensor  # [T, max_blocks] the tree requests' block-table rows
    base: torch.Tensor  # [T] committed prefix length = position of the root
    ancestor_bits: torch.Tensor  # int64 [T, 1+B, words] packed ancestor mask
    num_rows: torch.Tensor  # [T] root + scheduled nodes
    root_row: torch.Tensor  # [T] flattened query row of the root


def tree_kernel_args(plan: VerifyPlan, seq_lens: torch.Tensor, block_table: torch.Tensor
                     ) -> TreeKernelArgs:
    """Kernel arguments from the verify layout and vLLM's per-request ``seq_lens`` (prefix
    + root + scheduled nodes) and block table (both indexed by batch position)."""
    index = plan.batch_index.to(seq_lens.device)
    num_rows = 1 + plan.num_drafts
    return TreeKernelArgs(
        block_table=block_table[index].contiguous(),
        base=seq_lens[index].to(torch.int64) - num_rows,
        ancestor_bits=pack_bool_mask(plan.ancestors),
        num_rows=num_rows,
        root_row=plan.root_row,
    )


def split_kv_cache(kv_cache: torch.Tensor, head_size: int
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Key and value views ``[num_blocks, block_size, kv_heads, head_size]`` of a layer page."""
    if kv_cache.dim() != 4 or kv_cache.shape[-1] != 2 * head_size:
        raise NotImplementedError(
            f"dartree tree attention expects vLLM's [num_blocks, kv_heads, block_size, "
            f"2 * head_size] Triton cache, got shape {list(kv_cache.shape)}")
    key_cache, value_cache = kv_cache.transpose(1, 2).split(head_size, dim=-1)
    return key_cache, value_cache


class TreeTritonAttentionImpl(TritonAttentionImpl):
    @staticmethod
    def new_kv_mover() -> GpuKvMover:
        """The KV compaction of this backend's pages (``kv_mover.KvMover``)."""
        return GpuKvMover()

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        refuse_layer(self, "Triton")  # before weights load; refusals.py checked the config
        head = self.head_size
        unsupported = {
            "quantized kv cache": is_quantized_kv_cache(self.kv_cache_dtype),
            "chunk_lookback": self.chunk_lookback != -1,
            "non-decoder attention": self.attn_type != AttentionType.DECODER,
            "head_size not a power of two >= 16": head < 16 or head & (head - 1) != 0,
        }
        self._tree_unsupported = [name for name, used in unsupported.items() if used]

    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output,
                output_scale=None, output_block_scale=None):
        output = super().forward(layer, query, key, value, kv_cache, attn_metadata, output,
                                 output_scale, output_block_scale)
        plan = plan_for(attn_metadata)
        if (plan is None or attn_metadata is None or plan.chains  # causal is exact for chains
                or getattr(layer, "is_draft_layer", False)):
            return output
        unsupported = self._tree_unsupported + (["fused output quantization"]
                                                if output_scale is not None else [])
        if unsupported:
            raise NotImplementedError(
                f"dartree tree verification on the Triton backend does not support "
                f"{unsupported}")
        args = step_cached(("triton", id(plan), id(attn_metadata.block_table)),
                           lambda: tree_kernel_args(plan, attn_metadata.seq_lens,
                                                    attn_metadata.block_table))
        key_cache, value_cache = split_kv_cache(kv_cache, self.head_size)
        shape = (query.shape[0], self.num_heads, self.head_size)
        tree_attention(query.view(shape), key_cache, value_cache, args.block_table, args.base,
                       args.ancestor_bits, args.num_rows, args.root_row, self.scale,
                       out=output.view(output.shape[0], *shape[1:]),
                       max_prefix=attn_metadata.max_seq_len)
        return output


class TreeTritonAttentionMetadataBuilder(TritonAttentionMetadataBuilder):
    # The tree recompute is host-driven (it reads the active step in each forward): a full
    # CUDA graph would replay the stock kernel alone, so only piecewise graphs are allowed.
    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.NEVER


class TreeTritonAttentionBackend(TritonAttentionBackend):
    @staticmethod
    def get_impl_cls() -> type[TreeTritonAttentionImpl]:
        return TreeTritonAttentionImpl

    @staticmethod
    def get_builder_cls() -> type[TreeTritonAttentionMetadataBuilder]:
        return TreeTritonAttentionMetadataBuilder


def select_triton_backend(engine_args) -> None:
    """Make the engine use TRITON_ATTN: set it when the user chose no backend, refuse a
    different choice (only this backend carries the tree mask on GPUs), before any weight
    is loaded."""
    from vllm.config.attention import AttentionConfig
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    from vllm_dartree.config import DARTreeConfigError

    wanted = AttentionBackendEnum.TRITON_ATTN
    config = engine_args.attention_config
    chosen = {
        "attention_backend": engine_args.attention_backend,
        "attention_config.backend": getattr(config, "backend", None),
        **{f"attention_config.backend_per_kind.{kind}": backend
           for kind, backend in (getattr(config, "backend_per_kind", None) or {}).items()},
    }
    chosen = {field: AttentionConfig.validate_backend_before(value)
              for field, value in chosen.items()}
    for field, backend in chosen.items():
        if backend is not None and backend != wanted:
            raise DARTreeConfigError(
                f"engine key {field!r} = {backend.name} cannot verify dartree trees on GPUs; "
                f"leave it unset or use TRITON_ATTN (or use speculative_config tree 'chain')")
    if all(backend is None for backend in chosen.values()):
        engine_args.attention_backend = wanted


class GpuKvMover:
    """Moves the accepted path's KV to consecutive slots in every target layer, with one
    Triton launch per group of layers that share a slot mapping and page layout. The
    device table of the group's cache pointers is built once per group, not per step."""

    def __init__(self) -> None:
        self._pointer_tables: dict[tuple[int, ...], torch.Tensor] = {}

    def __call__(self, accepted: AcceptedPaths,
                 kv_caches: list[tuple[torch.Tensor, str, torch.Tensor]]) -> None:
        groups: dict[tuple, tuple[torch.Tensor, list[torch.Tensor]]] = {}
        for kv_cache, _isa, slot_mapping in kv_caches:
            # [blocks, block_size, kv_heads, 2 * head]: a slot's keys and values move together.
            cache = kv_cache.transpose(1, 2)
            key = (id(slot_mapping), tuple(cache.shape), cache.stride(), cache.dtype)
            groups.setdefault(key, (slot_mapping, []))[1].append(cache)
        for slot_mapping, caches in groups.values():
            src, dst = compaction_pairs(accepted, slot_mapping)
            copy_kv_slots(caches, src, dst, self._pointer_table(caches))

    def _pointer_table(self, caches: list[torch.Tensor]) -> torch.Tensor:
        key = tuple(cache.data_ptr() for cache in caches)  # host metadata: no sync
        if key not in self._pointer_tables:
            self._pointer_tables[key] = cache_pointer_table(caches)
        return self._pointer_tables[key]
