"""Independent pure-torch reference of the public DFlash / Domino drafter forward pass.

Written from the description of the public reference code (z-lab/dflash ``dflash/model.py``
``DFlashDraftModel``, jianuo-huang/Domino ``code/dflash.py`` ``spec_generate``; see
``../shared/notes/reference-methods.md`` sections 1 and 2), NOT from vllm_dartree or vLLM:

- Qwen3-style decoder layers (input_layernorm -> attention -> residual -> post_attention_layernorm
  -> SiLU-gated MLP -> residual), final ``norm``; no embedding and no lm_head of its own.
- Context = ``hidden_norm(fc(concat(target hidden states at target_layer_ids)))``; HF
  ``hidden_states[id + 1]`` is the output of target layer ``id`` (see
  ``TargetPrefill.context_features`` for the last layer).
- Attention: queries from the (input-layernormed) block; every layer projects the *same* fused
  context with its own ``k_proj``/``v_proj``, applies ``k_norm`` and RoPE at the context's
  absolute positions and prepends it to the block's K/V. Non-causal (every block query sees all
  context and all block tokens).
- Block = ``[root, mask x (block_size - 1)]`` embedded with the target's table, at positions
  ``start .. start + block_size - 1`` (``start`` = the root's position = context length here).
- Layouts: z-lab non-shift keeps slots 1..block-1 (slot j predicts position start + j);
  Domino shift keeps all slots (slot j predicts position start + j + 1).
- Domino head: ``prefix_gru = nn.GRU(H, G, bias=False)`` over the target embeddings of the
  realised tokens (root, then the first ``pure_draft_prefix_len`` argmax drafts, then each
  greedy corrected draft); ``embed_proj = Linear(H+G, E) -> SiLU -> Linear(E, V)``; slot i >=
  pure_draft_prefix_len gets ``base_i + embed_proj(cat[z_i, s])``.

- DSpark (deepseek-ai/DeepSpec ``deepspec/modeling/dspark``, as vLLM 0.32/0.33 serve it:
  ``qwen3_dspark.py``, ``v1/worker/gpu/spec_decode/dspark/speculator.py``): the same backbone
  with the config's keys at the top level, anchor-first (the shift layout: every slot of the
  block predicts the next position). The block is embedded with the drafter's own
  ``embed_tokens`` when the checkpoint has one, base logits come from its own ``lm_head``
  (draft vocabulary V', ids mapped to target ids as ``i + d2t[i]``); without them, the
  target's. Greedy chain:
  ``prev`` = the root; slot i takes argmax(base_i + markov_w2(markov_w1[prev])) and feeds
  the token (a target id) back as ``prev``. ``confidence_head.proj`` is loaded, not used.

Weights load from the checkpoint's ``model.safetensors`` by the released names, strictly.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn


# ----------------------------------------------------------------------------- config
@dataclass(frozen=True)
class ReferenceConfig:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    block_size: int
    mask_token_id: int
    target_layer_ids: tuple[int, ...]
    domino: bool
    shift_label: bool
    pure_draft_prefix_len: int
    gru_hidden_dim: int | None
    emb_dim: int | None
    markov_rank: int = 0  # > 0: a DSpark drafter
    draft_vocab_size: int | None = None
    confidence_features: int = 0  # H (+ r) inputs of confidence_head.proj; 0: none

    @classmethod
    def from_dict(cls, raw: dict) -> ReferenceConfig:
        if "Qwen3DSparkModel" in (raw.get("architectures") or ()):
            return cls.dspark_from_dict(raw)
        dflash = raw.get("dflash_config") or {}
        domino = dflash.get("projector_type") in ("domino", "causal_v5")
        rope = raw.get("rope_parameters") or {}
        theta = raw.get("rope_theta", rope.get("rope_theta", 1_000_000.0))
        heads = raw["num_attention_heads"]
        return cls(
            hidden_size=raw["hidden_size"],
            intermediate_size=raw["intermediate_size"],
            num_hidden_layers=raw["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=raw["num_key_value_heads"],
            head_dim=raw.get("head_dim") or raw["hidden_size"] // heads,
            vocab_size=raw["vocab_size"],
            rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
            rope_theta=float(theta),
            block_size=int(raw.get("block_size", 16)),
            mask_token_id=int(dflash.get("mask_token_id", raw.get("mask_token_id"))),
            target_layer_ids=tuple(int(i) for i in dflash["target_layer_ids"]),
            domino=domino,
            shift_label=bool(dflash.get("shift_label", False)),
            # The Domino reference reads a default of 0; every public checkpoint sets 1.
            pure_draft_prefix_len=int(dflash.get("pure_draft_prefix_len", 0)),
            gru_hidden_dim=dflash.get("gru_hidden_dim") if domino else None,
            emb_dim=dflash.get("emb_dim", raw.get("emb_dim")) if domino else None,
        )

    @classmethod
    def dspark_from_dict(cls, raw: dict) -> ReferenceConfig:
        """DeepSpec's build_draft_config keys, read as vLLM's DSpark model reads them."""
        heads = raw["num_attention_heads"]
        rank = int(raw["markov_rank"])
        confidence = 0
        if raw.get("enable_confidence_head", False):
            with_markov = raw.get("confidence_head_with_markov", False)
            confidence = raw["hidden_size"] + (rank if with_markov else 0)
        return cls(
            hidden_size=raw["hidden_size"], intermediate_size=raw["intermediate_size"],
            num_hidden_layers=raw["num_hidden_layers"], num_attention_heads=heads,
            num_key_value_heads=raw["num_key_value_heads"],
            head_dim=raw.get("head_dim") or raw["hidden_size"] // heads,
            vocab_size=raw["vocab_size"], rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
            rope_theta=float(raw.get("rope_theta", 1_000_000.0)),
            block_size=int(raw["block_size"]), mask_token_id=int(raw["mask_token_id"]),
            target_layer_ids=tuple(int(i) for i in raw["target_layer_ids"]),
            domino=False, shift_label=raw.get("sample_from_anchor", True),
            pure_draft_prefix_len=0, gru_hidden_dim=None, emb_dim=None, markov_rank=rank,
            draft_vocab_size=raw.get("draft_vocab_size") or raw["vocab_size"],
            confidence_features=confidence,
        )

    @property
    def dspark(self) -> bool:
        return self.markov_rank > 0

    @classmethod
    def from_checkpoint(cls, path: str | Path) -> ReferenceConfig:
        return cls.from_dict(json.loads((Path(path) / "config.json").read_text()))

    @property
    def num_drafts(self) -> int:
        """Predictions per block: all slots with the shift layout, slots 1.. without."""
        return self.block_size if self.shift_label else self.block_size - 1


# ---------------------------------------------------------------------------- modules
class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat([-second, first], dim=-1)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float):
    """Neox-style (half-split) RoPE tables for integer positions [N] -> ([N, d], [N, d])."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    freqs = positions.to(torch.float64)[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().float(), emb.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [heads, N, d] rotated by per-position cos/sin [N, d]."""
    return x * cos + rotate_half(x) * sin


