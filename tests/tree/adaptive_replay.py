"""A deterministic engine stand-in that drives adaptive verification through long runs, for
``test_adaptive_replay.py`` (and ``record_adaptive_replay.py``, which writes the trace).

Each step calls the policy in the engine's order (``step/tree_step.py``, the proposers):

1. ``observe_step`` with the previous step's shape and wall time;
2. ``observe_scheduled`` with the draft counts scheduled for this step (the last choice,
   cut or padded to this step's batch) and, where a node is verified, ``observe_acceptance``
   with the verified trees and paths drawn from them;
3. ``should_draft``; where it drafts, ``choose`` on a random tree; then ``record_drafting``.

The step times come from synthetic linear cost regimes (:class:`Regime`) with a little
noise, a few idle gaps, prefill rows when the batch grows, context written after pauses and,
in one phase, tree steps that turn slower than the cost model has learnt (what the measured
rates veto). Every random draw comes from :meth:`random.Random.random`, whose sequence Python
keeps across versions. Nothing here reads a clock.

The record of a step (:func:`run`): ``R`` the batch, ``k`` what ``observe_step`` returned,
``w`` the auto width after ``observe_scheduled``, ``d`` whether it drafts; a drafted step adds
``c`` the counts, ``e`` the expected tokens, ``t`` the predicted ms, ``g`` the gain scale and
``o`` a digest of the priority-ordered tree; every ``REPORT_EVERY`` steps ``r`` what
``step/policy_report.py`` reads (calibration errors, the cost model's description) and the
cost model's sample counts.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Callable
from dataclasses import astuple, dataclass
from pathlib import Path

import torch

from vllm_dartree.tree import DraftTree, truncate
from vllm_dartree.tree.adaptive import AdaptiveVerification, AutoWidth

TRACE = Path(__file__).parent / "data" / "adaptive_replay.json"
REPORT_EVERY = 50
PREFILL_ROWS = 24  # rows a joining request adds to its first step
IDLE_EVERY = 331  # every so many steps the engine waited for work before the step


@dataclass(frozen=True)
class Regime:
    """Step times [ms] of one load: the target's part and the drafter's part."""

    step: float
    request: float
    row: float
    tree: float  # a step that verifies a tree pays this beyond its rows
    draft_step: float
    draft_request: float
    context: float  # a step that does not draft: holding its context

    def target(self, requests: int, rows: int, nodes: int) -> float:
        return (self.step + self.request * requests + self.row * rows
                + self.tree * (nodes > 0))

    def drafting(self, requests: int) -> float:
        return self.draft_step + self.draft_request * requests

    def toward(self, other: Regime, share: float) -> Regime:
        """The regime ``share`` of the way from this one to ``other``."""
        return Regime(*(a + share * (b - a) for a, b in zip(astuple(self), astuple(other))))


# Rows nearly free: trees pay at every batch size.
GPU = Regime(20.0, 0.3, 0.02, 0.5, 1.5, 0.05, 0.2)
# The same, but verifying a tree costs 30 ms more than the cost model has seen.
SLOW_TREES = Regime(20.0, 0.3, 0.02, 30.5, 1.5, 0.05, 0.2)
# Every row costs: trees do not pay from a few requests on.
CPU = Regime(30.0, 2.0, 6.0, 4.0, 10.0, 4.0, 0.5)
# A large fixed step cost: trees pay at a few requests and not at many.
MIXED = Regime(60.0, 0.5, 4.0, 3.0, 2.0, 3.0, 0.3)


@dataclass(frozen=True)
class Phase:
    steps: int
    regime: Regime
    batch: Callable[[int], int]  # step within the phase -> requests
    sharpness: float = 0.5  # the drafter's confidence: lower, more mass on a first child
    truth: float = 0.8  # true over drafted conditional acceptance probability
    to: Regime | None = None  # the costs move from ``regime`` to this one over the phase

    def costs(self, i: int) -> Regime:
        return self.regime if self.to is None else self.regime.toward(self.to, i / self.steps)


@dataclass(frozen=True)
class Run:
    name: str
    seed: int
    budget: int  # nodes per tree
    depths: int
    policy: dict  # AdaptiveVerification keyword arguments
    width: dict  # AutoWidth keyword arguments (besides budget and depths)
    phases: tuple[Phase, ...]


def cycle(*sizes: int, every: int) -> Callable[[int], int]:
    return lambda i: sizes[i // every % len(sizes)]


def ramp(start: int, stop: int, every: int) -> Callable[[int], int]:
    step = 1 if stop >= start else -1
    return lambda i: start + step * min(abs(stop - start), i // every)


def constant(requests: int) -> Callable[[int], int]:
    return lambda i: requests


RUNS = (
    Run("small back-off", seed=1, budget=16, depths=5,
        policy={"start_up_steps": 5, "excursion_every": 40, "off_steps": 2, "max_off_steps": 32,
                "plain_every": 16},
        width={"max_width": 8, "window": 8},
        phases=(
            Phase(300, GPU, cycle(1, 2, 3, 4, 2, every=20)),
            Phase(250, GPU, constant(4), sharpness=0.3),
            Phase(200, SLOW_TREES, constant(4), sharpness=0.3),
            Phase(150, GPU, constant(4), sharpness=0.3),
            Phase(150, GPU, cycle(1, 2, 3, 4, every=10), to=MIXED),
            Phase(240, MIXED, ramp(1, 16, every=15), sharpness=0.3, truth=0.9),
            Phase(240, MIXED, ramp(16, 1, every=15), sharpness=0.3, truth=0.9),
            Phase(150, MIXED, cycle(8, 10, every=10), to=CPU),
            Phase(300, CPU, cycle(8, 12, 16, 10, every=25), sharpness=1.2, truth=0.6),
            Phase(150, CPU, cycle(2, 3, every=30), to=GPU),
        )),
    Run("defaults", seed=2, budget=12, depths=4, policy={}, width={"max_width": 6},
        phases=(
            Phase(250, GPU, cycle(1, 3, 2, every=40)),
            Phase(200, GPU, cycle(6, 9, every=50), to=CPU),
            Phase(300, CPU, cycle(6, 9, every=50), sharpness=1.0, truth=0.7),
            Phase(150, CPU, cycle(1, 2, every=25), sharpness=0.4, to=MIXED),
            Phase(200, MIXED, cycle(1, 2, 12, 2, every=25), sharpness=0.4),
        )),
)


# --------------------------------------------------------------------------- inputs
def uniform(rng: random.Random, low: float = 0.0, high: float = 1.0) -> float:
    return low + (high - low) * rng.random()


def random_tree(rng: random.Random, requests: int, budget: int, depths: int,
                sharpness: float) -> DraftTree:
    """Best-first random trees: each node takes a share of its parent's remaining
    probability (its path log-prob is the parent's plus log of that share); a request's tree
    holds between half the budget and all of it, padding after."""
    tokens, parents, depth, valid, scores = ([] for _ in range(5))
    for _ in range(requests):
        size = budget if rng.random() < 0.5 else budget // 2 + int(rng.random() * budget / 2)
        mass, at_depth, score = [1.0], [0], [0.0]  # index 0: the root
        row_parents = []
        for _ in range(size):
            open_nodes = [p for p in range(len(mass)) if at_depth[p] < depths and mass[p] > 1e-4]
            noise = [-math.log(-math.log(min(max(rng.random(), 1e-12), 1 - 1e-12)))
                     for _ in open_nodes]
            parent = max(zip(open_nodes, noise),
                         key=lambda pn: score[pn[0]] + math.log(mass[pn[0]]) + 0.5 * pn[1])[0]
            share = max(mass[parent] * rng.random() ** sharpness, 1e-6)
            mass[parent] -= share
            mass.append(1.0)
            at_depth.append(at_depth[parent] + 1)
            score.append(score[parent] + math.log(share))
            row_parents.append(parent)
        pad = budget - size
        tokens.append([int(rng.random() * 1000) for _ in range(budget)])
        parents.append(row_parents + [0] * pad)
        depth.append(at_depth[1:] + [1] * pad)
        valid.append([True] * size + [False] * pad)
        scores.append(score[1:] + [0.0] * pad)
    return DraftTree(torch.tensor(tokens), torch.tensor(parents), torch.tensor(depth),
                     torch.tensor([sum(v) for v in valid]), torch.tensor(valid),
                     torch.tensor(scores, dtype=torch.float32), depths)


def rows_for(tree: DraftTree, requests: int) -> DraftTree:
    """The tree's first ``requests`` rows; requests that joined since get empty rows."""
    extra = requests - tree.num_requests
    if extra <= 0:
        return DraftTree(tree.tokens[:requests], tree.parents[:requests],
                         tree.depths[:requests], tree.num_nodes[:requests],
                         tree.valid[:requests], tree.scores[:requests], tree.max_depth)
    budget = tree.budget

    def grow(values: torch.Tensor, fill) -> torch.Tensor:
        return torch.cat([values, torch.full((extra, budget), fill, dtype=values.dtype)])

    return DraftTree(grow(tree.tokens, 0), grow(tree.parents, 0), grow(tree.depths, 1),
                     torch.cat([tree.num_nodes, torch.zeros(extra, dtype=torch.int64)]),
                     grow(tree.valid, False), grow(tree.scores, 0.0), tree.max_depth)


def accepted_paths(rng: random.Random, verified: DraftTree, truth: float) -> list[int]:
    """Path lengths (root included): from the root, each step takes a verified child with
    probability ``truth`` times its drafted conditional probability, or stops."""
    lengths = []
    for row in range(verified.num_requests):
        parents = verified.parents[row].tolist()
        valid = verified.valid[row].tolist()
        scores = verified.scores[row].tolist()
        node, node_score, length = 0, 0.0, 1
        while True:
            draw, total, nxt = rng.random(), 0.0, None
            for j, (parent, ok) in enumerate(zip(parents, valid)):
                if ok and parent == node:
                    total += truth * math.exp(scores[j] - node_score)
                    if draw < total:
                        nxt = j
                        break
            if nxt is None:
                break
            node, node_score, length = nxt + 1, scores[nxt], length + 1
        lengths.append(length)
    return lengths


def digest(tree: DraftTree) -> str:
    data = tree.tokens.numpy().tobytes() + tree.parents.numpy().tobytes()
    return hashlib.sha1(data).hexdigest()[:8]


def rounded(value: float) -> float:
    return float(f"{value:.6g}")


# ------------------------------------------------------------------------------ run
def run(spec: Run, on_policy: Callable[[AdaptiveVerification], None] | None = None) -> list[dict]:
    """Every step's record (see the module docstring) of one run from a fresh policy."""
    rng = random.Random(spec.seed)
    auto = AutoWidth(budget=spec.budget, num_depths=spec.depths, **spec.width)
    policy = AdaptiveVerification(spec.depths, torch.device("cpu"), auto_width=auto, **spec.policy)
    if on_policy is not None:
        on_policy(policy)
    records = []
    previous = None  # (requests, rows, nodes, ms) of the last step, timed at the next
    proposal = None  # (tree, counts) of the last step's choice
    paused = 0  # steps since the last drafted step: context the next one writes
    last_requests = 0
    index = 0
    for phase in spec.phases:
        for i in range(phase.steps):
            index += 1
            requests = phase.batch(i)
            record: dict = {"R": requests}
            num_drafts = None if proposal is None else (
                proposal[1][:requests] + [0] * max(0, requests - len(proposal[1])))
            nodes = sum(num_drafts or [])
            rows = requests + nodes + PREFILL_ROWS * max(0, requests - last_requests)
            last_requests = requests
            if previous is not None:
                record["k"] = policy.observe_step(*previous)
            policy.observe_scheduled(num_drafts or [])
            record["w"] = auto.width
            if nodes:
                verified = truncate(rows_for(proposal[0], requests), torch.tensor(num_drafts))
                lengths = accepted_paths(rng, verified, phase.truth)
                policy.observe_acceptance(verified, torch.tensor(lengths))
            drafted = policy.should_draft(requests)
            record["d"] = drafted
            noise = uniform(rng, 0.96, 1.04)
            costs = phase.costs(i)
            if drafted:
                tree = random_tree(rng, requests, spec.budget, spec.depths, phase.sharpness)
                choice = policy.choose(tree)
                record.update(c=choice.counts, e=rounded(choice.expected_tokens),
                              t=rounded(choice.predicted_ms), g=rounded(policy.gain_scale),
                              o=digest(choice.tree))
                written = 0.3 * min(paused, 64)
                draft_ms = costs.drafting(requests) * noise + written
                policy.record_drafting(True, draft_ms, set_aside_ms=written)
                proposal, paused = (choice.tree, choice.counts), 0
            else:
                draft_ms = costs.context * noise
                policy.record_drafting(False, draft_ms)
                proposal, paused = None, paused + 1
            ms = costs.target(requests, rows, nodes) * noise + draft_ms
            if index % IDLE_EVERY == 0:
                ms += 5000.0  # the engine waited for a request before this step
            previous = (requests, rows, nodes, ms)
            if index % REPORT_EVERY == 0:
                calibration, cost = policy.calibration, policy.cost
                record["r"] = [rounded(calibration.error()), rounded(calibration.raw_error()),
                               cost.describe(), cost.observed, cost.tree_steps]
            records.append(record)
    return records


def replay(on_policy: Callable[[AdaptiveVerification], None] | None = None) -> dict[str, list]:
    """Every run's records, by run name."""
    return {spec.name: run(spec, on_policy) for spec in RUNS}
