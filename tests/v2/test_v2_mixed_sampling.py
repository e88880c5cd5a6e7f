"""The mixed-sampling batch (``tests/e2e/test_mixed_sampling_e2e.py``) on vLLM's V2 runner:
vLLM's CPU attention and the CUDA path, seeded requests token for token, logprobs from each
sampled token's node; structured outputs beside trees."""

from test_mixed_sampling_e2e import (  # noqa: F401 - collected here, on the V2 runner
    target_only,
    test_mixed_batch_matches_target_only_request_by_request,
    test_structured_outputs_beside_trees_match_target_only,
)
