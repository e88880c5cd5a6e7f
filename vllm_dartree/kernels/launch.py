"""The one lazy Triton import and the one dispatch rule shared by every kernel here.

Triton is optional: CPU installs carry the package but no driver. It is imported on first
use only, because ``triton.language`` fixes the interpreter mode at its first import
(``TRITON_INTERPRET=1`` must be set before it, see :func:`interpreter_loaded`). Each kernel
module writes its ``@triton.jit`` body as a plain function and wraps it in
:class:`LazyKernel`; its public entry point asks :func:`use_triton` whether to launch the
kernel or call its torch twin.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from typing import Any

import torch

triton: Any = None
tl: Any = None


def load_triton() -> bool:
    """Import triton on first use; False when it is not installed."""
    global triton, tl
    if triton is None:
        try:
            import triton as triton_module
            import triton.language as tl_module
        except ImportError:  # pragma: no cover - exercised only without triton
            return False
        triton, tl = triton_module, tl_module
    return True


def interpreter_enabled() -> bool:
    """TRITON_INTERPRET is set now (read at call time, not at import)."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def interpreter_loaded() -> bool:
    """Whether triton was imported with TRITON_INTERPRET=1.

    triton.language decorates its own helpers (tl.sum, tl.cumsum, tl.zeros) when it is
    imported, so the interpreter only works if the variable was set before the first
    ``import triton`` in the process.
    """
    return load_triton() and type(tl.sum).__name__ == "InterpretedFunction"


def bind(fn: Callable[..., None]) -> Callable[..., None]:
    """Give a kernel body's module the imported ``triton`` and ``tl`` (kernel bodies resolve
    them from their globals when they are compiled); returns ``fn``."""
    if not load_triton():
        raise RuntimeError("triton is not installed")
    fn.__globals__.update(triton=triton, tl=tl)
    return fn


class LazyKernel:
    """A kernel body, decorated on first launch: ``triton.jit``, or the interpreter when
    triton was imported under TRITON_INTERPRET=1. The body's module gets ``triton`` and
    ``tl`` bound then (kernel bodies resolve them from their globals at JIT time)."""

    def __init__(self, fn: Callable[..., None]) -> None:
        self.fn = fn
        self._decorated: dict[bool, Any] = {}

    def __getitem__(self, grid: tuple[int, ...]) -> Any:
        interpret = interpreter_loaded()
        if interpret not in self._decorated:
            bind(self.fn)
            if interpret:  # triton.jit would consult the environment variable, not the import
                from triton.runtime.interpreter import InterpretedFunction

                self._decorated[interpret] = InterpretedFunction(self.fn)
            else:
                self._decorated[interpret] = triton.jit(self.fn)
        return self._decorated[interpret][grid]


def use_triton(tensor: torch.Tensor, kernel: str) -> bool:
    """The dispatch rule: the Triton kernel on CUDA (when triton is installed) or for CPU
    tensors under TRITON_INTERPRET=1; otherwise the torch twin. A variable set only after
    triton was imported cannot take effect: the twin runs, with a warning."""
    if tensor.is_cuda:
        return load_triton()
    if not interpreter_enabled() or not load_triton():
        return False
    if not interpreter_loaded():
        warnings.warn(f"TRITON_INTERPRET=1 was set after triton was imported; using the "
                      f"torch twin of {kernel}", RuntimeWarning, stacklevel=3)
        return False
    return True


def require_launchable(tensor: torch.Tensor, kernel: str) -> None:
    """Raise unless a kernel can launch on ``tensor`` (the ``*_triton`` entry points)."""
    if not load_triton():
        raise RuntimeError(f"triton is not installed; use the torch twin of {kernel}")
    if not tensor.is_cuda and not (interpreter_loaded() and interpreter_enabled()):
        raise RuntimeError(f"{kernel} on CPU tensors needs the Triton interpreter: set "
                           "TRITON_INTERPRET=1 before triton is first imported and keep it "
                           "set while the kernel runs")


def next_power_of_2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()