class Attention(nn.Module):
    def __init__(self, cfg: ReferenceConfig) -> None:
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        self.heads, self.kv_heads, self.head_dim = cfg.num_attention_heads, \
            cfg.num_key_value_heads, d
        self.q_proj = nn.Linear(h, self.heads * d, bias=False)
        self.k_proj = nn.Linear(h, self.kv_heads * d, bias=False)
        self.v_proj = nn.Linear(h, self.kv_heads * d, bias=False)
        self.o_proj = nn.Linear(self.heads * d, h, bias=False)
        self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(d, cfg.rms_norm_eps)

    def forward(self, x: torch.Tensor, context: torch.Tensor, q_rope, kv_rope) -> torch.Tensor:
        """x [Q, H] (normed block), context [C, H] (fused target context) -> [Q, H]."""
        q_len, d = x.shape[0], self.head_dim
        q = self.q_norm(self.q_proj(x).view(q_len, self.heads, d)).transpose(0, 1)
        kv_in = torch.cat([context, x], dim=0)  # context K/V first, then the block
        k = self.k_norm(self.k_proj(kv_in).view(-1, self.kv_heads, d)).transpose(0, 1)
        v = self.v_proj(kv_in).view(-1, self.kv_heads, d).transpose(0, 1)
        q = apply_rope(q, *q_rope)
        k = apply_rope(k, *kv_rope)
        groups = self.heads // self.kv_heads
        k = k.repeat_interleave(groups, dim=0)
        v = v.repeat_interleave(groups, dim=0)
        scores = (q @ k.transpose(1, 2)) / math.sqrt(d)  # no mask: non-causal
        out = scores.softmax(dim=-1) @ v  # [heads, Q, d]
        return self.o_proj(out.transpose(0, 1).reshape(q_len, self.heads * d))


