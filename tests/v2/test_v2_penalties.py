"""Penalties along tree paths (``integration/v2/penalties.py``) against a per-row reference:
each penalized logits row gets vLLM's presence, frequency and repetition penalties with its
request's output counts plus the tokens of its own path, the rows of requests without
penalties stay as they were. vLLM's penalties kernel runs in Triton's interpreter here."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch

from vllm_dartree.integration.v2.penalties import TreePaths, apply_on_paths

VOCAB = 40


def reference(logits, prompt, output_counts, path, rep, freq, pres):
    """One row as target-only decoding penalizes it after ``path``: counts of the output
    so far plus the path; repetition over prompt or output tokens (divide positive logits,
    multiply the others), then frequency and presence."""
    counts = output_counts.clone()
    for token in path:
        counts[token] += 1
    seen = prompt | (counts > 0)
    scale = torch.where(seen, torch.tensor(rep), torch.tensor(1.0))
    out = torch.where(logits > 0, logits / scale, logits * scale)
    return out - freq * counts - pres * (counts > 0).float()


def packed(mask: torch.Tensor) -> torch.Tensor:
    """A bool [V] mask as vLLM's prompt_bin_mask row (32 tokens per int32)."""
    words = torch.zeros((VOCAB + 31) // 32, dtype=torch.int64)
    for token in torch.nonzero(mask).flatten().tolist():
        words[token // 32] |= 1 << (token % 32)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def test_each_row_is_penalized_along_its_own_path():
    gen = torch.Generator().manual_seed(3)
    # Three requests in slots 4, 1, 6: 3 rows, 2 rows (no penalties), 4 rows.
    slots, rows_per_request = [4, 1, 6], [3, 2, 4]
    penalized = {4: (1.3, 0.5, 0.2), 6: (0.8, 0.0, 1.5)}  # slot -> rep, freq, pres
    rep, freq, pres = (torch.ones(8), torch.zeros(8), torch.zeros(8))
    for slot, (r, f, p) in penalized.items():
        rep[slot], freq[slot], pres[slot] = r, f, p
    prompts = torch.rand(8, VOCAB, generator=gen) < 0.2
    output_counts = (torch.rand(8, VOCAB, generator=gen) < 0.15).to(torch.int32) * 2
    state = SimpleNamespace(
        use_penalty=np.array([slot in penalized for slot in range(8)]),
        output_bin_counts=output_counts,
        prompt_bin_mask=torch.stack([packed(prompts[s]) for s in range(8)]),
        repetition_penalty=SimpleNamespace(gpu=rep), frequency_penalty=SimpleNamespace(gpu=freq),
        presence_penalty=SimpleNamespace(gpu=pres))
    expanded = torch.tensor([s for s, n in zip(slots, rows_per_request) for _ in range(n)],
                            dtype=torch.int32)
    num_rows = len(expanded)
    # Path tokens per row (padded with VOCAB): roots empty, nodes with 1-3 tokens.
    paths = torch.full((num_rows, 3), VOCAB)
    row_paths = [[], [5], [5, 9], [], [7], [], [12], [12, 12], [3, 30, 12]]
    for row, path in enumerate(row_paths):
        paths[row, : len(path)] = torch.tensor(path)
    logits = torch.randn(num_rows, VOCAB, generator=gen) * 3
    ctx = SimpleNamespace(idx_mapping_np=np.array(slots), expanded_idx_mapping=expanded,
                          input_ids=torch.zeros(num_rows, dtype=torch.int32))
    found = logits.clone()
    apply_on_paths(state, found, ctx, TreePaths(paths, np.cumsum([0, *rows_per_request])))
    for row, slot in enumerate(expanded.tolist()):
        if slot not in penalized:
            assert torch.equal(found[row], logits[row])
            continue
        want = reference(logits[row], prompts[slot], output_counts[slot], row_paths[row],
                         *penalized[slot])
        torch.testing.assert_close(found[row], want)
    # The path matters: the same row without its path is penalized differently.
    assert not torch.allclose(found[8], reference(logits[8], prompts[6], output_counts[6], [],
                                                  *penalized[6]))
