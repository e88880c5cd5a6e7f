"""The released Qwen3-8B / Qwen3-4B Domino-b16 drafters fit, checked on the meta device.

The config is the released one (reference notes, sections 1.6 and 2.6: z-lab b16 backbone +
``dflash_config`` with ``projector_type: domino``). ``read_layout`` must accept it against a
target of that size, and the checkpoint names and shapes, written out here from the released
format, must equal the parameters of the independent reference model
(``tests/reference/dflash_reference.py``) and of the head modules our vLLM drafter builds
(``DARTreeDraftModel``), all instantiated on ``torch.device("meta")`` (nothing is allocated).
"""

from __future__ import annotations

from types import SimpleNamespace

import dflash_reference as ref
import pytest
import torch
from torch import nn

from vllm_dartree.integration import drafter_model
from vllm_dartree.integration.drafter_model import DARTreeDraftModel, read_layout

VOCAB = 151936
MASK = 151669
LAYER_IDS = [1, 9, 17, 25, 33]
GRU, EMB = 1024, 256
SIZES = {  # target (= drafter) hidden size, MLP width; 32 query / 8 KV heads of 128 for both
    "Qwen3-8B": (4096, 12288),
    "Qwen3-4B": (2560, 9728),
}


def released_config(hidden: int, intermediate: int, **dflash) -> dict:
    return {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "vocab_size": VOCAB,
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_hidden_layers": 5,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "rope_theta": 1_000_000,
        "attention_bias": False,
        "tie_word_embeddings": False,
        "block_size": 16,
        "num_target_layers": 36,
        "emb_dim": EMB,
        "dflash_config": {
            "mask_token_id": MASK,
            "target_layer_ids": LAYER_IDS,
            "projector_type": "domino",
            "pure_draft_prefix_len": 1,
            "emb_dim": EMB,
            "gru_hidden_dim": GRU,
            "shift_label": True,
        } | dflash,
    }


def released_names(hidden: int, intermediate: int) -> dict[str, tuple[int, ...]]:
    """Every tensor of a Domino-b16 checkpoint, by its released name (no embed, no lm_head)."""
    q, kv, head_dim = 32 * 128, 8 * 128, 128
    shapes: dict[str, tuple[int, ...]] = {}
    for i in range(5):
        p = f"layers.{i}"
        shapes |= {
            f"{p}.self_attn.q_proj.weight": (q, hidden),
            f"{p}.self_attn.k_proj.weight": (kv, hidden),
            f"{p}.self_attn.v_proj.weight": (kv, hidden),
            f"{p}.self_attn.o_proj.weight": (hidden, q),
            f"{p}.self_attn.q_norm.weight": (head_dim,),
            f"{p}.self_attn.k_norm.weight": (head_dim,),
            f"{p}.mlp.gate_proj.weight": (intermediate, hidden),
            f"{p}.mlp.up_proj.weight": (intermediate, hidden),
            f"{p}.mlp.down_proj.weight": (hidden, intermediate),
            f"{p}.input_layernorm.weight": (hidden,),
            f"{p}.post_attention_layernorm.weight": (hidden,),
        }
    return shapes | {
        "norm.weight": (hidden,),
        "hidden_norm.weight": (hidden,),
        "fc.weight": (hidden, 5 * hidden),
        "prefix_gru.weight_ih_l0": (3 * GRU, hidden),
        "prefix_gru.weight_hh_l0": (3 * GRU, GRU),
        "embed_proj.0.weight": (EMB, hidden + GRU),
        "embed_proj.2.weight": (VOCAB, EMB),
    }


def hf_config(raw: dict):
    """The drafter config as vLLM hands it over (a transformers config with the extra keys)."""
    from transformers import Qwen3Config

    return Qwen3Config(**raw)


def target_sizes(hidden: int) -> dict:
    return {"target_vocab": VOCAB, "target_hidden": hidden, "target_layers": 36}


@pytest.mark.parametrize("model", SIZES)
def test_read_layout_accepts_the_released_domino_config(model):
    hidden, intermediate = SIZES[model]
    layout = read_layout(hf_config(released_config(hidden, intermediate)), **target_sizes(hidden))
    assert layout.block_size == 16 and layout.shift_label and layout.num_depths == 16
    assert layout.has_head and layout.gru_hidden_dim == GRU and layout.emb_dim == EMB
    assert layout.mask_token_id == MASK and layout.target_layer_ids == tuple(LAYER_IDS)
    assert layout.pure_draft_prefix_len == 1


