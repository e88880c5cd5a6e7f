"""One DARTree step, phase by phase, as both of vLLM's model runners drive it.

=====================  =============================  ============================  =========================
phase                  V1 (``GPUModelRunner`` call)   V2 (hook)                     here
=====================  =============================  ============================  =========================
plan                   ``_prepare_inputs`` (after)    ``model_state.prepare_attn``  :meth:`TreeStep.plan`
target's KV            ``_model_forward`` (around)    ``model_state.prepare_attn``  :meth:`~TreeStep.target_forward`
                                                                                    / :meth:`~TreeStep.verify_forward`
depth positions        ``_model_forward`` (around)    ``model_state.prepare_inputs``  ``target_forward`` /
                                                                                    ``verify_plan.write_depth_positions``
tree attention         each attention layer           each attention layer          ``cpu_attention`` /
                                                                                    ``gpu_attention`` (``tree_context``)
accept, KV compaction  ``_sample`` (instead)          ``rejection_sampler(...)``    :meth:`~TreeStep.accept_with`
drafter context        ``drafter.propose``            ``speculator.propose``        :meth:`~TreeStep.accepted_order`
draft, tree build      ``drafter.propose``            ``speculator.propose``        ``drafting.TreeDrafting``
hand the trees over    ``drafter.propose``            ``speculator.propose``        :meth:`TreeStep.hand_over`
=====================  =============================  ============================  =========================

Data flows one way around the loop: proposal -> plan -> accepted paths -> drafter context
-> proposal. Each piece of state is consumed by the phase that reads it, and :meth:`plan`
(the first phase of every step) drops anything an earlier step left behind, so nothing can
outlive the step it belongs to (vLLM skips ``propose`` for a whole batch near
``max_model_len``). Each runner's glue (``v1/runner.py``; ``v2/model_state.py``,
``v2/sampler.py``, ``v2/speculator.py``) translates vLLM's objects into the plain arguments
used here; this module imports no vLLM.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

from vllm_dartree.step import tree_context
from vllm_dartree.step.profile import StepProfile
from vllm_dartree.step.verifier import TreeVerifier
from vllm_dartree.step.verify_plan import (
    AcceptedPaths,
    Proposal,
    VerifyPlan,
    accepted_row_order,
    build_plan,
    depth_position_values,
)
from vllm_dartree.tree import DraftTree
from vllm_dartree.tree.adaptive import AdaptiveVerification

MoveKv = Callable[[AcceptedPaths, Any], None]  # kv_mover.KvMover in an engine
# The engine's TreeStep, as an attribute of the vLLM object that carries it to the target
# side (V1: the model runner; V2: the target model, read by the model state).
STEP_ATTR = "dartree_step"


class TreeStep:
    """The per-engine state of the tree step in progress (one per model runner).

    ``move_kv(accepted, kv_caches)`` moves each accepted path's KV to consecutive slots in
    every target layer of ``kv_caches`` (what :meth:`target_forward` was given), in each
    layer's page layout. ``policy`` (adaptive verification, or None) is told each
    step's wall time (from one plan to the next) and each verified step's acceptance.
    """

    def __init__(self, budget: int, device: torch.device, verifier: TreeVerifier,
                 move_kv: MoveKv, policy: AdaptiveVerification | None = None) -> None:
        self.budget = budget
        self.device = device
        self.verifier = verifier
        self.move_kv = move_kv
        self.policy = policy
        self._last_plan: tuple[float, int, int, int] | None = None  # time, shape of the step
        self._proposed_in: int | None = None  # step of the proposal this step verifies
        self.step_index = 0  # steps planned so far
        self._proposal: Proposal | None = None  # trees for the next step's verify
        self._plan: VerifyPlan | None = None  # this step's verify layout
        self._kv_caches: Any = None  # the target layers' KV of this step's forward
        self._accepted: AcceptedPaths | None = None  # this step's paths, for the context
        self._forward_end: float | None = None  # profile clock at the forward's end (V1)
        self._forward_start: float | None = None  # profile clock at the forward's start (V2)
        # This step's requests (batch order) whose drafts are chains of their own.
        self.chain_rows: list[bool] = []

    # ---- phase 1: plan (after vLLM laid the step's tokens out) --------------------------
    def plan(self, req_ids: list[str], num_drafts: list[int] | None,
             num_scheduled: np.ndarray, chain_drafts: dict[str, list[int]],
             verify_as_chain: bool, chain_rows: list[bool] | None = None
             ) -> VerifyPlan | None:
        """Lay out this step's tree verification; None when vLLM verifies it (no drafts, or
        ``verify_as_chain``: every request's draft is a chain vLLM verifies itself). A step
        without drafts has no plan, so its forward and attention run as in plain decoding
        (adaptive verification's paused steps). ``chain_rows[i]``: request ``req_ids[i]``
        verifies as a chain (``verify_plan.verifies_as_chain``; on V1
        ``verifies_as_chain_on_v1``), its drafts this step's and the next proposal's
        (:attr:`chain_rows`)."""
        StepProfile.new_round(self.device)
        self.chain_rows = list(chain_rows or [False] * len(req_ids))
        self._time_previous_step(len(req_ids), int(np.sum(num_scheduled[: len(req_ids)])),
                                 0 if num_drafts is None else int(sum(num_drafts)))
        self.step_index += 1
        proposal, self._proposal = self._proposal, None
        self._plan = self._kv_caches = self._accepted = None
        if self.policy is not None:  # no drafts scheduled: none were given
            self.policy.observe_scheduled(num_drafts or [])
        if num_drafts is None or verify_as_chain or not any(num_drafts):
            return None  # vLLM verifies it (a step without drafts: plain decoding)
        if proposal is not None and proposal.step_index != self.step_index - 1:
            proposal = None  # proposed for a step that was never verified
        self._proposed_in = None if proposal is None else proposal.step_index
        self._plan = build_plan(self.step_index, req_ids[: len(num_drafts)], num_drafts,
                                num_scheduled, proposal, chain_drafts, self.budget,
                                self.device, chain_rows)
        return self._plan

    def _time_previous_step(self, requests: int, rows: int, nodes: int) -> None:
        """Tell the adaptive policy what the previous step cost (requests, rows, tree nodes
        among them, ms)."""
        if self.policy is None:
            return
        now = time.perf_counter()
        if self._last_plan is not None:
            started, *shape = self._last_plan
            self.policy.observe_step(*shape, (now - started) * 1e3)
        self._last_plan = (now, requests, rows, nodes)

    def has_plan(self) -> bool:
        """This step verifies trees (its plan awaits acceptance)."""
        return self._plan is not None

    # ---- phase 2: the target forward ----------------------------------------------------
    @contextmanager
    def target_forward(self, positions: torch.Tensor | None, kv_caches: Callable[[], Any]
                       ) -> Iterator[VerifyPlan | None]:
        """Around the target's forward: depth positions written into vLLM's positions buffer
        (in place: CUDA-graph replays read it; restored afterwards, before the drafter and
        sampler read it) and the plan published to the attention backends. ``kv_caches()``
        (the target layers' KV, for compaction) is asked only when there is a plan."""
        plan = self._plan
        if plan is None or positions is None:
            yield None
            return
        self._kv_caches = kv_caches()
        sequential = positions[plan.node_rows].clone()
        positions[plan.node_rows] = depth_position_values(plan, positions)
        try:
            with tree_context.tree_verify(plan), StepProfile.phase("target_forward",
                                                                   self.device):
                yield plan
        finally:
            positions[plan.node_rows] = sequential
            self._forward_end = StepProfile.stamp(self.device)  # the target's logits follow

    def forward_begins(self) -> None:
        """V2: the target forward of this step's plan starts now (the profile's
        ``target_forward`` then spans the forward and the target's logits: V2's runner
        computes them before its sampler, with no hook between)."""
        if self._plan is not None:
            self._forward_start = StepProfile.stamp(self.device)

    def verify_forward(self, kv_caches: Callable[[], Any]) -> VerifyPlan | None:
        """V2: the target forward about to run verifies this step's plan (None: it runs as
        vLLM plans it); ``kv_caches()`` (its target layers' KV, for compaction) is asked only
        when there is a plan. Depth positions and the plan's hand-over to the attention
        backends are the V2 model state's (it owns the positions buffer its forward reads)."""
        if self._plan is not None:
            self._kv_caches = kv_caches()
        return self._plan

    # ---- phase 3: accept and compact, in place of vLLM's sampler ------------------------
    def accept_with(self, choose: Callable[[VerifyPlan], torch.Tensor], columns: int
                    ) -> tuple[torch.Tensor, AcceptedPaths] | None:
        """(sampled token ids [R, columns], accepted paths) of a tree step, ``choose(plan)``
        being the target's token at every logits row (V1: ``verifier.target_choice``; V2:
        vLLM's sampler); None without a plan."""
        plan, self._plan = self._plan, None
        kv_caches, self._kv_caches = self._kv_caches, None
        if plan is None:
            return None
        if self._forward_start is not None:  # V2: forward and logits in one span
            StepProfile.since("target_forward", self._forward_start, self.device)
        else:
            StepProfile.since("target_logits", self._forward_end, self.device)
        self._forward_end = self._forward_start = None
        with StepProfile.phase("accept", self.device):
            choice = choose(plan)
        sampled, self._accepted = self.verifier.accept(
            plan, choice, columns, lambda paths: self.move_kv(paths, kv_caches))
        if self.policy is not None and plan.step_index - 1 == self._proposed_in:
            self.policy.observe_acceptance(plan.tree, self._accepted.num_accepted)
        return sampled, self._accepted

    # ---- phase 4: the drafter's next context --------------------------------------------
    def accepted_order(self, num_rows: int) -> torch.Tensor | None:
        """The permutation of the step's ``num_rows`` token rows that puts each accepted
        path first (``verify_plan.accepted_row_order``); None after a step without a tree.
        Consumed: the drafter's context is built once per step."""
        accepted, self._accepted = self._accepted, None
        return None if accepted is None else accepted_row_order(accepted, num_rows)

    def hand_over(self, req_ids: list[str], tree: DraftTree, chains: bool = False) -> None:
        """The drafter's trees (row r for ``req_ids[r]``; ``chains``: all of them chains),
        verified by the next step."""
        self._proposal = Proposal(self.step_index, {r: i for i, r in enumerate(req_ids)}, tree,
                                  chains)
