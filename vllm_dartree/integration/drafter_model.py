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
from typing import Any

import torch
from torch import nn
from vllm.model_executor.models.qwen3_dflash import DFlashQwen3ForCausalLM

from vllm_dartree.checkpoint import DrafterConfigError, DrafterLayout
from vllm_dartree.tree import DominoHead
from vllm_dartree.tree.correction import input_gate_table

HEAD_PREFIXES = ("prefix_gru.", "embed_proj.")
LEGACY_HEAD_PREFIX = "logit_head."  # older Domino exports nest the head under this name


def hf_config_dict(hf_config: Any) -> dict[str, Any]:
    """The drafter's config as vLLM loaded it, as the ``config.json`` dict it came from."""
    return hf_config.to_dict() if hasattr(hf_config, "to_dict") else dict(vars(hf_config))


def read_layout(hf_config: Any, *, target_vocab: int, target_hidden: int,
                target_layers: int) -> DrafterLayout:
    """The drafter's layout, checked against its target (errors name the field)."""
    layout = DrafterLayout.from_config(hf_config_dict(hf_config))
    layout.check_target(vocab=target_vocab, hidden=target_hidden, num_layers=target_layers)
    return layout


class DARTreeDraftModel(DFlashQwen3ForCausalLM):
    """vLLM's DFlash drafter, plus the Domino correction head when the checkpoint has one."""

    def __init__(self, *, vllm_config, prefix: str = ""):
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        self.layout = DrafterLayout.from_config(hf_config_dict(self.config))
        self.has_domino_head = self.layout.has_head
        self.pure_draft_prefix_len = self.layout.pure_draft_prefix_len
        if self.has_domino_head:
            hidden = self.config.hidden_size
            state, emb = self.layout.gru_hidden_dim, self.layout.emb_dim
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
