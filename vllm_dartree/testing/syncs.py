"""Count the tensor operations that make the host wait for the device on a GPU.

On this CPU nothing waits, so the tree step's host syncs are counted instead: every call
that would block on CUDA (reading a value: ``item``, ``tolist``, ``bool``/``int``/
``float``/``index`` of a tensor; data-dependent shapes: ``nonzero``, ``masked_select``,
boolean-mask indexing, ``repeat_interleave`` without ``output_size``, ``unique``; copies to
the host: ``cpu``, ``numpy``) is recorded while the mode is active.
"""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

READS = {"item", "tolist", "__bool__", "__int__", "__float__", "__index__", "cpu", "numpy",
         "nonzero", "masked_select", "unique", "unique_consecutive", "argwhere"}
INDEXING = {"__getitem__", "__setitem__", "index_put", "index_put_"}


def _has_bool_index(args) -> bool:
    index = args[1] if len(args) > 1 else None
    parts = index if isinstance(index, (tuple, list)) else (index,)
    return any(isinstance(p, torch.Tensor) and p.dtype == torch.bool for p in parts)


class HostSyncCounter(TorchFunctionMode):
    """``with HostSyncCounter() as syncs: ...`` then ``syncs.calls`` lists what synced."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", str(func))
        if name in READS:
            self.calls.append(name)
        elif name in INDEXING and _has_bool_index(args):
            self.calls.append(f"{name} with a boolean mask")
        elif name == "repeat_interleave" and isinstance(args[1] if len(args) > 1 else
                                                        kwargs.get("repeats"), torch.Tensor) \
                and kwargs.get("output_size") is None:
            self.calls.append("repeat_interleave with tensor repeats")
        elif name == "to" and any(a == "cpu" or (isinstance(a, torch.device) and a.type == "cpu")
                                  for a in (*args[1:], kwargs.get("device"))):
            self.calls.append("to(cpu)")
        return func(*args, **kwargs)
