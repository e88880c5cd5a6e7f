"""A reduced draft vocabulary (models/draft_vocab.py): which ids are kept, the head's weights
in vLLM's format, and the SmolLM2 drafter built from its training sources."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from vllm_dartree.checkpoint import DrafterLayout
from vllm_dartree.models.draft_vocab import (
    MARKER,
    coverage,
    kept_token_ids,
    reduced_weights,
    token_counts,
    write_reduced_drafter,
)
from vllm_dartree.models.tiny import DrafterSpec, write_drafter


class CharTokenizer:
    """``encode_batch`` like ``tokenizers``: one id per character, 'a' = 0."""

    class Encoding:
        def __init__(self, ids):
            self.ids = ids

    def encode_batch(self, texts):
        return [self.Encoding([ord(c) - ord("a") for c in t]) for t in texts]


def test_counts_add_up_over_batches():
    counts = token_counts(["abca", "cc", "d"], CharTokenizer(), vocab_size=6, batch=2)
    assert counts.tolist() == [2, 1, 3, 1, 0, 0]


def test_the_most_frequent_ids_are_kept_with_the_always_kept_ones():
    counts = torch.tensor([5, 0, 9, 9, 1, 7])
    assert kept_token_ids(counts, 3).tolist() == [2, 3, 5]  # ascending ids
    assert kept_token_ids(counts, 3, always=[1]).tolist() == [1, 2, 3]  # 9, 9 beat 7
    assert kept_token_ids(counts, 2).tolist() == [2, 3]
    assert coverage(counts, torch.tensor([2, 3])) == pytest.approx(18 / 31)
    with pytest.raises(ValueError, match="size=7"):
        kept_token_ids(counts, 7)
    with pytest.raises(ValueError, match="always-kept"):
        kept_token_ids(counts, 1, always=[0, 1])


def test_the_reduced_head_maps_draft_ids_back_to_target_ids():
    lm_head = torch.randn(6, 4)
    kept = torch.tensor([1, 2, 5])
    weights = reduced_weights(lm_head, kept)
    assert torch.equal(weights["lm_head.weight"], lm_head[kept])
    draft_ids = torch.arange(3)
    assert (draft_ids + weights["d2t"]).tolist() == [1, 2, 5]  # vLLM: target = i + d2t[i]


def test_a_written_drafter_declares_its_vocabulary(tmp_path):
    drafter = write_drafter(DrafterSpec(domino=True))
    config = json.loads((drafter / "config.json").read_text())
    vocab, hidden = config["vocab_size"], config["hidden_size"]
    lm_head = torch.randn(vocab, hidden)
    kept = torch.arange(0, vocab, 3)
    out = write_reduced_drafter(drafter, lm_head, kept, tmp_path / "reduced", {"note": "t"})
    layout = DrafterLayout.from_config(json.loads((out / "config.json").read_text()))
    assert layout.output_vocab_size == kept.numel() and layout.has_reduced_vocab
    weights = load_file(str(out / "model.safetensors"))
    original = load_file(str(drafter / "model.safetensors"))
    assert all(torch.equal(weights[k], v) for k, v in original.items())
    assert torch.equal(weights["lm_head.weight"], lm_head[kept])
    assert json.loads((out / MARKER).read_text())["note"] == "t"
    with pytest.raises(ValueError, match="already has its own lm_head"):
        write_reduced_drafter(out, lm_head, kept, tmp_path / "twice", {})


@pytest.mark.e2e
def test_the_smollm2_drafter_keeps_its_training_tokens_and_end_of_turn():
    from vllm_dartree.models.draft_vocab import DEFAULT_SIZE, ensure_reduced_smollm2_drafter

    out = ensure_reduced_smollm2_drafter()
    assert ensure_reduced_smollm2_drafter() == out  # the marker short-circuits
    marker = json.loads((out / MARKER).read_text())
    assert marker["training_coverage"] > 0.98  # 16384 of 49152 ids: 99.2% measured
    assert json.loads((out / "config.json").read_text())["draft_vocab_size"] == DEFAULT_SIZE
    kept = torch.arange(DEFAULT_SIZE) + load_file(str(out / "model.safetensors"))["d2t"]
    assert {0, 1, 2} <= set(kept.tolist())  # <|endoftext|>, <|im_start|>, <|im_end|>
