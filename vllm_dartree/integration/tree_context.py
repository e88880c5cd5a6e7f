"""Which tree verify step the target forward in progress belongs to.

The runner enters :func:`tree_verify` around the target's forward of a tree step (never
around the drafter's); the attention backends (CPU and Triton) read :func:`active_step` in
every layer and recompute the tree rows while it is set. Work that every layer would repeat
(gather plans, kernel arguments) is memoised with :func:`step_cached` and dropped when the
step ends. No vLLM import: this is plain process state.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from vllm_dartree.integration.verify import VerifyStep

T = TypeVar("T")

_active_step: VerifyStep | None = None
_cache: dict[Hashable, Any] = {}


@contextmanager
def tree_verify(step: VerifyStep | None) -> Iterator[None]:
    """Mark the target forward of a tree verify step (the drafter's forward is never inside)."""
    global _active_step
    _active_step = step
    try:
        yield
    finally:
        _active_step = None
        _cache.clear()


def active_step() -> VerifyStep | None:
    return _active_step


def step_cached(key: Hashable, build: Callable[[], T]) -> T:
    """``build()`` once per step and key (the first layer builds, the others reuse)."""
    if key not in _cache:
        _cache[key] = build()
    return _cache[key]
