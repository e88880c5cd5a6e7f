"""Adaptive verification's per-request draft counts, to vLLM's scheduler (V2).

V2's runner tells the scheduler its drafts through ``DraftTokensHandler``: the drafts' width
(B for every request) as ``[-1] * B`` placeholders, or the tokens themselves with structured
output. The scheduler schedules as many drafts as a request's list holds, and the runner
verifies exactly those rows. A dartree speculator with adaptive verification puts each
request's chosen count on the step's input batch (``COUNTS_ATTR``); these two declared
patches cut each request's list to it, so rows not chosen are never scheduled or computed,
and a paused step's requests get none (plain decoding). A batch without counts (any other
engine, a fixed budget) is handed over unchanged.
"""

from __future__ import annotations

import functools

from vllm_dartree.integration.patching import Runner, VllmPatch
from vllm_dartree.integration.touchpoints import ALL_RELEASES

COUNTS_ATTR = "dartree_draft_counts"  # on a V2 InputBatch: [num_reqs] counts, batch order
HANDLER = "vllm.v1.worker.gpu.spec_decode.utils:DraftTokensHandler"


class DraftCountsKept(VllmPatch):
    """``set_draft_tokens``: remember the step's counts by request id (None: no counts)."""

    target = HANDLER
    attribute = "set_draft_tokens"
    releases = ALL_RELEASES
    runner = Runner.V2

    @classmethod
    def replacement(cls, original):
        @functools.wraps(original)
        def set_draft_tokens(self, input_batch, draft_tokens):
            original(self, input_batch, draft_tokens)
            counts = getattr(input_batch, COUNTS_ATTR, None)
            self.dartree_counts = (None if counts is None
                                   else dict(zip(input_batch.req_ids, counts)))

        return set_draft_tokens


class DraftCountsHandedOver(VllmPatch):
    """``get_draft_tokens``: each request's drafts cut to its count."""

    target = HANDLER
    attribute = "get_draft_tokens"
    releases = ALL_RELEASES
    runner = Runner.V2

    @classmethod
    def replacement(cls, original):
        @functools.wraps(original)
        def get_draft_tokens(self):
            drafts = original(self)
            counts = getattr(self, "dartree_counts", None)
            if drafts is None or counts is None:
                return drafts
            drafts.draft_token_ids = [
                list(tokens[: counts.get(req_id, len(tokens))])
                for req_id, tokens in zip(drafts.req_ids, drafts.draft_token_ids)]
            return drafts

        return get_draft_tokens


DRAFT_COUNT_PATCHES = (DraftCountsKept, DraftCountsHandedOver)
