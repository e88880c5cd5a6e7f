"""The drafter inside vLLM: vLLM's DFlash backbone plus the checkpoint's correction head.

vLLM's model registry entries ``DFlashDraftModel`` (vLLM 0.32/0.33 map it to
``qwen3_dflash.DFlashQwen3ForCausalLM``) and ``DFlashQwen3DSparkModel`` (the name vLLM gives a
``Qwen3DSparkModel`` checkpoint carried as method "dflash"; unregistered in vLLM) name
:class:`DARTreeDraftModel` once dartree is active (``activation.DrafterArchitecture``,
``activation.DSparkDrafterArchitecture``). It subclasses that model, whose loader already
handles what DSpark shares with DFlash (the backbone, optional own ``embed_tokens`` /
``lm_head``, ``d2t`` for a reduced draft vocabulary, ``t2d`` skipped, ``mask_embedding``
dropped). For a z-lab DFlash checkpoint it is the stock model; a Domino checkpoint
(``dflash_config.projector_type == "domino"``) adds ``prefix_gru.*`` and ``embed_proj.*``,
exposed as a :class:`~vllm_dartree.tree.DominoHead`; a DSpark checkpoint adds
``markov_head.markov_w1/w2``, exposed as a :class:`~vllm_dartree.tree.MarkovHead`, and an
optional ``confidence_head.proj`` (:meth:`chain_confidence`, adaptive verification's
acceptance estimate). Names and
shapes are those of vLLM's ``qwen3_dspark.Qwen3DSparkForCausalLM.load_weights``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn
from vllm.model_executor.models.qwen3_dflash import DFlashQwen3ForCausalLM

from vllm_dartree.checkpoint import (
    DOMINO,
    HEAD_PREFIXES,
    MARKOV,
    DrafterConfigError,
    DrafterLayout,
    bare_weight_name,
)
from vllm_dartree.tree import CorrectionHead, DominoHead, MarkovHead
from vllm_dartree.tree.correction import input_gate_table


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
    """vLLM's DFlash drafter, plus the checkpoint's correction head (Domino or Markov)."""

    def __init__(self, *, vllm_config, prefix: str = ""):
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        self.layout = DrafterLayout.from_config(hf_config_dict(self.config))
        self.has_domino_head = self.layout.head == DOMINO
        self.has_confidence_head = False  # set when the weights load (vLLM drops an absent one)
        self._column_order: tuple[torch.Tensor | None, torch.Tensor] | None = None
        self.pure_draft_prefix_len = self.layout.pure_draft_prefix_len
        dtype = vllm_config.model_config.dtype
        if self.has_domino_head:
            hidden = self.config.hidden_size
            state, emb = self.layout.gru_hidden_dim, self.layout.emb_dim
            self.prefix_gru = nn.GRU(hidden, state, num_layers=1, bias=False, batch_first=True,
                                     dtype=dtype)
            self.embed_proj = nn.Sequential(
                nn.Linear(hidden + state, emb, bias=False, dtype=dtype),
                nn.SiLU(),
                nn.Linear(emb, self.config.vocab_size, bias=False, dtype=dtype),
            )
        if self.layout.head == MARKOV:
            self.dspark_heads = _dspark_modules(self.layout, dtype)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]):
        head: dict[str, torch.Tensor] = {}
        backbone_names: set[str] = set()

        def backbone_only():
            for name, tensor in weights:
                name = bare_weight_name(name)
                if name.startswith(HEAD_PREFIXES):
                    head[name] = tensor
                else:
                    backbone_names.add(name)
                    yield name, tensor

        loaded = super().load_weights(backbone_only())
        expected = self._head_parameters()
        if not expected and head:
            raise DrafterConfigError(
                f"drafter checkpoint has head weights {sorted(head)[:2]}... but its config "
                "names no correction head (dflash_config.projector_type = 'domino', or a "
                "Qwen3DSparkModel config with markov_rank)")
        self._check_reduced_vocab(backbone_names)
        optional = {name for name in expected if name.startswith("confidence_head.")}
        missing = sorted(set(expected) - set(head) - optional)
        if missing:
            raise DrafterConfigError(f"{self.layout.head} drafter checkpoint lacks weights "
                                     f"{missing}")
        for name, param in expected.items():
            if name not in head:  # an absent confidence head: vLLM drops it too
                continue
            if tuple(head[name].shape) != tuple(param.shape):
                raise DrafterConfigError(
                    f"{self.layout.head} drafter weight {name} has shape "
                    f"{list(head[name].shape)}, expected {list(param.shape)}")
            with torch.no_grad():
                param.copy_(head[name].to(param.dtype))
        # Like vLLM: a confidence head the config enables but the checkpoint lacks is absent.
        self.has_confidence_head = "confidence_head.proj.weight" in head
        return loaded

    def _head_parameters(self) -> dict[str, nn.Parameter]:
        """The head's parameters by their checkpoint names."""
        if self.has_domino_head:
            return dict(self.prefix_gru.named_parameters(prefix="prefix_gru")) | dict(
                self.embed_proj.named_parameters(prefix="embed_proj"))
        if self.layout.head == MARKOV:
            return dict(self.dspark_heads.named_parameters())
        return {}

    def _check_reduced_vocab(self, names: set[str]) -> None:
        """vLLM's DSpark loader: a reduced draft vocabulary needs its own lm_head (the
        target's has V rows) and d2t (to map draft ids to target ids)."""
        if not self.layout.has_reduced_vocab:
            return
        for weight, why in (("lm_head.weight", "the target's lm_head cannot be shared"),
                            ("d2t", "draft ids cannot be mapped to target ids")):
            if weight not in names:
                raise DrafterConfigError(
                    f"drafter config draft_vocab_size = {self.layout.draft_vocab_size} < "
                    f"vocab_size = {self.layout.vocab_size}, but the checkpoint has no "
                    f"{weight}: {why}")

    def correction_head(self) -> CorrectionHead | None:
        """The checkpoint's head for the tree core, or None for z-lab DFlash."""
        if self.layout.head == MARKOV:
            return self._markov_head()
        if not self.has_domino_head:
            return None
        return self._domino_head()

    def _domino_head(self) -> DominoHead:
        """The Domino head with its [V, 3G] input-gate table over the full vocabulary. The
        table is built through the embedding module's forward: under tensor parallelism each
        rank holds a vocabulary shard of the (shared, target) embedding, and the forward
        gathers every row from the ranks."""
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

    def draft_logits(self, hidden_states: torch.Tensor, min_columns: int = 1
                     ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits [N, V'] and the target id of each column [V'] (ascending), or over the
        target's vocabulary [N, V] and None.

        vLLM's ``compute_logits`` scatters a reduced head's V' logits into a [N, V] row of
        -inf, which every top-K then scans; the tree core takes the V' columns and their
        ids instead. Columns go in ascending target id so that ties break as they would
        over the full row (the lower id first). A head with fewer than ``min_columns``
        columns (the tree's top-K or budget) still gets the full row: there the tree picks
        -inf columns too.
        """
        logits = self.logits_processor(self.lm_head, hidden_states)
        if self.draft_id_to_target_id is None:
            return logits, None
        if self._column_order is None:  # d2t is loaded with the weights: read it once
            ids = (torch.arange(logits.shape[-1], device=logits.device)
                   + self.draft_id_to_target_id.data)
            order = None if bool((ids[1:] > ids[:-1]).all()) else torch.argsort(ids)
            self._column_order = (order, ids if order is None else ids[order])
        order, ids = self._column_order
        if ids.numel() < min_columns:
            full = logits.new_full((logits.shape[0], self.config.vocab_size), float("-inf"))
            full[:, ids] = logits if order is None else logits[:, order]
            return full, None
        return (logits if order is None else logits[:, order]), ids

    def chain_confidence(self, depth_hidden: torch.Tensor, previous_tokens: torch.Tensor
                         ) -> torch.Tensor | None:
        """[R, D] DSpark's confidence head on the chain: the probability that depth d's
        token is accepted given every earlier one was (``depth_hidden`` [R, D, H], the
        chain's previous token per depth [R, D], root first); None without the head."""
        if not self.has_confidence_head:
            return None
        features = depth_hidden.float()
        if self.layout.confidence_head_with_markov:
            previous = self.dspark_heads.markov_head.markov_w1(previous_tokens)
            features = torch.cat([features, previous.float()], dim=-1)
        return torch.sigmoid(self.dspark_heads.confidence_head.proj(features).squeeze(-1))

    def _markov_head(self) -> MarkovHead:
        """The Markov head; with a reduced draft vocabulary, markov_w2's rows are looked up
        through the inverse of d2t (the tree core works on target ids)."""
        rows = None
        if self.layout.has_reduced_vocab:
            rows = MarkovHead.draft_rows_from_d2t(self.draft_id_to_target_id.data,
                                                  self.layout.vocab_size)
        markov = self.dspark_heads.markov_head
        return MarkovHead(markov_w1=markov.markov_w1.weight, markov_w2=markov.markov_w2.weight,
                          scale=self.layout.logit_scale, draft_row_of_target=rows)


def _dspark_modules(layout: DrafterLayout, dtype: torch.dtype) -> nn.Module:
    """Parameters named as in a DSpark checkpoint: markov_head.markov_w1.weight [V, r],
    markov_head.markov_w2.weight [V', r] and, with a confidence head,
    confidence_head.proj.weight [1, H (+ r)] and .bias [1] (float32, as vLLM keeps it).
    Replicated on every rank, as in vLLM (the head runs per draft position)."""
    rank = layout.markov_rank
    heads = nn.Module()
    heads.markov_head = nn.Module()
    heads.markov_head.markov_w1 = nn.Embedding(layout.vocab_size, rank, dtype=dtype)
    heads.markov_head.markov_w2 = nn.Linear(rank, layout.output_vocab_size, bias=False,
                                            dtype=dtype)
    if layout.confidence_head:
        features = layout.hidden_size + (rank if layout.confidence_head_with_markov else 0)
        heads.confidence_head = nn.Module()
        heads.confidence_head.proj = nn.Linear(features, 1, bias=True, dtype=torch.float32)
    return heads
