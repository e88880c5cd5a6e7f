"""Adaptive verify budget: how many drafted nodes the target verifies next step, and whose.

A fixed tree suits one load only: where the target's rows are nearly free (a GPU at low
concurrency) big trees pay; where every row costs real compute (a busy GPU, any CPU) the
best tree is small or none. :class:`AdaptiveBudget` picks, every step, the number of nodes
n across the whole batch that maximises expected emitted tokens per millisecond:

    p_u   = min over u and its ancestors a of  min(1, c[d(a)] * exp(s_a))
    E(n)  = R + P_n            P_n: sum of the n largest p_u over the batch
    T(n)  = t_step + t_req * R + t_row * (R + n) + t_tree * [n > 0] + D(R)
                                                               (:class:`StepCostModel`)
    n*    = argmax_{0 <= n <= R * B} E(n) / T(n)

``s`` is a node's path log-probability under the corrected drafter (``DraftTree.scores``)
and ``c[d]`` the per-depth calibration (:class:`DepthCalibration`: accepted nodes observed
at depth d over their predicted sum). A step emits one bonus token per request plus one
per accepted node, and the nodes of one depth of a tree are disjoint events, so E(n) is the
expected number of tokens. ``p`` never grows along a path and ties go to the shallower
node, so every request's share of the top-n is a subtree (Lemma 1 of the paper for the
path score); n* = 0 means plain decoding for the step.

Drafting itself costs (D: the drafter's block, its logits, the tree; timed directly),
so after each drafted step the policy also asks whether its choice beats not drafting:

    keep drafting iff  smoothed (R + g * (E(n*) - R)) / T(n*)  >=  1.05 * R / T(0, no drafting)

g is the tokens the verified trees delivered beyond R over the tokens E promised
(exponentially weighted): the per-depth calibration fits the drafter's raw probabilities,
while E adds them up along prefix-closed selections, so the sum keeps an error of its own.
The 5% margin covers what the step-time model misses near a tie: a tree that only matches
plain decoding loses to it once its variance and probes are paid. The model can still be
wrong where it extrapolates (plain steps it rarely sees, costs that are not linear in rows),
so measured rates have a veto (:class:`MeasuredRates`): once the engine has seen, at this
batch size, enough steady drafted steps and plain steps, drafting stops whenever the
drafted steps delivered fewer tokens per ms than the plain ones (their drafted sums are then
dropped and measured afresh after the pause). Until a later measurement at that batch size
says drafting paid, the model's approval does not reset the back-off there (so each veto
doubles it, where otherwise every veto was followed by a four-step pause and eight more
losing drafted steps) and a shrinking batch does not end a pause early at
that size. Every ``plain_every``-th drafted step pauses
drafting for a few steps until three such probes have measured plain steps at this batch
size.

A step that does not draft still owes the drafter its context (so later drafts see
every committed token; the proposer writes it when drafting resumes) but queries no
block; such steps repeat with a doubling back-off (``off_steps`` .. ``max_off_steps``)
between single drafted probes. A pause ends early when the batch has shrunk below the
size at which drafting stopped and the cost model, with the gain and tree size per request
last seen, predicts that a tree now pays (with fewer requests each step's fixed cost
weighs more). A probe costs a drafter pass over the whole batch (on a 2-core CPU at 16
requests about half a plain step), so it is skipped, and the pause goes on, where no tree
could pay by the same test without its margin: k nodes per request delivering G_k tokens
each beyond the root, G_k what the best k nodes per request of the last 64 drafted steps
promised on average (times g). That test also stops drafting, without a drafted step, when the batch grows to a
size where trees cannot pay. Once the back-off is at its maximum, probes run regardless
(the cost model may be wrong where it extrapolates).

Each request's nodes are put in priority order (:func:`priority_order`), so that any
prefix of columns is a subtree: the chosen count of a request is just how many of its
columns vLLM schedules. That order depends only on the drafter's output and the observed
acceptance, never on timings, so every tensor-parallel rank builds the same trees; only
the counts (rank 0's, which the scheduler uses) come from the clock.

Pure torch and no vLLM import; :meth:`AdaptiveBudget.choose` reads its choice back to the
host once per step (vLLM's scheduler takes the draft counts as host lists anyway).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np
import torch

from vllm_dartree.tree.types import DraftTree, ancestor_mask, reorder


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


def depth_leaders(tree: DraftTree, num_depths: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[R, D] token and path log-prob of each depth's most likely node (-inf: no node)."""
    depth = torch.arange(1, num_depths + 1, device=tree.depths.device)
    at_depth = (tree.depths.unsqueeze(2) == depth) & tree.valid.unsqueeze(2)  # [R, B, D]
    scores = torch.where(at_depth, tree.scores.float().unsqueeze(2),
                         torch.full_like(at_depth, float("-inf"), dtype=torch.float32))
    best, column = scores.max(dim=1)
    return tree.tokens.gather(1, column), best


