"""Drafters as SpecForge, Model-Optimizer and speculators write them (``tool_writers``): the
checkpoint reader's verdict on each, the weight names the loader takes, vLLM's own
conversion of a speculators config, and the README's per-tool table rebuilt from them."""

from __future__ import annotations

import json

import pytest
from safetensors import safe_open
from tool_writers import ROW, ROWS, write

from vllm_dartree.checkpoint import (
    HEAD_PREFIXES,
    DrafterConfigError,
    DrafterLayout,
    bare_weight_name,
)
from vllm_dartree.env import project_root

# Every row that loads: the layout facts a wrong reading would change. Every tool here
# writes mask 511 (the tiny target's last id) and target layers 0 and 1.
LOADS = {
    # name: (head, lattice, block_size, shift_label, confidence head, it reads the Markov row)
    "specforge-dflash": (None, None, 16, False, False, False),
    "specforge-domino": ("domino", None, 16, True, False, False),
    "specforge-dspark": ("markov", None, 16, True, True, True),
    "modelopt-dflash": (None, None, 16, False, False, False),
    "modelopt-domino": ("domino", None, 16, True, False, False),
    "modelopt-dspark": ("markov", None, 16, True, True, True),
    "speculators-dflash-full_attention=True": (None, None, 8, False, False, False),
    "speculators-dflash2-full_attention=True": (None, "dflash2", 8, False, False, False),
    "speculators-dspark-full_attention=True": ("markov", None, 8, True, True, True),
    # the anchor slot predicts the first draft token: the shift layout, block_size depths
    "speculators-dflash-full_attention=True-sample_from_anchor=True":
        (None, None, 8, True, False, False),
    # the flag changes only sliding-window layers; full ones are bidirectional either way
    "speculators-dflash-full_attention=True-sliding_window_non_causal=True":
        (None, None, 8, False, False, False),
}
SLIDING = ("speculators {kind} config transformer_layer_config.layer_types = "
           "['sliding_attention', 'sliding_attention']: draft layers [0, 1] use sliding-window "
           "attention (speculators' default), which dartree does not serve; allowed: every "
           "layer 'full_attention' (train with --full-attention-indices 0 1)")
REFUSED = {f"speculators-{kind}": SLIDING.format(kind=kind)
           for kind in ("dflash", "dflash2", "dspark")} | {
    "speculators-dflash2-full_attention=True-sample_from_anchor=True":
        "speculators dflash2 config sample_from_anchor = True is not supported; allowed: false "
        "(vLLM's DFlash2 model drafts in the non-shift layout: train without "
        "--sample-from-anchor)",
    "speculators-dspark-full_attention=True-sample_from_anchor=False":
        "speculators dspark config sample_from_anchor = False (the bonus-anchor layout) is not "
        "supported; allowed: true (speculators' DSpark default: train without "
        "--no-sample-from-anchor)",
}
MODELOPT_ATTENTION = (
    "drafter config sets {field}: causal or sliding-window DFlash drafters are not supported "
    "(allowed: full non-causal block attention; Model-Optimizer trains it with "
    "dflash_swa_window_size unset and dflash_draft_attention 'bidirectional', speculators "
    "with --full-attention-indices naming every draft layer)")
REFUSED |= {
    "modelopt-dflash-dflash_draft_attention=causal":
        MODELOPT_ATTENTION.format(field="is_causal / dflash_config.causal"),
    "modelopt-dflash-dflash_swa_window_size=32":
        MODELOPT_ATTENTION.format(field="dflash_config.use_swa"),
}
SPECULATORS_LOADS = [name for name in LOADS if name.startswith("speculators")]


def test_every_row_has_a_verdict():
    assert set(LOADS) | set(REFUSED) == set(ROW) and not set(LOADS) & set(REFUSED)


def verdict(name: str) -> DrafterLayout | str:
    try:
        return DrafterLayout.from_dir(write(ROW[name]))
    except DrafterConfigError as error:
        return str(error)


@pytest.mark.parametrize("name", list(LOADS))
def test_the_reader_reads_what_the_tool_wrote(name):
    layout = verdict(name)
    assert isinstance(layout, DrafterLayout), layout
    assert (layout.head, layout.lattice, layout.block_size, layout.shift_label,
            layout.confidence_head, layout.confidence_head_with_markov) == LOADS[name]
    assert (layout.mask_token_id, layout.target_layer_ids) == (511, (0, 1))
    layout.check_target(vocab=512, hidden=128, num_layers=2)


@pytest.mark.parametrize("name", list(REFUSED))
def test_the_reader_refuses_with_the_field_and_the_training_flag(name):
    assert verdict(name) == REFUSED[name]


