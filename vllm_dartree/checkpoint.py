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
# Domino's projector names (DARTree normalises its older alias "causal_v5" to "domino").
HEAD_OF_PROJECTOR = {None: None, "domino": "domino", "causal_v5": "domino"}


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
    block_size: int = 16  # query slots per step: [root, mask x (block_size - 1)]
    shift_label: bool = False  # absent: z-lab's non-shift layout
    head: str | None = None  # absent projector_type: no correction head (z-lab DFlash)
    gru_hidden_dim: int | None = None  # Domino head: GRU state size G
    emb_dim: int | None = None  # Domino head: projection size E
    # Absent means 0 in Domino's and DARTree's reference code; the released b16 Domino
    # configs set 1 (depth 1 uncorrected).
    pure_draft_prefix_len: int = 0
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
    def num_depths(self) -> int:
        """Positions one drafter forward drafts: 16 for b16 Domino, 15 for b16 z-lab DFlash."""
        return self.block_size if self.shift_label else self.block_size - 1

    # ------------------------------------------------------------------------- reading
    @classmethod
    def from_config(cls, config: dict[str, Any]) -> DrafterLayout:
        """Read a drafter ``config.json`` (released, or written by :meth:`to_config`);
        every error names the field and what is allowed."""
        dflash = dict(config.get("dflash_config") or {})
        projector = dflash.get("projector_type")
        if projector not in HEAD_OF_PROJECTOR:
            raise DrafterConfigError(
                f"drafter config dflash_config.projector_type = {projector!r} is not "
                "supported; allowed: absent (z-lab DFlash) or 'domino'")
        mask = dflash.get("mask_token_id", config.get("mask_token_id"))
        if mask is None:
            raise DrafterConfigError(
                "drafter config is missing dflash_config.mask_token_id (the id fed to the "
                "masked block slots, e.g. 151669 for Qwen3)")
        layer_ids = tuple(int(i) for i in dflash.get("target_layer_ids") or ())
        if not layer_ids:
            raise DrafterConfigError("drafter config is missing dflash_config.target_layer_ids")
        block = int(config.get("block_size") or cls.block_size)
        if block < 2:
            raise DrafterConfigError(f"drafter config block_size = {block} must be >= 2")
        head = HEAD_OF_PROJECTOR[projector]
        gru, emb = dflash.get("gru_hidden_dim"), dflash.get("emb_dim", config.get("emb_dim"))
        if head and (gru is None or emb is None):
            raise DrafterConfigError(
                "Domino drafter config needs dflash_config.gru_hidden_dim and emb_dim "
                f"(got gru_hidden_dim={gru!r}, emb_dim={emb!r})")
        unsupported = {
            "is_causal / dflash_config.causal": config.get("is_causal") or dflash.get("causal"),
            "dflash_config.use_swa": dflash.get("use_swa"),
            "sliding_attention layers": "sliding_attention" in (config.get("layer_types") or ()),
        }
        found = [name for name, value in unsupported.items() if value]
        if found:
            raise DrafterConfigError(
                f"drafter config sets {', '.join(found)}: causal or sliding-window DFlash "
                "drafters are not supported (allowed: full non-causal block attention)")
        heads = config["num_attention_heads"]
        rope = config.get("rope_parameters") or {}
        return cls(
            vocab_size=int(config["vocab_size"]),
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
            shift_label=bool(dflash.get("shift_label", cls.shift_label)),
            head=head,
            gru_hidden_dim=None if gru is None else int(gru),
            emb_dim=None if emb is None else int(emb),
            pure_draft_prefix_len=int(dflash.get("pure_draft_prefix_len",
                                                 cls.pure_draft_prefix_len)),
            rms_norm_eps=float(config.get("rms_norm_eps", cls.rms_norm_eps)),
            rope_theta=float(config.get("rope_theta", rope.get("rope_theta", cls.rope_theta))),
            max_position_embeddings=int(config.get("max_position_embeddings",
                                                   cls.max_position_embeddings)),
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
        """``config.json`` in the released format (Domino when the layout has a head)."""
        dflash: dict[str, Any] = {"mask_token_id": self.mask_token_id,
                                  "target_layer_ids": list(self.target_layer_ids)}
        config: dict[str, Any] = {
            "architectures": [ARCHITECTURE],
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
            "dflash_config": dflash,
        }
        if self.shift_label:
            dflash["shift_label"] = True
        if self.has_head:
            dflash |= {"projector_type": self.head,
                       "pure_draft_prefix_len": self.pure_draft_prefix_len,
                       "gru_hidden_dim": self.gru_hidden_dim, "emb_dim": self.emb_dim}
            config["emb_dim"] = self.emb_dim
        return config

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))
