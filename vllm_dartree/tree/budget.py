"""Adaptive verify budget: how many drafted nodes the target verifies next step, and whose.

A fixed tree suits one load only: where the target's rows are nearly free (a GPU at low
concurrency) big trees pay; where every row costs real compute (a busy GPU, any CPU) the
best tree is small or none. :class:`AdaptiveBudget` picks, every step, the number of nodes
n across the whole batch that maximises expected emitted tokens per millisecond:

    p_u   = min over u and its ancestors a of  min(1, c[d(a)] * exp(s_a))
    E(n)  = R + P_n            P_n: sum of the n largest p_u over the batch
    T(n)  = fixed(R, drafting) + t_row * (R + n)               (:class:`StepCostModel`)
    n*    = argmax_{0 <= n <= R * B} E(n) / T(n)

``s`` is a node's path log-probability under the corrected drafter (``DraftTree.scores``)
and ``c[d]`` the per-depth calibration (:class:`DepthCalibration`: accepted nodes observed
at depth d over their predicted sum). A step emits one bonus token per request plus one
per accepted node, and the nodes of one depth of a tree are disjoint events, so E(n) is the
expected number of tokens. ``p`` never grows along a path and ties go to the shallower
node, so every request's share of the top-n is a subtree (Lemma 1 of the paper for the
path score); n* = 0 means plain decoding for the step.

Drafting itself costs (the drafter's block, its logits, the tree, per request and per step),
so after each drafted step the policy also asks whether its choice beats not drafting:

    keep drafting iff  E(n*) / T(n*, drafted)  >=  R / T(0, not drafted)

A step that does not draft still feeds the drafter its context (so later drafts see
every committed token) but queries no block; such steps repeat with a doubling back-off
(``off_steps`` .. ``max_off_steps``) between single drafted probes.

Each request's nodes are put in priority order (:func:`priority_order`), so that any
prefix of columns is a subtree: the chosen count of a request is just how many of its
columns vLLM schedules. That order depends only on the drafter's output and the observed
acceptance, never on timings, so every tensor-parallel rank builds the same trees; only
the counts (rank 0's, which the scheduler uses) come from the clock.

Pure torch and no vLLM import; :meth:`AdaptiveBudget.choose` reads its choice back to the
host once per step (vLLM's scheduler takes the draft counts as host lists anyway).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from vllm_dartree.tree.types import DraftTree, ancestor_mask


# ------------------------------------------------------------------- node acceptance
def node_acceptance(tree: DraftTree, depth_scale: torch.Tensor) -> torch.Tensor:
    """[R, B] calibrated probability that each node is on the accepted path (0 for padding).

    ``depth_scale`` [D + 1] is c[d] (index = depth). The running minimum over ancestors
    keeps p non-increasing along every path, whatever the per-depth scales do.
    """
    depths = tree.depths.clamp(max=depth_scale.shape[0] - 1)
    raw = (depth_scale[depths] * tree.scores.float().exp()).clamp(max=1.0)
    raw = torch.where(tree.valid, raw, torch.zeros_like(raw))
    ancestors = ancestor_mask(tree)[:, 1:, 1:]  # [R, i, j]: node j is i or above i
    spread = torch.where(ancestors, raw.unsqueeze(1), torch.ones_like(raw).unsqueeze(1))
    return spread.amin(dim=2) * tree.valid


def priority_order(tree: DraftTree, acceptance: torch.Tensor) -> tuple[DraftTree, torch.Tensor]:
    """Each request's nodes sorted by (acceptance desc, depth asc); padding last.

    Every prefix of the new columns is ancestor-closed: an ancestor never has a lower
    acceptance than its descendant and wins ties by depth. Returns the reordered tree and
    its acceptance [R, B] in the new order.
    """
    key = torch.where(tree.valid, acceptance, torch.full_like(acceptance, -1.0))
    by_depth = tree.depths.argsort(dim=1, stable=True)
    order = by_depth.gather(1, key.gather(1, by_depth).argsort(dim=1, descending=True,
                                                                  stable=True))
    return reorder(tree, order), acceptance.gather(1, order)


def reorder(tree: DraftTree, order: torch.Tensor) -> DraftTree:
    """The tree with new column j holding old column ``order[:, j]`` (a topological order)."""
    num_requests, budget = order.shape
    new_index = torch.zeros(num_requests, 1 + budget, dtype=torch.int64, device=order.device)
    new_index.scatter_(1, order + 1, torch.arange(1, budget + 1, device=order.device)
                       .expand_as(order).contiguous())
    return DraftTree(
        tokens=tree.tokens.gather(1, order),
        parents=new_index.gather(1, tree.parents.gather(1, order)),
        depths=tree.depths.gather(1, order),
        num_nodes=tree.num_nodes,
        valid=tree.valid.gather(1, order),
        scores=tree.scores.gather(1, order),
        max_depth=tree.max_depth,
    )


# ---------------------------------------------------------------------- selection
def best_node_count(acceptance: torch.Tensor, step_ms: torch.Tensor) -> torch.Tensor:
    """n* = argmax_n (R + P_n) / step_ms[n] over n = 0 .. R*B (0-dim int64 tensor).

    ``acceptance`` [R, B] per node, ``step_ms`` [R*B + 1] predicted step time with n nodes.
    """
    num_requests = acceptance.shape[0]
    best_first = acceptance.flatten().sort(descending=True).values
    expected = num_requests + torch.cat([best_first.new_zeros(1), best_first.cumsum(0)])
    return (expected / step_ms).argmax()


def counts_of_top(acceptance: torch.Tensor, total: torch.Tensor,
                  valid: torch.Tensor | None = None) -> torch.Tensor:
    """[R] how many of each request's (priority-ordered) nodes are among the batch's
    ``total`` best. Ties across requests go to the lower request index, so the counts add
    up to ``total`` exactly; padding columns (``valid`` False, sorted last) never count."""
    num_requests, budget = acceptance.shape
    flat = acceptance.flatten()
    rank = torch.empty_like(flat, dtype=torch.int64)
    rank[flat.argsort(descending=True, stable=True)] = torch.arange(flat.numel(),
                                                                    device=flat.device)
    chosen = rank.view(num_requests, budget) < total
    return (chosen if valid is None else chosen & valid).sum(dim=1)


# --------------------------------------------------------------------- cost model
COST_TERMS = ("step", "request", "drafting step", "drafted request", "row")


@dataclass
class StepCostModel:
    """Step time, linear in what the step did, fitted online  [ms]:

        T = t_step + t_req * R + t_draft_step * [drafted] + t_draft_req * drafted + t_row * rows

    R requests, ``drafted`` of them drafted for (0 in a step that did not draft; a drafting
    step also pays a fixed host cost: launching the drafter, building the trees), ``rows``
    tokens the target computed. Exponentially weighted least squares (forgetting ``decay``
    per step) with every coefficient >= 0 (an unconstrained fit trades a huge t_step for a
    negative t_req whenever the batch size barely varies), solved exactly over every
    support of the five coefficients, plus a small ridge so the fit starts defined. A step
    far above the prediction (an idle engine between requests) is not evidence of cost and
    is skipped once the model has seen ``warmup`` steps.
    """

    decay: float = 0.98
    ridge: float = 1e-3
    warmup: int = 8
    outlier_ratio: float = 3.0
    observed: int = 0
    _gram: np.ndarray = field(default_factory=lambda: np.zeros((5, 5)))
    _moment: np.ndarray = field(default_factory=lambda: np.zeros(5))
    coefficients: np.ndarray = field(default_factory=lambda: np.zeros(5))

    @staticmethod
    def features(requests: int, drafted: int, rows: int) -> np.ndarray:
        return np.array([1.0, requests, float(drafted > 0), drafted, rows], dtype=np.float64)

    def predict(self, requests: int, rows: torch.Tensor | int, drafted: int | None = None
                ) -> torch.Tensor:
        """Predicted ms; ``drafted`` defaults to every request."""
        t_step, t_req, t_draft_step, t_draft_req, t_row = self.coefficients.tolist()
        drafted = requests if drafted is None else drafted
        fixed = t_step + t_req * requests + t_draft_step * (drafted > 0) + t_draft_req * drafted
        return fixed + t_row * torch.as_tensor(rows, dtype=torch.float64)

    def observe(self, requests: int, drafted: int, rows: int, ms: float) -> bool:
        """Add one step; False when it was skipped as an idle gap."""
        if self.observed >= self.warmup and ms > self.outlier_ratio * float(
                self.predict(requests, rows, drafted)):
            return False
        x = self.features(requests, drafted, rows)
        self._gram = self.decay * self._gram + np.outer(x, x)
        self._moment = self.decay * self._moment + ms * x
        self.observed += 1
        self.coefficients = nonnegative_least_squares(
            self._gram + self.ridge * np.eye(5), self._moment)
        return True

    def describe(self) -> str:
        return ", ".join(f"{v:.2f}/{name}" for name, v in zip(COST_TERMS, self.coefficients))


def nonnegative_least_squares(gram: np.ndarray, moment: np.ndarray) -> np.ndarray:
    """argmin_{theta >= 0} theta' G theta - 2 theta' m, by trying every support (five
    unknowns: 31 tiny solves; the best feasible one is the optimum of this convex problem)."""
    size = moment.shape[0]
    best, best_loss = np.zeros(size), 0.0
    for mask in range(1, 1 << size):
        support = [i for i in range(size) if mask >> i & 1]
        theta = np.zeros(size)
        theta[support] = np.linalg.solve(gram[np.ix_(support, support)], moment[support])
        if (theta < 0).any():
            continue
        loss = float(theta @ gram @ theta - 2 * theta @ moment)
        if loss < best_loss:
            best, best_loss = theta, loss
    return best


# -------------------------------------------------------------------- calibration
class DepthCalibration:
    """c[d] = observed / predicted accepted nodes at depth d (exponentially weighted).

    ``predicted[d]`` sums exp(path log-prob) of the verified nodes at depth d, ``observed[d]``
    counts the requests whose accepted path reached depth d. Both stay on the device (no
    host sync per step); c[d] starts at ``prior`` (1: trust the drafter) and moves toward
    the observed ratio as evidence accumulates (``pseudo`` nodes of prior weight).
    """

    def __init__(self, max_depth: int, device: torch.device, decay: float = 0.99,
                 pseudo: float = 4.0, prior: torch.Tensor | None = None) -> None:
        self.decay = decay
        self.pseudo = pseudo
        self.prior = (torch.ones(max_depth + 1, device=device) if prior is None
                      else prior.to(device))
        self.predicted = torch.zeros(max_depth + 1, device=device)
        self.observed = torch.zeros(max_depth + 1, device=device)

    def scale(self) -> torch.Tensor:
        """[D + 1] c[d] (index = depth; index 0 unused)."""
        weight = self.predicted + self.pseudo
        return (self.observed + self.pseudo * self.prior) / weight

    def update(self, tree: DraftTree, num_accepted: torch.Tensor) -> None:
        """One verified step: ``tree`` as verified (valid = scheduled), ``num_accepted`` [R]
        the path lengths including the root."""
        size = self.predicted.shape[0]
        depths = tree.depths.clamp(max=size - 1)
        predicted = torch.zeros_like(self.predicted).scatter_add_(
            0, depths.flatten(), (tree.scores.float().exp() * tree.valid).flatten())
        reached = torch.arange(size, device=depths.device) <= (num_accepted - 1).unsqueeze(1)
        observed = reached.to(self.observed.dtype).sum(dim=0)
        observed[0] = 0
        self.predicted = self.decay * self.predicted + predicted
        self.observed = self.decay * self.observed + observed

    def error(self) -> float:
        """Mean |predicted * c - observed| / observed over depths with evidence, using the
        current scales on the accumulated sums: 0 when calibrated (host read)."""
        seen = self.observed[1:] > 0.5
        if not bool(seen.any()):
            return 0.0
        gap = (self.predicted[1:] * self.scale()[1:] - self.observed[1:]).abs()
        return float((gap[seen] / self.observed[1:][seen]).mean())

    def raw_error(self) -> float:
        """The same with c = 1: how far the drafter's own probabilities are off."""
        seen = self.observed[1:] > 0.5
        if not bool(seen.any()):
            return 0.0
        gap = (self.predicted[1:] - self.observed[1:]).abs()
        return float((gap[seen] / self.observed[1:][seen]).mean())


