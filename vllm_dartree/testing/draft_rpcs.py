"""Count the engine core's requests to the worker for the next drafts.

``executor.take_draft_token_ids`` is the call ``integration/draft_handoff.py`` makes
unnecessary; a test wraps an in-process engine's executor (uni or mp) while it generates.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def counting_draft_rpcs(llm) -> Iterator[list[int]]:
    """Yields a list that gains an entry per ``take_draft_token_ids`` call in the block."""
    executor = llm.llm_engine.model_executor
    calls: list[int] = []
    original = executor.take_draft_token_ids

    def take_draft_token_ids():
        calls.append(1)
        return original()

    executor.take_draft_token_ids = take_draft_token_ids
    try:
        yield calls
    finally:
        del executor.take_draft_token_ids
