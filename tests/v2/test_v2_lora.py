"""The LoRA case (``tests/e2e/test_lora_e2e.py``) on vLLM's V2 runner: two adapters and base
requests in one batch, every tree variant equal to target-only with the same adapters. On
vLLM 0.32/0.33 the lm_head's LoRA ids follow the logits rows (``integration/lora.py``: V2's
own mapping there has one per request, and any speculative step fails in
``compute_logits``)."""

from test_lora_e2e import (  # noqa: F401 - collected here, on the V2 runner
    baseline,
    test_lora_adapters_match_target_only,
)
