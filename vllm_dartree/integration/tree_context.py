"""The one side channel: which tree verify plan the target forward in progress belongs to.

vLLM's attention backends get per-layer metadata from vLLM only, so the tree layout reaches
them here. :meth:`TreeStep.target_forward <vllm_dartree.integration.step.TreeStep.target_forward>`
enters :func:`tree_verify` around the target's forward of a tree step (never around the
drafter's); the CPU and Triton backends read :func:`active_plan` in every layer. Work every
layer would repeat (gather plans, kernel arguments) is memoised with :func:`step_cached`
and dropped when the forward ends. No vLLM import: this is plain process state.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from vllm_dartree.integration.verify_plan import VerifyPlan

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


def active_plan() -> VerifyPlan | None:
    return _active_plan


def step_cached(key: Hashable, build: Callable[[], T]) -> T:
    """``build()`` once per forward and key (the first layer builds, the others reuse)."""
    if key not in _cache:
        _cache[key] = build()
    return _cache[key]
