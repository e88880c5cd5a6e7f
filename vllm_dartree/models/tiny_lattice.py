"""Tiny drafters of vLLM's two lattice formats, written as vLLM loads them (0.32 to 0.34):

- DFlash2 (``DFlash2DraftModel`` -> ``qwen3_dflash2.DFlash2Qwen3ForCausalLM``): the DFlash
  backbone with a grouped convolution around each layer's attention and MLP
  (``layers.{i}.attention_conv`` / ``mlp_conv``: ``base_kernel`` [2, taps, H] and
  ``kernel_projection.weight`` [2 * taps * H / group, H]) and a low-rank candidate selector
  (``candidate_selector.predecessor_codebook`` / ``successor_codebook`` [V, rank],
  ``hidden_projection.weight`` [rank, H]); config keys under ``dflash_config``:
  ``conv_kernel_size``, ``conv_group_size``, ``selector_rank``, ``selector_top_k``.
- LiLiCorr (``LiLiCorrDraftModel`` -> ``lilicorr.LiLiCorrForCausalLM``): the same backbone
  (the convolution when ``conv_kernel_size`` / ``conv_group_size`` are set) with the
  LiLiCorr candidate-lattice correlator under ``lilicorr.`` (every parameter required by
  0.32's coverage check); config keys ``lilicorr_*`` under ``dflash_config``.

Both draft with the target's embedding and lm_head (no ``embed_tokens`` / ``lm_head`` in the
checkpoint, as z-lab's DFlash). The backbone's weights and config are tiny.py's DFlash
drafter's (:func:`vllm_dartree.models.tiny.drafter_weights` / ``drafter_config``); each
writer caches its output under ``.cache/models/tiny/`` keyed by its spec, as tiny.py's do.

The lattice weights are large enough that the walk is not degenerate: DFlash2's edge term
(codebooks N(0, 1), hidden projection N(0, selector_std^2)) is of the unary logits' scale, so
the best successor changes with the predecessor; LiLiCorr's scores are cosines times
``lilicorr_logit_scale``. Random drafters for a random target draft almost nothing the
target accepts: they serve the config, loading and refusal tests; acceptance is measured on
the trained pair (``models/tiny_lattice_pair.py``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import save_file

from vllm_dartree.checkpoint import DFLASH2, LILICORR
from vllm_dartree.models.tiny import (
    DrafterSpec,
    TargetSpec,
    _cached_dir,
    _normal,
    drafter_layout,
    drafter_weights,
)
from vllm_dartree.training.lattice import LatticeHeadConfig
from vllm_dartree.training.lattice import lattice_config as head_lattice_config


@dataclass(frozen=True)
class LatticeSpec:
    """A random DFlash2 or LiLiCorr drafter of shape ``head`` for ``backbone.target``."""

    backbone: DrafterSpec = field(default_factory=DrafterSpec)
    # The format and its shapes (the trainer's own description: one place for both).
    head: LatticeHeadConfig = field(default_factory=LatticeHeadConfig)
    conv_std: float = 0.1
    selector_std: float = 0.07  # edge std ~ 44 * selector_std at rank 16, H 128: ~3
    lilicorr_std: float = 0.2
    seed: int = 7

    @property
    def target(self) -> TargetSpec:
        return self.backbone.target


def lattice_config(spec: LatticeSpec) -> dict:
    """config.json: the backbone's z-lab config with the format's architecture and keys."""
    return head_lattice_config(drafter_layout(spec.backbone), spec.head)


def conv_weights(spec: LatticeSpec, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Each layer's two DFlashGroupedConv: tap 0 of the base kernel near 1 (the identity),
    the later taps and the per-row kernel projection small, so the backbone's signal stays
    and every row still mixes in the rows before it in its block."""
    hidden, taps, group = (spec.target.hidden_size, spec.head.conv_kernel_size,
                           spec.head.conv_group_size)
    if hidden % group:
        raise ValueError(f"conv_group_size {group} must divide {hidden}")
    groups = hidden // group
    weights = {}
    for i in range(spec.backbone.num_hidden_layers):
        for conv in ("attention_conv", "mlp_conv"):
            base = _normal(gen, 0.3, 2, taps, hidden)
            base[:, 0] += 1.0
            weights[f"layers.{i}.{conv}.base_kernel"] = base
            weights[f"layers.{i}.{conv}.kernel_projection.weight"] = _normal(
                gen, spec.conv_std, 2 * taps * groups, hidden)
    return weights


