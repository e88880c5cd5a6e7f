"""LoRA on a dartree engine (V2 runner, vLLM's CPU attention): two adapters and base
requests in one batch, every tree variant equal to target-only decoding with the same
adapters. On vLLM 0.32/0.33 the lm_head's LoRA ids follow the logits rows
(``integration/lora.py``: V2's own mapping there has one per request, and any speculative
step fails in ``compute_logits``)."""

from __future__ import annotations

import pytest
from lora_case import ENGINE, VARIANTS, acceptance_length, check_adapters_change_tokens, generate

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def baseline(engines, pair):
    out = generate(engines.get(model=str(pair[0]), **ENGINE))
    check_adapters_change_tokens(out)
    return out


@pytest.mark.parametrize(("name", "settings"), VARIANTS, ids=[v[0] for v in VARIANTS])
def test_lora_adapters_match_target_only_on_v2(engines, pair, baseline, name, settings):
    target, drafter = pair
    llm = engines.get(model=str(target), **ENGINE, speculative_config={
        "method": "dartree", "model": str(drafter), **settings})
    assert generate(llm) == baseline
    assert acceptance_length(llm) > 1.5
