"""The one drafter-checkpoint module: the released configs round-trip, every reader agrees
on what an absent field means, and a bad config names its field."""

from __future__ import annotations

import json

import pytest

from vllm_dartree.bench.methods import drafter_depths
from vllm_dartree.checkpoint import DrafterConfigError, DrafterLayout, bare_weight_name
from vllm_dartree.env import project_root
from vllm_dartree.models.smollm2 import DRAFTER

VOCAB, MASK, IDS = 151936, 151669, [1, 9, 17, 25, 33]
SIZES = {"Qwen3-8B": (4096, 12288), "Qwen3-4B": (2560, 9728)}  # hidden, MLP width


def qwen3_drafter(architecture: str, hidden: int, intermediate: int) -> dict:
    """The Qwen3 fields every released Qwen3 drafter config carries (a 5-layer drafter)."""
    return {"architectures": [architecture], "model_type": "qwen3",
            "vocab_size": VOCAB, "hidden_size": hidden, "intermediate_size": intermediate,
            "num_hidden_layers": 5, "num_attention_heads": 32, "num_key_value_heads": 8,
            "head_dim": 128, "hidden_act": "silu", "rms_norm_eps": 1e-6,
            "rope_theta": 1_000_000, "max_position_embeddings": 40960,
            "attention_bias": False, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}


def zlab_dflash(hidden: int, intermediate: int) -> dict:
    """z-lab/Qwen3-*-DFlash-b16 as its config.json reads (speculators' converter fixture)."""
    return qwen3_drafter("DFlashDraftModel", hidden, intermediate) | {
            "block_size": 16, "num_target_layers": 36,
            "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
            "dflash_config": {"mask_token_id": MASK, "target_layer_ids": IDS}}


def domino(hidden: int, intermediate: int) -> dict:
    """Huang2020/Qwen3-*-Domino-b16: the DFlash keys plus the head and the shift layout."""
    config = zlab_dflash(hidden, intermediate) | {"emb_dim": 256}
    config["dflash_config"] = config["dflash_config"] | {
        "projector_type": "domino", "pure_draft_prefix_len": 1, "emb_dim": 256,
        "gru_hidden_dim": 1024, "shift_label": True}
    return config


@pytest.mark.parametrize("model", sorted(SIZES))
@pytest.mark.parametrize("release", [zlab_dflash, domino], ids=["zlab-dflash", "domino"])
def test_released_configs_round_trip(model, release):
    raw = release(*SIZES[model])
    layout = DrafterLayout.from_config(raw)
    written = layout.to_config("bfloat16")
    assert DrafterLayout.from_config(written) == layout
    # What we write is what the release says, key by key (less the keys we do not model).
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps",
                "rope_theta", "max_position_embeddings", "block_size", "num_target_layers",
                "architectures", "model_type", "torch_dtype"):
        assert written[key] == raw[key], key
    assert written["dflash_config"] == raw["dflash_config"]
    assert written.get("emb_dim") == raw.get("emb_dim")
    if release is domino:
        assert (layout.has_head, layout.shift_label, layout.num_depths) == (True, True, 16)
        assert (layout.gru_hidden_dim, layout.emb_dim, layout.pure_draft_prefix_len) == (
            1024, 256, 1)
    else:
        assert (layout.has_head, layout.shift_label, layout.num_depths) == (False, False, 15)


def test_the_committed_smollm2_drafter_reads_back():
    folder = project_root() / DRAFTER
    raw = json.loads((folder / "config.json").read_text())
    layout = DrafterLayout.from_dir(folder)
    assert DrafterLayout.from_config(layout.to_config(raw["torch_dtype"])) == layout
    assert layout.has_head and drafter_depths(folder) == 16


