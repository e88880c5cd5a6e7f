"""V2's half of the drafts' hand-over with the sampled tokens (the engine core's half and
the why: ``integration/draft_handoff.py``).

V2's ``sample_tokens`` returns an ``AsyncOutput`` whose ``get_output()`` (the executor
calls it at once when scheduling is synchronous) returns the ``ModelRunnerOutput`` object
it wraps; a dartree runner attaches its next drafts to that object. With asynchronous
scheduling the engine never asks for drafts (they stay on the device), so nothing is
attached.
"""

from __future__ import annotations

import functools

from vllm_dartree.integration.draft_handoff import attach_drafts
from vllm_dartree.integration.patching import Runner, VllmPatch
from vllm_dartree.integration.touchpoints import ALL_RELEASES

V2_RUNNER = "vllm.v1.worker.gpu.model_runner:GPUModelRunner"


class DraftsWithAsyncOutput(VllmPatch):
    """A dartree V2 runner returns its next drafts with the sampled tokens (worker)."""

    target = V2_RUNNER
    attribute = "sample_tokens"
    releases = ALL_RELEASES
    runner = Runner.V2

    @classmethod
    def replacement(cls, original):
        from vllm_dartree.step.drafting import TreeDrafting

        @functools.wraps(original)
        def sample_tokens(self, grammar_output):
            output = original(self, grammar_output)
            runner_output = getattr(output, "model_runner_output", None)
            if (isinstance(getattr(self, "speculator", None), TreeDrafting)
                    and not self.vllm_config.scheduler_config.async_scheduling
                    and runner_output is not None and runner_output.req_ids):
                attach_drafts(runner_output, self.take_draft_token_ids())
            return output

        return sample_tokens
