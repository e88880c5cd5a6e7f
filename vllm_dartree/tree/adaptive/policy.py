"""Adaptive verification: the units of this package composed into the policy the engine asks
each step (:class:`AdaptiveVerification`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from vllm_dartree.tree.adaptive.acceptance import DeliveryRatio, DepthCalibration, node_acceptance
from vllm_dartree.tree.adaptive.cost import StepCostModel
from vllm_dartree.tree.adaptive.outlook import TreeOutlook
from vllm_dartree.tree.adaptive.pause import PausePolicy
from vllm_dartree.tree.adaptive.rates import MeasuredRates
from vllm_dartree.tree.adaptive.selection import best_node_count, counts_of_top, priority_order
from vllm_dartree.tree.adaptive.width import AutoWidth
from vllm_dartree.tree.types import DraftTree


@dataclass
class VerifyChoice:
    """One step's choice: the trees in priority order and the nodes to verify of each."""

    tree: DraftTree  # [R, B], columns in priority order (any prefix is a subtree)
    counts: list[int]  # [R] host: leading columns to verify per request
    expected_tokens: float  # E(n*) (host)
    predicted_ms: float  # T(n*) (host)


@dataclass
class ProposerStep:
    """What the current step's proposer did (:meth:`AdaptiveVerification.record_drafting`)."""

    drafted: bool = False
    draft_ms: float = 0.0  # its time, less the context written for earlier steps
    set_aside_ms: float = 0.0  # that context's time: a cost of the steps that held it


