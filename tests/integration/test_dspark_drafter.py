"""DSpark checkpoints (deepseek-ai/dspark_qwen3_*_block7) in our vLLM drafter, without an engine.

Names and shapes are those vLLM's own loader expects (vLLM 0.32/0.33
``model_executor/models/qwen3_dspark.py``: ``Qwen3DSparkForCausalLM.load_weights`` prefixes
every name but ``lm_head`` with ``model.``; the heads are ``model.markov_head.markov_w1``
[V, r], ``model.markov_head.markov_w2`` [V', r] and ``model.confidence_head.proj`` [1, H (+ r)]
with a bias; ``d2t`` [V'] becomes ``draft_id_to_target_id``; ``t2d`` is skipped). The released
8B sizes are checked on the meta device; loading and its errors on a small CPU drafter whose
vLLM backbone is stubbed (its loader needs a live engine config).
"""

from __future__ import annotations

from types import SimpleNamespace

import dflash_reference as ref
import pytest
import torch
from torch import nn

from vllm_dartree.checkpoint import DrafterConfigError
from vllm_dartree.config import carried_settings
from vllm_dartree.integration import drafter_model
from vllm_dartree.integration.drafter_model import DARTreeDraftModel, read_layout
from vllm_dartree.tree import MarkovHead

VOCAB, MASK, LAYER_IDS, RANK = 151936, 151669, [1, 9, 17, 25, 33], 256
HIDDEN, INTERMEDIATE = 4096, 12288  # Qwen3-8B


def dspark_config(vocab=VOCAB, hidden=HIDDEN, intermediate=INTERMEDIATE, rank=RANK, heads=32,
                  kv_heads=8, head_dim=128, layers=5, **changes) -> dict:
    """DeepSpec's build_draft_config output for Qwen3 (config/dspark/dspark_qwen3_8b.py)."""
    return {"architectures": ["Qwen3DSparkModel"], "model_type": "qwen3", "vocab_size": vocab,
            "hidden_size": hidden, "intermediate_size": intermediate,
            "num_hidden_layers": layers, "num_attention_heads": heads,
            "num_key_value_heads": kv_heads, "head_dim": head_dim, "hidden_act": "silu",
            "rms_norm_eps": 1e-6, "rope_theta": 1_000_000, "attention_bias": False,
            "tie_word_embeddings": False, "num_target_layers": 36, "block_size": 7,
            "layer_types": ["full_attention"] * layers, "mask_token_id": MASK % vocab,
            "target_layer_ids": LAYER_IDS[: min(layers, 5)], "num_anchors": 512,
            "enable_confidence_head": True, "confidence_head_with_markov": True,
            "markov_rank": rank, "markov_head_type": "vanilla"} | changes


def head_names(vocab=VOCAB, hidden=HIDDEN, rank=RANK, draft_vocab=None) -> dict:
    draft_vocab = draft_vocab or vocab
    return {"markov_head.markov_w1.weight": (vocab, rank),
            "markov_head.markov_w2.weight": (draft_vocab, rank),
            "confidence_head.proj.weight": (1, hidden + rank),
            "confidence_head.proj.bias": (1,)}


def hf_config(raw: dict):
    """The config as a dartree engine sees it: transformers' Qwen3Config with the extra keys,
    renamed DFlashQwen3DSparkModel by vLLM's EAGLEConfig (method "dflash")."""
    from transformers import Qwen3Config

    config = Qwen3Config(**raw)
    config.architectures = ["DFlash" + raw["architectures"][0]]
    return config


def build_our_drafter(raw: dict, monkeypatch, device: str = "meta") -> DARTreeDraftModel:
    """DARTreeDraftModel's own head construction; vLLM's backbone constructor and loader are
    stubbed (the loader stub keeps d2t as vLLM does, as draft_id_to_target_id)."""
    config = hf_config(raw)

    def backbone_stub(self, *, vllm_config, prefix=""):
        nn.Module.__init__(self)
        self.config = config

    def loader_stub(self, weights):
        names = set()
        for name, tensor in weights:
            names.add(name)
            if name == "d2t":
                self.draft_id_to_target_id = nn.Parameter(tensor, requires_grad=False)
        return names

    monkeypatch.setattr(drafter_model.DFlashQwen3ForCausalLM, "__init__", backbone_stub)
    monkeypatch.setattr(drafter_model.DFlashQwen3ForCausalLM, "load_weights", loader_stub)
    vllm_config = SimpleNamespace(model_config=SimpleNamespace(dtype=torch.float32))
    with torch.device(device):
        return DARTreeDraftModel(vllm_config=vllm_config)


