"""What steps did deliver, drafting and not, per batch size: the measured check on the cost
model's judgement (:class:`MeasuredRates`)."""

from __future__ import annotations

import torch


class MeasuredRates:
    """Tokens per millisecond the engine delivered at batch size R, drafting and not:

        rate_on(R)  = sum (R + accepted nodes) / sum ms   steps that drafted after a step
                                                          that drafted (steady drafting)
        rate_off(R) = sum R / sum ms                      steps that verified no node and
                                                          did not draft (plain decoding)

    Sums forget ``decay`` per sample of their kind and R; steps that also prefilled, or
    whose time spans an idle gap, are left out (:meth:`observe_step`). The cost model
    predicts what a step would cost, and can be wrong where it extrapolates (plain steps it
    rarely sees, costs that are not linear in rows); these say what steps did cost, so the
    policy stops drafting when its trees delivered fewer tokens per ms than plain decoding
    at the same batch size, whatever the model predicts (``verdict``). A verdict against drafting holds
    at that batch size (``vetoed``) until a later one says drafting paid, even while the
    drafted sums it came from are measured afresh.
    """

    def __init__(self, decay: float = 0.9, min_on: int = 8, min_off: int = 2) -> None:
        self.decay = decay
        self.min_on, self.min_off = min_on, min_off
        self._sums: dict[tuple[bool, int], list[float]] = {}  # (on, R) -> [tokens, ms, n]
        self._paid: dict[int, bool] = {}  # R -> the last verdict
        self._drafted_before = False  # whether the step before the current one drafted
        self._accepted: torch.Tensor | None = None  # nodes the current step accepted

    def note_accepted(self, accepted: torch.Tensor) -> None:
        """The current step's verification accepted ``accepted`` nodes in all (device; read
        with the step's time)."""
        self._accepted = accepted

    def observe_step(self, requests: int, rows: int, nodes: int, ms: float, drafted: bool,
                     kept: bool) -> None:
        """One step's time, sorted: steady drafting (drafted after a drafted step, with its
        acceptance known unless it verified nothing), plain decoding (no node, no drafting)
        or neither; ``kept`` False (an idle gap) or a prefill (rows beyond R + nodes) makes
        it neither."""
        drafted_before, self._drafted_before = self._drafted_before, drafted
        accepted, self._accepted = self._accepted, None
        if kept and rows == requests + nodes:
            if drafted and drafted_before and (nodes == 0 or accepted is not None):
                tokens = requests + (0.0 if accepted is None else float(accepted))
                self.observe(True, requests, tokens, ms)
            elif not drafted and nodes == 0:
                self.observe(False, requests, float(requests), ms)

    def observe(self, drafting: bool, requests: int, tokens: float, ms: float) -> None:
        tokens_sum, ms_sum, count = self._sums.get((drafting, requests), (0.0, 0.0, 0))
        self._sums[(drafting, requests)] = [self.decay * tokens_sum + tokens,
                                            self.decay * ms_sum + ms, count + 1]

    def rate(self, drafting: bool, requests: int) -> float | None:
        """Tokens per ms, or None before enough samples."""
        tokens, ms, count = self._sums.get((drafting, requests), (0.0, 0.0, 0))
        enough = count >= (self.min_on if drafting else self.min_off)
        return tokens / ms if enough and ms > 0 else None

    def verdict(self, requests: int) -> bool | None:
        """Whether drafting paid at ``requests`` (None: not measured both ways yet); a
        verdict is remembered for :meth:`vetoed`."""
        on, off = self.rate(True, requests), self.rate(False, requests)
        if on is None or off is None:
            return None
        self._paid[requests] = on >= off
        return self._paid[requests]

    def vetoed(self, requests: int) -> bool:
        """Whether the last verdict at ``requests`` was against drafting."""
        return not self._paid.get(requests, True)

    def needs_plain(self, requests: int) -> bool:
        """Whether plain decoding at ``requests`` has fewer than three plain samplings."""
        return self._sums.get((False, requests), (0.0, 0.0, 0))[2] < 3 * self.min_off

    def forget_drafting(self, requests: int) -> None:
        """Drop the drafted steps' sums at ``requests``: after a pause drafting is measured
        afresh (the drafts, the load or the prompts may have changed)."""
        self._sums.pop((True, requests), None)