def with_confidence(tree: DraftTree, survival: torch.Tensor) -> DraftTree:
    """The tree with its scores moved so that each depth's most likely node carries a
    confidence head's chain survival, its siblings and cousins keeping their ratio to it.

    ``survival`` [R, D] is the head's probability that the chain's node at depth d is
    accepted given depth d - 1 was (DSpark's per-slot confidence); the chain is taken as
    each depth's most likely node. Only the acceptance estimate changes: the nodes, their
    order within the tree and what is verified stay the drafter's.
    """
    num_depths = survival.shape[1]
    _, best = depth_leaders(tree, num_depths)
    log_survival = survival.float().clamp(min=1e-6, max=1.0).log().cumsum(dim=1)
    shift = torch.where(torch.isfinite(best), log_survival - best, torch.zeros_like(best))
    depth_index = (tree.depths.clamp(min=1, max=num_depths) - 1)
    moved = tree.scores.float() + shift.gather(1, depth_index)
    return DraftTree(tree.tokens, tree.parents, tree.depths, tree.num_nodes, tree.valid,
                     torch.where(tree.valid, moved, tree.scores.float()), tree.max_depth)


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


# ------------------------------------------------------------------------- width
class AutoWidth:
    """The pruned tree's width W for the next drafted step (``width: "auto"``):

        W_next = the smallest width in ``widths`` that is >= max n_r over the requests of
                 the last ``window`` steps that verified a node
        widths = {ceil(B / D)} + {powers of two between} + {W_max}

    n_r: the nodes scheduled for request r in a step; B nodes per tree, D depths, W_max the
    widest allowed. A selection of n nodes holds at most n nodes of any one depth, and
    within a depth the budget ranks nodes by path score, as the pruned tree's per-depth
    top-W does; so a width of at least n keeps (up to the calibration's per-depth caps)
    every node the budget would pick, while the correction head scores W * K candidates per
    request and depth.

    The window keeps the width up while some recent step used it (one step's count says
    little about the next one's: at low load a confident step is often followed by a
    doubtful one), so the tree narrows only when the load has kept every request to a few
    nodes. Steps that verified nothing (not drafted, or no node paid) say nothing about the
    width a tree needs and leave it as it was, so the first tree after a pause is as wide
    as the trees before it (a chain after every pause biased the decision to resume
    drafting against trees: serving run 6-check). ``ceil(B / D)`` keeps W * D >= B, so a
    tree still holds B nodes and a request can be given more. Rounding up to a power of
    two leaves a handful of widths, so a GPU captures the head's graphs for each at
    start-up.
    """

    def __init__(self, max_width: int, budget: int, num_depths: int, window: int = 16
                 ) -> None:
        narrowest = min(max_width, -(-budget // num_depths))
        powers = [2**i for i in range(max_width.bit_length()) if narrowest < 2**i < max_width]
        self.widths = [narrowest, *powers, max_width] if narrowest < max_width else [max_width]
        self.width = max_width  # until a choice has been seen
        self._recent: deque[int] = deque(maxlen=window)  # each step's largest count

    def update(self, counts: list[int]) -> int:
        """The width for the next drafted step, after a step scheduled ``counts`` [R]."""
        largest = max(counts, default=0)
        if largest == 0:
            return self.width
        self._recent.append(largest)
        most = max(self._recent)
        self.width = next((w for w in self.widths if w >= most), self.widths[-1])
        return self.width


# --------------------------------------------------------------------- cost model
@dataclass
class LinearCost:
    """ms = theta . x with every theta >= 0, fitted online.

    Exponentially weighted least squares (forgetting ``decay`` per sample), solved exactly
    over every support of the coefficients (an unconstrained fit trades a huge intercept for
    a negative slope whenever a feature barely varies), plus a small ridge so the fit starts
    defined. A sample far above the prediction (an idle engine between requests) is not
    evidence of cost and is skipped once the model has seen ``warmup`` samples; before
    that, a sample over ``gap_ratio`` times the largest one kept is skipped (a server's
    warm-up request, then the first real request minutes later: a serving check took that
    gap, 101 s, for the cost of its first tree step).

    The fit is solved when the coefficients are next read, not at every sample: a pause in
    drafting observes every step but predicts nothing, and a solve costs about a millisecond
    of host time next to a 50 ms step on a CPU. The outlier screen reads a fit at most
    ``screen_lag`` samples old.
    """

    terms: tuple[str, ...]
    decay: float = 0.98
    ridge: float = 1e-3
    warmup: int = 8
    outlier_ratio: float = 3.0
    gap_ratio: float = 10.0
    screen_lag: int = 16
    observed: int = 0
    _gram: np.ndarray = field(init=False)
    _moment: np.ndarray = field(init=False)
    _solved: np.ndarray = field(init=False)  # the fit as of the last solve
    _unsolved: int = field(init=False, default=0)  # samples added since
    _largest: float = field(init=False, default=0.0)  # ms, the largest sample kept

    def __post_init__(self) -> None:
        size = len(self.terms)
        self._gram, self._moment, self._solved = (np.zeros((size, size)), np.zeros(size),
                                                  np.zeros(size))

    @property
    def coefficients(self) -> np.ndarray:
        if self._unsolved:
            self._solved = nonnegative_least_squares(
                self._gram + self.ridge * np.eye(len(self.terms)), self._moment)
            self._unsolved = 0
        return self._solved

    def predict(self, *x: float) -> float:
        return float(self.coefficients @ np.asarray(x, dtype=np.float64))

    def observe(self, ms: float, *x: float) -> bool:
        """Add one sample; False when it was skipped as an idle gap."""
        x = np.asarray(x, dtype=np.float64)
        if self.observed >= self.warmup:
            never_solved = self._unsolved == self.observed
            fresh = never_solved or self._unsolved >= self.screen_lag
            fit = self.coefficients if fresh else self._solved
            if ms > self.outlier_ratio * float(fit @ x):
                return False
        elif self.observed and ms > self.gap_ratio * self._largest:
            return False
        self._largest = max(self._largest, ms)
        self._gram = self.decay * self._gram + np.outer(x, x)
        self._moment = self.decay * self._moment + ms * x
        self.observed += 1
        self._unsolved += 1
        return True

    def describe(self) -> str:
        return " + ".join(f"{v:.2f}/{name}" for name, v in zip(self.terms, self.coefficients))


def nonnegative_least_squares(gram: np.ndarray, moment: np.ndarray) -> np.ndarray:
    """argmin_{theta >= 0} theta' G theta - 2 theta' m, by trying every support (a handful
    of unknowns: a few tiny solves; the best feasible one is the optimum of this convex
    problem)."""
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


class StepCostModel:
    """A step's wall time [ms] as the target's part plus the drafter's part:

        T(R, n, drafting) = t_step + t_req * R + t_row * (R + n) + t_tree * [n > 0]
                            + D(R, drafting)
        D(R, True)  = d_step + d_req * R        D(R, False) = d_context

``t_tree`` is what a step that verifies a tree pays beyond its rows (the plan, tree
attention set-up, acceptance, KV compaction).
    The drafter's part is timed directly around the proposer's work (its block forward,
    logits, tree and choice; on a GPU that wall time also absorbs whatever the device still
    had queued), so the two parts are fitted separately and a batch that always drafts
    still tells what a step without drafting would cost. ``rows`` are the tokens the target
    computed (one per request plus the verified nodes, plus any prefill).
    """

    def __init__(self) -> None:
        self.target = LinearCost(("step", "request", "row", "tree step"))
        self.drafting = LinearCost(("drafting step", "drafted request"))
        self.context_ms = 0.0  # a step that does not draft: it holds its context (EMA)
        self._context_steps = 0
        self.tree_steps = 0  # samples kept that verified a tree (evidence for t_row, t_tree)

    @property
    def observed(self) -> int:
        return self.target.observed

    def predict(self, requests: int, nodes: torch.Tensor | int, drafting: bool = True
                ) -> torch.Tensor:
        """Predicted ms of a step verifying ``nodes`` in all (a tensor: one per entry)."""
        t_step, t_req, t_row, t_tree = self.target.coefficients.tolist()
        draft = self.drafting.predict(1.0, requests) if drafting else self.context_ms
        nodes = torch.as_tensor(nodes, dtype=torch.float64)
        return (t_step + t_req * requests + draft + t_row * (requests + nodes)
                + t_tree * (nodes > 0))

    def plain_ms(self, requests: int) -> float:
        """Predicted ms of a plain decoding step: no node verified, no drafting."""
        return float(self.predict(requests, 0, drafting=False))

    def observe(self, requests: int, rows: int, nodes: int, ms: float, drafted: bool,
                draft_ms: float) -> bool:
        """One step: ``rows`` computed, ``nodes`` of them tree nodes; its wall time ``ms``,
        of which ``draft_ms`` in the proposer."""
        if drafted:
            self.drafting.observe(draft_ms, 1.0, requests)
        else:
            self.context_ms = draft_ms if self._context_steps == 0 else (
                0.9 * self.context_ms + 0.1 * draft_ms)
            self._context_steps += 1
        kept = self.target.observe(max(ms - draft_ms, 0.0), 1.0, requests, rows,
                                   float(nodes > 0))
        self.tree_steps += kept and nodes > 0
        return kept

    def describe(self) -> str:
        return (f"target {self.target.describe()}; drafting {self.drafting.describe()}; "
                f"context only {self.context_ms:.2f}")


# -------------------------------------------------------------------- calibration
class DepthCalibration:
    """c[d] = observed / predicted accepted nodes at depth d (exponentially weighted).

    ``predicted[d]`` sums exp(path log-prob) of the verified nodes at depth d, ``observed[d]``
    counts the requests whose accepted path reached depth d. Both stay on the device (no
    host sync per step); c[d] starts at 1 (trust the drafter) and moves toward the observed
    ratio as evidence accumulates (``pseudo`` nodes of prior weight).
    """

    def __init__(self, max_depth: int, device: torch.device, decay: float = 0.99,
                 pseudo: float = 4.0) -> None:
        self.decay = decay
        self.pseudo = pseudo
        self.predicted = torch.zeros(max_depth + 1, device=device)
        self.observed = torch.zeros(max_depth + 1, device=device)

    def scale(self) -> torch.Tensor:
        """[D + 1] c[d] (index = depth; index 0 unused)."""
        weight = self.predicted + self.pseudo
        return (self.observed + self.pseudo) / weight

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
        return self._relative_error(self.scale()[1:])

    def raw_error(self) -> float:
        """The same with c = 1: how far the drafter's own probabilities are off."""
        return self._relative_error(1.0)

    def _relative_error(self, scale: torch.Tensor | float) -> float:
        seen = self.observed[1:] > 0.5
        if not bool(seen.any()):
            return 0.0
        gap = (self.predicted[1:] * scale - self.observed[1:]).abs()
        return float((gap[seen] / self.observed[1:][seen]).mean())


# ------------------------------------------------------------------ measured rates
class MeasuredRates:
    """Tokens per millisecond the engine delivered at batch size R, drafting and not:

        rate_on(R)  = sum (R + accepted nodes) / sum ms   steps that drafted after a step
                                                          that drafted (steady drafting)
        rate_off(R) = sum R / sum ms                      steps that verified no node and
                                                          did not draft (plain decoding)

    Sums forget ``decay`` per sample of their kind and R; steps that also prefilled are left
    out (their time is mostly the prefill). The cost model predicts what a step would cost;
    these say what steps did cost, so :class:`AdaptiveBudget` stops drafting when its trees
    delivered fewer tokens per ms than plain decoding at the same batch size, whatever the
    model predicts (``verdict``). A verdict against drafting holds at that batch size
    (``vetoed``) until a later one says drafting paid, even while the drafted sums it came
    from are measured afresh.
    """

    def __init__(self, decay: float = 0.9, min_on: int = 8, min_off: int = 2) -> None:
        self.decay = decay
        self.min_on, self.min_off = min_on, min_off
        self._sums: dict[tuple[bool, int], list[float]] = {}  # (on, R) -> [tokens, ms, n]
        self._paid: dict[int, bool] = {}  # R -> the last verdict

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
        """Whether plain decoding at ``requests`` has fewer than three probes' samples."""
        return self._sums.get((False, requests), (0.0, 0.0, 0))[2] < 3 * self.min_off

    def forget_drafting(self, requests: int) -> None:
        """Drop the drafted steps' sums at ``requests``: after a pause drafting is measured
        afresh (the drafts, the load or the prompts may have changed)."""
        self._sums.pop((True, requests), None)


# ------------------------------------------------------------------------- policy
# Steps without drafting that measure plain decoding: the first verifies the last tree, the
# next ones are plain steps (MeasuredRates needs min_off of them).
PLAIN_PROBE_STEPS = 3


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
    verifies a quarter of R*B more than n* or no node at all, so the per-row, per-request and drafting costs
    stay told apart (output is unaffected: any count is lossless, drafting or not). After
    that cycle and until the cost model has seen ``trusted_after`` steps that verified a
    tree, every drafted step verifies at least a quarter of R*B: a young fit can price a tree step absurdly (a slow
    first step at start-up: 3.3 s after 13 drafted steps in a serving check), then chooses
    no node, and a step without a node never shows it wrong (serving check run 10 at one
    request: 1000 steps without drafting before it recovered).
    """

    PROBE_FRACTIONS = (1.0, 0.0, 0.5, 0.25, 0.75)
    rate_smoothing = 0.8
    required_gain = 1.05  # a drafted step must promise this much more than plain decoding
    gain_decay = 0.95  # forgetting of the delivered/promised token sums
    gain_pseudo = 2.0  # tokens of prior weight on g = 1
    trusted_after = 32  # tree steps the cost model must have seen to rule probes out

    def __init__(self, max_depth: int, device: torch.device, probe_steps: int = 5,
                 probe_every: int = 100, off_steps: int = 4, max_off_steps: int = 256,
                 auto_width: AutoWidth | None = None, plain_every: int = 64) -> None:
        self.cost = StepCostModel()
        self.auto_width = auto_width  # ``width: "auto"``: narrows the tree with the counts
        self.calibration = DepthCalibration(max_depth, device)
        self.probe_steps = probe_steps
        self.probe_every = probe_every
        self.off_steps = off_steps
        self.max_off_steps = max_off_steps
        self.steps = 0  # drafted steps (choices made)
        self._off_left = 0  # steps still to skip drafting
        self._rate: float | None = None  # smoothed predicted tokens/ms of drafted steps
        self._backoff = off_steps
        self._stopped_at = 0  # batch size when drafting last stopped
        self._recent_curves: deque[np.ndarray] = deque(maxlen=64)  # drafted steps' G_k
        self._last_tree = (0.0, 0.0)  # gain (tokens beyond R) and nodes per request, then
        self._promised = torch.zeros((), device=device)  # EW sums: tokens beyond R that
        self._delivered = torch.zeros((), device=device)  # E promised / verification gave
        self._pending: torch.Tensor | None = None  # the last choice's promise, until verified
        self.gain_scale = 1.0  # g (host copy, read with each choice)
        self._drafted = False  # whether the current step drafted
        self._draft_ms = 0.0  # and how long the proposer took
        self._set_aside_ms = 0.0  # of the step's time: writing context held by a pause
        self.measured = MeasuredRates()
        self.plain_every = plain_every
        self._drafted_before = False  # whether the step before the current one drafted
        self._accepted: torch.Tensor | None = None  # nodes the current step accepted

    # ---- drafting on or off ----------------------------------------------------------
    def should_draft(self, requests: int) -> bool:
        """Whether this step, with ``requests`` in its batch, should draft trees for the next
        (rank 0 decides under TP)."""
        if (self._off_left > 0 and requests < self._stopped_at
                and not self.measured.vetoed(requests) and self._pays_at(requests)):
            self._off_left = 0  # the load dropped: probe now (the back-off keeps growing)
        if self._off_left == 0 and self._backoff < self.max_off_steps and not self._could_pay(
                requests):
            self._pause(requests)  # no drafted probe where no tree seen lately would pay
        if self._off_left > 0:
            self._off_left -= 1
            return False
        return True

    def _could_pay(self, requests: int) -> bool:
        """Whether some tree could pay at ``requests``, without the 5% margin: k nodes per
        request delivering G_k tokens beyond the root each, for some k, where G_k is what
        the best k*R' nodes of the last 64 drafted steps (R' requests each) promised per
        request, times g, on average over the steps (the most any step promised is too
        optimistic: at one request an easy stretch of text promises a token per node,
        which let probes run at 16 requests in a serving check). True until the cost model has seen ``trusted_after`` steps that verified a tree:
        a young fit can price a tree step absurdly (serving at one request: 3.5 s after ten
        drafted steps), and only drafted probes correct it."""
        if self.cost.tree_steps < self.trusted_after or not self._recent_curves:
            return True
        size = max(len(curve) for curve in self._recent_curves)
        gains = torch.from_numpy(np.mean(  # beyond a tree's last column its curve is flat
            [np.pad(curve, (0, size - len(curve)), mode="edge") for curve in
             self._recent_curves], axis=0))
        per_request = torch.arange(1, size + 1, dtype=torch.float64)
        tree_ms = self.cost.predict(requests, per_request * requests)
        plain_ms = self.cost.plain_ms(requests)
        if plain_ms <= 0 or bool((tree_ms <= 0).any()):
            return True
        return bool(((1 + gains) / tree_ms >= 1 / plain_ms).any())

    def _pays_at(self, requests: int) -> bool:
        """Whether the last tree seen, per request, would pay with ``requests`` in a step."""
        gain, nodes = self._last_tree
        tree_ms = float(self.cost.predict(requests, round(nodes * requests)))
        plain_ms = self.cost.plain_ms(requests)
        return plain_ms > 0 and (1 + gain) / tree_ms >= self.required_gain / plain_ms

    def record_drafting(self, drafted: bool, ms: float, set_aside_ms: float = 0.0) -> None:
        """What this step's proposer did (after the ranks agreed) and its wall time, for the
        cost model's next sample. ``set_aside_ms`` of it wrote context held from earlier
        steps that did not draft: a cost of those steps, spread over a pause, so it is left
        out of this step's time."""
        self._drafted, self._draft_ms = drafted, ms - set_aside_ms
        self._set_aside_ms = set_aside_ms

    def _update_worth(self, requests: int, expected: float, nodes: int,
                      curve: list[float]) -> None:
        """After a drafted step: keep drafting, or back off (doubling) while it does not pay.

        The drafted steps' predicted rate is smoothed (``rate_smoothing``; the first drafted
        step after a pause starts it afresh), so one unlucky tree does not stop drafting.
        """
        if self.steps <= self.probe_steps:
            self._off_left = int(self.steps % 5 == 0)  # start-up: sample a step without
            return
        tree_ms = float(self.cost.predict(requests, nodes))
        plain_ms = self.cost.plain_ms(requests)
        if min(tree_ms, plain_ms) <= 0:
            return
        gain = self.gain_scale * (expected - requests)
        self._last_tree = (gain / requests, nodes / requests)
        self._recent_curves.append(self.gain_scale * np.asarray(curve))
        rate = (requests + gain) / tree_ms
        fresh = self._rate is None
        self._rate = rate if fresh else (
            self.rate_smoothing * self._rate + (1 - self.rate_smoothing) * rate)
        measured = self.measured.verdict(requests)
        if self._rate >= self.required_gain * requests / plain_ms and measured is not False:
            if not self.measured.vetoed(requests):
                self._backoff = self.off_steps
            if (self.plain_every and self.steps % self.plain_every == 0
                    and self.measured.needs_plain(requests)):
                self._off_left = PLAIN_PROBE_STEPS  # measure plain decoding at this load
            return
        if measured is False:
            self.measured.forget_drafting(requests)
        self._pause(requests)

    def _pause(self, requests: int) -> None:
        """Stop drafting for the current back-off, then double it."""
        self._off_left = self._backoff
        self._backoff = min(2 * self._backoff, self.max_off_steps)
        self._stopped_at = requests
        self._rate = None

    # ---- which nodes -------------------------------------------------------------------
    def choose(self, tree: DraftTree) -> BudgetChoice:
        """The nodes to verify next step for every request of ``tree`` (one host read)."""
        acceptance = node_acceptance(tree, self.calibration.scale())
        ordered, acceptance = priority_order(tree, acceptance)
        num_requests, budget = acceptance.shape
        total = num_requests * budget
        step_ms = self.cost.predict(num_requests, torch.arange(total + 1))
        if self.steps < self.probe_steps:
            fraction = self.PROBE_FRACTIONS[self.steps % len(self.PROBE_FRACTIONS)]
            chosen = torch.tensor(round(fraction * total), device=acceptance.device)
        else:
            chosen = best_node_count(acceptance, step_ms.clamp(min=1e-3).to(
                acceptance.device, torch.float32))
            if self.probe_every and self.steps % self.probe_every == 0:
                # Alternately a quarter of R*B more than n*, and no node at all.
                probe = self.steps // self.probe_every % 2
                chosen = (chosen + -(-total // 4)).clamp(max=total) if probe else chosen * 0
            if self.cost.tree_steps < self.trusted_after:
                chosen = chosen.clamp(min=-(-total // 4))  # evidence for the tree's cost
        counts = counts_of_top(acceptance, chosen, ordered.valid)
        kept = torch.arange(budget, device=counts.device) < counts.unsqueeze(1)
        promised = (acceptance * kept).sum()
        self._pending = promised
        gain = (self._delivered + self.gain_pseudo) / (self._promised + self.gain_pseudo)
        # What the best k*R nodes of this batch promise per request, k = 1 .. B.
        ends = torch.arange(1, budget + 1, device=acceptance.device) * num_requests - 1
        curve = acceptance.flatten().sort(descending=True).values.cumsum(0)[ends]
        host = torch.cat([counts.to(torch.float64),
                          torch.stack([promised, gain]).to(torch.float64),
                          curve.to(torch.float64) / num_requests]).tolist()  # the host read
        counts_host, (promised_host, self.gain_scale) = host[:num_requests], host[
            num_requests:num_requests + 2]
        expected_host = num_requests + promised_host
        counts_host = [int(c) for c in counts_host]
        nodes = sum(counts_host)
        self.steps += 1
        self._update_worth(num_requests, expected_host, nodes, host[num_requests + 2:])
        predicted = float(self.cost.predict(num_requests, nodes))
        return BudgetChoice(ordered, counts_host, expected_host, predicted)

    def observe_scheduled(self, num_drafts: list[int]) -> None:
        """The draft counts vLLM scheduled for this step's requests (host, the same on every
        tensor-parallel rank, so every rank's next tree has the same width)."""
        if self.auto_width is not None:
            self.auto_width.update(num_drafts)

    def observe_step(self, requests: int, rows: int, nodes: int, ms: float) -> bool:
        """The previous step's wall time (it drafted as :meth:`record_drafting` said)."""
        drafted, draft_ms = self._drafted, self._draft_ms
        drafted_before, self._drafted_before = self._drafted_before, drafted
        accepted, self._accepted = self._accepted, None
        ms -= self._set_aside_ms
        self._drafted, self._draft_ms, self._set_aside_ms = False, 0.0, 0.0
        kept = self.cost.observe(requests, rows, nodes, ms, drafted, draft_ms)
        if kept and rows == requests + nodes:  # no idle gap, no prefill in the step
            if drafted and drafted_before and (nodes == 0 or accepted is not None):
                tokens = requests + (0.0 if accepted is None else float(accepted))
                self.measured.observe(True, requests, tokens, ms)
            elif not drafted and nodes == 0:
                self.measured.observe(False, requests, float(requests), ms)
        return kept

    def observe_acceptance(self, tree: DraftTree, num_accepted: torch.Tensor) -> None:
        """The verified trees of the last choice and their path lengths (root included)."""
        self.calibration.update(tree, num_accepted)
        self._accepted = (num_accepted - 1).clamp(min=0).sum()  # read with the step's time
        if self._pending is not None:
            decay = self.gain_decay
            self._promised = decay * self._promised + self._pending
            self._delivered = decay * self._delivered + (num_accepted - 1).clamp(min=0).sum()
            self._pending = None


__all__ = [
    "AdaptiveBudget",
    "AutoWidth",
    "BudgetChoice",
    "DepthCalibration",
    "MeasuredRates",
    "StepCostModel",
    "best_node_count",
    "counts_of_top",
    "depth_leaders",
    "node_acceptance",
    "priority_order",
    "with_confidence",
]
