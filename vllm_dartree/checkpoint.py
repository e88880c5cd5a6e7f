"""A drafter checkpoint's ``config.json``: the one place its layout is read and written.

Two released formats share one schema (a Qwen3 config plus DFlash keys):

- z-lab DFlash (``z-lab/Qwen3-8B-DFlash-b16``): ``architectures: ["DFlashDraftModel"]``,
  ``block_size``, ``num_target_layers``, ``dflash_config: {mask_token_id,
  target_layer_ids}``; no correction head; the non-shift layout (block slot j >= 1 predicts
  its own position, so a b16 block drafts 15 depths).
- Domino (``Huang2020/Qwen3-8B-Domino-b16``): the same plus ``dflash_config:
  {projector_type: "domino", gru_hidden_dim, emb_dim, pure_draft_prefix_len, shift_label}``
  and a top-level ``emb_dim``; the shift layout (slot j predicts position root + j + 1:
  16 depths).
- DSpark (``deepseek-ai/dspark_qwen3_8b_block7``, DeepSpec's ``build_draft_config``):
  ``architectures: ["Qwen3DSparkModel"]``, a copy of the target's Qwen3 config plus
  top-level ``block_size``, ``mask_token_id``, ``target_layer_ids``, ``markov_rank``,
  ``markov_head_type``, ``enable_confidence_head``, ``confidence_head_with_markov`` and
  optionally ``draft_vocab_size`` (a reduced output vocabulary whose checkpoint ships
  ``d2t``). vLLM (``qwen3_dspark.py``, ``dspark/speculator.py``) runs it anchor-first:
  ``block_size`` query slots [root, mask x (block_size - 1)], slot j predicting position
  root + j + 1 (the shift layout) unless ``sample_from_anchor`` is false.
- vLLM's lattice drafters, a DFlash backbone whose head scores K candidates per depth and
  every transition between them (vLLM runs them on its V2 runner only):
  - DFlash2 (``architectures: ["DFlash2DraftModel"]``, ``qwen3_dflash2.py``): z-lab's layout
    plus ``dflash_config: {selector_top_k, selector_rank, conv_kernel_size,
    conv_group_size}`` (optional: ``input_embedding_scale``, ``output_multiplier``,
    ``final_logit_softcapping``);
  - LiLiCorr (``["LiLiCorrDraftModel"]``, ``lilicorr.py``): z-lab's layout plus
    ``dflash_config: {lilicorr_candidate_topk, lilicorr_num_layers, lilicorr_num_heads,
    lilicorr_hidden_size, lilicorr_mlp_ratio, lilicorr_factor_dim, lilicorr_vector_eps,
    lilicorr_logit_scale}`` (optional: the DFlash2 conv keys, both or neither).

The training tools write these formats with their own names, read here as they come
(``tests/tools/tool_writers.py`` writes each with the tool's own code):

- SpecForge 0.2.0 (``model.save_pretrained`` of its draft classes): DFlash as z-lab;
  Domino as ``architectures: ["DominoDraftModel"]`` (vLLM's method "dflash" prefixes it:
  ``DFlashDominoDraftModel``); DSpark as ``["DSparkDraftModel"]`` (``DFlashDSparkDraftModel``)
  with its keys nested in ``dflash_config`` (``projector_type: "dspark"``, ``markov_rank``,
  ``markov_head_type``, ``enable_confidence_head`` or ``confidence_head_alpha`` > 0,
  ``confidence_head_with_markov``), trained in the shift layout (its training labels slot k
  with position anchor + k + 1; its own ``spec_generate`` reads slots 1..B-1 instead, which
  the reader does not follow).
- Model-Optimizer 0.47.0 (``DFlashExporter`` and subclasses): ``["DFlashDraftModel"]`` for
  all three heads; Domino's keys as z-lab/Domino; DSpark's nested in ``dflash_config``
  (``projector_type: "dspark"``, ``shift_label``, ``markov_rank``, ``markov_head_type``,
  ``use_confidence_head``: a confidence head that always reads the Markov embedding) with
  flat head weights (``markov_w1``, ``markov_w2``, ``confidence_proj``; see
  :data:`FLAT_HEAD_NAMES`).
- speculators 0.9.0: its own ``config.json`` (``speculators_model_type`` "dflash",
  "dflash2" or "dspark", the decoder in ``transformer_layer_config``, ``block_size``,
  ``mask_token_id``, ``aux_hidden_state_layer_ids`` (hidden-state indices: target layer
  i + 1), ``sample_from_anchor``, the DSpark keys at the top level). vLLM converts it
  (``transformers_utils/configs/speculators``) into a config without ``block_size``, so the
  engine reads the checkpoint's own file (:func:`speculators_drafter_keys`).

Each field has one default, what the releases' own code takes its absence to mean (named
where it is set). The drafter in vLLM, the benchmark, training and the fixture writers all
read and write through :class:`DrafterLayout`. No vLLM import.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

ARCHITECTURE = "DFlashDraftModel"
DSPARK_ARCHITECTURE = "Qwen3DSparkModel"  # vLLM's registry name for dense Qwen3 DSpark
# ... and the name vLLM gives it when it carries the drafter as method "dflash" (EAGLEConfig
# prefixes "DFlash"), which is how a dartree engine sees the config.
DSPARK_ARCHITECTURES = (DSPARK_ARCHITECTURE, "DFlash" + DSPARK_ARCHITECTURE)
# SpecForge's class names, and vLLM's "DFlash"-prefixed names for them. Its DSpark name is
# also vLLM's DeepSeek-V4 DSpark drafter: read as SpecForge's only with its nested keys.
SPECFORGE_DOMINO_ARCHITECTURES = ("DominoDraftModel", "DFlashDominoDraftModel")
SPECFORGE_DSPARK_ARCHITECTURES = ("DSparkDraftModel", "DFlashDSparkDraftModel")
NESTED_DSPARK = "dspark"  # dflash_config.projector_type of SpecForge's and Model-Optimizer's
DOMINO, MARKOV = "domino", "markov"  # the correction-head kinds a layout can name
DFLASH2, LILICORR = "dflash2", "lilicorr"  # the lattice kinds a layout can name
# vLLM's registry names of its lattice drafters (EAGLEConfig keeps both names as they are).
LATTICE_ARCHITECTURES = {"DFlash2DraftModel": DFLASH2, "LiLiCorrDraftModel": LILICORR}
# dflash_config keys vLLM's models index without a default, per lattice kind.
LATTICE_REQUIRED_KEYS = {
    DFLASH2: ("selector_top_k", "selector_rank", "conv_kernel_size", "conv_group_size"),
    LILICORR: ("lilicorr_candidate_topk", "lilicorr_num_layers", "lilicorr_num_heads",
               "lilicorr_hidden_size", "lilicorr_mlp_ratio", "lilicorr_factor_dim",
               "lilicorr_vector_eps", "lilicorr_logit_scale"),
}
LATTICE_TOP_K_KEY = {DFLASH2: "selector_top_k", LILICORR: "lilicorr_candidate_topk"}
SUPPORTED_ARCHITECTURES = (ARCHITECTURE, DSPARK_ARCHITECTURE, *LATTICE_ARCHITECTURES,
                           *SPECFORGE_DOMINO_ARCHITECTURES, *SPECFORGE_DSPARK_ARCHITECTURES)
# speculators' model types and the vLLM architecture each one is served as.
SPECULATORS_ARCHITECTURES = {"dflash": ARCHITECTURE, "dflash2": "DFlash2DraftModel",
                             "dspark": DSPARK_ARCHITECTURE}
# speculators' training flag that gives a draft layer full (not sliding-window) attention.
SPECULATORS_FULL_ATTENTION_FLAG = "--full-attention-indices"
# Domino's projector names (DARTree normalises its older alias "causal_v5" to "domino").
HEAD_OF_PROJECTOR = {None: None, "domino": DOMINO, "causal_v5": DOMINO}
# DeepSpec's Markov head types; vLLM's Qwen3 DSpark model implements only the vanilla one.
MARKOV_HEAD_TYPES = (None, "vanilla")

# Weight names: a correction head's weights, by kind; the backbone's are vLLM's DFlash ones.
HEAD_PREFIXES = ("prefix_gru.", "embed_proj.", "markov_head.", "confidence_head.")
LEGACY_HEAD_PREFIX = "logit_head."  # older Domino exports nest the head under this name
# Model-Optimizer's DSpark head names (flat, as DeepSpec's training module names them) and
# the checkpoint names vLLM's DSpark loader and this plugin read.
FLAT_HEAD_NAMES = {"markov_w1.": "markov_head.markov_w1.",
                   "markov_w2.": "markov_head.markov_w2.",
                   "confidence_proj.": "confidence_head.proj."}
# Drafters trained beside a vision-language target (Qwen3.5/3.6) may name their backbone by
# the target's text-model path.
TEXT_MODEL_PREFIXES = ("model.language_model.", "language_model.")


def bare_weight_name(name: str) -> str:
    """A drafter checkpoint's weight name without a legacy head or text-model prefix, and
    with Model-Optimizer's flat DSpark head names nested: the name vLLM's DFlash/DSpark
    loaders and the training drafter take."""
    name = name.removeprefix(LEGACY_HEAD_PREFIX)
    for prefix in TEXT_MODEL_PREFIXES:
        if name.startswith(prefix):
            name = name[len(prefix):]
            break
    for flat, nested in FLAT_HEAD_NAMES.items():
        if name.startswith(flat):
            return nested + name[len(flat):]
    return name


class DrafterConfigError(ValueError):
    """A drafter checkpoint that cannot serve the requested target or settings."""


@dataclass(frozen=True)
class DrafterLayout:
    """Every shape and constant of a drafter checkpoint."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    target_layer_ids: tuple[int, ...]  # 0-based target layers whose outputs feed the drafter
    mask_token_id: int  # the id fed to the masked block slots (151669 for Qwen3)
    num_target_layers: int = 0  # absent: not stated (only informational)
    block_size: int = 16  # query slots per step: [root, mask x (block_size - 1)]; required
    shift_label: bool = False  # absent: z-lab's non-shift layout
    # None (z-lab DFlash: no projector_type), DOMINO or MARKOV (a DSpark checkpoint)
    head: str | None = None
    gru_hidden_dim: int | None = None  # Domino head: GRU state size G
    emb_dim: int | None = None  # Domino head: projection size E
    # Absent means 0 in Domino's and DARTree's reference code; the released b16 Domino
    # configs set 1 (depth 1 uncorrected).
    pure_draft_prefix_len: int = 0
    markov_rank: int | None = None  # Markov head: r of markov_w1 [V, r], markov_w2 [V', r]
    # DSpark's optional per-position acceptance head (absent: none, as in vLLM's loader);
    # with_markov: it also reads the Markov embedding of the previous token.
    confidence_head: bool = False
    confidence_head_with_markov: bool = False
    # Output (draft) vocabulary V' when smaller than vocab_size: the checkpoint then ships
    # d2t (draft id i -> target id i + d2t[i]) and its own lm_head. None: V' = vocab_size.
    draft_vocab_size: int | None = None
    # DFLASH2 or LILICORR: the drafter scores its own candidate lattice (no correction
    # head), lattice_top_k candidates per depth. None: the drafter gives logits only.
    lattice: str | None = None
    lattice_top_k: int | None = None
    logit_scale: float = 1.0  # LogitsProcessor scale vLLM applies to base logits and bias
    rms_norm_eps: float = 1e-6  # Qwen3Config's default
    # Absent: transformers' Qwen3Config default, which is what vLLM loads a drafter config
    # with (vLLM's own 1e6 fallback, set_default_rope_theta, applies only to configs that
    # have no rope_parameters at all, which a Qwen3Config always has).
    rope_theta: float = 10000.0
    max_position_embeddings: int = 32768  # Qwen3Config's default

    def __post_init__(self) -> None:
        object.__setattr__(self, "target_layer_ids", tuple(int(i) for i in
                                                           self.target_layer_ids))

    @property
    def has_head(self) -> bool:
        return self.head is not None

    @property
    def output_vocab_size(self) -> int:
        """V': the rows of the drafter's lm_head (and of markov_w2)."""
        return self.draft_vocab_size or self.vocab_size

    @property
    def has_reduced_vocab(self) -> bool:
        return self.output_vocab_size < self.vocab_size

    @property
    def is_dspark(self) -> bool:
        return self.head == MARKOV

    @property
    def has_lattice(self) -> bool:
        return self.lattice is not None

    @property
    def num_depths(self) -> int:
        """Positions one drafter forward drafts: 16 for b16 Domino, 15 for b16 z-lab DFlash."""
        return self.block_size if self.shift_label else self.block_size - 1

    # ------------------------------------------------------------------------- reading
    @classmethod
    def from_config(cls, config: dict[str, Any]) -> DrafterLayout:
        """Read a drafter ``config.json`` (released, or written by :meth:`to_config`);
        every error names the field, its value and what is allowed. A speculators
        ``config.json`` is read through :func:`speculators_drafter_keys`."""
        if "speculators_model_type" in config:
            config = {**(config.get("transformer_layer_config") or {}),
                      **speculators_drafter_keys(config)}
        _refuse_causal_or_sliding(config)
        architectures = config.get("architectures") or ()
        dflash = dict(config.get("dflash_config") or {})
        nested_dspark = dflash.get("projector_type") == NESTED_DSPARK
        dspark = nested_dspark or any(a in DSPARK_ARCHITECTURES for a in architectures)
        lattice = next((LATTICE_ARCHITECTURES[a] for a in architectures
                        if a in LATTICE_ARCHITECTURES), None)
        if not nested_dspark and any(a in SPECFORGE_DSPARK_ARCHITECTURES
                                     for a in architectures):
            raise DrafterConfigError(
                f"drafter config architectures = {list(architectures)} without "
                f"dflash_config.projector_type = {NESTED_DSPARK!r}: dartree reads that name "
                "as SpecForge's DSpark drafter, whose keys sit in dflash_config (vLLM's "
                "DeepSeek-V4 DSpark drafter of that name is not served)")
        _refuse_unknown_architecture(architectures, dspark or lattice is not None)
        fields_of_head = (_dspark_fields(config, nested_dspark) if dspark
                          else _lattice_fields(config, lattice) if lattice
                          else _domino_fields(config, architectures))
        # vLLM's DFlash model reads dflash_config first, then the top level (DSpark's place).
        mask = dflash.get("mask_token_id", config.get("mask_token_id"))
        if mask is None:
            raise DrafterConfigError(
                "drafter config is missing dflash_config.mask_token_id (top-level "
                "mask_token_id for DSpark): the id fed to the masked block slots, e.g. 151669 "
                "for Qwen3")
        layer_ids = tuple(int(i) for i in dflash.get("target_layer_ids")
                          or config.get("target_layer_ids") or ())
        if not layer_ids:
            raise DrafterConfigError(
                "drafter config is missing dflash_config.target_layer_ids (top-level "
                "target_layer_ids for DSpark): a non-empty list of 0-based target layers")
        if config.get("block_size") is None:
            raise DrafterConfigError(
                "drafter config is missing block_size, the query slots per draft (e.g. 16): "
                "z-lab, SpecForge, Model-Optimizer and DeepSpec write it at the top level, "
                "speculators in its own config.json (vLLM's conversion drops it); add the "
                "value the drafter was trained with")
        block = int(config["block_size"])
        if block < 2:
            raise DrafterConfigError(f"drafter config block_size = {block} must be >= 2")
        vocab = int(config["vocab_size"])
        # vLLM: getattr(config, "draft_vocab_size", None) or config.vocab_size
        draft_vocab = config.get("draft_vocab_size") or None
        if draft_vocab is not None and not 1 <= int(draft_vocab) <= vocab:
            raise DrafterConfigError(
                f"drafter config draft_vocab_size = {draft_vocab} is not allowed; it must be "
                f"in 1..vocab_size = {vocab} (a larger output vocabulary is not supported)")
        heads = config["num_attention_heads"]
        rope = config.get("rope_parameters") or {}
        return cls(
            vocab_size=vocab,
            hidden_size=int(config["hidden_size"]),
            intermediate_size=int(config["intermediate_size"]),
            num_hidden_layers=int(config["num_hidden_layers"]),
            num_attention_heads=int(heads),
            num_key_value_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or config["hidden_size"] // heads),
            target_layer_ids=layer_ids,
            mask_token_id=int(mask),
            num_target_layers=int(config.get("num_target_layers") or 0),
            block_size=block,
            draft_vocab_size=None if draft_vocab is None or int(draft_vocab) == vocab
            else int(draft_vocab),
            logit_scale=float(config.get("logit_scale", cls.logit_scale)),
            rms_norm_eps=float(config.get("rms_norm_eps", cls.rms_norm_eps)),
            rope_theta=float(config.get("rope_theta", rope.get("rope_theta", cls.rope_theta))),
            max_position_embeddings=int(config.get("max_position_embeddings",
                                                   cls.max_position_embeddings)),
            **fields_of_head,
        )

    @classmethod
    def from_dir(cls, folder: str | Path) -> DrafterLayout:
        return cls.from_config(json.loads((Path(folder) / "config.json").read_text()))

    def check_target(self, *, vocab: int, hidden: int, num_layers: int) -> None:
        """Raise unless this drafter fits a target of these sizes."""
        if self.vocab_size != vocab:
            raise DrafterConfigError(
                f"drafter config vocab_size = {self.vocab_size} does not match the target's "
                f"{vocab}")
        if not 0 <= self.mask_token_id < vocab:
            raise DrafterConfigError(
                f"drafter config dflash_config.mask_token_id = {self.mask_token_id} is outside "
                f"the target's embedding (0..{vocab - 1})")
        if self.hidden_size != hidden:
            raise DrafterConfigError(
                f"drafter config hidden_size = {self.hidden_size} does not match the target's "
                f"{hidden}")
        bad = [i for i in self.target_layer_ids if not 0 <= i < num_layers]
        if bad:
            raise DrafterConfigError(
                f"drafter config dflash_config.target_layer_ids = {list(self.target_layer_ids)}"
                f" has {bad} outside the target's layers 0..{num_layers - 1}")

    # ------------------------------------------------------------------------- writing
    def to_config(self, dtype: str = "float32") -> dict[str, Any]:
        """``config.json`` in the released format: DSpark's for a Markov head, else DFlash's
        (Domino's when the layout has a Domino head). A lattice drafter's config holds keys
        this layout does not (its selector's rank, its conv): not written here."""
        if self.has_lattice:
            raise DrafterConfigError(f"to_config writes DFlash, Domino and DSpark configs, not "
                                     f"a {self.lattice} drafter's")
        config: dict[str, Any] = {
            "architectures": [DSPARK_ARCHITECTURE if self.is_dspark else ARCHITECTURE],
            "model_type": "qwen3",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "attention_bias": False,
            "tie_word_embeddings": False,
            "torch_dtype": dtype,
            "block_size": self.block_size,
            "num_target_layers": self.num_target_layers,
        }
        if self.draft_vocab_size is not None:
            config["draft_vocab_size"] = self.draft_vocab_size
        if self.logit_scale != DrafterLayout.logit_scale:
            config["logit_scale"] = self.logit_scale
        if self.is_dspark:
            return config | self._dspark_keys()
        dflash: dict[str, Any] = {"mask_token_id": self.mask_token_id,
                                  "target_layer_ids": list(self.target_layer_ids)}
        config["dflash_config"] = dflash
        if self.shift_label:
            dflash["shift_label"] = True
        if self.has_head:
            dflash |= {"projector_type": self.head,
                       "pure_draft_prefix_len": self.pure_draft_prefix_len,
                       "gru_hidden_dim": self.gru_hidden_dim, "emb_dim": self.emb_dim}
            config["emb_dim"] = self.emb_dim
        return config

    def _dspark_keys(self) -> dict[str, Any]:
        """The top-level keys DeepSpec's build_draft_config adds to a copy of the target's
        config (sample_from_anchor only when the layout is not DSpark's anchor-first one)."""
        keys: dict[str, Any] = {
            "mask_token_id": self.mask_token_id,
            "target_layer_ids": list(self.target_layer_ids),
            "layer_types": ["full_attention"] * self.num_hidden_layers,
            "markov_rank": self.markov_rank,
            "markov_head_type": "vanilla",
            "enable_confidence_head": self.confidence_head,
        }
        if self.confidence_head:
            keys["confidence_head_with_markov"] = self.confidence_head_with_markov
        return keys

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))