def test_absent_fields_mean_one_thing_everywhere(tmp_path):
    """Absent fields (pure_draft_prefix_len, rope_theta) mean the same in the vLLM drafter
    (which sees the config through transformers), the benchmark and training; an absent
    block_size has no default (vLLM's conversion of a speculators config drops it, whose
    DFlash2 default is 8): it is refused."""
    raw = domino(*SIZES["Qwen3-8B"])
    del raw["dflash_config"]["pure_draft_prefix_len"], raw["rope_theta"]
    layout = DrafterLayout.from_config(raw)
    assert (layout.pure_draft_prefix_len, layout.rope_theta, layout.block_size) == (
        0, 10000.0, 16)
    with pytest.raises(DrafterConfigError, match="missing block_size"):
        DrafterLayout.from_config({k: v for k, v in raw.items() if k != "block_size"})
    (tmp_path / "config.json").write_text(json.dumps(raw))
    assert drafter_depths(tmp_path) == 16
    from transformers import Qwen3Config

    from vllm_dartree.integration.drafter_model import read_layout

    seen_by_vllm = read_layout(Qwen3Config(**raw), target_vocab=VOCAB, target_hidden=4096,
                               target_layers=36)
    assert seen_by_vllm == layout


@pytest.mark.parametrize(("change", "message"), [
    (lambda c: c["dflash_config"].pop("mask_token_id"), "missing dflash_config.mask_token_id"),
    (lambda c: c["dflash_config"].pop("target_layer_ids"), "dflash_config.target_layer_ids"),
    (lambda c: c["dflash_config"].update(projector_type="medusa"), "projector_type = 'medusa'"),
    (lambda c: c["dflash_config"].pop("gru_hidden_dim"), "gru_hidden_dim"),
    (lambda c: c.update(block_size=1), "block_size = 1 must be >= 2"),
    (lambda c: c.update(layer_types=["sliding_attention"] * 5), "sliding_attention layers"),
    (lambda c: c["dflash_config"].update(causal=True), "causal"),
])
def test_a_bad_config_names_its_field(change, message):
    raw = domino(*SIZES["Qwen3-4B"])
    change(raw)
    with pytest.raises(DrafterConfigError, match=message):
        DrafterLayout.from_config(raw)


@pytest.mark.parametrize(("sizes", "message"), [
    ({"vocab": 1000}, "vocab_size = 151936 does not match the target's 1000"),
    ({"hidden": 1024}, "hidden_size = 2560 does not match"),
    ({"num_layers": 20}, r"target_layer_ids = \[1, 9, 17, 25, 33\] has \[25, 33\]"),
])
def test_a_drafter_that_does_not_fit_its_target_is_refused(sizes, message):
    layout = DrafterLayout.from_config(domino(*SIZES["Qwen3-4B"]))
    target = {"vocab": VOCAB, "hidden": 2560, "num_layers": 36} | sizes
    with pytest.raises(DrafterConfigError, match=message):
        layout.check_target(**target)


# ------------------------------------------------------------------------------- DSpark
def dspark(hidden: int, intermediate: int, **changes) -> dict:
    """deepseek-ai/dspark_qwen3_*_block7 as DeepSpec's build_draft_config writes it: a copy
    of the target's Qwen3 config with the DSpark keys at the top level."""
    return qwen3_drafter("Qwen3DSparkModel", hidden, intermediate) | {
            "num_target_layers": 36, "block_size": 7, "layer_types": ["full_attention"] * 5,
            "mask_token_id": MASK, "target_layer_ids": IDS, "num_anchors": 512,
            "enable_confidence_head": True, "confidence_head_with_markov": True,
            "markov_rank": 256, "markov_head_type": "vanilla"} | changes


