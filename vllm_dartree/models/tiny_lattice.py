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
``lilicorr_logit_scale``. The target is near-chaotic (nothing to predict from a random
drafter), so the writers fit a frequency prior: the final norm weight makes the mask rows'
top-4 candidates the 4 tokens the target emits most (measured on prompts of another seed:
about 4% of its greedy tokens); the walk then picks among them by the previous token / the
lattice, so a few drafts are accepted.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import save_file

from vllm_dartree.models.tiny import (
    DrafterSpec,
    TargetSpec,
    _cached_dir,
    _normal,
    drafter_config,
    drafter_weights,
)

DFLASH2_ARCHITECTURE = "DFlash2DraftModel"
LILICORR_ARCHITECTURE = "LiLiCorrDraftModel"


@dataclass(frozen=True)
class LatticeSpec:
    """A DFlash2 or LiLiCorr drafter for ``backbone.target``."""

    backbone: DrafterSpec = field(default_factory=DrafterSpec)
    lilicorr: bool = False
    # The grouped convolution (DFlash2 always; LiLiCorr when both are > 0).
    conv_kernel_size: int = 3
    conv_group_size: int = 32
    conv_std: float = 0.1
    # DFlash2's candidate selector.
    selector_rank: int = 16
    selector_top_k: int = 4
    selector_std: float = 0.07  # edge std ~ 44 * selector_std at rank 16, H 128: ~3
    # LiLiCorr's correlator.
    lilicorr_hidden_size: int = 64
    lilicorr_num_heads: int = 2
    lilicorr_num_layers: int = 1
    lilicorr_mlp_ratio: float = 2.0
    lilicorr_factor_dim: int = 16
    lilicorr_candidate_topk: int = 4
    lilicorr_logit_scale: float = 8.0
    lilicorr_vector_eps: float = 1e-6
    lilicorr_std: float = 0.2
    # A frequency prior (see :func:`frequent_target_tokens`): the backbone's final norm weight
    # is fitted so that, for the mask rows, the target's lm_head ranks these tokens first
    # (the candidates); empty: tiny.py's norm weight (ones).
    prior_tokens: tuple[int, ...] = ()
    prior_logit: float = 5.0  # the fitted logits' mean magnitude scale
    seed: int = 7

    @property
    def target(self) -> TargetSpec:
        return self.backbone.target

    @property
    def has_conv(self) -> bool:
        return self.conv_kernel_size > 0 and self.conv_group_size > 0

    @property
    def kind(self) -> str:
        return "lilicorr" if self.lilicorr else "dflash2"


def lattice_config(spec: LatticeSpec) -> dict:
    """config.json: tiny.py's DFlash config (block_size top-level, mask_token_id and
    target_layer_ids under dflash_config) with the format's architecture and keys."""
    config = drafter_config(spec.backbone)
    dflash = config["dflash_config"]
    # LiLiCorr reads dflash_config.block_size before the top-level one: both say the same.
    dflash["block_size"] = spec.backbone.block_size
    if spec.has_conv:
        dflash |= {"conv_kernel_size": spec.conv_kernel_size,
                   "conv_group_size": spec.conv_group_size}
    if spec.lilicorr:
        config["architectures"] = [LILICORR_ARCHITECTURE]
        dflash |= {
            "lilicorr_enabled": True,
            "lilicorr_hidden_size": spec.lilicorr_hidden_size,
            "lilicorr_num_heads": spec.lilicorr_num_heads,
            "lilicorr_num_layers": spec.lilicorr_num_layers,
            "lilicorr_mlp_ratio": spec.lilicorr_mlp_ratio,
            "lilicorr_factor_dim": spec.lilicorr_factor_dim,
            "lilicorr_candidate_topk": spec.lilicorr_candidate_topk,
            "lilicorr_logit_scale": spec.lilicorr_logit_scale,
            "lilicorr_vector_eps": spec.lilicorr_vector_eps,
        }
    else:
        config["architectures"] = [DFLASH2_ARCHITECTURE]
        dflash |= {"selector_rank": spec.selector_rank, "selector_top_k": spec.selector_top_k}
    return config