# ------------------------------------------------------------------------- per format
def _refuse_unknown_architecture(architectures, known_special: bool) -> None:
    """A DFlash2, LiLiCorr or DSpark architecture this reader does not know (DFlash2's beam
    or NoPE variants, another family's DSpark) is refused by name rather than read as
    plain DFlash."""
    if known_special:
        return
    unknown = [a for a in architectures
               if any(family in a for family in ("DFlash2", "LiLiCorr", "DSpark"))]
    if unknown:
        raise DrafterConfigError(
            f"drafter config architectures = {list(architectures)} names {unknown[0]!r}, "
            f"which dartree does not read; allowed: {', '.join(SUPPORTED_ARCHITECTURES)}")


def _lattice_fields(config: dict[str, Any], lattice: str) -> dict[str, Any]:
    """Fields of a DFlash2 or LiLiCorr config: the keys vLLM's model reads without a
    default must be there, the candidate count a positive integer (a power of two <= 16 for
    LiLiCorr, as its head requires)."""
    dflash = dict(config.get("dflash_config") or {})
    if dflash.get("projector_type") is not None:
        raise DrafterConfigError(
            f"{lattice} drafter config sets dflash_config.projector_type = "
            f"{dflash['projector_type']!r}; allowed: absent (its lattice is its correction)")
    missing = [key for key in LATTICE_REQUIRED_KEYS[lattice] if key not in dflash]
    if missing:
        raise DrafterConfigError(
            f"{lattice} drafter config is missing dflash_config.{', '.join(missing)} (vLLM's "
            f"{lattice} model reads them without a default)")
    if lattice == LILICORR and not dflash.get("lilicorr_enabled", True):
        raise DrafterConfigError("LiLiCorr drafter config dflash_config.lilicorr_enabled = "
                                 "False is not supported; allowed: absent or true")
    key = LATTICE_TOP_K_KEY[lattice]
    top_k = dflash[key]
    powers = lattice != LILICORR or (top_k <= 16 and top_k & (top_k - 1) == 0)
    if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1 or not powers:
        raise DrafterConfigError(
            f"{lattice} drafter config dflash_config.{key} = {top_k!r} is not supported; "
            "allowed: a positive integer" + (" power of two <= 16" if lattice == LILICORR
                                             else ""))
    # vLLM runs both in z-lab's layout (its DFlash speculator has no shift layout).
    return {"shift_label": False, "lattice": lattice, "lattice_top_k": top_k}


