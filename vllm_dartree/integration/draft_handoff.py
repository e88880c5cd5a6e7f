"""The next step's drafts travel with the step's sampled tokens: one RPC per step fewer.

A speculative vLLM engine that schedules synchronously (every adaptive-verification engine, and
every engine on vLLM's CPU backend) asks the worker for the drafts in a call of its own
after each step: ``EngineCore.post_step`` calls ``executor.take_draft_token_ids()``. With
the multiprocess executor (TP > 1, and every CPU engine) that is a round trip through its
message queues, paid on every step, also where adaptive verification drafts nothing. Both
runners propose inside ``sample_tokens``, so the drafts are ready when the sampled tokens are: each runner's glue attaches them to its
synchronous ``ModelRunnerOutput`` (``v1/draft_handoff.py``, ``v2/draft_handoff.py``, with
:func:`attach_drafts`). The engine-core side is the same for both runners: the scheduler
keeps them when it reads that output (:class:`DraftsKeptByScheduler`) and ``post_step``
hands them to the scheduler as vLLM would, without the call (:class:`DraftsWithoutRpc`).
A step whose output carries no drafts (another engine in the same process, an empty step,
asynchronous scheduling) takes vLLM's path unchanged.
"""

from __future__ import annotations

import functools
from typing import Any

from vllm_dartree.integration.patching import Runner, VllmPatch
from vllm_dartree.integration.touchpoints import ALL_RELEASES

DRAFTS_ATTR = "dartree_draft_token_ids"  # on a ModelRunnerOutput: DraftTokenIds | None
PENDING_ATTR = "dartree_pending_drafts"  # on the scheduler: (DraftTokenIds | None,)
SCHEDULER = "vllm.v1.core.sched.scheduler:Scheduler"
ENGINE_CORE = "vllm.v1.engine.core:EngineCore"


def attach_drafts(output: Any, drafts: Any) -> None:
    """Put a worker's next drafts (``DraftTokenIds`` or None) on its step output."""
    setattr(output, DRAFTS_ATTR, drafts)


class DraftsKeptByScheduler(VllmPatch):
    """The scheduler keeps the drafts that came with a step's output until ``post_step``
    (engine core)."""

    target = SCHEDULER
    attribute = "update_from_output"
    releases = ALL_RELEASES
    runner = Runner.BOTH

    @classmethod
    def replacement(cls, original):
        @functools.wraps(original)
        def update_from_output(self, scheduler_output, model_runner_output):
            outputs = original(self, scheduler_output, model_runner_output)
            if DRAFTS_ATTR in getattr(model_runner_output, "__dict__", {}):
                setattr(self, PENDING_ATTR, (getattr(model_runner_output, DRAFTS_ATTR),))
            return outputs

        return update_from_output


class DraftsWithoutRpc(VllmPatch):
    """``post_step`` gives the scheduler the drafts it kept instead of asking the worker
    (engine core)."""

    target = ENGINE_CORE
    attribute = "post_step"
    releases = ALL_RELEASES
    runner = Runner.BOTH

    @classmethod
    def replacement(cls, original):
        @functools.wraps(original)
        def post_step(self, model_executed):
            pending = self.scheduler.__dict__.pop(PENDING_ATTR, None)
            if pending is None:
                return original(self, model_executed)
            (drafts,) = pending
            if drafts is not None:
                self.scheduler.update_draft_token_ids(drafts)
            return None

        return post_step


ENGINE_CORE_PATCHES = (DraftsKeptByScheduler, DraftsWithoutRpc)
