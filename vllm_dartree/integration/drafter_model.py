"""The drafter inside vLLM: vLLM's DFlash backbone plus, for Domino checkpoints, the GRU head.

vLLM's model registry entry ``DFlashDraftModel`` (vLLM 0.32/0.33 map it to
``qwen3_dflash.DFlashQwen3ForCausalLM``) names :class:`DARTreeDraftModel` once dartree is
active (``activation.DrafterArchitecture``). It subclasses that model:
for a z-lab DFlash checkpoint it is the stock model; for a Domino checkpoint
(``dflash_config.projector_type == "domino"``) it also loads ``prefix_gru.*`` and
``embed_proj.*`` and exposes them as a :class:`~vllm_dartree.tree.DominoHead`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from vllm.model_executor.models.qwen3_dflash import DFlashQwen3ForCausalLM

from vllm_dartree.tree import DominoHead
from vllm_dartree.tree.correction import input_gate_table

HEAD_PREFIXES = ("prefix_gru.", "embed_proj.")
LEGACY_HEAD_PREFIX = "logit_head."  # older Domino exports nest the head under this name
KNOWN_PROJECTORS = (None, "domino", "causal_v5")


@dataclass(frozen=True)
class DrafterLayout:
    """What the proposer needs to know about a drafter checkpoint."""

    block_size: int  # query slots per step: [root, mask x (block_size - 1)]
    shift_label: bool  # True: every slot predicts the next position (Domino)
    has_head: bool
    mask_token_id: int
    target_layer_ids: tuple[int, ...]
    pure_draft_prefix_len: int
    gru_hidden_dim: int | None
    emb_dim: int | None

    @property
    def num_depths(self) -> int:
        """Drafted positions per step: 16 for b16 Domino, 15 for b16 z-lab DFlash."""
        return self.block_size if self.shift_label else self.block_size - 1


class DrafterConfigError(ValueError):
    """A drafter checkpoint that cannot serve the requested target or settings."""


def read_layout(hf_config: Any, *, target_vocab: int, target_hidden: int,
                target_layers: int) -> DrafterLayout:
    """Validate a drafter ``config.json`` against its target; name the field on error."""
    def get(name: str, default: Any = None) -> Any:
        return getattr(hf_config, name, default)

    dflash = dict(get("dflash_config") or {})
    projector = dflash.get("projector_type")
    if projector not in KNOWN_PROJECTORS:
        raise DrafterConfigError(
            f"drafter config dflash_config.projector_type = {projector!r} is not supported; "
            "allowed: absent (z-lab DFlash) or 'domino'"
        )
    has_head = projector in ("domino", "causal_v5")
    if "mask_token_id" not in dflash and get("mask_token_id") is None:
        raise DrafterConfigError(
            "drafter config is missing dflash_config.mask_token_id (the id fed to the masked "
            "block slots, e.g. 151669 for Qwen3)"
        )
    mask_token_id = int(dflash.get("mask_token_id", get("mask_token_id")))
    vocab = get("vocab_size")
    if vocab != target_vocab:
        raise DrafterConfigError(
            f"drafter config vocab_size = {vocab} does not match the target's {target_vocab}"
        )
    if not 0 <= mask_token_id < target_vocab:
        raise DrafterConfigError(
            f"drafter config dflash_config.mask_token_id = {mask_token_id} is outside the "
            f"target's embedding (0..{target_vocab - 1})"
        )
    hidden = get("hidden_size")
    if hidden != target_hidden:
        raise DrafterConfigError(
            f"drafter config hidden_size = {hidden} does not match the target's {target_hidden}"
        )
    layer_ids = tuple(int(i) for i in dflash.get("target_layer_ids") or ())
    if not layer_ids:
        raise DrafterConfigError("drafter config is missing dflash_config.target_layer_ids")
    bad = [i for i in layer_ids if not 0 <= i < target_layers]
    if bad:
        raise DrafterConfigError(
            f"drafter config dflash_config.target_layer_ids = {list(layer_ids)} has {bad} "
            f"outside the target's layers 0..{target_layers - 1}"
        )
    block_size = int(get("block_size", 16) or 16)
    if block_size < 2:
        raise DrafterConfigError(f"drafter config block_size = {block_size} must be >= 2")
    shift = bool(dflash.get("shift_label", False))
    gru = dflash.get("gru_hidden_dim")
    emb = dflash.get("emb_dim", get("emb_dim"))
    if has_head and (gru is None or emb is None):
        raise DrafterConfigError(
            "Domino drafter config needs dflash_config.gru_hidden_dim and emb_dim "
            f"(got gru_hidden_dim={gru!r}, emb_dim={emb!r})"
        )
    return DrafterLayout(
        block_size=block_size,
        shift_label=shift,
        has_head=has_head,
        mask_token_id=mask_token_id,
        target_layer_ids=layer_ids,
        pure_draft_prefix_len=int(dflash.get("pure_draft_prefix_len", 0)),
        gru_hidden_dim=None if gru is None else int(gru),
        emb_dim=None if emb is None else int(emb),
    )


class DARTreeDraftModel(DFlashQwen3ForCausalLM):
    """vLLM's DFlash drafter, plus the Domino correction head when the checkpoint has one."""

    def __init__(self, *, vllm_config, prefix: str = ""):
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        dflash = dict(getattr(self.config, "dflash_config", None) or {})
        self.has_domino_head = dflash.get("projector_type") in ("domino", "causal_v5")
        self.pure_draft_prefix_len = int(dflash.get("pure_draft_prefix_len", 0))
        if self.has_domino_head:
            hidden = self.config.hidden_size
            state = int(dflash["gru_hidden_dim"])
            emb = int(dflash.get("emb_dim", getattr(self.config, "emb_dim", 0)))
            dtype = vllm_config.model_config.dtype
            self.prefix_gru = nn.GRU(hidden, state, num_layers=1, bias=False, batch_first=True,
                                     dtype=dtype)
            self.embed_proj = nn.Sequential(
                nn.Linear(hidden + state, emb, bias=False, dtype=dtype),
                nn.SiLU(),
                nn.Linear(emb, self.config.vocab_size, bias=False, dtype=dtype),
            )

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]):
        head: dict[str, torch.Tensor] = {}

        def backbone_only():
            for name, tensor in weights:
                name = name.removeprefix(LEGACY_HEAD_PREFIX)
                if name.startswith(HEAD_PREFIXES):
                    head[name] = tensor
                else:
                    yield name, tensor

        loaded = super().load_weights(backbone_only())
        if self.has_domino_head:
            expected = dict(self.prefix_gru.named_parameters(prefix="prefix_gru")) | dict(
                self.embed_proj.named_parameters(prefix="embed_proj")
            )
            missing = sorted(set(expected) - set(head))
            if missing:
                raise DrafterConfigError(f"Domino drafter checkpoint lacks weights {missing}")
            for name, param in expected.items():
                if tuple(head[name].shape) != tuple(param.shape):
                    raise DrafterConfigError(
                        f"Domino drafter weight {name} has shape {list(head[name].shape)}, "
                        f"expected {list(param.shape)}"
                    )
                with torch.no_grad():
                    param.copy_(head[name].to(param.dtype))
        elif head:
            raise DrafterConfigError(
                f"drafter checkpoint has head weights {sorted(head)[:2]}... but its config "
                "does not set dflash_config.projector_type = 'domino'"
            )
        return loaded

    def correction_head(self) -> DominoHead | None:
        """The Domino head with its [V, 3G] input-gate table over the full vocabulary, or
        None for z-lab DFlash. The table is built through the embedding module's forward:
        under tensor parallelism each rank holds a vocabulary shard of the (shared, target)
        embedding, and the forward gathers every row from the ranks."""
        if not self.has_domino_head:
            return None
        return DominoHead(
            embed=None,
            gru_ih=self.prefix_gru.weight_ih_l0,
            gru_hh=self.prefix_gru.weight_hh_l0,
            proj0=self.embed_proj[0].weight,
            proj2=self.embed_proj[2].weight,
            pure_draft_prefix_len=self.pure_draft_prefix_len,
            input_gate_table=input_gate_table(self.model.embed_tokens,
                                              self.prefix_gru.weight_ih_l0,
                                              self.config.vocab_size),
        )