def _refuse_causal_or_sliding(config: dict[str, Any]) -> None:
    dflash = dict(config.get("dflash_config") or {})
    unsupported = {
        "is_causal / dflash_config.causal": config.get("is_causal") or dflash.get("causal"),
        "dflash_config.use_swa": dflash.get("use_swa"),
        "sliding_attention layers": "sliding_attention" in (config.get("layer_types") or ()),
    }
    found = [name for name, value in unsupported.items() if value]
    if found:
        raise DrafterConfigError(
            f"drafter config sets {', '.join(found)}: causal or sliding-window DFlash "
            "drafters are not supported (allowed: full non-causal block attention; "
            "Model-Optimizer trains it with dflash_swa_window_size unset and "
            "dflash_draft_attention 'bidirectional', speculators with "
            f"{SPECULATORS_FULL_ATTENTION_FLAG} naming every draft layer)")


def _domino_fields(config: dict[str, Any], architectures) -> dict[str, Any]:
    """Head fields of a z-lab DFlash or Domino config (all under dflash_config)."""
    dflash = dict(config.get("dflash_config") or {})
    projector = dflash.get("projector_type")
    # SpecForge's DominoDraftModel sets projector_type "domino" where it is absent.
    if projector is None and any(a in SPECFORGE_DOMINO_ARCHITECTURES for a in architectures):
        projector = DOMINO
    if projector not in HEAD_OF_PROJECTOR:
        raise DrafterConfigError(
            f"drafter config dflash_config.projector_type = {projector!r} is not "
            "supported; allowed: absent (z-lab DFlash) or 'domino'")
    head = HEAD_OF_PROJECTOR[projector]
    gru, emb = dflash.get("gru_hidden_dim"), dflash.get("emb_dim", config.get("emb_dim"))
    if head and (gru is None or emb is None):
        raise DrafterConfigError(
            "Domino drafter config needs dflash_config.gru_hidden_dim and emb_dim "
            f"(got gru_hidden_dim={gru!r}, emb_dim={emb!r})")
    return {
        "shift_label": bool(dflash.get("shift_label", DrafterLayout.shift_label)),
        "head": head,
        "gru_hidden_dim": None if gru is None else int(gru),
        "emb_dim": None if emb is None else int(emb),
        "pure_draft_prefix_len": int(dflash.get("pure_draft_prefix_len",
                                                DrafterLayout.pure_draft_prefix_len)),
    }


