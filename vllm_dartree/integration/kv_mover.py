"""Which KV compaction a device's target pages take (shared by both runners' glue)."""

from __future__ import annotations

from typing import Any

import torch


def kv_mover(device: torch.device | str) -> Any:
    """The KV compaction of this platform's page layout: a Triton kernel per layer group on
    CUDA, vLLM's packed CPU layout element by element otherwise."""
    if torch.device(device).type == "cuda":
        from vllm_dartree.integration.gpu_attention import GpuKvMover

        return GpuKvMover()
    from vllm_dartree.integration.cpu_attention import move_accepted_kv

    return move_accepted_kv