def conv_weights(spec: LatticeSpec, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Each layer's two DFlashGroupedConv: tap 0 of the base kernel near 1 (the identity),
    the later taps and the per-row kernel projection small, so the backbone's signal stays
    and every row still mixes in the rows before it in its block."""
    hidden, taps = spec.target.hidden_size, spec.conv_kernel_size
    groups = hidden // spec.conv_group_size
    if hidden % spec.conv_group_size:
        raise ValueError(f"conv_group_size {spec.conv_group_size} must divide {hidden}")
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
    vocab, hidden, rank = spec.target.vocab_size, spec.target.hidden_size, spec.selector_rank
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
    model_hidden = spec.target.hidden_size
    h = spec.lilicorr_hidden_size or model_hidden
    heads, block, topk = spec.lilicorr_num_heads, spec.backbone.block_size, \
        spec.lilicorr_candidate_topk
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
    mlp = int(h * spec.lilicorr_mlp_ratio)
    for i in range(spec.lilicorr_num_layers):
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
        w |= _linear(gen, std * 4, head, spec.lilicorr_factor_dim, h)
    return {f"lilicorr.{name}": tensor for name, tensor in w.items()}


def frequent_target_tokens(target: TargetSpec, count: int = 4, prompts: int = 120,
                           max_tokens: int = 32, seed: int = 1000) -> tuple[int, ...]:
    """The ``count`` tokens the target emits most often in greedy decoding of random prompts
    (float32 transformers; prompts of a seed of their own, not the tests')."""
    import collections

    import transformers

    from vllm_dartree.models.tiny import random_prompts, write_target

    model = transformers.Qwen3ForCausalLM.from_pretrained(
        str(write_target(target)), torch_dtype=torch.float32).eval()
    counts: collections.Counter[int] = collections.Counter()
    with torch.no_grad():
        for prompt in random_prompts(prompts, target.vocab_size, seed=seed, min_len=3,
                                     max_len=40):
            out = model.generate(torch.tensor([prompt]), max_new_tokens=max_tokens,
                                 do_sample=False, eos_token_id=None, pad_token_id=0)
            counts.update(out[0, len(prompt):].tolist())
    return tuple(sorted(t for t, _ in counts.most_common(count)))


def cached_frequent_target_tokens(target: TargetSpec) -> tuple[int, ...]:
    """:func:`frequent_target_tokens` with the defaults, in a child process (after a vLLM
    CPU engine ran, this process's OpenMP threads are bound and a transformers forward is
    many times slower), cached beside the models."""
    import hashlib
    import subprocess
    import sys
    from dataclasses import asdict

    from vllm_dartree.env import cache_dir

    key = hashlib.sha256(json.dumps(asdict(target), sort_keys=True).encode()).hexdigest()[:12]
    path = cache_dir() / "models" / "tiny" / f"frequent-tokens-{key}.json"
    if not path.exists():
        script = ("import json, sys\n"
                  "from vllm_dartree.models.tiny import TargetSpec\n"
                  "from vllm_dartree.models.tiny_lattice import frequent_target_tokens\n"
                  "print('RESULT' + json.dumps(frequent_target_tokens("
                  "TargetSpec(**json.loads(sys.argv[1])))))\n")
        out = subprocess.run([sys.executable, "-c", script, json.dumps(asdict(target))],
                             capture_output=True, text=True, check=True, timeout=900)
        (line,) = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT")]
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(line.removeprefix("RESULT"))
        os.replace(tmp, path)
    return tuple(json.loads(path.read_text()))


def prior_norm_weight(spec: LatticeSpec) -> torch.Tensor:
    """The final norm weight w for which lm_head @ (rmsnorm(embed[mask]) * w) (what a mask
    row's hidden is when the layers add little) puts ``spec.prior_tokens`` first: the least
    squares fit to logits 1 there and 0 elsewhere, scaled to ``prior_logit``."""
    from safetensors.torch import load_file

    from vllm_dartree.models.tiny import write_target

    target = load_file(str(write_target(spec.target) / "model.safetensors"))
    mask = target["model.embed_tokens.weight"][spec.backbone.mask_token_id]
    normed = mask / mask.pow(2).mean().add(1e-6).sqrt()
    design = target["lm_head.weight"] * normed
    wanted = torch.zeros(spec.target.vocab_size)
    wanted[list(spec.prior_tokens)] = 1.0
    fit = torch.linalg.lstsq(design, wanted[:, None]).solution[:, 0]
    return fit * spec.prior_logit / fit.abs().mean()


def lattice_weights(spec: LatticeSpec) -> dict[str, torch.Tensor]:
    """The backbone's weights (tiny.py's DFlash drafter) plus the format's own."""
    if spec.backbone.domino or spec.backbone.dspark or spec.backbone.text_weight_prefix:
        raise ValueError("a lattice drafter's backbone is a plain z-lab DFlash one")
    weights = drafter_weights(spec.backbone)
    if spec.prior_tokens:
        weights["norm.weight"] = prior_norm_weight(spec)
    gen = torch.Generator().manual_seed(spec.seed)
    if spec.has_conv:
        weights |= conv_weights(spec, gen)
    if spec.lilicorr:
        topk = spec.lilicorr_candidate_topk
        if topk <= 0 or topk > 16 or topk & (topk - 1):
            raise ValueError("LiLiCorr's candidate top-k is a power of two <= 16")
        weights |= lilicorr_weights(spec, gen)
    else:
        weights |= selector_weights(spec, gen)
    return weights


def write_lattice(spec: LatticeSpec) -> Path:
    def write(out: Path) -> None:
        weights = {name: t.contiguous() for name, t in lattice_weights(spec).items()}
        save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
        (out / "config.json").write_text(json.dumps(lattice_config(spec), indent=2))

    return _cached_dir(spec.kind, spec, write)


def write_tiny_dflash2(target_spec: TargetSpec | None = None, *, block_size: int = 16,
                       **settings) -> Path:
    """A random DFlash2 drafter (``DFlash2DraftModel``) for ``target_spec``; ``settings``
    are :class:`LatticeSpec` fields."""
    target_spec = target_spec or TargetSpec()
    backbone = DrafterSpec(target=target_spec, block_size=block_size)
    settings.setdefault("prior_tokens", cached_frequent_target_tokens(target_spec))
    return write_lattice(LatticeSpec(backbone=backbone, lilicorr=False, **settings))


def write_tiny_lilicorr(target_spec: TargetSpec | None = None, *, block_size: int = 16,
                        **settings) -> Path:
    """A random LiLiCorr drafter (``LiLiCorrDraftModel``) for ``target_spec``; serve it with
    1 <= num_speculative_tokens < ``block_size``."""
    target_spec = target_spec or TargetSpec()
    backbone = DrafterSpec(target=target_spec, block_size=block_size)
    settings.setdefault("prior_tokens", cached_frequent_target_tokens(target_spec))
    return write_lattice(LatticeSpec(backbone=backbone, lilicorr=True, **settings))