def _dspark_fields(config: dict[str, Any], nested: bool) -> dict[str, Any]:
    """Head fields of a dense Qwen3 DSpark config: top-level keys (DeepSpec, as vLLM reads
    them), or nested in dflash_config beside projector_type "dspark" (SpecForge,
    Model-Optimizer)."""
    keys = dict(config.get("dflash_config") or {}) if nested else config
    at = "dflash_config." if nested else ""
    rank = keys.get("markov_rank")
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise DrafterConfigError(
            f"DSpark drafter config {at}markov_rank = {rank!r} is not supported; allowed: a "
            "positive integer (a DSpark drafter without a Markov head is not served here)")
    kind = keys.get("markov_head_type")
    if kind not in MARKOV_HEAD_TYPES:
        raise DrafterConfigError(
            f"DSpark drafter config {at}markov_head_type = {kind!r} is not supported; "
            "allowed: absent or 'vanilla' (the head vLLM's Qwen3 DSpark model implements)")
    # vLLM's DSparkSpeculator: getattr(hf_config, "sample_from_anchor", True)
    if not config.get("sample_from_anchor", True):
        raise DrafterConfigError(
            "DSpark drafter config sample_from_anchor = False (the speculators fill-in "
            "layout, anchor as bonus) is not supported; allowed: absent or true (dense "
            "DSpark: the anchor slot predicts the first draft token)")
    # Model-Optimizer writes its DSpark module's fixed shift_label (true); SpecForge trains
    # DSpark shifted (labels at anchor + 1 .. anchor + block_size) and writes none.
    if nested and not keys.get("shift_label", True):
        raise DrafterConfigError(
            "DSpark drafter config dflash_config.shift_label = False is not supported; "
            "allowed: absent or true (DSpark's anchor slot predicts the first draft token)")
    if not nested and (config.get("dflash_config") or {}).get("projector_type") is not None:
        raise DrafterConfigError(
            "DSpark drafter config sets dflash_config.projector_type = "
            f"{config['dflash_config']['projector_type']!r}; allowed: absent (a DSpark "
            "checkpoint's correction head is its Markov head)")
    if "use_confidence_head" in keys:
        # Model-Optimizer's DSparkModule: confidence_proj reads [hidden; markov_w1[prev]].
        confidence = bool(keys["use_confidence_head"])
        with_markov = confidence
    else:
        # SpecForge's DSparkDraftModel: enabled by default when confidence_head_alpha > 0.
        enabled = nested and float(keys.get("confidence_head_alpha") or 0.0) > 0.0
        confidence = bool(keys.get("enable_confidence_head", enabled))
        with_markov = confidence and bool(keys.get("confidence_head_with_markov", False))
    return {
        "shift_label": True,
        "head": MARKOV,
        "markov_rank": rank,
        "confidence_head": confidence,
        "confidence_head_with_markov": with_markov,
    }


