"""Context held while adaptive verification pauses drafting, on V2: the V1 suite's test, run
here on V2 engines (DARTreeSpeculator holds what vLLM's DFlash would have written)."""

from test_pending_context import (  # noqa: F401 - collected and run on V2 engines
    test_held_context_is_written_as_each_step_would_have,
)
