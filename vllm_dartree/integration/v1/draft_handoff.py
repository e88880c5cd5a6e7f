"""The next step's drafts travel with the step's sampled tokens: one RPC per step fewer.

A speculative vLLM engine that schedules synchronously (every adaptive-budget engine, and
every engine on vLLM's CPU backend) asks the worker for the drafts in a call of its own
after each step: ``EngineCore.post_step`` calls ``executor.take_draft_token_ids()``, a
round trip through the multiprocess executor's message queues. On the 2-core CPU server it
took 0.8 ms per step (mean of 2000 steps, MT-Bench at 2 clients: about 1.3% of a step),
and it is paid on every step, also where the adaptive budget drafts nothing. The drafts
are ready when the worker returns the sampled tokens (the proposer runs inside
``sample_tokens``), so a dartree runner attaches them to its ``ModelRunnerOutput``
(:class:`DraftsWithOutput`), the scheduler keeps them when it reads that output
(:class:`DraftsKeptByScheduler`) and ``post_step`` hands them to the scheduler as vLLM
would, without the call (:class:`DraftsWithoutRpc`). A step whose output carries no
drafts (another engine in the same process, an empty step, asynchronous scheduling) takes
vLLM's path unchanged.
"""

from __future__ import annotations

import functools

from vllm_dartree.integration.patching import VllmPatch
from vllm_dartree.integration.v1.runner import RUNNER, tree_step_of

DRAFTS_ATTR = "dartree_draft_token_ids"  # on a ModelRunnerOutput: DraftTokenIds | None
PENDING_ATTR = "dartree_pending_drafts"  # on the scheduler: (DraftTokenIds | None,)
SCHEDULER = "vllm.v1.core.sched.scheduler:Scheduler"
ENGINE_CORE = "vllm.v1.engine.core:EngineCore"


class DraftsWithOutput(VllmPatch):
    """A dartree runner returns its next drafts with the sampled tokens (worker)."""

    target = RUNNER
    attribute = "sample_tokens"

    @classmethod
    def replacement(cls, original):
        from vllm.v1.outputs import ModelRunnerOutput

        @functools.wraps(original)
        def sample_tokens(self, grammar_output):
            output = original(self, grammar_output)
            # req_ids: vLLM's shared empty output is never written to.
            if (tree_step_of(self) is not None and type(output) is ModelRunnerOutput
                    and output.req_ids):
                setattr(output, DRAFTS_ATTR, self.take_draft_token_ids())
            return output

        return sample_tokens


class DraftsKeptByScheduler(VllmPatch):
    """The scheduler keeps the drafts that came with a step's output until ``post_step``
    (engine core)."""

    target = SCHEDULER
    attribute = "update_from_output"

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


DRAFT_HANDOFF_PATCHES = (DraftsWithOutput, DraftsKeptByScheduler, DraftsWithoutRpc)
