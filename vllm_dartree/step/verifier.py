"""Acceptance of a tree step, in place of vLLM's rejection sampler.

:class:`TreeVerifier` takes the step's plan and the target's logits at every verify row and
returns what vLLM's sampler would: per request, the accepted tokens then the bonus token
(-1 padded). It samples the target at every row (argmax, or temperature / top-k / top-p
from the request's own generator), walks each tree from the root along the target's
choices, moves the accepted path's KV to consecutive slots, records statistics and tells
its observers (the benchmark recorder) about every accepted step.

This is lossless: the tree is a deterministic function of the drafter's output, so the
emitted tokens are exactly what the target would sample decoding alone.

No vLLM import; the KV move is a function given by the runner (CPU or GPU page layout).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

import torch

from vllm_dartree.step.profile import StepProfile
from vllm_dartree.step.verify_plan import AcceptedPaths, VerifyPlan
from vllm_dartree.tree import accept_tree, choose_tokens

logger = logging.getLogger("vllm.dartree")

LOG_EVERY_S = 10.0

KvCompactor = Callable[[AcceptedPaths], None]
Observer = Callable[[AcceptedPaths], None]  # called with every accepted tree step


class TreeVerifier:
    """Target choice at every verify row, tree walk, KV compaction, statistics.

    Observers (e.g. the benchmark's round recorder) see every accepted step of every
    verifier in this process: register one with :meth:`observing`.
    """

    _observers: ClassVar[list[Observer]] = []

    def __init__(self) -> None:
        self.stats = AcceptanceStats()

    @classmethod
    @contextmanager
    def observing(cls, observer: Observer) -> Iterator[None]:
        """Call ``observer(accepted)`` after every tree step while the block runs (engines
        in this process only; it reads, never changes, what it is given)."""
        cls._observers.append(observer)
        try:
            yield
        finally:
            cls._observers.remove(observer)

    def accept(self, plan: VerifyPlan, choice: torch.Tensor, columns: int,
               compact_kv: KvCompactor) -> tuple[torch.Tensor, AcceptedPaths]:
        """-> (sampled token ids [R, columns] int32, -1 padded: each request's accepted
        tokens then its bonus token; accepted paths). ``choice`` is the target's token at
        every logits row of the step (any runner's sampler)."""
        with StepProfile.phase("accept", choice.device):
            result = accept_tree(plan.tree, choice[plan.node_logit_rows])
            out = torch.full((len(plan.logit_starts), columns), -1,
                             dtype=torch.int64, device=choice.device)
            out[:, 0] = choice[plan.first_logit_row]  # requests without drafts: bonus only
            width = min(result.accepted_tokens.shape[1], out.shape[1])
            out[plan.batch_index, :width] = result.accepted_tokens[:, :width]
        accepted = AcceptedPaths(plan, result.accepted_nodes, result.num_accepted)
        with StepProfile.phase("kv_compaction", choice.device):
            compact_kv(accepted)
        self.stats.record(accepted)
        for observer in self._observers:
            observer(accepted)
        return out.to(torch.int32), accepted

    @staticmethod
    def target_choice(logits: torch.Tensor, plan: VerifyPlan, sampling: Any) -> torch.Tensor:
        """The target's token at every logits row of the step."""
        if sampling.all_greedy:
            return choose_tokens(logits, None)
        request = plan.request_of_logit_row  # per-request settings, expanded to rows

        def per_row(values: torch.Tensor | None) -> torch.Tensor | None:
            return None if values is None else values[request]

        starts = plan.logit_starts
        ends = starts[1:] + [plan.num_logit_rows]
        generators = [(slice(starts[r], ends[r]), generator)
                      for r, generator in sampling.generators.items()]
        return choose_tokens(logits, per_row(sampling.temperature), per_row(sampling.top_k),
                             per_row(sampling.top_p), generators)


class AcceptanceStats:
    """Running acceptance length, logged periodically (vLLM's counters carry the totals).

    Sums stay on the device; they are read (one host sync) only when a log line is due.
    """

    def __init__(self) -> None:
        self.rounds = 0
        self.accepted: torch.Tensor | int = 0
        self.nodes: torch.Tensor | int = 0
        self._last_log = time.monotonic()

    def record(self, accepted: AcceptedPaths) -> None:
        self.rounds += accepted.plan.num_requests
        self.accepted = self.accepted + accepted.num_accepted.sum()
        self.nodes = self.nodes + accepted.plan.tree.num_nodes.sum()
        now = time.monotonic()
        if now - self._last_log >= LOG_EVERY_S:
            self._last_log = now
            logger.info("dartree: mean acceptance length %.2f over %d rounds (%.1f nodes/tree)",
                        float(self.accepted) / self.rounds, self.rounds,
                        float(self.nodes) / self.rounds)
