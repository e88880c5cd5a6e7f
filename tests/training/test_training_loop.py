"""Trainer: loss goes down, runs are deterministic and resumable, head-only training, data."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from training_helpers import small_drafter

from vllm_dartree.training.data import (
    PromptOverlapError,
    check_no_overlap,
    generate_responses,
    sample_anchors,
    target_features,
)
from vllm_dartree.training.train import (
    CHECKPOINT,
    TrainConfig,
    decode_rounds,
    default_target_layer_ids,
    lambda_at,
    lr_at,
    simulate_acceptance,
    train,
)


def tiny_config(target_dir, out, **changes) -> TrainConfig:
    fields = dict(target=str(target_dir), out=str(out), steps=6, gru_hidden_dim=16,
                  emb_dim=8, target_layer_ids=(0, 1), lr=1e-2, batch_size=4,
                  anchors_per_sequence=4, seq_len=40, num_sequences=12, prompt_max_len=12,
                  stop_at_eos=False, progress=False, threads=1)
    return TrainConfig(**(fields | changes))


def weights(result) -> dict[str, torch.Tensor]:
    return load_file(str(result.drafter_dir / "model.safetensors"))


def test_loss_decreases(target_dir, tmp_path):
    result = train(tiny_config(target_dir, tmp_path, steps=30, lambda0=0.0))
    assert len(result.losses) == 30
    first, last = sum(result.losses[:5]) / 5, sum(result.losses[-5:]) / 5
    assert last < 0.8 * first, (first, last)


def test_deterministic_and_resumable(target_dir, tmp_path):
    full = train(tiny_config(target_dir, tmp_path / "a"))
    again = train(tiny_config(target_dir, tmp_path / "b"))
    assert full.losses == again.losses
    half = train(tiny_config(target_dir, tmp_path / "c", stop_after=3))
    assert half.step == 3 and (tmp_path / "c" / CHECKPOINT).exists()
    with pytest.raises(ValueError, match="steps: 6 in the checkpoint, 12 now"):
        train(tiny_config(target_dir, tmp_path / "c", resume=True, steps=12))
    resumed = train(tiny_config(target_dir, tmp_path / "c", resume=True))
    assert resumed.step == 6 and resumed.losses[:3] == half.losses
    assert resumed.losses == full.losses
    for name, tensor in weights(full).items():
        torch.testing.assert_close(weights(resumed)[name], tensor, rtol=0, atol=0)


def test_freeze_backbone_trains_only_the_head(target_dir, tmp_path):
    base = train(tiny_config(target_dir, tmp_path / "a", steps=2))
    head = train(tiny_config(target_dir, tmp_path / "b", steps=4, freeze_backbone=True,
                             init_from=str(base.drafter_dir)))
    before, after = weights(base), weights(head)
    for name in before:
        same = torch.equal(before[name], after[name])
        assert same != name.startswith(("prefix_gru.", "embed_proj.")), name


def test_schedules():
    cfg = TrainConfig(target="t", out="o", steps=100, lr=1.0, lambda0=0.5, warmup_steps=10)
    assert lambda_at(cfg, 0) == 0.5 and lambda_at(cfg, 99) == 0.0
    assert lr_at(cfg, 0) == pytest.approx(0.1) and lr_at(cfg, 9) == pytest.approx(1.0)
    assert lr_at(cfg, 99) == pytest.approx(cfg.min_lr_ratio, abs=1e-3)


def test_default_target_layer_ids():
    assert default_target_layer_ids(36, 5) == (1, 9, 17, 25, 33)  # z-lab Qwen3-8B
    assert default_target_layer_ids(2, 1) == (0, 1)


def test_check_no_overlap():
    train_prompts = ["Solve  2+2 please", "Write a haiku about the sea and its long tides"]
    check_no_overlap(train_prompts, ["solve 3+3 please"])
    with pytest.raises(PromptOverlapError):
        check_no_overlap(train_prompts, ["SOLVE 2+2\nplease"])  # whitespace / case
    with pytest.raises(PromptOverlapError):  # contained in a longer training prompt
        check_no_overlap(["<user>Write a haiku about the sea and its long tides</user>"],
                         ["Write a haiku about the sea and its long tides"])
    with pytest.raises(PromptOverlapError):
        check_no_overlap([[1, 2, 3]], [[4], [1, 2, 3]])
    check_no_overlap([[1, 2, 3]], [[1, 2]])


def test_anchors_stay_in_the_response():
    gen = torch.Generator().manual_seed(0)
    anchors = sample_anchors(torch.tensor([5, 2]), torch.tensor([30, 9]), 64, gen)
    assert anchors[0].min() >= 5 and anchors[0].max() <= 28
    assert anchors[1].min() >= 2 and anchors[1].max() <= 7


def test_features_are_layer_outputs_before_the_final_norm(target):
    tokens = torch.tensor([[3, 7, 1, 9, 4]])
    out = target(input_ids=tokens, output_hidden_states=True)
    features = target_features(target, tokens, [0, 1])
    torch.testing.assert_close(features[..., :64], out.hidden_states[1])
    last = features[..., 64:]  # HF's last entry is normed; ours is the raw layer output
    torch.testing.assert_close(target.model.norm(last), out.hidden_states[2])


def test_left_padded_generation_equals_unpadded(target):
    prompts = [[5, 6], [7, 8, 9, 10, 11]]
    batched = generate_responses(target, prompts, 8, stop_at_eos=False)
    for prompt, seq in zip(prompts, batched.sequences):
        alone = generate_responses(target, [prompt], 8, stop_at_eos=False).sequences[0]
        assert torch.equal(seq, alone)


def test_simulated_acceptance_runs(target):
    from vllm_dartree.training.train import target_tables

    model = small_drafter()
    embed, lm_head = target_tables(target)
    model.embed.copy_(embed)
    model.lm_head.copy_(lm_head)
    report = simulate_acceptance(model, target, [[3, 4, 5]], max_new_tokens=12)
    assert set(report.tau) == {"pruned", "chain"} and all(t >= 1 for t in report.tau.values())
    assert len(report.base_top1) == 16


def test_decode_rounds():
    assert decode_rounds([3, 1, 1, 2, 5, 1, 1], 7) == [3, 2, 1]


def test_llama_target_with_tied_embeddings(tmp_path):
    """SmolLM2-style target: Llama architecture, tied embeddings, no head_dim in config."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=40, hidden_size=64, intermediate_size=96,
                         num_hidden_layers=3, num_attention_heads=2, num_key_value_heads=1,
                         tie_word_embeddings=True, rope_theta=100000.0, rms_norm_eps=1e-5)
    LlamaForCausalLM(config).save_pretrained(tmp_path / "llama")
    result = train(tiny_config(tmp_path / "llama", tmp_path / "run", steps=2,
                               target_layer_ids=None))
    exported = json.loads((result.drafter_dir / "config.json").read_text())
    assert exported["dflash_config"]["target_layer_ids"] == [0, 1, 2]
    assert exported["head_dim"] == 32 and exported["rope_theta"] == 100000.0
    assert exported["rms_norm_eps"] == 1e-5 and exported["vocab_size"] == 40