def selector_weights(spec: LatticeSpec, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """DFlash2's CandidateSelector: scores[p, c] = unary[c] + sum_r pred[prev_p, r] *
    (W h)[r] * succ[c, r]."""
    vocab, hidden, rank = (spec.target.vocab_size, spec.target.hidden_size,
                           spec.head.selector_rank)
    return {
        "candidate_selector.predecessor_codebook": _normal(gen, 1.0, vocab, rank),
        "candidate_selector.successor_codebook": _normal(gen, 1.0, vocab, rank),
        "candidate_selector.hidden_projection.weight": _normal(gen, spec.selector_std, rank,
                                                               hidden),
    }


def _linear(gen: torch.Generator, std: float, prefix: str, out: int, inp: int,
            ) -> dict[str, torch.Tensor]:
    return {f"{prefix}.weight": _normal(gen, std / max(1.0, (inp / 64) ** 0.5), out, inp),
            f"{prefix}.bias": _normal(gen, 0.02, out)}


def lilicorr_weights(spec: LatticeSpec, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """LiLiCorrHead's parameters by the names its loader reads (``lilicorr.`` + the head's
    own names; ReplicatedLinear and the NemotronH MLPs carry biases)."""
    model_hidden, shape = spec.target.hidden_size, spec.head
    h = shape.lilicorr_hidden_size or model_hidden
    heads, block, topk = shape.lilicorr_num_heads, spec.backbone.block_size, shape.top_k
    std, features = spec.lilicorr_std, 5
    w: dict[str, torch.Tensor] = {}
    if h != model_hidden:
        w |= _linear(gen, std * 4, "token_proj", h, model_hidden)
    w |= _linear(gen, std * 4, "pass_hidden_proj", h, model_hidden)
    w |= {"feature_norm.weight": torch.ones(features), "feature_norm.bias": torch.zeros(features)}
    w |= _linear(gen, 1.0, "feature_mlp.up_proj", h, features)
    w |= _linear(gen, std, "feature_mlp.down_proj", h, h)
    w |= {
        "slot_embedding": _normal(gen, 0.5, 1, 1, block - 1, 1, h),
        "rank_embedding": _normal(gen, 0.5, 1, 1, 1, topk, h),
        "relative_slot_bias": _normal(gen, 0.5, heads, 2 * block - 1),
        "same_slot_bias": _normal(gen, 0.5, heads),
    }
    w |= _linear(gen, std * 4, "context_proj", h, model_hidden)
    mlp = int(h * shape.lilicorr_mlp_ratio)
    for i in range(shape.lilicorr_num_layers):
        p = f"layers.{i}"
        w |= {f"{p}.attn_norm.weight": torch.ones(h), f"{p}.mlp_norm.weight": torch.ones(h),
              f"{p}.attn.in_proj_weight": _normal(gen, std, 3 * h, h),
              f"{p}.attn.in_proj_bias": torch.zeros(3 * h)}
        w |= _linear(gen, std, f"{p}.attn.out_proj", h, h)
        w |= _linear(gen, std, f"{p}.mlp.up_proj", mlp, h)
        w |= _linear(gen, std, f"{p}.mlp.down_proj", h, mlp)
    w |= {"output_norm.weight": torch.ones(h), "anchor_norm.weight": torch.ones(h)}
    w |= _linear(gen, std * 4, "factor_input_proj", h, 3 * h)
    for head in ("out_head", "in_head", "anchor_out_head"):
        w |= _linear(gen, std * 4, head, shape.lilicorr_factor_dim, h)
    return {f"lilicorr.{name}": tensor for name, tensor in w.items()}


def lattice_weights(spec: LatticeSpec) -> dict[str, torch.Tensor]:
    """The backbone's weights (tiny.py's DFlash drafter) plus the format's own."""
    if spec.backbone.domino or spec.backbone.dspark or spec.backbone.text_weight_prefix:
        raise ValueError("a lattice drafter's backbone is a plain z-lab DFlash one")
    weights = drafter_weights(spec.backbone)
    gen = torch.Generator().manual_seed(spec.seed)
    if spec.head.has_conv:
        weights |= conv_weights(spec, gen)
    if spec.head.kind == LILICORR:
        weights |= lilicorr_weights(spec, gen)
    else:
        weights |= selector_weights(spec, gen)
    return weights


def write_lattice(spec: LatticeSpec) -> Path:
    def write(out: Path) -> None:
        weights = {name: t.contiguous() for name, t in lattice_weights(spec).items()}
        save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
        (out / "config.json").write_text(json.dumps(lattice_config(spec), indent=2))

    return _cached_dir(spec.head.kind, spec, write)


def write_tiny_lattice(kind: str, target_spec: TargetSpec | None = None, *,
                       block_size: int = 16, **shape) -> Path:
    """A random ``kind`` (DFLASH2 or LILICORR) drafter for ``target_spec`` (``shape``:
    :class:`LatticeHeadConfig` fields); serve a LiLiCorr one with 1 <= num_speculative_tokens
    < ``block_size``."""
    backbone = DrafterSpec(target=target_spec or TargetSpec(), block_size=block_size)
    head = LatticeHeadConfig(kind=kind, **({"lilicorr_conv": True} if kind == LILICORR else {})
                             | shape)
    return write_lattice(LatticeSpec(backbone=backbone, head=head))


def write_tiny_dflash2(target_spec: TargetSpec | None = None, **settings) -> Path:
    return write_tiny_lattice(DFLASH2, target_spec, **settings)


def write_tiny_lilicorr(target_spec: TargetSpec | None = None, **settings) -> Path:
    return write_tiny_lattice(LILICORR, target_spec, **settings)