def speculators_drafter_keys(config: dict[str, Any]) -> dict[str, Any]:
    """The keys of this module's schema that a speculators ``config.json`` states in its own
    names: ``DrafterLayout.from_config`` merges them over its ``transformer_layer_config``,
    and a dartree engine sets them on the config vLLM converted from it (which lacks
    ``block_size`` and marks DFlash causal unless trained with
    ``sliding_window_non_causal``). speculators trains full-attention draft layers
    bidirectionally, so such a drafter is non-causal whatever that flag says."""
    kind = config.get("speculators_model_type")
    if kind not in SPECULATORS_ARCHITECTURES:
        raise DrafterConfigError(
            f"speculators config speculators_model_type = {kind!r} is not a drafter dartree "
            f"reads; allowed: {', '.join(SPECULATORS_ARCHITECTURES)}")
    layer = dict(config.get("transformer_layer_config") or {})
    types = list(layer.get("layer_types") or ())
    sliding = [i for i, t in enumerate(types) if t == "sliding_attention"]
    if sliding:
        layers = " ".join(str(i) for i in range(len(types)))
        raise DrafterConfigError(
            f"speculators {kind} config transformer_layer_config.layer_types = {types}: "
            f"draft layers {sliding} use sliding-window attention (speculators' default), "
            "which dartree does not serve; allowed: every layer 'full_attention' (train with "
            f"{SPECULATORS_FULL_ATTENTION_FLAG} {layers})")
    for key in ("block_size", "mask_token_id", "aux_hidden_state_layer_ids"):
        if config.get(key) is None:
            raise DrafterConfigError(
                f"speculators {kind} config is missing {key} (speculators {kind} writes it; "
                "dartree does not guess it)")
    # speculators' defaults (DFlashSpeculatorConfig False, DSparkSpeculatorConfig True);
    # its config.json always states the value.
    anchor = bool(config.get("sample_from_anchor", kind == "dspark"))
    # vLLM's conversion: aux_hidden_state_layer_ids index hidden states (0: the embeddings).
    layer_ids = [int(i) - 1 for i in config["aux_hidden_state_layer_ids"]]
    keys: dict[str, Any] = {"architectures": [SPECULATORS_ARCHITECTURES[kind]],
                            "block_size": int(config["block_size"])}
    if config.get("draft_vocab_size") is not None:
        keys["draft_vocab_size"] = int(config["draft_vocab_size"])
    if kind == "dspark":
        if not anchor:
            raise DrafterConfigError(
                "speculators dspark config sample_from_anchor = False (the bonus-anchor "
                "layout) is not supported; allowed: true (speculators' DSpark default: train "
                "without --no-sample-from-anchor)")
        keys |= {"mask_token_id": config["mask_token_id"], "target_layer_ids": layer_ids,
                 "sample_from_anchor": anchor}
        keys |= {key: config[key] for key in ("markov_rank", "markov_head_type",
                                              "enable_confidence_head",
                                              "confidence_head_with_markov")
                 if config.get(key) is not None}
        return keys
    dflash: dict[str, Any] = {"mask_token_id": config["mask_token_id"],
                              "target_layer_ids": layer_ids, "causal": False}
    if kind == "dflash2":
        if anchor:
            raise DrafterConfigError(
                "speculators dflash2 config sample_from_anchor = True is not supported; "
                "allowed: false (vLLM's DFlash2 model drafts in the non-shift layout: train "
                "without --sample-from-anchor)")
        dflash |= {key: config[key] for key in LATTICE_REQUIRED_KEYS[DFLASH2] if key in config}
    elif anchor:
        dflash["shift_label"] = True  # the anchor slot predicts the first draft token
    keys["dflash_config"] = dflash
    return keys
