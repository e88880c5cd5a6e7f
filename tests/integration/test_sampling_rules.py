"""The tree verifier samples with vLLM's own filtering rules: top-k / top-p masks equal
vLLM's ``apply_top_k_top_p`` (what its sampler applies without speculation)."""

from __future__ import annotations

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