# ------------------------------------------------------------------------- policy
@dataclass
class BudgetChoice:
    """One step's choice: the trees in priority order and the nodes to verify of each."""

    tree: DraftTree  # [R, B], columns in priority order (any prefix is a subtree)
    counts: list[int]  # [R] host: leading columns to verify per request
    expected_tokens: float  # E(n*) (host)
    predicted_ms: float  # T(n*) (host)


class AdaptiveBudget:
    """Chooses each step's nodes by the formulas in the module docstring.

    The cost model learns from the steps it sees, so the choice sometimes varies on purpose:
    the first ``probe_steps`` drafted steps take their count from a cycle over 0 .. R*B (and
    the step after every fifth does not draft), and every ``probe_every``-th drafted step
    verifies a quarter of R*B more than n*, so the per-row, per-request and drafting costs
    stay told apart (output is unaffected: any count is lossless, drafting or not).
    """

    PROBE_FRACTIONS = (1.0, 0.0, 0.5, 0.25, 0.75)

    def __init__(self, max_depth: int, device: torch.device, probe_steps: int = 5,
                 probe_every: int = 100, off_steps: int = 4, max_off_steps: int = 64) -> None:
        self.cost = StepCostModel()
        self.calibration = DepthCalibration(max_depth, device)
        self.probe_steps = probe_steps
        self.probe_every = probe_every
        self.off_steps = off_steps
        self.max_off_steps = max_off_steps
        self.steps = 0  # drafted steps (choices made)
        self._off_left = 0  # steps still to skip drafting
        self._backoff = off_steps
        self._drafted = 0  # requests the current step drafted for

    # ---- drafting on or off ----------------------------------------------------------
    def should_draft(self) -> bool:
        """Whether this step should draft trees for the next (rank 0 decides under TP)."""
        if self._off_left > 0:
            self._off_left -= 1
            return False
        return True

    def record_drafting(self, requests: int, drafted: bool) -> None:
        """What this step did (after the ranks agreed), for the cost model's next sample."""
        self._drafted = requests if drafted else 0

    def _update_worth(self, requests: int, expected: float, nodes: int) -> None:
        """After a drafted step: keep drafting, or back off (doubling) while it does not pay."""
        if self.steps <= self.probe_steps:
            self._off_left = int(self.steps % 5 == 0)  # start-up: sample a step without
            return
        tree_ms = float(self.cost.predict(requests, requests + nodes))
        plain_ms = float(self.cost.predict(requests, requests, drafted=0))
        if min(tree_ms, plain_ms) <= 0 or expected / tree_ms >= requests / plain_ms:
            self._backoff = self.off_steps
            return
        self._off_left = self._backoff
        self._backoff = min(2 * self._backoff, self.max_off_steps)

    # ---- which nodes -------------------------------------------------------------------
    def choose(self, tree: DraftTree) -> BudgetChoice:
        """The nodes to verify next step for every request of ``tree`` (one host read)."""
        acceptance = node_acceptance(tree, self.calibration.scale())
        ordered, acceptance = priority_order(tree, acceptance)
        num_requests, budget = acceptance.shape
        total = num_requests * budget
        step_ms = self.cost.predict(num_requests, num_requests + torch.arange(total + 1))
        if self.steps < self.probe_steps:
            fraction = self.PROBE_FRACTIONS[self.steps % len(self.PROBE_FRACTIONS)]
            chosen = torch.tensor(round(fraction * total), device=acceptance.device)
        else:
            chosen = best_node_count(acceptance, step_ms.clamp(min=1e-3).to(
                acceptance.device, torch.float32))
            if self.probe_every and self.steps % self.probe_every == 0:
                chosen = (chosen + -(-total // 4)).clamp(max=total)
        counts = counts_of_top(acceptance, chosen, ordered.valid)
        kept = torch.arange(budget, device=counts.device) < counts.unsqueeze(1)
        expected = num_requests + (acceptance * kept).sum()
        host = torch.cat([counts.to(torch.float64), expected.to(torch.float64).view(1)])
        *counts_host, expected_host = host.tolist()  # the one host read of the step
        counts_host = [int(c) for c in counts_host]
        nodes = sum(counts_host)
        self.steps += 1
        self._update_worth(num_requests, expected_host, nodes)
        predicted = float(self.cost.predict(num_requests, num_requests + nodes))
        return BudgetChoice(ordered, counts_host, expected_host, predicted)

    def observe_step(self, requests: int, rows: int, ms: float) -> bool:
        """The previous step's wall time (it drafted as :meth:`record_drafting` said)."""
        drafted, self._drafted = self._drafted, 0
        return self.cost.observe(requests, drafted, rows, ms)

    def observe_acceptance(self, tree: DraftTree, num_accepted: torch.Tensor) -> None:
        self.calibration.update(tree, num_accepted)


__all__ = [
    "AdaptiveBudget",
    "BudgetChoice",
    "DepthCalibration",
    "StepCostModel",
    "best_node_count",
    "counts_of_top",
    "node_acceptance",
    "priority_order",
    "reorder",
]
