"""The training drafter: shapes, checkpoint names, no label leakage, and the inference math."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from training_helpers import SMALL, small_arch, small_drafter

from vllm_dartree.checkpoint import DrafterLayout
from vllm_dartree.models import tiny as tm
from vllm_dartree.training.model import IGNORE_INDEX, block_labels
from vllm_dartree.training.train import export_drafter, load_drafter


def inputs(model, n=2, t=24, seed=1):
    gen = torch.Generator().manual_seed(seed)
    width = len(model.arch.target_layer_ids) * model.arch.hidden_size
    features = torch.randn(n, t, width, generator=gen)
    tokens = torch.randint(0, model.arch.vocab_size - 1, (n, t), generator=gen)
    anchors = torch.tensor([[3, 9, 20], [1, 5, 22]])[:n]
    return features, tokens, anchors


def test_forward_shapes():
    model = small_drafter()
    features, tokens, anchors = inputs(model)
    out = model(features, tokens, anchors)
    assert out.hidden.shape == (2, 3, 16, 64)
    assert out.base_logits.shape == out.corrected_logits.shape == (2, 3, 16, 32)
    # pure_draft_prefix_len = 1: slot 0 is never corrected.
    torch.testing.assert_close(out.corrected_logits[:, :, 0], out.base_logits[:, :, 0])
    assert not torch.allclose(out.corrected_logits[:, :, 1:], out.base_logits[:, :, 1:])


def released_spec() -> tm.DrafterSpec:
    return tm.DrafterSpec(target=SMALL, domino=True, gru_hidden_dim=24, emb_dim=16,
                          target_layer_ids=(0, 1))


def test_parameter_names_are_the_checkpoint_names():
    shapes = {k: tuple(v.shape) for k, v in tm.drafter_weights(released_spec()).items()}
    model = small_drafter()
    assert {k: tuple(v.shape) for k, v in model.state_dict().items()} == shapes
    assert {k for k, _ in model.named_parameters()} == set(shapes)


def test_export_round_trip(tmp_path):
    model = small_drafter()
    out = export_drafter(model, tmp_path / "d")
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        exported = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    released = tm.drafter_weights(released_spec())
    assert exported == {k: tuple(v.shape) for k, v in released.items()}
    config = json.loads((out / "config.json").read_text())
    assert config == tm.drafter_config(released_spec()) | {"intermediate_size": 96}
    assert DrafterLayout.from_config(config) == model.arch
    again = load_drafter(out, model.embed, model.lm_head).eval()
    features, tokens, anchors = inputs(model)
    torch.testing.assert_close(again(features, tokens, anchors).corrected_logits,
                               model(features, tokens, anchors).corrected_logits)


def test_bf16_export(tmp_path):
    out = export_drafter(small_drafter(), tmp_path / "d", dtype="bfloat16")
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert f.get_tensor("fc.weight").dtype == torch.bfloat16
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "bfloat16"


def test_loads_a_released_format_checkpoint():
    spec = released_spec()
    spec = tm.DrafterSpec(**{**spec.__dict__, "target": tm.TargetSpec(
        **{**SMALL.__dict__, "intermediate_size": 96})})
    model = small_drafter()
    loaded = load_drafter(tm.write_drafter(spec), model.embed, model.lm_head)
    for name, tensor in tm.drafter_weights(spec).items():
        torch.testing.assert_close(loaded.state_dict()[name], tensor)


def test_batched_anchors_equal_one_anchor_with_truncated_context():
    """Masking: anchor p sees exactly the context < p and its own block."""
    model = small_drafter()
    features, tokens, anchors = inputs(model)
    batched = model(features, tokens, anchors)
    for row in range(2):
        for a, p in enumerate(anchors[row].tolist()):
            alone = model(features[row:row + 1, :p], tokens[row:row + 1], torch.tensor([[p]]))
            torch.testing.assert_close(alone.base_logits[0, 0], batched.base_logits[row, a],
                                       rtol=1e-4, atol=1e-4)


def test_no_label_leakage():
    """Base logits ignore tokens after the root; corrected slot j ignores x_{p+j+1..}."""
    model = small_drafter()
    features, tokens, anchors = inputs(model, n=1)
    p = int(anchors[0, 1])
    ref = model(features, tokens, anchors[:, 1:2])
    for j in (0, 4, 10):
        changed = tokens.clone()
        changed[0, p + j + 1:] = (changed[0, p + j + 1:] + 1) % 31
        out = model(features, changed, anchors[:, 1:2])
        torch.testing.assert_close(out.base_logits, ref.base_logits)
        torch.testing.assert_close(out.corrected_logits[0, 0, : j + 1],
                                   ref.corrected_logits[0, 0, : j + 1])
        assert not torch.allclose(out.corrected_logits[0, 0, j + 1:],
                                  ref.corrected_logits[0, 0, j + 1:])
    later = features.clone()
    later[0, p:] += 1.0  # target states at positions >= p are not available at inference
    torch.testing.assert_close(model(later, tokens, anchors[:, 1:2]).base_logits,
                               ref.base_logits)


def test_head_math_equals_domino_head():
    """The training head = DominoHead.gru_step + candidate_bias on the same weights."""
    model = small_drafter()
    head = model.domino_head()
    features, tokens, anchors = inputs(model, n=1)
    out = model(features, tokens, anchors)
    states = model.prefix_states(tokens, anchors)
    all_ids = torch.arange(model.arch.vocab_size).unsqueeze(0)
    for a, p in enumerate(anchors[0].tolist()):
        h = torch.zeros(1, model.arch.gru_hidden_dim)
        for j in range(model.arch.block_size):
            h = head.gru_step(head.embed[tokens[0, min(p + j, tokens.shape[1] - 1)]][None], h)
            torch.testing.assert_close(states[0, a, j], h[0], rtol=1e-5, atol=1e-5)
            if j < head.pure_draft_prefix_len:
                continue
            z = out.hidden[0, a, j][None]
            bias = head.candidate_bias(z, h[:, None], all_ids)[0, 0]
            torch.testing.assert_close(out.corrected_logits[0, a, j],
                                       out.base_logits[0, a, j] + bias, rtol=1e-4, atol=1e-4)


def test_block_labels_mask_past_the_end():
    tokens = torch.arange(10).unsqueeze(0)
    labels = block_labels(tokens, torch.tensor([[2, 8]]), torch.tensor([10]), 4)
    assert labels.tolist() == [[[3, 4, 5, 6], [9, IGNORE_INDEX, IGNORE_INDEX, IGNORE_INDEX]]]


@pytest.mark.parametrize("kv_heads", [1, 2])
def test_gqa_and_mha(kv_heads):
    model = small_drafter(num_key_value_heads=kv_heads)
    assert model(*inputs(model)).hidden.isfinite().all()
    assert small_arch(num_key_value_heads=kv_heads).num_key_value_heads == kv_heads
