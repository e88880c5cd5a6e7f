"""Where a tree step's time goes: wall time per phase, per round.

Off unless asked for (the benchmark's ``--profile``, or ``VLLM_DARTREE_PROFILE=1`` for a
server, which then logs the medians periodically and records every phase in the Prometheus
histogram ``vllm_dartree:phase_ms{phase=...}``; the engine runs in its own process, so
``/metrics`` shows it through prometheus_client's multiprocess mode, which ``vllm-dartree
serve`` turns on for a profiled server): when off, :meth:`StepProfile.phase` is one
attribute check. When on, every phase is timed with a synchronised wall clock (on CUDA
the device is synchronised at each phase boundary, which costs some overlap: profile
numbers are for finding where time goes, not for headline speeds).

Phases (summed over the layers of one forward where a phase recurs):

==================  ===========================================================
drafter_forward     the drafter's block forward (V1 ``proposer._draft_block``; V2 vLLM's
                    DFlash ``propose``: context K/V and the query)
drafter_logits      the drafter's logits over the vocabulary, per drafted depth
tree_build          candidates, correction head, selection (``tree.build_tree``)
target_forward      the target's verify forward, whole (V1: ``_model_forward``; V2: from the
                    model state's inputs to the sampler, so the target's logits too)
stock_attention     inside it: vLLM's attention kernel, every layer
tree_attention      inside it: the tree rows recomputed, every layer
target_logits       V1: from the forward's end to acceptance: the target's logits at every
                    verify row (its lm_head, a full-vocabulary matmul) and vLLM's work
                    between its forward and its sampler (V2: inside target_forward)
accept              target choice at every row and the tree walk
kv_compaction       the accepted path's KV moved to consecutive slots
round               from one step's plan to the next (everything, host included)
==================  ===========================================================
"""

from __future__ import annotations

import logging
import os
import statistics
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import ClassVar

import torch

logger = logging.getLogger("vllm.dartree")

PHASES = ("drafter_forward", "drafter_logits", "tree_build", "target_forward",
          "stock_attention", "tree_attention", "target_logits", "accept", "kv_compaction",
          "round")
PROFILE_ENV = "VLLM_DARTREE_PROFILE"
LOG_EVERY_S = 30.0


class StepProfile:
    """Process-wide per-round phase times (one engine per process is profiled at a time)."""

    enabled: ClassVar[bool] = os.environ.get(PROFILE_ENV, "0") == "1"
    rounds: ClassVar[list[dict[str, float]]] = []
    _current: ClassVar[dict[str, float]] = defaultdict(float)
    _round_start: ClassVar[float | None] = None
    _last_log: ClassVar[float] = time.monotonic()

    @classmethod
    @contextmanager
    def recording(cls) -> Iterator[list[dict[str, float]]]:
        """Profile while the block runs; yields the list the rounds are appended to."""
        previous, cls.enabled = cls.enabled, True
        cls.rounds, cls._current, cls._round_start = [], defaultdict(float), None
        try:
            yield cls.rounds
        finally:
            cls.enabled = previous

    @classmethod
    @contextmanager
    def phase(cls, name: str, device: torch.device | None = None) -> Iterator[None]:
        if not cls.enabled:
            yield
            return
        _synchronize(device)
        start = time.perf_counter()
        try:
            yield
        finally:
            _synchronize(device)
            cls._current[name] += (time.perf_counter() - start) * 1e3

    @classmethod
    def stamp(cls, device: torch.device | None = None) -> float | None:
        """A synchronised clock reading that opens a phase spanning two calls (None when
        off); :meth:`since` closes it."""
        if not cls.enabled:
            return None
        _synchronize(device)
        return time.perf_counter()

    @classmethod
    def since(cls, name: str, start: float | None, device: torch.device | None = None) -> None:
        """Add the time since ``start`` (a :meth:`stamp`) to phase ``name``."""
        if start is None or not cls.enabled:
            return
        _synchronize(device)
        cls._current[name] += (time.perf_counter() - start) * 1e3

    @classmethod
    def new_round(cls, device: torch.device | None = None, tree_step: bool = True) -> None:
        """Called when a step is planned: closes the previous round (if it verified a tree)."""
        if not cls.enabled:
            return
        _synchronize(device)
        now = time.perf_counter()
        if cls._round_start is not None and cls._current.get("target_forward"):
            cls._current["round"] = (now - cls._round_start) * 1e3
            cls.rounds.append(dict(cls._current))
            _observe(cls._current)
            cls._log_periodically()
        cls._current = defaultdict(float)
        cls._round_start = now if tree_step else None

    @classmethod
    def _log_periodically(cls) -> None:
        now = time.monotonic()
        if now - cls._last_log < LOG_EVERY_S:
            return
        cls._last_log = now
        medians = summarize(cls.rounds[-200:])
        logger.info("dartree profile (median ms over %d rounds): %s", min(len(cls.rounds), 200),
                    ", ".join(f"{k} {v:.1f}" for k, v in medians.items()))


_HISTOGRAM = None
HISTOGRAM_BUCKETS_MS = (0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


def _observe(round_ms: dict[str, float]) -> None:
    """Record one round in the Prometheus histogram (when prometheus_client is there)."""
    global _HISTOGRAM
    if _HISTOGRAM is None:
        try:
            from prometheus_client import Histogram
        except ImportError:  # pragma: no cover - vLLM always installs it
            return
        _HISTOGRAM = Histogram("vllm_dartree:phase_ms", "dartree tree-step time per phase "
                               "and round (ms)", ["phase"], buckets=HISTOGRAM_BUCKETS_MS)
    for phase in PHASES:
        _HISTOGRAM.labels(phase=phase).observe(round_ms.get(phase, 0.0))


def summarize(rounds: list[dict[str, float]]) -> dict[str, float]:
    """Median ms of each phase over ``rounds`` (a phase absent from a round counts 0)."""
    if not rounds:
        return {}
    return {name: statistics.median(r.get(name, 0.0) for r in rounds) for name in PHASES}


def _synchronize(device: torch.device | None) -> None:
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)