def test_specforges_dspark_name_needs_its_nested_keys():
    """``DSparkDraftModel`` is also vLLM's DeepSeek-V4 DSpark drafter: without SpecForge's
    dflash_config.projector_type "dspark" it is refused by name, not read as DFlash."""
    raw = json.loads((write(ROW["specforge-dspark"]) / "config.json").read_text())
    del raw["dflash_config"]["projector_type"]
    with pytest.raises(DrafterConfigError, match=r"\['DSparkDraftModel'\] without "
                                                 r"dflash_config.projector_type = 'dspark'"):
        DrafterLayout.from_config(raw)


@pytest.mark.parametrize("name", [n for n, facts in LOADS.items() if facts[0]])
def test_head_weights_reach_the_names_the_loader_reads(name):
    """The head weights each tool writes, through the loader's name map, are exactly the
    head parameters the drafter builds (Model-Optimizer's flat DSpark names included)."""
    folder = write(ROW[name])
    with safe_open(folder / "model.safetensors", "pt") as weights:
        names = {bare_weight_name(n) for n in weights.keys()}
    head = {n for n in names if n.startswith(HEAD_PREFIXES)}
    expected = {
        "domino": {"prefix_gru.weight_ih_l0", "prefix_gru.weight_hh_l0",
                   "embed_proj.0.weight", "embed_proj.2.weight"},
        "markov": {"markov_head.markov_w1.weight", "markov_head.markov_w2.weight",
                   "confidence_head.proj.weight", "confidence_head.proj.bias"},
    }[LOADS[name][0]]
    assert head == expected


@pytest.mark.parametrize("name", SPECULATORS_LOADS)
def test_vllms_conversion_drops_block_size_and_the_engine_sets_it_back(name):
    """vLLM's SpeculatorsConfig (what a dartree engine's drafter config is) drops a DFlash
    or DFlash2 block_size and marks DFlash causal unless trained with
    sliding_window_non_causal: read as it is, such a config is refused (never read as block
    16); with the keys the engine sets from the checkpoint's own config.json every row
    reads as the checkpoint."""
    from vllm.transformers_utils.configs.speculators import SpeculatorsConfig

    from vllm_dartree.integration.speculative_config import set_speculators_keys

    folder = write(ROW[name])
    converted = SpeculatorsConfig.from_pretrained(str(folder))
    if LOADS[name][0] != "markov":  # vLLM's update_dspark copies block_size
        assert not hasattr(converted, "block_size")
        raw = json.loads((folder / "config.json").read_text())
        causal = converted.dflash_config["causal"]
        assert causal == (not raw["sliding_window_non_causal"])  # DFlash2's default: True
        with pytest.raises(DrafterConfigError,
                           match="dflash_config.causal" if causal else "missing block_size"):
            DrafterLayout.from_config(converted.to_dict())
    set_speculators_keys(converted, json.loads((folder / "config.json").read_text()))
    assert DrafterLayout.from_config(converted.to_dict()) == DrafterLayout.from_dir(folder)
    if LOADS[name][0] == "markov":  # our drafter's name, not vLLM's Qwen3DSparkModel
        assert converted.architectures == ["DFlashQwen3DSparkModel"]


def test_the_readme_table_is_the_verdicts():
    """Each row is named on one line of the README's per-tool table, whose dartree cell
    says what the reader says (rows with one verdict may share a line)."""
    readme = (project_root() / "README.md").read_text()
    for row in ROWS:
        lines = [line for line in readme.splitlines() if f"`{row.name}`" in line]
        assert len(lines) == 1, row.name
        cells = [cell.strip() for cell in lines[0].strip("|").split("|")]
        said = cells[3]
        if row.name in LOADS:
            assert said.startswith("loads"), (row.name, said)
        else:
            assert said.startswith("refused"), (row.name, said)
            field = next(f for f in ("layer_types", "sample_from_anchor", "causal", "use_swa")
                         if f in REFUSED[row.name])
            assert field in said, (row.name, said)


def test_train_drafter_writes_a_domino_drafter_as_model_optimizer_does():
    """``vllm-dartree train-drafter`` writes configs through DrafterLayout.to_config: for the
    layout Model-Optimizer wrote, the same architecture and the same dflash_config (which
    adds only its explicit causal = false) and top-level emb_dim."""
    folder = write(ROW["modelopt-domino"])
    theirs = json.loads((folder / "config.json").read_text())
    ours = DrafterLayout.from_dir(folder).to_config()
    assert ours["architectures"] == theirs["architectures"] == ["DFlashDraftModel"]
    assert ours["emb_dim"] == theirs["emb_dim"] and ours["block_size"] == theirs["block_size"]
    assert {k: v for k, v in theirs["dflash_config"].items() if k != "causal"} == \
        ours["dflash_config"]
    assert theirs["dflash_config"]["causal"] is False
