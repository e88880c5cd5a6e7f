"""The fused, chunked training loss against its reference (materialised logits)."""

from __future__ import annotations

import pytest
import torch
from training_helpers import small_drafter

from vllm_dartree.training.loss import drafter_loss, fused_drafter_loss, slot_weights
from vllm_dartree.training.model import IGNORE_INDEX, block_labels
from vllm_dartree.training.train import check_autocast, fused_step_loss


def batch(model, seed=3):
    gen = torch.Generator().manual_seed(seed)
    n, t = 3, 40
    width = len(model.arch.target_layer_ids) * model.arch.hidden_size
    features = torch.randn(n, t, width, generator=gen)
    tokens = torch.randint(0, model.arch.vocab_size - 1, (n, t), generator=gen)
    anchors = torch.tensor([[2, 11, 30], [1, 7, 25], [5, 18, 33]])
    lengths = torch.tensor([40, 31, 36])  # labels past these are ignored
    return features, tokens, anchors, block_labels(tokens, anchors, lengths, 16)


def loss_and_grads(model, fused, lam, gamma):
    model.zero_grad()
    features, tokens, anchors, labels = batch(model)
    assert (labels == IGNORE_INDEX).any()
    if fused:
        loss, stats = fused_step_loss(model, features, tokens, anchors, labels, lam, gamma)
    else:
        loss, stats = drafter_loss(model(features, tokens, anchors), labels, lam, gamma)
    loss.backward()
    return loss.detach(), stats, {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("lam,gamma", [(0.0, 7.0), (0.3, None), (1.0, 7.0)])
def test_fused_loss_equals_reference(lam, gamma):
    model = small_drafter().train()
    ref_loss, ref_stats, ref_grads = loss_and_grads(model, False, lam, gamma)
    loss, stats, grads = loss_and_grads(model, True, lam, gamma)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-5)
    assert stats == pytest.approx(ref_stats, rel=1e-5)
    for name, grad in ref_grads.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)
    assert any(g.abs().sum() > 0 for g in grads.values())


@pytest.mark.parametrize("chunk", [1, 7, 500])
def test_chunk_size_does_not_change_the_loss(chunk):
    gen = torch.Generator().manual_seed(0)
    rows, hidden, emb, vocab = 50, 8, 4, 37
    h = torch.randn(rows, hidden, generator=gen, requires_grad=True)
    u = torch.randn(rows, emb, generator=gen, requires_grad=True)
    lm_head = torch.randn(vocab, hidden, generator=gen)
    proj = torch.randn(vocab, emb, generator=gen, requires_grad=True)
    labels = torch.randint(0, vocab, (5, 10), generator=gen)
    labels[1, 4:] = IGNORE_INDEX
    weights = slot_weights(10, 3.0, "cpu")

    def run(chunk_rows):
        loss, _ = fused_drafter_loss(h.view(5, 10, -1), u.view(5, 10, -1), lm_head, proj,
                                     labels, weights, 0.4, chunk=chunk_rows)
        return (loss, *torch.autograd.grad(loss, (h, u, proj)))

    for got, want in zip(run(chunk), run(rows)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_bf16_autocast_stays_close_to_float32():
    model = small_drafter().train()
    ref_loss, _, _ = loss_and_grads(model, True, 0.3, 7.0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, _, grads = loss_and_grads(model, True, 0.3, 7.0)
    assert loss.dtype == torch.float32
    assert abs(loss.item() - ref_loss.item()) < 0.02 * ref_loss.item()
    assert all(g.dtype == torch.float32 for g in grads.values())


def test_autocast_setting_is_checked():
    check_autocast("float32", "cpu")
    with pytest.raises(ValueError, match=r"autocast='fp8'.*allowed \['bfloat16', 'float16', "
                                         r"'float32'\]"):
        check_autocast("fp8", "cpu")


def test_recipe_refuses_a_bad_autocast_before_any_stage(tmp_path):
    from vllm_dartree.training.smollm2 import RecipeConfig, run

    with pytest.raises(ValueError, match="autocast='bf8'"):
        run(RecipeConfig(out=str(tmp_path / "run"), autocast="bf8"))
    assert not (tmp_path / "run").exists()
