"""KV compaction after acceptance, by the attention backend each target layer runs on.

A tree step's accepted path moves to the slots right after its root in every target layer.
How a slot is laid out in a page is the backend's business: each tree attention backend's
impl names its mover (``new_kv_mover``: vLLM's packed CPU pages element by element, or a
Triton kernel over Triton-attention pages), so the mover follows the backend the engine
really uses, whatever the platform. Shared by both runners' glue; imports no vLLM.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterator, Mapping
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


def target_attention_layers(metadata: Mapping[str, Any], layers: Mapping[str, Any],
                            drafter_layers: Container[str] = ()
                            ) -> Iterator[tuple[Any, Any]]:
    """(layer, attention metadata) of every target attention layer of a forward, from the
    forward's ``metadata`` and the engine's ``layers``, both by layer name. Left out: the
    drafter's layers (named in ``drafter_layers`` or marked ``is_draft_layer``: they share
    the KV group but hold no tree) and layers whose metadata has no slot mapping (a hybrid
    target's GDN/Mamba layers keep their state in per-request slots, ``gdn_rows``)."""
    for name, item in metadata.items():
        layer = layers.get(name)
        if (item is None or layer is None or name in drafter_layers
                or getattr(layer, "is_draft_layer", False) or not hasattr(item, "slot_mapping")):
            continue
        yield layer, item


def target_layers_kv(metadata: Mapping[str, Any], layers: Mapping[str, Any],
                     drafter_layers: Container[str] = ()) -> list[LayerKv]:
    """The KV of every target attention layer of a forward (:func:`target_attention_layers`),
    what a tree step compacts after acceptance."""
    return [layer_kv(layer, item)
            for layer, item in target_attention_layers(metadata, layers, drafter_layers)]


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
