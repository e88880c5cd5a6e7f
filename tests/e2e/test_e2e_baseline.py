"""Real vLLM on the tiny models: target-only decoding and the in-tree DFlash method."""

from __future__ import annotations

import pytest

from vllm_dartree.harness.engine import generate_ids, spec_decode_counters
from vllm_dartree.models.tiny import TargetSpec, random_prompts

pytestmark = pytest.mark.e2e

PROMPTS = random_prompts(6, TargetSpec().vocab_size, seed=11)


def greedy(max_tokens: int = 32):
    from vllm import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


@pytest.fixture(scope="module")
def target_only_output(engines, tiny_target):
    return generate_ids(engines.get(model=str(tiny_target)), PROMPTS, greedy())


def test_target_only_generates_varied_tokens(target_only_output):
    assert [len(out) for out in target_only_output] == [32] * len(PROMPTS)
    # The fixture models are built so greedy output is not one repeated token.
    assert all(len(set(out)) >= 8 for out in target_only_output)
    assert len({tuple(out) for out in target_only_output}) == len(PROMPTS)


def test_target_only_matches_transformers(target_only_output, tiny_target):
    """vLLM reads the fixture checkpoint exactly as transformers does."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_target), dtype=torch.float32)
    for prompt, expected in zip(PROMPTS[:2], target_only_output[:2]):
        out = model.generate(
            torch.tensor([prompt]), max_new_tokens=32, do_sample=False, eos_token_id=None,
            pad_token_id=0,
        )
        assert out[0, len(prompt):].tolist() == expected


def test_dflash_in_tree_is_lossless(engines, tiny_target, tiny_dflash, target_only_output):
    llm = engines.get(
        model=str(tiny_target),
        speculative_config={"method": "dflash", "model": str(tiny_dflash),
                            "num_speculative_tokens": 15},
    )
    assert generate_ids(llm, PROMPTS, greedy()) == target_only_output
    counters = spec_decode_counters(llm)
    assert counters["num_drafts"] > 0
    assert counters["num_draft_tokens"] == 15 * counters["num_drafts"]