class MLP(nn.Module):
    def __init__(self, cfg: ReferenceConfig) -> None:
        super().__init__()
        h, i = cfg.hidden_size, cfg.intermediate_size
        self.gate_proj = nn.Linear(h, i, bias=False)
        self.up_proj = nn.Linear(h, i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ReferenceConfig) -> None:
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, context, q_rope, kv_rope):
        x = x + self.self_attn(self.input_layernorm(x), context, q_rope, kv_rope)
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlashDraftModel(nn.Module):
    """The HF-style drafter: parameter names are the released checkpoint's names."""

    def __init__(self, cfg: ReferenceConfig) -> None:
        super().__init__()
        self.cfg = cfg
        h = cfg.hidden_size
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(h, cfg.rms_norm_eps)
        self.fc = nn.Linear(len(cfg.target_layer_ids) * h, h, bias=False)
        self.hidden_norm = RMSNorm(h, cfg.rms_norm_eps)
        if cfg.domino:
            g, e = cfg.gru_hidden_dim, cfg.emb_dim
            self.prefix_gru = nn.GRU(h, g, num_layers=1, batch_first=True, bias=False)
            self.embed_proj = nn.Sequential(
                nn.Linear(h + g, e, bias=False), nn.SiLU(), nn.Linear(e, cfg.vocab_size, bias=False)
            )
        if cfg.dspark:
            self.add_dspark_modules(cfg)

    def add_dspark_modules(self, cfg: ReferenceConfig) -> None:
        h, rank, draft = cfg.hidden_size, cfg.markov_rank, cfg.draft_vocab_size
        self.embed_tokens = nn.Embedding(cfg.vocab_size, h)
        self.lm_head = nn.Linear(h, draft, bias=False)
        self.markov_head = nn.Module()
        self.markov_head.markov_w1 = nn.Embedding(cfg.vocab_size, rank)
        self.markov_head.markov_w2 = nn.Linear(rank, draft, bias=False)
        if cfg.confidence_features:
            self.confidence_head = nn.Module()
            self.confidence_head.proj = nn.Linear(cfg.confidence_features, 1, bias=True)
        if draft < cfg.vocab_size:
            self.register_buffer("d2t", torch.zeros(draft, dtype=torch.int64))
            self.register_buffer("t2d", torch.zeros(cfg.vocab_size, dtype=torch.bool))

    def draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids] if hasattr(self, "d2t") else draft_ids

    def fuse_context(self, target_features: torch.Tensor) -> torch.Tensor:
        """[C, n_ids * H] concatenated target layer outputs -> [C, H]."""
        return self.hidden_norm(self.fc(target_features))

    def forward(self, block_embeds: torch.Tensor, target_features: torch.Tensor,
                context_positions: torch.Tensor, block_positions: torch.Tensor) -> torch.Tensor:
        """block_embeds [Q, H], target_features [C, n*H] -> final-normed hidden [Q, H]."""
        context = self.fuse_context(target_features)
        q_rope = rope_cos_sin(block_positions, self.cfg.head_dim, self.cfg.rope_theta)
        kv_rope = rope_cos_sin(torch.cat([context_positions, block_positions]),
                               self.cfg.head_dim, self.cfg.rope_theta)
        x = block_embeds
        for layer in self.layers:
            x = layer(x, context, q_rope, kv_rope)
        return self.norm(x)


def load_drafter(path: str | Path, *, device: str | torch.device = "cpu") -> DFlashDraftModel:
    """The reference drafter with the checkpoint's weights (every name must match exactly)."""
    cfg = ReferenceConfig.from_checkpoint(path)
    model = DFlashDraftModel(cfg)
    weights = load_file(str(Path(path) / "model.safetensors"))
    for shared in ("embed_tokens", "lm_head"):  # DSpark: absent means the target's
        if cfg.dspark and f"{shared}.weight" not in weights:
            delattr(model, shared)
    missing, unexpected = model.load_state_dict(weights, strict=False)
    if missing or unexpected:
        raise ValueError(f"checkpoint names differ from the reference: missing {missing}, "
                         f"unexpected {unexpected}")
    return model.to(device=device, dtype=torch.float32).eval()


# ------------------------------------------------------------------------------ target
@dataclass
class TargetPrefill:
    hidden_states: tuple[torch.Tensor, ...]  # HF output_hidden_states, each [L, H]
    layer_outputs: tuple[torch.Tensor, ...]  # output of every decoder layer (pre final norm)
    logits: torch.Tensor  # [L, V]
    embed: torch.Tensor  # [V, H] target input embedding
    lm_head: torch.Tensor  # [V, H] target output projection

    def context_features(self, layer_ids) -> torch.Tensor:
        """[L, n*H]: outputs of target layers ``layer_ids``, concatenated on the feature axis.

        This is HF ``hidden_states[id + 1]`` for every id but the last layer's: transformers
        stores the *final-normed* state as the last entry, while the drafters are defined on
        the layer outputs (DARTree's ``SelectedHiddenCollector`` hooks the layers; the
        released checkpoints use ids [1, 9, 17, 25, 33] of 36, never the last layer).
        """
        return torch.cat([self.layer_outputs[i] for i in layer_ids], dim=-1)


