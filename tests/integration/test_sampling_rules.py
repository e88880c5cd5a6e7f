"""The tree verifier samples with vLLM's own filtering rules: top-k / top-p masks equal
vLLM's ``apply_top_k_top_p`` (what its sampler applies without speculation)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from vllm_dartree.tree import GREEDY_TEMPERATURE, choose_tokens, filter_top_k_top_p


@pytest.mark.parametrize("seed", range(5))
def test_top_k_top_p_masks_equal_vllms(seed):
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p

    gen = torch.Generator().manual_seed(seed)
    rows, vocab = 12, 300
    logits = torch.randn(rows, vocab, generator=gen) * 3
    logits[::3, 5:9] = logits[::3, 4:5]  # ties at the cut
    top_k = torch.randint(1, vocab + 1, (rows,), generator=gen)
    top_k[0] = vocab  # "no top-k"
    top_p = torch.rand(rows, generator=gen) * 0.9 + 0.05
    top_p[1] = 1.0
    for k, p in ((top_k, top_p), (top_k, None), (None, top_p)):
        ours = filter_top_k_top_p(logits.clone(), k, p)
        theirs = apply_top_k_top_p(logits.clone(), None if k is None else k.clone(),
                                   None if p is None else p.clone())
        assert torch.equal(torch.isinf(ours), torch.isinf(theirs))
        assert torch.equal(ours[~torch.isinf(ours)], theirs[~torch.isinf(theirs)])


def test_greedy_rows_take_the_argmax_below_vllms_threshold():
    logits = torch.tensor([[0.0, 2.0, 1.0]] * 3)
    temperature = torch.tensor([0.0, GREEDY_TEMPERATURE / 2, 1e6])
    chosen = choose_tokens(logits, temperature)
    assert chosen[:2].tolist() == [1, 1]


def test_chain_rows_get_logit_bias_and_min_p_as_vllms_processors_apply_them():
    """V1's chain draft rows (``v1/sampling.py``): each row gets its request's bias and
    min p exactly as vLLM's processors give a request's one row without speculation."""
    from vllm.v1.sample.logits_processor.builtin import MinPLogitsProcessor

    from vllm_dartree.integration.v1.sampling import (
        add_logit_bias,
        mask_below_min_p,
        row_requests,
    )

    gen = torch.Generator().manual_seed(0)
    num_draft_tokens = [3, 0, 2, 4]
    rows = torch.from_numpy(row_requests(num_draft_tokens))
    assert rows.tolist() == [0, 0, 0, 2, 2, 3, 3, 3, 3]
    logits = torch.randn(rows.numel(), 50, generator=gen) * 2
    biases = {0: {3: 5.0, 7: -2.5}, 1: {1: 9.0}, 3: {49: 0.75}}
    biased = logits.clone()
    add_logit_bias(biased, biases, num_draft_tokens)
    expected = logits.clone()
    for row, req in enumerate(rows.tolist()):
        for token, value in biases.get(req, {}).items():
            expected[row, token] += value
    assert torch.equal(biased, expected)

    min_p = torch.tensor([0.0, 0.3, 0.05, 0.6])
    temperature = torch.tensor([0.7, 1.0, 0.0, 1.3])
    ours = logits.clone()
    mask_below_min_p(ours, min_p[rows], temperature[rows])
    processor = MinPLogitsProcessor.__new__(MinPLogitsProcessor)
    processor.min_p_count, processor.min_p = 3, min_p[rows].unsqueeze(1)
    greedy_as_one = torch.where(temperature < GREEDY_TEMPERATURE, 1.0, temperature)
    tempered = logits / greedy_as_one[rows].unsqueeze(1)
    theirs = processor.apply(tempered.clone())
    assert torch.equal(torch.isinf(ours), torch.isinf(theirs))
    assert torch.isinf(ours).any() and not torch.isinf(ours[rows == 0]).any()


def test_tree_rows_get_penalties_along_their_paths():
    """V1's tree rows (``v1/sampling.add_penalties_on_paths``): row i counts its request's
    output plus its own path; the result equals vLLM's penalties of the row alone with the
    path appended to its output (what target-only decoding applies after that path)."""
    from vllm.model_executor.layers.utils import apply_penalties

    from vllm_dartree.integration.v1.sampling import add_penalties_on_paths

    gen = torch.Generator().manual_seed(4)
    vocab = 50
    outputs = [[3, 3, 8], [1], [20, 21, 22, 3]]
    prompts = torch.tensor([[5, 6, vocab], [7, vocab, vocab], [3, 4, 5]])
    meta = SimpleNamespace(
        output_token_ids=outputs, prompt_token_ids=prompts,
        presence_penalties=torch.tensor([0.5, 0.0, 1.0]),
        frequency_penalties=torch.tensor([0.3, 0.0, 0.0]),
        repetition_penalties=torch.tensor([1.3, 1.0, 0.7]))
    request = torch.tensor([0, 0, 0, 1, 2, 2])  # rows per request: 3, 1, 2
    row_paths = [[], [8], [8, 11], [], [], [9]]
    paths = torch.full((6, 2), vocab)
    for row, path in enumerate(row_paths):
        paths[row, : len(path)] = torch.tensor(path, dtype=torch.int64)
    logits = torch.randn(6, vocab, generator=gen) * 3
    found = logits.clone()
    add_penalties_on_paths(found, meta, request, paths)
    for row, r in enumerate(request.tolist()):
        tokens = outputs[r] + row_paths[row]
        expected = apply_penalties(
            logits[row : row + 1].clone(), prompts[r : r + 1],
            torch.tensor([tokens]), meta.presence_penalties[r : r + 1],
            meta.frequency_penalties[r : r + 1], meta.repetition_penalties[r : r + 1])
        torch.testing.assert_close(found[row], expected[0])
    assert not torch.allclose(found[2], apply_penalties(
        logits[2:3].clone(), prompts[:1], torch.tensor([outputs[0]]),
        meta.presence_penalties[:1], meta.frequency_penalties[:1],
        meta.repetition_penalties[:1])[0])  # the path changes the row


def test_stop_tokens_are_masked_by_each_rows_depth_until_min_tokens():
    """V1's tree rows (``v1/sampling.mask_stop_before_min_tokens``): a request with 3 tokens
    out of min_tokens 5 has its stop tokens masked at depths 0 and 1 (3 or 4 tokens out),
    not at depth 2; a request not short of min_tokens is left alone."""
    from vllm_dartree.integration.v1.sampling import mask_stop_before_min_tokens

    logits = torch.zeros(6, 12)
    short = {0: (5, [1, 2, 3], {7, 9}, False)}
    mask_stop_before_min_tokens(logits, short, [4, 2], torch.tensor([0, 1, 2, 3, 0, 1]))
    masked = torch.isinf(logits)
    assert masked[:2, [7, 9]].all() and not masked[2:].any()
    assert masked.sum() == 4