def test_8b_names_match_the_spec():
    """Spot-check the table against the issue's numbers for Qwen3-8B."""
    names = released_names(*SIZES["Qwen3-8B"])
    assert names["fc.weight"] == (4096, 5 * 4096)
    assert names["prefix_gru.weight_ih_l0"] == (3072, 4096)
    assert names["prefix_gru.weight_hh_l0"] == (3072, 1024)
    assert names["embed_proj.0.weight"] == (256, 5120)
    assert names["embed_proj.2.weight"] == (151936, 256)
    # 5 layers x 11 tensors + norm, hidden_norm, fc + 4 head tensors
    assert len(names) == 5 * 11 + 3 + 4


@pytest.mark.parametrize("model", SIZES)
def test_reference_model_parameters_are_the_released_names(model):
    hidden, intermediate = SIZES[model]
    cfg = ref.ReferenceConfig.from_dict(released_config(hidden, intermediate))
    with torch.device("meta"):
        reference = ref.DFlashDraftModel(cfg)
    shapes = {name: tuple(p.shape) for name, p in reference.named_parameters()}
    assert shapes == released_names(hidden, intermediate)
    assert cfg.num_drafts == 16 and cfg.target_layer_ids == tuple(LAYER_IDS)


def build_our_drafter(raw: dict, monkeypatch) -> DARTreeDraftModel:
    """DARTreeDraftModel's own head construction on the meta device; vLLM's backbone
    constructor is stubbed out (it needs a live vLLM config and would allocate the backbone)."""
    config = hf_config(raw)

    def backbone_stub(self, *, vllm_config, prefix=""):
        nn.Module.__init__(self)
        self.config = config

    monkeypatch.setattr(drafter_model.DFlashQwen3ForCausalLM, "__init__", backbone_stub)
    vllm_config = SimpleNamespace(model_config=SimpleNamespace(dtype=torch.bfloat16))
    with torch.device("meta"):
        ours = DARTreeDraftModel(vllm_config=vllm_config)
        ours.model = SimpleNamespace(embed_tokens=nn.Embedding(
            VOCAB, raw["hidden_size"], dtype=torch.bfloat16))
    return ours


@pytest.mark.parametrize("model", SIZES)
def test_our_head_modules_have_the_released_shapes(model, monkeypatch):
    """The head modules our vLLM drafter builds, and the DominoHead made from them."""
    hidden, intermediate = SIZES[model]
    ours = build_our_drafter(released_config(hidden, intermediate), monkeypatch)
    head_names = {name: shape for name, shape in released_names(hidden, intermediate).items()
                  if name.startswith(("prefix_gru.", "embed_proj."))}
    shapes = {name: tuple(p.shape) for name, p in ours.named_parameters()}
    assert shapes == head_names
    assert all(p.device.type == "meta" for p in ours.parameters())
    assert ours.has_domino_head and ours.pure_draft_prefix_len == 1
    head = ours.correction_head()  # validates every shape against H, G, E, V
    assert (head.hidden_size, head.state_size, head.proj_z.shape[0]) == (hidden, GRU, EMB)
    assert tuple(head.proj2.shape) == (VOCAB, EMB)


def test_absent_pure_draft_prefix_len_defaults_to_zero_like_the_references(monkeypatch):
    """Domino ``code/dflash.py`` / DARTree ``utils/draft_model.py`` read
    ``dflash_config.get("pure_draft_prefix_len", 0)``: a config without the key corrects every
    slot (slot 0 with the GRU state after the root alone). The released configs all set 1."""
    raw = released_config(*SIZES["Qwen3-8B"])
    del raw["dflash_config"]["pure_draft_prefix_len"]
    assert ref.ReferenceConfig.from_dict(raw).pure_draft_prefix_len == 0
    assert read_layout(hf_config(raw), **target_sizes(4096)).pure_draft_prefix_len == 0
    assert build_our_drafter(raw, monkeypatch).correction_head().pure_draft_prefix_len == 0