@torch.no_grad()
def prefill_target(target_path: str | Path, prompt: list[int]) -> TargetPrefill:
    """Run the target with transformers in float32 and keep every layer's output."""
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(str(target_path), dtype=torch.float32)
    target.eval()
    outputs: list[torch.Tensor] = []

    def keep(_module, _inputs, output):
        outputs.append((output[0] if isinstance(output, tuple) else output)[0])

    hooks = [layer.register_forward_hook(keep) for layer in target.model.layers]
    try:
        out = target(torch.tensor([prompt]), output_hidden_states=True)
    finally:
        for hook in hooks:
            hook.remove()
    return TargetPrefill(
        hidden_states=tuple(h[0] for h in out.hidden_states),
        layer_outputs=tuple(outputs),
        logits=out.logits[0].float(),
        embed=target.get_input_embeddings().weight.detach().clone(),
        lm_head=target.get_output_embeddings().weight.detach().clone(),
    )


# ------------------------------------------------------------------------------- draft
@dataclass
class DraftBlock:
    hidden: torch.Tensor  # [D, H] drafter outputs of the prediction slots (after final norm)
    base_logits: torch.Tensor  # [D, V] target lm_head of ``hidden`` ([D, V'] DSpark's own)
    block_positions: torch.Tensor  # [block_size]
    predicted_positions: torch.Tensor  # [D] the position each prediction is for


@torch.no_grad()
def draft_block(model: DFlashDraftModel, target: TargetPrefill, prompt_len: int,
                root: int) -> DraftBlock:
    """First drafter call after the prefill: context = prompt positions 0..L-1, root at L."""
    cfg = model.cfg
    start = prompt_len
    block_ids = torch.full((cfg.block_size,), cfg.mask_token_id, dtype=torch.int64)
    block_ids[0] = root
    block_positions = torch.arange(start, start + cfg.block_size)
    own_embed, own_lm_head = getattr(model, "embed_tokens", None), getattr(model, "lm_head", None)
    embed = target.embed if own_embed is None else own_embed.weight
    out = model(embed[block_ids], target.context_features(cfg.target_layer_ids),
                torch.arange(prompt_len), block_positions)
    if cfg.shift_label:
        hidden, predicted = out, block_positions + 1
    else:
        hidden, predicted = out[1:], block_positions[1:]
    lm_head = target.lm_head if own_lm_head is None else own_lm_head.weight  # [V' or V, H]
    return DraftBlock(hidden, hidden @ lm_head.T, block_positions, predicted)


@dataclass
class GreedyChain:
    tokens: torch.Tensor  # [D] greedy draft tokens (argmax base, then argmax corrected)
    corrected_logits: torch.Tensor  # [D - P, V] logits of slots P.. (base + head bias)
    states: torch.Tensor  # [D - P, G] GRU state used for slots P..


@torch.no_grad()
def domino_greedy_chain(model: DFlashDraftModel, target: TargetPrefill, block: DraftBlock,
                        root: int, prefix_len: int | None = None) -> GreedyChain:
    """Domino ``spec_generate`` at temperature 0 for one block, recording logits and states.

    ``prefix_len`` overrides the config's ``pure_draft_prefix_len`` (slots before it are the
    plain argmax of the base logits and get no correction).
    """
    prefix = model.cfg.pure_draft_prefix_len if prefix_len is None else prefix_len
    depths = block.base_logits.shape[0]
    tokens = [int(t) for t in block.base_logits[:prefix].argmax(-1)]
    realised = torch.tensor([root, *tokens])
    _, state = model.prefix_gru(target.embed[realised][None])  # state [1, 1, G]
    corrected, states = [], []
    for i in range(prefix, depths):
        s = state[0]  # [1, G]
        bias = model.embed_proj(torch.cat([block.hidden[i : i + 1], s], dim=-1))
        logits = block.base_logits[i : i + 1] + bias
        token = int(logits.argmax(-1))
        corrected.append(logits[0])
        states.append(s[0])
        tokens.append(token)
        if i + 1 < depths:
            _, state = model.prefix_gru(target.embed[token].view(1, 1, -1), state)
    return GreedyChain(torch.tensor(tokens), torch.stack(corrected), torch.stack(states))


@torch.no_grad()
def dspark_greedy_chain(model: DFlashDraftModel, block: DraftBlock, root: int) -> torch.Tensor:
    """DSpark's sequential Markov stage at temperature 0: [D] draft tokens (target ids)."""
    markov = model.markov_head
    prev, tokens = torch.tensor([root]), []
    for i in range(block.base_logits.shape[0]):
        logits = block.base_logits[i : i + 1] + markov.markov_w2(markov.markov_w1(prev))
        prev = model.draft_to_target(logits.argmax(-1))
        tokens.append(int(prev))
    return torch.tensor(tokens)