class AdaptiveVerification:
    """Each step's nodes and whether to draft, from the units of this package.

    Which nodes: the acceptance p of every node (:mod:`.acceptance`), the step times T(n)
    (:class:`StepCostModel`), their best count n* and its split over the requests
    (:mod:`.selection`). The count verified, with c = ``start_up_steps``,
    e = ``excursion_every`` and s the drafted steps so far:

        n = round(START_UP_FRACTIONS[s mod 5] * R * B)   s < c: the start-up cycle of sizes
            n* + ceil(R * B / 4), at most R * B          s a multiple of e, s / e odd: an
            0                                            s a multiple of e, s / e even: excursion
            n*                                           otherwise
        then n >= ceil(R * B / 4) while the cost model has seen fewer than
        ``trusted_after`` steps that verified a tree

    The cost model learns from the steps it sees, so the count varies on purpose (any count
    is lossless, drafting or not): the start-up cycle and the periodic count excursions keep
    the per-row, per-request and drafting costs told apart, and the floor keeps a young fit,
    which can price a tree step absurdly and then choose no node, from never seeing the tree
    step that shows it wrong.

    Whether to draft: :class:`PausePolicy` judges every drafted step after the start-up
    cycle, with x = (R + g * (E(n*) - R)) / T(n*) (g: :class:`DeliveryRatio`), the measured
    rates (:class:`MeasuredRates`) and, before each step, the tests of :class:`TreeOutlook`.
    A step that does not draft still owes the drafter its context (so later drafts see
    every committed token; the proposer writes it when drafting resumes) but queries no
    block.
    """

    START_UP_FRACTIONS = (1.0, 0.0, 0.5, 0.25, 0.75)
    trusted_after = 32  # tree steps the cost model must have seen before the floor lifts

    def __init__(self, max_depth: int, device: torch.device, start_up_steps: int = 5,
                 excursion_every: int = 100, off_steps: int = 4, max_off_steps: int = 256,
                 auto_width: AutoWidth | None = None, plain_every: int = 64) -> None:
        self.cost = StepCostModel()
        self.calibration = DepthCalibration(max_depth, device)
        self.delivery = DeliveryRatio(device)
        self.measured = MeasuredRates()
        self.outlook = TreeOutlook(self.cost, self.trusted_after)
        self.pause = PausePolicy(off_steps, max_off_steps)
        self.auto_width = auto_width  # ``width: "auto"``: narrows the tree with the counts
        self.start_up_steps = start_up_steps
        self.excursion_every = excursion_every
        self.plain_every = plain_every
        self.steps = 0  # drafted steps (choices made)
        self._step = ProposerStep()

    @property
    def gain_scale(self) -> float:
        """g (host copy, read with each choice)."""
        return self.delivery.scale

    # ---- drafting on or off ----------------------------------------------------------
    def should_draft(self, requests: int) -> bool:
        """Whether this step, with ``requests`` in its batch, should draft trees for the next
        (rank 0 decides under TP)."""
        return self.pause.should_draft(requests, self.measured.vetoed,
                                       self.outlook.last_tree_pays,
                                       self.outlook.some_tree_could_pay)

    def record_drafting(self, drafted: bool, ms: float, set_aside_ms: float = 0.0) -> None:
        """What this step's proposer did (after the ranks agreed) and its wall time, for the
        cost model's next sample. ``set_aside_ms`` of it wrote context held from earlier
        steps that did not draft: a cost of those steps, spread over a pause, so it is left
        out of this step's time."""
        self._step = ProposerStep(drafted, ms - set_aside_ms, set_aside_ms)

    def _judge(self, requests: int, expected: float, nodes: int, curve: list[float]) -> None:
        """After a drafted step: the pause policy's judgement of it (none in start-up, nor
        before the cost model predicts a positive time)."""
        if self.steps <= self.start_up_steps:
            self.pause.start_up(self.steps)
            return
        tree_ms = float(self.cost.predict(requests, nodes))
        plain_ms = self.cost.plain_ms(requests)
        if min(tree_ms, plain_ms) <= 0:
            return
        gain = self.gain_scale * (expected - requests)
        self.outlook.remember(gain / requests, nodes / requests,
                              self.gain_scale * np.asarray(curve))
        verdict = self.measured.verdict(requests)
        plain_due = bool(self.plain_every and self.steps % self.plain_every == 0
                         and self.measured.needs_plain(requests))
        self.pause.judge(requests, (requests + gain) / tree_ms, plain_ms, verdict,
                         self.measured.vetoed(requests), plain_due)
        if verdict is False:
            self.measured.forget_drafting(requests)  # measured afresh after the pause

    # ---- which nodes -------------------------------------------------------------------
    def _node_count(self, acceptance: torch.Tensor, step_ms: torch.Tensor,
                    total: int) -> torch.Tensor:
        """n of the class docstring (0-dim tensor)."""
        if self.steps < self.start_up_steps:
            fraction = self.START_UP_FRACTIONS[self.steps % len(self.START_UP_FRACTIONS)]
            return torch.tensor(round(fraction * total), device=acceptance.device)
        chosen = best_node_count(acceptance, step_ms.clamp(min=1e-3).to(
            acceptance.device, torch.float32))
        if self.excursion_every and self.steps % self.excursion_every == 0:
            above = self.steps // self.excursion_every % 2
            chosen = (chosen + -(-total // 4)).clamp(max=total) if above else chosen * 0
        if self.cost.tree_steps < self.trusted_after:
            chosen = chosen.clamp(min=-(-total // 4))
        return chosen

    def choose(self, tree: DraftTree) -> VerifyChoice:
        """The nodes to verify next step for every request of ``tree`` (one host read)."""
        acceptance = node_acceptance(tree, self.calibration.scale())
        ordered, acceptance = priority_order(tree, acceptance)
        num_requests, budget = acceptance.shape
        total = num_requests * budget
        step_ms = self.cost.predict(num_requests, torch.arange(total + 1))
        chosen = self._node_count(acceptance, step_ms, total)
        counts = counts_of_top(acceptance, chosen, ordered.valid)
        kept = torch.arange(budget, device=counts.device) < counts.unsqueeze(1)
        promised = (acceptance * kept).sum()
        gain = self.delivery.promise(promised)
        # What the best k*R nodes of this batch promise per request, k = 1 .. B.
        ends = torch.arange(1, budget + 1, device=acceptance.device) * num_requests - 1
        curve = acceptance.flatten().sort(descending=True).values.cumsum(0)[ends]
        host = torch.cat([counts.to(torch.float64),
                          torch.stack([promised, gain]).to(torch.float64),
                          curve.to(torch.float64) / num_requests]).tolist()  # the host read
        counts_host, (promised_host, self.delivery.scale) = host[:num_requests], host[
            num_requests:num_requests + 2]
        expected_host = num_requests + promised_host
        counts_host = [int(c) for c in counts_host]
        nodes = sum(counts_host)
        self.steps += 1
        self._judge(num_requests, expected_host, nodes, host[num_requests + 2:])
        predicted = float(self.cost.predict(num_requests, nodes))
        return VerifyChoice(ordered, counts_host, expected_host, predicted)

    def observe_scheduled(self, num_drafts: list[int]) -> None:
        """The draft counts vLLM scheduled for this step's requests (host, the same on every
        tensor-parallel rank, so every rank's next tree has the same width)."""
        if self.auto_width is not None:
            self.auto_width.update(num_drafts)

    def observe_step(self, requests: int, rows: int, nodes: int, ms: float) -> bool:
        """The previous step's wall time (it drafted as :meth:`record_drafting` said)."""
        step, self._step = self._step, ProposerStep()
        ms -= step.set_aside_ms
        kept = self.cost.observe(requests, rows, nodes, ms, step.drafted, step.draft_ms)
        self.measured.observe_step(requests, rows, nodes, ms, step.drafted, kept)
        return kept

    def observe_acceptance(self, tree: DraftTree, num_accepted: torch.Tensor) -> None:
        """The verified trees of the last choice and their path lengths (root included)."""
        self.calibration.update(tree, num_accepted)
        accepted = (num_accepted - 1).clamp(min=0).sum()
        self.measured.note_accepted(accepted)
        self.delivery.deliver(accepted)