@pytest.mark.parametrize("draft_vocab", [None, 32000], ids=["full-vocab", "reduced-vocab"])
def test_released_dspark_config_and_names(draft_vocab, monkeypatch):
    """read_layout accepts the released config against a Qwen3-8B target; our drafter's head
    parameters and the independent reference's are the released names and shapes."""
    raw = dspark_config(**({"draft_vocab_size": draft_vocab} if draft_vocab else {}))
    layout = read_layout(hf_config(raw), target_vocab=VOCAB, target_hidden=HIDDEN,
                         target_layers=36)
    assert (layout.head, layout.markov_rank, layout.num_depths) == ("markov", RANK, 7)
    expected = head_names(draft_vocab=draft_vocab)
    ours = build_our_drafter(raw, monkeypatch)
    assert {n: tuple(p.shape) for n, p in ours._head_parameters().items()} == expected
    assert ours.dspark_heads.confidence_head.proj.weight.dtype == torch.float32
    cfg = ref.ReferenceConfig.from_dict(raw)
    with torch.device("meta"):
        reference = ref.DFlashDraftModel(cfg)
    shapes = {n: tuple(t.shape) for n, t in reference.state_dict().items()}
    assert {n: s for n, s in shapes.items() if n.startswith(("markov", "confid"))} == expected
    output_rows = draft_vocab or VOCAB
    assert shapes["lm_head.weight"] == (output_rows, HIDDEN)
    assert shapes["embed_tokens.weight"] == (VOCAB, HIDDEN)
    if draft_vocab:
        assert (shapes["d2t"], shapes["t2d"]) == ((draft_vocab,), (VOCAB,))


# ------------------------------------------------------------------- loading (small, CPU)
SMALL = {"vocab": 64, "hidden": 32, "intermediate": 64, "rank": 4, "heads": 2, "kv_heads": 1,
         "head_dim": 16, "layers": 1}


def small_weights(draft_vocab: int | None = None) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    weights = {name: torch.randn(*shape, generator=gen) for name, shape in
               head_names(SMALL["vocab"], SMALL["hidden"], SMALL["rank"], draft_vocab).items()}
    weights |= {"fc.weight": torch.zeros(32, 32), "lm_head.weight": torch.zeros(
        draft_vocab or 64, 32)}
    if draft_vocab:
        kept = torch.arange(0, 2 * draft_vocab, 2)
        weights["d2t"] = kept - torch.arange(draft_vocab)
        weights["t2d"] = torch.zeros(64, dtype=torch.bool).index_fill(0, kept, True)
    return weights


@pytest.mark.parametrize("draft_vocab", [None, 20], ids=["full-vocab", "reduced-vocab"])
def test_loaded_markov_head_is_the_checkpoints(draft_vocab, monkeypatch):
    raw = dspark_config(**SMALL, **({"draft_vocab_size": draft_vocab} if draft_vocab else {}))
    ours = build_our_drafter(raw, monkeypatch, device="cpu")
    weights = small_weights(draft_vocab)
    ours.load_weights(iter(weights.items()))
    head = ours.correction_head()
    assert isinstance(head, MarkovHead) and ours.has_confidence_head
    assert torch.equal(head.markov_w1, weights["markov_head.markov_w1.weight"])
    assert torch.equal(head.markov_w2, weights["markov_head.markov_w2.weight"])
    if draft_vocab:  # target id 2i is draft id i: its bias row is markov_w2[i]
        target_ids = torch.arange(0, 2 * draft_vocab, 2)
        assert torch.equal(head.candidate_weights(target_ids), head.markov_w2)
    else:
        assert head.draft_row_of_target is None


def test_an_absent_confidence_head_is_dropped_like_vllm_does(monkeypatch):
    ours = build_our_drafter(dspark_config(**SMALL), monkeypatch, device="cpu")
    weights = {n: t for n, t in small_weights().items() if not n.startswith("confidence")}
    ours.load_weights(iter(weights.items()))
    assert not ours.has_confidence_head and isinstance(ours.correction_head(), MarkovHead)


