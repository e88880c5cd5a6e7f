"""KV compaction after acceptance, by the attention backend each target layer runs on.

A tree step's accepted path moves to the slots right after its root in every target layer.
How a slot is laid out in a page is the backend's business: each tree attention backend's
impl names its mover (``new_kv_mover``: vLLM's packed CPU pages element by element, or a
Triton kernel over Triton-attention pages), so the mover follows the backend the engine
really uses, whatever the platform. Shared by both runners' glue; imports no vLLM.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from vllm_dartree.step.verify_plan import AcceptedPaths

BackendMover = Callable[[AcceptedPaths, list[tuple[torch.Tensor, str, torch.Tensor]]], None]


class LayerKv(NamedTuple):
    """One target attention layer's KV as a tree step compacts it."""

    kv_cache: torch.Tensor
    isa: str  # vLLM's CPU page-layout ISA ("" elsewhere)
    slot_mapping: torch.Tensor  # this step's slot of every token row
    backend: type  # the layer's attention impl class


def layer_kv(layer: Any, metadata: Any) -> LayerKv:
    """The KV of a target attention layer in the forward of this step's ``metadata``."""
    kv_cache = layer.kv_cache
    if isinstance(kv_cache, (list, tuple)):  # one entry per virtual engine in older vLLM
        kv_cache = kv_cache[0]
    return LayerKv(kv_cache, getattr(layer, "isa", ""), metadata.slot_mapping,
                   type(layer.impl))


class KvMover:
    """Moves accepted paths' KV in every target layer, each backend's layers with its own
    mover (one per backend and engine: a mover may cache per-layer tables)."""

    def __init__(self) -> None:
        self._movers: dict[type, BackendMover] = {}

    def __call__(self, accepted: AcceptedPaths, layers: list[LayerKv]) -> None:
        by_backend: dict[type, list[tuple[torch.Tensor, str, torch.Tensor]]] = {}
        for entry in layers:
            by_backend.setdefault(entry.backend, []).append(entry[:3])
        for backend, entries in by_backend.items():
            self._mover(backend)(accepted, entries)

    def _mover(self, backend: type) -> BackendMover:
        if backend not in self._movers:
            new_kv_mover = getattr(backend, "new_kv_mover", None)
            if new_kv_mover is None:
                raise NotImplementedError(
                    f"a target attention layer runs on {backend.__qualname__}, which has no "
                    "dartree tree attention; trees are verified on vLLM's CPU_ATTN and "
                    "TRITON_ATTN backends (use one, or tree 'chain')")
            self._movers[backend] = new_kv_mover()
        return self._movers[backend]
