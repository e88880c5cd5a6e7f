"""The fixture checkpoints are in the formats of the released models."""

from __future__ import annotations

import json

from safetensors import safe_open

from vllm_dartree.models import tiny as tm


def _tensors(path):
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}


def test_target_is_a_qwen3_checkpoint(tiny_target):
    config = json.loads((tiny_target / "config.json").read_text())
    assert config["architectures"] == ["Qwen3ForCausalLM"] and config["model_type"] == "qwen3"
    assert config["head_dim"] in tm.CPU_HEAD_DIMS and not config["tie_word_embeddings"]
    shapes = _tensors(tiny_target)
    assert shapes["model.embed_tokens.weight"] == (512, 128)
    assert shapes["lm_head.weight"] == (512, 128)
    assert shapes["model.layers.1.self_attn.q_norm.weight"] == (32,)


def test_dflash_drafter_has_zlab_names_and_no_embedding(tiny_dflash):
    config = json.loads((tiny_dflash / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"]
    assert config["block_size"] == 16
    assert config["dflash_config"] == {"mask_token_id": 511, "target_layer_ids": [0, 1]}
    shapes = _tensors(tiny_dflash)
    assert shapes["fc.weight"] == (128, 256)
    assert {"hidden_norm.weight", "norm.weight", "layers.0.self_attn.k_norm.weight"} <= set(shapes)
    assert not any("embed_tokens" in k or "lm_head" in k for k in shapes)


def test_domino_drafter_adds_the_gru_head(tiny_domino):
    config = json.loads((tiny_domino / "config.json").read_text())
    dflash = config["dflash_config"]
    assert dflash["projector_type"] == "domino" and dflash["shift_label"] is True
    assert dflash["pure_draft_prefix_len"] == 1
    g, e = dflash["gru_hidden_dim"], dflash["emb_dim"]
    assert config["emb_dim"] == e
    shapes = _tensors(tiny_domino)
    assert shapes["prefix_gru.weight_ih_l0"] == (3 * g, 128)
    assert shapes["prefix_gru.weight_hh_l0"] == (3 * g, g)
    assert shapes["embed_proj.0.weight"] == (e, 128 + g)
    assert shapes["embed_proj.2.weight"] == (512, e)


def test_writers_are_deterministic_and_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_DARTREE_CACHE", str(tmp_path))
    spec = tm.TargetSpec(vocab_size=40, seed=9)
    first = tm.write_target(spec)
    data = (first / "model.safetensors").read_bytes()
    (first / "model.safetensors").unlink()
    (first / "config.json").unlink()
    assert (tm.write_target(spec) / "model.safetensors").read_bytes() == data


def test_tiny_vocabulary_variant():
    path = tm.write_target(tm.TINY_VOCAB_TARGET)
    assert json.loads((path / "config.json").read_text())["vocab_size"] == 48
    drafter = tm.write_drafter(tm.DrafterSpec(target=tm.TINY_VOCAB_TARGET, domino=True))
    assert _tensors(drafter)["embed_proj.2.weight"][0] == 48
