"""LoRA on a dartree engine (V1 runner): two adapters and base requests in one batch, every
tree variant equal to target-only decoding with the same adapters. The drafter reads the
target's base embedding (``integration/lora.py``); each tree row is verified with its
request's adapter."""

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
def test_lora_adapters_match_target_only(engines, pair, baseline, name, settings):
    target, drafter = pair
    llm = engines.get(model=str(target), **ENGINE, speculative_config={
        "method": "dartree", "model": str(drafter), **settings})
    assert generate(llm) == baseline
    assert acceptance_length(llm) > 1.5