@pytest.mark.parametrize(("draft_vocab", "drop", "change", "message"), [
    (None, "markov_head.markov_w2.weight", None,
     r"markov drafter checkpoint lacks weights \['markov_head.markov_w2.weight'\]"),
    (None, None, ("markov_head.markov_w1.weight", (64, 5)),
     r"weight markov_head.markov_w1.weight has shape \[64, 5\], expected \[64, 4\]"),
    (20, "lm_head.weight", None,
     "draft_vocab_size = 20 < vocab_size = 64, but the checkpoint has no lm_head.weight"),
    (20, "d2t", None, "draft_vocab_size = 20 < vocab_size = 64, but the checkpoint has no d2t"),
])
def test_a_dspark_checkpoint_that_does_not_fit_is_refused(draft_vocab, drop, change, message,
                                                          monkeypatch):
    raw = dspark_config(**SMALL, **({"draft_vocab_size": draft_vocab} if draft_vocab else {}))
    ours = build_our_drafter(raw, monkeypatch, device="cpu")
    weights = small_weights(draft_vocab)
    weights.pop(drop, None)
    if change:
        weights[change[0]] = torch.zeros(*change[1])
    with pytest.raises(DrafterConfigError, match=message):
        ours.load_weights(iter(weights.items()))


def test_markov_weights_without_a_dspark_config_are_refused(monkeypatch):
    raw = dspark_config(**SMALL) | {"architectures": ["DFlashDraftModel"],
                                     "dflash_config": {"mask_token_id": 63,
                                                       "target_layer_ids": [0]}}
    ours = build_our_drafter(raw, monkeypatch, device="cpu")
    with pytest.raises(DrafterConfigError, match="config names no correction head"):
        ours.load_weights(iter(small_weights().items()))


# --------------------------------------------------------- engine config (no weights load)
def test_a_dspark_drafter_builds_a_dartree_engine_config(tmp_path, tiny_dspark):
    """vLLM resolves the renamed architecture to our drafter, and the V1 runner (which reads
    target layers only from dflash_config) sees DSpark's top-level target_layer_ids."""
    from test_refusals import config_only_target, engine_config

    config = engine_config(config_only_target(tmp_path, "plain"), tiny_dspark)
    draft = config.speculative_config.draft_model_config
    assert draft.architectures == ["DFlashQwen3DSparkModel"]
    assert draft.hf_config.dflash_config["target_layer_ids"] == [0, 1]
    assert draft.hf_config.dflash_config["mask_token_id"] == draft.hf_config.mask_token_id
    assert carried_settings(config.speculative_config).tree == "pruned"


@pytest.mark.parametrize(("changes", "message"), [
    ({"markov_head_type": "rnn"}, "markov_head_type = 'rnn' is not supported"),
    ({"sample_from_anchor": False}, "sample_from_anchor = False"),
    ({"markov_rank": 0}, "markov_rank = 0 is not supported"),
])
def test_an_unsupported_dspark_config_is_refused_before_weights_load(tmp_path, tiny_dspark,
                                                                     changes, message):
    import json

    from test_refusals import config_only_target, engine_config

    drafter = tmp_path / "drafter"
    drafter.mkdir()  # a config.json only: nothing can load weights
    raw = json.loads((tiny_dspark / "config.json").read_text())
    (drafter / "config.json").write_text(json.dumps(raw | changes))
    with pytest.raises(DrafterConfigError, match=message):
        engine_config(config_only_target(tmp_path, "plain"), drafter)


def test_a_trained_markov_drafter_loads_into_our_vllm_drafter(trained_tiny_dspark, monkeypatch):
    """``train-drafter --head markov`` output: its config reads as a DSpark layout against its
    target and our vLLM drafter loads its head unchanged (vLLM's backbone loader stubbed)."""
    import json

    from safetensors.torch import load_file

    from vllm_dartree.models.tiny_pair import TRAINED_TARGET as t

    _, drafter = trained_tiny_dspark
    raw = json.loads((drafter / "config.json").read_text())
    layout = read_layout(hf_config(raw), target_vocab=t.vocab_size, target_hidden=t.hidden_size,
                         target_layers=t.num_hidden_layers)
    assert (layout.head, layout.markov_rank, layout.confidence_head) == ("markov", 8, True)
    weights = load_file(str(drafter / "model.safetensors"))
    ours = build_our_drafter(raw, monkeypatch, device="cpu")
    ours.load_weights(iter(weights.items()))
    head = ours.correction_head()
    assert torch.equal(head.markov_w1, weights["markov_head.markov_w1.weight"])
    assert torch.equal(head.markov_w2, weights["markov_head.markov_w2.weight"])
    assert ours.has_confidence_head
