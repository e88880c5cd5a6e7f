"""V1's half of the drafts' hand-over with the sampled tokens (the engine core's half and
the why: ``integration/draft_handoff.py``): a dartree runner's synchronous
``ModelRunnerOutput`` carries its next drafts."""

from __future__ import annotations

import functools

from vllm_dartree.integration.draft_handoff import attach_drafts
from vllm_dartree.integration.v1.runner import V1RunnerPatch, tree_step_of


class DraftsWithOutput(V1RunnerPatch):
    """A dartree runner returns its next drafts with the sampled tokens (worker)."""

    attribute = "sample_tokens"

    @classmethod
    def replacement(cls, original):
        from vllm.v1.outputs import ModelRunnerOutput

        @functools.wraps(original)
        def sample_tokens(self, grammar_output):
            output = original(self, grammar_output)
            # An AsyncGPUModelRunnerOutput (async scheduling) is left alone: its engine
            # never asks for drafts. req_ids: vLLM's shared empty output is never written to.
            if (tree_step_of(self) is not None and type(output) is ModelRunnerOutput
                    and output.req_ids):
                attach_drafts(output, self.take_draft_token_ids())
            return output

        return sample_tokens
