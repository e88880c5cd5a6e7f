"""``train-drafter --head markov``: DSpark's Markov head in the training drafter.

The training model's teacher-forced corrected logits must be what the tree core's
:class:`~vllm_dartree.tree.MarkovHead` computes on the same weights (slot 0's previous token
is the anchor), and a training run must write a checkpoint in DSpark's format.
"""

from __future__ import annotations

import json

import torch
from safetensors import safe_open
from training_helpers import small_drafter, small_markov_arch

from vllm_dartree.checkpoint import DrafterLayout
from vllm_dartree.training.cli import main
from vllm_dartree.training.loss import drafter_loss
from vllm_dartree.training.model import block_labels
from vllm_dartree.training.train import (
    TrainConfig,
    arch_for_target,
    export_drafter,
    fused_step_loss,
    load_drafter,
)

MARKOV_RUN = ["--head", "markov", "--block-size", "7", "--markov-rank", "8",
              "--confidence-head", "--steps", "2", "--batch-size", "2", "--seq-len", "24",
              "--num-sequences", "4", "--threads", "1", "--no-progress", "--ignore-eos",
              "--target-layer-ids", "0", "1"]


def markov_drafter(**changes):
    arch = small_markov_arch(**changes)
    return small_drafter(**{name: getattr(arch, name) for name in DrafterLayout.field_names()})


def inputs(model, n=2, t=24, seed=1):
    gen = torch.Generator().manual_seed(seed)
    width = len(model.arch.target_layer_ids) * model.arch.hidden_size
    features = torch.randn(n, t, width, generator=gen)
    tokens = torch.randint(0, model.arch.vocab_size - 1, (n, t), generator=gen)
    return features, tokens, torch.tensor([[3, 9, 17], [1, 5, 16]])[:n]


def test_corrected_logits_equal_the_tree_cores_markov_head():
    """Slot j's bias is MarkovHead's for previous token x_{p+j} (slot 0: the anchor), on the
    full vocabulary and on a candidate subset (the trees' path)."""
    model = markov_drafter()
    head = model.correction_head()
    features, tokens, anchors = inputs(model)
    out = model(features, tokens, anchors)
    for n in range(tokens.shape[0]):
        for a, p in enumerate(anchors[n].tolist()):
            for j in range(model.arch.block_size):
                prev = tokens[n, p + j]
                expected = out.base_logits[n, a, j] + head.full_bias(prev)
                torch.testing.assert_close(out.corrected_logits[n, a, j], expected)
    # candidate-restricted: log-softmax over K candidates of the corrected logits
    cands = torch.tensor([[0, 5, 7, 30]])
    base = out.base_logits[0, 1, 2][cands]
    state = head.root_state(tokens[0, 9 + 2].view(1)).unsqueeze(1)
    context = head.depth_context(out.hidden[0, 1, 2].view(1, 1, -1))[:, 0]
    got = head.corrected_logprobs(base, context, head.candidate_weights(cands), state)[0, 0]
    torch.testing.assert_close(got, out.corrected_logits[0, 1, 2][cands[0]].log_softmax(-1))


def test_fused_loss_equals_the_reference_for_the_markov_head():
    model = markov_drafter(confidence_head=False)
    features, tokens, anchors = inputs(model)
    labels = block_labels(tokens, anchors, torch.tensor([24, 20]), model.arch.block_size)
    fused, _ = fused_step_loss(model, features, tokens, anchors, labels, 0.3)
    reference, _ = drafter_loss(model(features, tokens, anchors), labels, 0.3)
    torch.testing.assert_close(fused, reference, rtol=1e-4, atol=1e-4)


def test_confidence_head_reads_the_markov_embedding_and_trains():
    model = markov_drafter(confidence_head=True, confidence_head_with_markov=True)
    features, tokens, anchors = inputs(model)
    out = model(features, tokens, anchors)
    assert out.confidence_logits.shape == anchors.shape + (model.arch.block_size,)
    labels = block_labels(tokens, anchors, torch.tensor([24, 24]), model.arch.block_size)
    loss, stats = fused_step_loss(model.train(), features, tokens, anchors, labels, 0.3)
    loss.backward()
    assert "bce" in stats and model.confidence_head.proj.weight.grad.abs().sum() > 0


def test_new_markov_layout_is_dsparks():
    cfg = TrainConfig(target="t", out="o", head="markov", markov_rank=16, block_size=8,
                      confidence_head=True, target_layer_ids=(0,))
    config = {"vocab_size": 32, "hidden_size": 64, "intermediate_size": 96,
              "num_hidden_layers": 2, "num_attention_heads": 2}
    arch = arch_for_target(cfg, config)
    assert (arch.head, arch.markov_rank, arch.confidence_head,
            arch.confidence_head_with_markov, arch.num_depths) == ("markov", 16, True, True, 8)
    assert DrafterLayout.from_config(arch.to_config()) == arch


def test_export_round_trip(tmp_path):
    model = markov_drafter(confidence_head=True, confidence_head_with_markov=True)
    out = export_drafter(model, tmp_path / "d")
    again = load_drafter(out, model.embed, model.lm_head).eval()
    features, tokens, anchors = inputs(model)
    torch.testing.assert_close(again(features, tokens, anchors).corrected_logits,
                               model(features, tokens, anchors).corrected_logits)


def test_train_drafter_head_markov_writes_a_dspark_checkpoint(target_dir, tmp_path):
    main(["--target", str(target_dir), "--out", str(tmp_path / "run"), *MARKOV_RUN])
    drafter = tmp_path / "run" / "drafter"
    config = json.loads((drafter / "config.json").read_text())
    assert config["architectures"] == ["Qwen3DSparkModel"]
    layout = DrafterLayout.from_config(config)
    assert (layout.head, layout.markov_rank, layout.block_size, layout.confidence_head) == (
        "markov", 8, 7, True)
    with safe_open(str(drafter / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    assert {"markov_head.markov_w1.weight", "markov_head.markov_w2.weight",
            "confidence_head.proj.weight", "confidence_head.proj.bias"} <= names
    assert not any(n.startswith(("prefix_gru.", "embed_proj.")) for n in names)
