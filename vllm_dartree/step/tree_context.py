"""How the tree verify plan reaches the attention backends of the target forward.

vLLM's attention backends get per-layer metadata from vLLM only. On V1,
:meth:`TreeStep.target_forward <vllm_dartree.step.tree_step.TreeStep.target_forward>`
enters :func:`tree_verify` around the target's forward of a tree step (never around the
drafter's). On V2, whose runner has no hook around the forward, the model state attaches the
plan to the target layers' own metadata objects (:func:`attach`; the drafter builds its own).
The CPU and Triton backends read :func:`plan_for` in every layer. Work every layer would
repeat (gather plans, kernel arguments) is memoised with :func:`step_cached` and dropped
when the forward ends (V1) or the next plan is attached (V2). No vLLM import.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from vllm_dartree.step.verify_plan import VerifyPlan

T = TypeVar("T")

_active_plan: VerifyPlan | None = None
_cache: dict[Hashable, Any] = {}


@contextmanager
def tree_verify(plan: VerifyPlan) -> Iterator[None]:
    """Mark the target forward of a tree verify step."""
    global _active_plan
    _active_plan = plan
    try:
        yield
    finally:
        _active_plan = None
        _cache.clear()


PLAN_ATTR = "dartree_plan"  # on a V2 target layer's attention metadata


def attach(metadata: Iterable[Any], plan: VerifyPlan | None) -> None:
    """V2: mark these attention-metadata objects as the target forward of ``plan``."""
    _cache.clear()
    for item in metadata:
        setattr(item, PLAN_ATTR, plan)


def plan_for(attn_metadata: Any) -> VerifyPlan | None:
    """The plan an attention layer given ``attn_metadata`` verifies, if any."""
    attached = getattr(attn_metadata, PLAN_ATTR, None)
    return attached if attached is not None else _active_plan


def step_cached(key: Hashable, build: Callable[[], T]) -> T:
    """``build()`` once per forward and key (the first layer builds, the others reuse)."""
    if key not in _cache:
        _cache[key] = build()
    return _cache[key]