@pytest.mark.parametrize("model", sorted(SIZES))
@pytest.mark.parametrize("reduced", [False, True], ids=["full-vocab", "reduced-vocab"])
def test_dspark_configs_round_trip(model, reduced):
    raw = dspark(*SIZES[model], **({"draft_vocab_size": 32000} if reduced else {}))
    layout = DrafterLayout.from_config(raw)
    assert (layout.head, layout.markov_rank, layout.block_size) == ("markov", 256, 7)
    # vLLM's DSparkSpeculator: anchor first (sample_from_anchor defaults to True), so a
    # block of 7 slots drafts 7 depths, like Domino's shift layout.
    assert layout.shift_label and layout.num_depths == 7
    assert layout.confidence_head and layout.confidence_head_with_markov
    assert (layout.mask_token_id, layout.target_layer_ids) == (MASK, tuple(IDS))
    assert layout.output_vocab_size == (32000 if reduced else VOCAB)
    assert layout.has_reduced_vocab is reduced
    written = layout.to_config("bfloat16")
    assert DrafterLayout.from_config(written) == layout
    for key in ("architectures", "block_size", "mask_token_id", "target_layer_ids",
                "markov_rank", "markov_head_type", "enable_confidence_head",
                "confidence_head_with_markov", "layer_types", "vocab_size", "hidden_size"):
        assert written[key] == raw[key], key
    assert written.get("draft_vocab_size") == raw.get("draft_vocab_size")
    assert "dflash_config" not in written


def test_dspark_config_as_a_dartree_engine_sees_it():
    """vLLM carries a dartree drafter as method "dflash": transformers loads the DSpark
    config as a Qwen3Config and EAGLEConfig renames the architecture DFlashQwen3DSparkModel."""
    from transformers import Qwen3Config

    from vllm_dartree.integration.drafter_model import read_layout

    raw = dspark(*SIZES["Qwen3-8B"], enable_confidence_head=False)
    del raw["confidence_head_with_markov"]
    seen = Qwen3Config(**raw)
    seen.architectures = ["DFlashQwen3DSparkModel"]
    layout = read_layout(seen, target_vocab=VOCAB, target_hidden=4096, target_layers=36)
    assert layout == DrafterLayout.from_config(raw)
    assert not layout.confidence_head and layout.logit_scale == 1.0


def test_dspark_absent_fields_mean_what_vllm_takes_them_to_mean():
    raw = dspark(*SIZES["Qwen3-4B"])
    for key in ("markov_head_type", "enable_confidence_head", "confidence_head_with_markov"):
        del raw[key]
    layout = DrafterLayout.from_config(raw | {"draft_vocab_size": None})
    # vLLM: getattr(config, "enable_confidence_head", False), draft_vocab_size or vocab_size
    assert not layout.confidence_head and not layout.confidence_head_with_markov
    assert layout.draft_vocab_size is None and layout.output_vocab_size == VOCAB


@pytest.mark.parametrize(("changes", "message"), [
    ({"markov_rank": 0}, "markov_rank = 0 is not supported; allowed: a positive integer"),
    ({"markov_rank": None}, "markov_rank = None"),
    ({"markov_head_type": "gated"}, "markov_head_type = 'gated' is not supported; allowed: "
                                    "absent or 'vanilla'"),
    ({"sample_from_anchor": False}, "sample_from_anchor = False .* allowed: absent or true"),
    ({"block_size": None}, "drafter config is missing block_size"),
    ({"mask_token_id": None}, "missing dflash_config.mask_token_id \\(top-level"),
    ({"target_layer_ids": []}, "missing dflash_config.target_layer_ids \\(top-level"),
    ({"draft_vocab_size": VOCAB + 1}, f"draft_vocab_size = {VOCAB + 1} is not allowed; it must "
                                      f"be in 1..vocab_size = {VOCAB}"),
    ({"dflash_config": {"projector_type": "domino"}}, "projector_type = 'domino'; allowed: "
                                                      "absent"),
    ({"layer_types": ["sliding_attention"] * 5}, "sliding_attention layers"),
])
def test_a_bad_dspark_config_names_its_field(changes, message):
    raw = dspark(*SIZES["Qwen3-4B"], **changes)
    with pytest.raises(DrafterConfigError, match=message):
        DrafterLayout.from_config(raw)


