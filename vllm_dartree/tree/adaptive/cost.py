"""The step-time model: what a step costs with n nodes verified, drafting or not.

    T(R, n, drafting) = t_step + t_req * R + t_row * (R + n) + t_tree * [n > 0]
                        + D(R, drafting)
    D(R, True)  = d_step + d_req * R        D(R, False) = d_context

fitted online, every coefficient >= 0, from the engine's own steps (:class:`StepCostModel`
over two :class:`LinearCost` fits).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass
class LinearCost:
    """ms = theta . x with every theta >= 0, fitted online.

    Exponentially weighted least squares (forgetting ``decay`` per sample), solved exactly
    over every support of the coefficients (an unconstrained fit trades a huge intercept for
    a negative slope whenever a feature barely varies), plus a small ridge so the fit starts
    defined. A sample far above the prediction (an idle engine between requests) is not
    evidence of cost and is skipped once the model has seen ``warmup`` samples; before
    that, a sample over ``gap_ratio`` times the largest one kept is skipped (a server's
    warm-up request, then the first real request minutes later).

    The fit is solved when the coefficients are next read, not at every sample: a pause in
    drafting observes every step but predicts nothing, and a solve is host time every step
    would pay. The outlier screen reads a fit at most ``screen_lag`` samples old.
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
    """A step's wall time [ms] as the target's part plus the drafter's part (the module's
    T(R, n, drafting)).

    ``t_tree`` is what a step that verifies a tree pays beyond its rows (the plan, tree
    attention set-up, acceptance, KV compaction). The drafter's part is timed directly around
    the proposer's work (its block forward, logits, tree and choice; on a GPU that wall time
    also absorbs whatever the device still had queued), so the two parts are fitted
    separately and a batch that always drafts still tells what a step without drafting would
    cost. ``rows`` are the tokens the target computed (one per request plus the verified
    nodes, plus any prefill).
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
