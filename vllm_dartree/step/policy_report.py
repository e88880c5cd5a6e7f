"""What adaptive verification chose, for people: a periodic log line and Prometheus metrics.

Metrics (engine process; ``vllm-dartree serve`` turns on prometheus_client's multiprocess
mode for an adaptive engine so the API server's ``/metrics`` shows them):

====================================  =========  =============================================
``vllm_dartree:budget_nodes``         histogram  nodes chosen for a request in a step
``vllm_dartree:budget_width``         histogram  the pruned tree's width W per drafted step
                                                 (fixed, or chosen by ``width: "auto"``)
``vllm_dartree:budget_calibration``   gauge      mean relative error of the calibrated
                                                 per-depth acceptance (0 = calibrated)
====================================  =========  =============================================
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import ClassVar

from vllm_dartree.tree.adaptive import AdaptiveVerification, VerifyChoice

logger = logging.getLogger("vllm.dartree")

LOG_EVERY_S = 30.0
NODE_BUCKETS = (0, 1, 2, 4, 8, 16, 32, 64, 128)
WIDTH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 32, 64, 128)

# Called with the nodes chosen per request of every drafted step, or None for a step the
# policy did not draft.
Observer = Callable[[list[int] | None], None]


class PolicyReport:
    """Running totals of the policy's choices; logs and exports them. Observers (tests,
    benchmarks) see every step's choice in this process: :meth:`observing`."""

    _observers: ClassVar[list[Observer]] = []

    @classmethod
    @contextmanager
    def observing(cls, observer: Observer) -> Iterator[None]:
        cls._observers.append(observer)
        try:
            yield
        finally:
            cls._observers.remove(observer)

    def __init__(self) -> None:
        self.steps = 0
        self.widths = 0  # summed over drafted steps
        self.steps_without_tree = 0
        self.steps_without_drafting = 0
        self.requests = 0
        self.nodes = 0
        self._last_log = time.monotonic()
        self._metrics = _metrics()

    def record_no_drafting(self) -> None:
        self.steps_without_drafting += 1
        for observer in self._observers:
            observer(None)

    def record(self, choice: VerifyChoice, policy: AdaptiveVerification, width: int) -> None:
        """One drafted step: the counts chosen and the width of the trees they come from."""
        for observer in self._observers:
            observer(choice.counts)
        nodes = sum(choice.counts)
        self.steps += 1
        self.widths += width
        self.steps_without_tree += nodes == 0
        self.requests += len(choice.counts)
        self.nodes += nodes
        if self._metrics is not None:
            histogram = self._metrics[0]
            for count in choice.counts:
                histogram.observe(count)
            self._metrics[1].observe(width)
        now = time.monotonic()
        if now - self._last_log >= LOG_EVERY_S:
            self._last_log = now
            self.log(policy)

    def log(self, policy: AdaptiveVerification) -> None:
        error, raw = policy.calibration.error(), policy.calibration.raw_error()
        if self._metrics is not None:
            self._metrics[2].set(error)
        logger.info(
            "dartree budget: %.2f nodes/request over %d drafted steps (%.0f%% without a tree), "
            "%d steps not drafted, mean width %.1f, calibration error %.2f (uncalibrated %.2f), "
            "delivered/promised tokens %.2f, step cost (ms) %s",
            self.nodes / max(self.requests, 1), self.steps,
            100 * self.steps_without_tree / max(self.steps, 1), self.steps_without_drafting,
            self.widths / max(self.steps, 1), error, raw, policy.gain_scale, policy.cost.describe())


def _metrics():
    try:
        from prometheus_client import Gauge, Histogram
    except ImportError:  # pragma: no cover - vLLM always installs it
        return None
    global _METRICS
    if _METRICS is None:
        _METRICS = (
            Histogram("vllm_dartree:budget_nodes", "adaptive verification: nodes chosen for a "
                      "request in a step", buckets=NODE_BUCKETS),
            Histogram("vllm_dartree:budget_width", "adaptive verification: width of the pruned "
                      "tree per drafted step", buckets=WIDTH_BUCKETS),
            Gauge("vllm_dartree:budget_calibration", "adaptive verification: mean relative error "
                  "of the calibrated per-depth acceptance", multiprocess_mode="livemostrecent"),
        )
    return _METRICS


_METRICS = None