@pytest.mark.parametrize(("name", "bare"), [
    ("model.language_model.layers.0.self_attn.q_proj.weight", "layers.0.self_attn.q_proj.weight"),
    ("language_model.embed_tokens.weight", "embed_tokens.weight"),
    ("logit_head.prefix_gru.weight_ih_l0", "prefix_gru.weight_ih_l0"),
    ("fc.weight", "fc.weight"), ("lm_head.weight", "lm_head.weight")])
def test_drafter_weight_names_of_vision_language_releases_are_read_bare(name, bare):
    """Qwen3.5/3.6 drafters may name their backbone by the target's text-model path; the
    engine e2e on such a checkpoint: tests/v2/test_v2_hybrid.py (Qwen3.5)."""
    assert bare_weight_name(name) == bare


# ------------------------------------------------------------------- lattice drafters
def dflash2(hidden: int, intermediate: int) -> dict:
    """A DFlash2 config as vLLM's qwen3_dflash2.py reads it: z-lab's keys plus the
    candidate selector's and the grouped conv's."""
    config = zlab_dflash(hidden, intermediate) | {"architectures": ["DFlash2DraftModel"]}
    config["dflash_config"] = config["dflash_config"] | {
        "selector_top_k": 8, "selector_rank": 64, "conv_kernel_size": 4, "conv_group_size": 64}
    return config


def lilicorr(hidden: int, intermediate: int) -> dict:
    """A LiLiCorr config as vLLM's lilicorr.py reads it."""
    config = zlab_dflash(hidden, intermediate) | {"architectures": ["LiLiCorrDraftModel"]}
    config["dflash_config"] = config["dflash_config"] | {
        "lilicorr_candidate_topk": 8, "lilicorr_num_layers": 2, "lilicorr_num_heads": 8,
        "lilicorr_hidden_size": 512, "lilicorr_mlp_ratio": 2.0, "lilicorr_factor_dim": 64,
        "lilicorr_vector_eps": 1e-6, "lilicorr_logit_scale": 16.0}
    return config


@pytest.mark.parametrize("release, kind", [(dflash2, "dflash2"), (lilicorr, "lilicorr")])
def test_lattice_drafter_configs_are_read(release, kind):
    layout = DrafterLayout.from_config(release(*SIZES["Qwen3-8B"]))
    assert (layout.lattice, layout.lattice_top_k, layout.head) == (kind, 8, None)
    assert layout.num_depths == 15  # z-lab's layout, as vLLM runs both
    with pytest.raises(DrafterConfigError, match="not a " + kind):
        layout.to_config()


@pytest.mark.parametrize("release, change, message", [
    (dflash2, {"selector_rank": None}, "missing dflash_config.selector_rank"),
    (dflash2, {"selector_top_k": 0}, r"selector_top_k = 0 is not supported"),
    (lilicorr, {"lilicorr_candidate_topk": 6}, "power of two <= 16"),
    (lilicorr, {"lilicorr_enabled": False}, "lilicorr_enabled = False"),
    (dflash2, {"projector_type": "domino"}, "projector_type = 'domino'"),
])
def test_a_bad_lattice_config_names_its_field(release, change, message):
    config = release(*SIZES["Qwen3-8B"])
    for key, value in change.items():
        if value is None:
            config["dflash_config"].pop(key)
        else:
            config["dflash_config"][key] = value
    with pytest.raises(DrafterConfigError, match=message):
        DrafterLayout.from_config(config)


@pytest.mark.parametrize("architecture", ["DFlash2BeamDraftModel", "DFlash2RicursiveDraftModel",
                                          "Gemma4DSparkModel"])
def test_a_drafter_architecture_not_understood_is_refused_by_name(architecture):
    config = dflash2(*SIZES["Qwen3-8B"]) | {"architectures": [architecture]}
    with pytest.raises(DrafterConfigError, match=f"names '{architecture}'.*allowed: "
                                                 "DFlashDraftModel"):
        DrafterLayout.from_config(config)
