"""Adaptive verification: how many drafted nodes the target verifies next step, and whose.

A fixed tree suits one load only: where the target's rows are nearly free (a GPU at low
concurrency) big trees pay; where every row costs real compute (a busy GPU, any CPU) the
best tree is small or none. :class:`AdaptiveVerification` picks, every step, the number of nodes
n across the whole batch that maximises expected emitted tokens per millisecond, and
whether to draft at all:

    p_u = min over u and its ancestors a of  min(1, c[d(a)] * exp(s_a))   acceptance.py
    E(n) = R + P_n           P_n: sum of the n largest p_u over the batch  selection.py
    T(n) = t_step + t_req * R + t_row * (R + n) + t_tree * [n > 0] + D(R)  cost.py
    n*   = argmax_{0 <= n <= R * B} E(n) / T(n)                            selection.py
    keep drafting iff smoothed (R + g * (E(n*) - R)) / T(n*)
                      >= REQUIRED_GAIN * R / T(0, no drafting)            pause.py

The units, each with its rule in its docstring:

- ``acceptance``: node acceptance p, the per-depth calibration c, the delivered/promised
  ratio g;
- ``selection``: priority order (any prefix of a request's columns is a subtree), n* and
  its split over the requests;
- ``cost``: the online step-time model T;
- ``width``: the pruned tree's width with the load (``width: "auto"``);
- ``rates``: measured tokens per ms of drafted and plain steps per batch size (the veto);
- ``pause``: the pause/probe policy, a state machine (PROBING, DRAFTING, PAUSED,
  SAMPLING_PLAIN) with transitions named after their rules;
- ``outlook``: what recent trees would deliver at another batch size (the pause policy's
  tests);
- ``policy``: :class:`AdaptiveVerification`, their composition, and the count rules that keep
  the cost model told (the start-up cycle, the periodic count excursions, the floor).

"Probe" means one thing here: the single drafted step that ends a pause (PROBING); a
pause's plain steps that measure plain decoding are "plain sampling".

Pure torch and numpy, no vLLM import; :meth:`AdaptiveVerification.choose` reads its choice back to
the host once per step (vLLM's scheduler takes the draft counts as host lists anyway).
"""

from vllm_dartree.tree.adaptive.acceptance import (
    DeliveryRatio,
    DepthCalibration,
    depth_leaders,
    node_acceptance,
    with_confidence,
)
from vllm_dartree.tree.adaptive.cost import LinearCost, StepCostModel, nonnegative_least_squares
from vllm_dartree.tree.adaptive.outlook import TreeOutlook
from vllm_dartree.tree.adaptive.pause import (
    PLAIN_SAMPLE_STEPS,
    REQUIRED_GAIN,
    DraftingState,
    PausePolicy,
)
from vllm_dartree.tree.adaptive.policy import AdaptiveVerification, VerifyChoice
from vllm_dartree.tree.adaptive.rates import MeasuredRates
from vllm_dartree.tree.adaptive.selection import best_node_count, counts_of_top, priority_order
from vllm_dartree.tree.adaptive.width import AutoWidth

__all__ = [
    "PLAIN_SAMPLE_STEPS",
    "REQUIRED_GAIN",
    "AdaptiveVerification",
    "AutoWidth",
    "VerifyChoice",
    "DeliveryRatio",
    "DepthCalibration",
    "DraftingState",
    "LinearCost",
    "MeasuredRates",
    "PausePolicy",
    "StepCostModel",
    "TreeOutlook",
    "best_node_count",
    "counts_of_top",
    "depth_leaders",
    "node_acceptance",
    "nonnegative_least_squares",
    "priority_order",
    "with_confidence",
]
