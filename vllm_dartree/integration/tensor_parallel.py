"""What the tree step asks of vLLM's tensor-parallel group, given to it as callables by
both runners' adapters (``step/`` imports no vLLM)."""

from __future__ import annotations

from vllm.distributed.parallel_state import get_tp_group


def same_on_every_rank(decision: bool) -> bool:
    """Rank 0's ``decision`` on every rank of the tensor-parallel group (itself at TP=1)."""
    group = get_tp_group()
    if group.world_size == 1:
        return decision
    return bool(group.broadcast_object(decision, src=0))
