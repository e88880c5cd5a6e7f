"""The DFlash drafter with a causal correction head (Domino's or DSpark's Markov head), in
pure torch, computing what vLLM computes.

Ground truth is vLLM's ``qwen3_dflash.py`` (``DFlashQwen3Model``) plus our
``integration/proposer.py`` (``_draft_block``) and ``tree/correction.py`` (``DominoHead``):

- context = ``hidden_norm(fc(concat of target layer outputs at target_layer_ids))``;
- every draft layer projects the context with its own ``k_proj``/``v_proj``, applies
  ``k_norm`` and RoPE at the context's absolute positions, and prepends it to the block's K/V
  (the context does not pass through ``input_layernorm``: vLLM's
  ``precompute_and_store_context_kv`` projects the ``hidden_norm`` output directly);
- the block ``[x_p, mask x (bs-1)]`` at positions ``p .. p+bs-1`` is embedded with the
  target's table; attention is non-causal over ``[context < p ; whole block]``;
- pre-norm Qwen3 layers, final ``norm``, logits with the target's ``lm_head``;
- z-lab's non-shift layout (no correction head: ``head`` None, ``shift_label`` False, what
  vLLM's DFlash, DFlash2 and LiLiCorr speculators run): slot 0 (the root) predicts nothing,
  slot j >= 1 predicts ``x_{p+j}`` (vLLM's ``sample_indices`` are the block's slots 1..N,
  each sampled at its own position);
- shift layout: slot j predicts ``x_{p+j+1}``; for j >= ``pure_draft_prefix_len`` the Domino
  head adds ``SiLU(proj0 . [z_j ; s_j]) . proj2^T`` with ``s_j`` the GRU state after the
  target embeddings of ``x_p .. x_{p+j}`` (teacher forcing; nn.GRU, no bias, zero state);
- or, for a DSpark layout (``qwen3_dspark.py``, ``tree/markov.py``), every slot j adds the
  Markov bias ``logit_scale * markov_w2 . markov_w1[x_{p+j}]``: slot 0's previous token is
  the anchor x_p; an optional ``confidence_head.proj`` reads ``[z_j (; markov_w1[x_{p+j}])]``
  and predicts whether slot j's corrected argmax is the target's token.

Both heads' biases are ``u_j . P^T`` for a per-slot vector u_j and a [V, *] matrix P (Domino:
``SiLU(proj0 . [z_j ; s_j])`` and ``embed_proj.2``; Markov: ``markov_w1[x_{p+j}]`` and
``markov_w2``), which is what the fused loss takes.

Parameter names equal the released checkpoint names, so ``state_dict()`` is the export.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from vllm_dartree.checkpoint import DOMINO, MARKOV, DrafterLayout
from vllm_dartree.tree.correction import DominoHead
from vllm_dartree.tree.markov import MarkovHead

IGNORE_INDEX = -100
TRAINABLE_HEADS = (DOMINO, MARKOV)


def check_trainable(arch: DrafterLayout) -> None:
    headed = arch.head in TRAINABLE_HEADS and arch.shift_label
    zlab = arch.head is None and not arch.shift_label and not arch.has_lattice
    if not (headed or zlab):
        raise ValueError("the trainer builds drafters with a Domino or Markov (DSpark) "
                         "correction head in the shift layout, or head-less z-lab DFlash "
                         f"backbones in the non-shift layout; got head={arch.head!r}, "
                         f"shift_label={arch.shift_label}, lattice={arch.lattice!r}")
    if arch.has_reduced_vocab:
        raise ValueError("the trainer shares the target's lm_head: a reduced draft vocabulary "
                         f"(draft_vocab_size = {arch.draft_vocab_size}) is not trainable")


# ------------------------------------------------------------------------------ blocks
class RMSNorm(nn.Module):
    """Qwen3/vLLM RMSNorm: statistics in float32, plain (not 1 + w) weight."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def rope_cos_sin(
    positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Neox-style RoPE tables for ``positions`` [...]: cos, sin [..., head_dim]."""
    inv_freq = 1.0 / theta ** (
        torch.arange(0, head_dim, 2, dtype=torch.float32, device=positions.device) / head_dim
    )
    angles = positions.float().unsqueeze(-1) * inv_freq
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [N, heads, L, hd], cos/sin [N, L, hd] (neox: rotate the two halves)."""
    first, second = x.chunk(2, dim=-1)
    rotated = torch.cat([-second, first], dim=-1)
    return x * cos.unsqueeze(1) + rotated * sin.unsqueeze(1)


class DraftAttention(nn.Module):
    """Qwen3 attention whose keys/values are ``[context ; block]`` (DFlash KV injection)."""

    def __init__(self, arch: DrafterLayout) -> None:
        super().__init__()
        hidden, hd = arch.hidden_size, arch.head_dim
        self.heads, self.kv_heads, self.head_dim = (
            arch.num_attention_heads, arch.num_key_value_heads, hd)
        self.q_proj = nn.Linear(hidden, self.heads * hd, bias=False)
        self.k_proj = nn.Linear(hidden, self.kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(hidden, self.kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(self.heads * hd, hidden, bias=False)
        self.q_norm = RMSNorm(hd, arch.rms_norm_eps)
        self.k_norm = RMSNorm(hd, arch.rms_norm_eps)

    def _heads(self, x: torch.Tensor, heads: int) -> torch.Tensor:
        return x.view(*x.shape[:2], heads, self.head_dim).transpose(1, 2)

    def keys_values(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x [N, L, H] -> K (normed, rotated), V: [N, kv_heads, L, hd]."""
        k = apply_rope(self.k_norm(self._heads(self.k_proj(x), self.kv_heads)), cos, sin)
        return k, self._heads(self.v_proj(x), self.kv_heads)

    def forward(
        self,
        x: torch.Tensor,
        context: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
        visible: torch.Tensor,
    ) -> torch.Tensor:
        """x [N, Q, H] block, context [N, T, H]; visible [N, Q, T+Q] bool."""
        cos_q, sin_q, cos_c, sin_c = rope
        q = apply_rope(self.q_norm(self._heads(self.q_proj(x), self.heads)), cos_q, sin_q)
        k_blk, v_blk = self.keys_values(x, cos_q, sin_q)
        k_ctx, v_ctx = self.keys_values(context, cos_c, sin_c)
        k = torch.cat([k_ctx, k_blk], dim=2)
        v = torch.cat([v_ctx, v_blk], dim=2)
        if self.kv_heads != self.heads:
            group = self.heads // self.kv_heads
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=visible.unsqueeze(1))
        return self.o_proj(out.transpose(1, 2).reshape(*x.shape[:2], -1))


class DraftMLP(nn.Module):
    def __init__(self, hidden: int, inter: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DraftLayer(nn.Module):
    """Pre-norm layer; equal to vLLM's fused-residual form (norm(x + residual))."""

    def __init__(self, arch: DrafterLayout) -> None:
        super().__init__()
        self.self_attn = DraftAttention(arch)
        self.mlp = DraftMLP(arch.hidden_size, arch.intermediate_size)
        self.input_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)

    def forward(self, x, context, rope, visible) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), context, rope, visible)
        return x + self.mlp(self.post_attention_layernorm(x))


# ------------------------------------------------------------------------------ outputs
@dataclass
class DrafterOutput:
    """Per anchor a and slot j (slot j predicts x_{p_a + j + 1}; x_{p_a + j} in the non-shift
    layout, where slot 0 predicts nothing)."""

    hidden: torch.Tensor  # [N, A, bs, H] after the final norm (z_j)
    base_logits: torch.Tensor  # [N, A, bs, V]
    # [N, A, bs, V] base + head bias (teacher forced); None without a head
    corrected_logits: torch.Tensor | None
    confidence_logits: torch.Tensor | None = None  # [N, A, bs] (DSpark's confidence head)


class MarkovModules(nn.Module):
    """DSpark's Markov head under its checkpoint names (``markov_head.``): ``markov_w1`` (an
    embedding [V, r]) and ``markov_w2`` (r -> V, weight [V, r])."""

    def __init__(self, arch: DrafterLayout) -> None:
        super().__init__()
        rank = arch.markov_rank
        self.markov_w1 = nn.Embedding(arch.vocab_size, rank)
        self.markov_w2 = nn.Linear(rank, arch.vocab_size, bias=False)


class BlockDrafter(nn.Module):
    """DFlash backbone + a correction head (Domino or Markov), or the bare backbone in z-lab's
    non-shift layout (``arch.head`` None); the target's embedding and lm_head are frozen
    buffers."""

    def __init__(self, arch: DrafterLayout, embed: torch.Tensor, lm_head: torch.Tensor) -> None:
        super().__init__()
        check_trainable(arch)
        if embed.shape != (arch.vocab_size, arch.hidden_size):
            raise ValueError(f"target embedding {list(embed.shape)} does not match the drafter "
                             f"(vocab {arch.vocab_size}, hidden {arch.hidden_size})")
        if lm_head.shape != embed.shape:
            raise ValueError(f"target lm_head {list(lm_head.shape)} must be {list(embed.shape)}")
        self.arch = arch
        hidden, state = arch.hidden_size, arch.gru_hidden_dim
        self.fc = nn.Linear(len(arch.target_layer_ids) * hidden, hidden, bias=False)
        self.hidden_norm = RMSNorm(hidden, arch.rms_norm_eps)
        self.layers = nn.ModuleList(DraftLayer(arch) for _ in range(arch.num_hidden_layers))
        self.norm = RMSNorm(hidden, arch.rms_norm_eps)
        if arch.head == DOMINO:
            self.prefix_gru = nn.GRU(hidden, state, num_layers=1, bias=False, batch_first=True)
            self.embed_proj = nn.Sequential(
                nn.Linear(hidden + state, arch.emb_dim, bias=False),
                nn.SiLU(),
                nn.Linear(arch.emb_dim, arch.vocab_size, bias=False),
            )
        elif arch.head == MARKOV:
            self.markov_head = MarkovModules(arch)
            if arch.confidence_head:
                inputs = hidden + (arch.markov_rank if arch.confidence_head_with_markov else 0)
                self.confidence_head = nn.Module()
                self.confidence_head.proj = nn.Linear(inputs, 1, bias=True)
        # Not parameters and not in state_dict: the released drafters ship neither.
        self.register_buffer("embed", embed.detach().clone(), persistent=False)
        self.register_buffer("lm_head", lm_head.detach().clone(), persistent=False)
        self._cast_lm_head: torch.Tensor | None = None  # see output_table

    # ------------------------------------------------------------------ initialisation
    @torch.no_grad()
    def reset_parameters(self, generator: torch.Generator) -> None:
        """Seeded init: fan-in scaled projections, residual outputs and the head bias small."""
        for name, param in self.named_parameters():
            if name.endswith("norm.weight") or name == "confidence_head.proj.bias":
                param.fill_(1.0 if name.endswith("norm.weight") else 0.0)
                continue
            fan_in = param.shape[1]
            std = fan_in ** -0.5
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                std /= math.sqrt(2 * max(1, self.arch.num_hidden_layers))
            if name == "markov_head.markov_w1.weight":
                std = 1.0  # an embedding: unit rows, so markov_w2 sets the bias scale
            if name in self.head_output_names():
                std *= 0.1  # start with corrected ~= base
            param.copy_(torch.randn(param.shape, generator=generator) * std)

    def head_parameters(self) -> list[nn.Parameter]:
        if self.arch.head is None:
            return []
        if self.arch.head == DOMINO:
            return [*self.prefix_gru.parameters(), *self.embed_proj.parameters()]
        return [p for name, p in self.named_parameters()
                if name.startswith(("markov_head.", "confidence_head."))]

    @staticmethod
    def head_output_names() -> tuple[str, ...]:
        """The [V, *] matrices P of the head bias u . P^T (one per head kind)."""
        return ("embed_proj.2.weight", "markov_head.markov_w2.weight")

    @property
    def head_output_weight(self) -> torch.Tensor:
        """P of the head bias u . P^T: [V, E] (Domino) or [V, r] (Markov); [V, 0] without a
        head (the fused loss then computes the base CE only)."""
        if self.arch.head is None:
            return self.lm_head.new_zeros(self.arch.vocab_size, 0)
        if self.arch.head == DOMINO:
            return self.embed_proj[2].weight
        return self.markov_head.markov_w2.weight

    def correction_head(self) -> DominoHead | MarkovHead:
        """The tree core's head on these weights (shares storage)."""
        return self.domino_head() if self.arch.head == DOMINO else self.markov_tree_head()

    def markov_tree_head(self) -> MarkovHead:
        return MarkovHead(markov_w1=self.markov_head.markov_w1.weight,
                          markov_w2=self.markov_head.markov_w2.weight,
                          scale=self.arch.logit_scale)

    def domino_head(self) -> DominoHead:
        """The same weights as the inference-time :class:`DominoHead` (shares storage)."""
        return DominoHead(
            embed=self.embed, gru_ih=self.prefix_gru.weight_ih_l0,
            gru_hh=self.prefix_gru.weight_hh_l0, proj0=self.embed_proj[0].weight,
            proj2=self.embed_proj[2].weight,
            pure_draft_prefix_len=self.arch.pure_draft_prefix_len,
        )

    # ------------------------------------------------------------------------ forward
    def context(self, features: torch.Tensor) -> torch.Tensor:
        """[N, T, len(ids) * H] target layer outputs -> [N, T, H] (vLLM: fc, then hidden_norm)."""
        return self.hidden_norm(self.fc(features))

    def block_ids(self, tokens: torch.Tensor, anchors: torch.Tensor) -> torch.Tensor:
        """[N, A] anchors -> [N, A, bs]: the root x_p, then mask ids."""
        bs = self.arch.block_size
        ids = torch.full((*anchors.shape, bs), self.arch.mask_token_id, dtype=torch.long,
                         device=tokens.device)
        ids[..., 0] = tokens.gather(1, anchors)
        return ids

    def backbone(
        self, features: torch.Tensor, tokens: torch.Tensor, anchors: torch.Tensor
    ) -> torch.Tensor:
        """Drafter hidden states (after the final norm) for every anchor: [N, A, bs, H]."""
        n, t = features.shape[:2]  # context length (tokens may run further: the labels)
        num_anchors, bs = anchors.shape[1], self.arch.block_size
        context = self.context(features)
        x = self.embed[self.block_ids(tokens, anchors)].view(n, num_anchors * bs, -1)
        slot = torch.arange(bs, device=tokens.device)
        positions = (anchors.unsqueeze(-1) + slot).view(n, -1)
        ctx_positions = torch.arange(t, device=tokens.device).expand(n, t)
        cos_q, sin_q = rope_cos_sin(positions, self.arch.head_dim, self.arch.rope_theta, x.dtype)
        cos_c, sin_c = rope_cos_sin(ctx_positions, self.arch.head_dim, self.arch.rope_theta,
                                    x.dtype)
        visible = self.visibility(anchors, t)
        for layer in self.layers:
            x = layer(x, context, (cos_q, sin_q, cos_c, sin_c), visible)
        return self.norm(x).view(n, num_anchors, bs, -1)

    def visibility(self, anchors: torch.Tensor, context_len: int) -> torch.Tensor:
        """[N, A*bs, T + A*bs]: context positions < p, and every slot of the same block."""
        n, num_anchors = anchors.shape
        bs = self.arch.block_size
        ctx = torch.arange(context_len, device=anchors.device)
        sees_ctx = ctx.view(1, 1, -1) < anchors.unsqueeze(-1)  # [N, A, T]
        sees_ctx = sees_ctx.repeat_interleave(bs, dim=1)
        block_of = torch.arange(num_anchors * bs, device=anchors.device) // bs
        same_block = (block_of.unsqueeze(1) == block_of.unsqueeze(0)).expand(n, -1, -1)
        return torch.cat([sees_ctx, same_block], dim=-1)

    def previous_tokens(self, tokens: torch.Tensor, anchors: torch.Tensor) -> torch.Tensor:
        """[N, A, bs]: x_{p+j}, the token before the one slot j predicts (slot 0: the anchor);
        teacher forcing."""
        n, num_anchors = anchors.shape
        index = anchors.unsqueeze(-1) + torch.arange(self.arch.block_size, device=tokens.device)
        index = index.clamp(max=tokens.shape[1] - 1)  # slots past the end carry no label
        return tokens.gather(1, index.view(n, -1)).view(n, num_anchors, -1)

    def prefix_states(self, tokens: torch.Tensor, anchors: torch.Tensor) -> torch.Tensor:
        """GRU states s_j after x_p .. x_{p+j} (teacher forcing): [N, A, bs, G]."""
        prev = self.previous_tokens(tokens, anchors)
        states, _ = self.prefix_gru(self.embed[prev.flatten(0, 1)])
        return states.view(*prev.shape, -1)

    def output_table(self, device_type: str) -> torch.Tensor:
        """The frozen lm_head, cast once to the autocast dtype (not on every call)."""
        if not torch.is_autocast_enabled(device_type):
            return self.lm_head
        dtype = torch.get_autocast_dtype(device_type)
        cached = self._cast_lm_head
        if cached is None or cached.dtype != dtype or cached.device != self.lm_head.device:
            self._cast_lm_head = self.lm_head.to(dtype)
        return self._cast_lm_head

    def head_input(self, hidden: torch.Tensor, tokens: torch.Tensor,
                   anchors: torch.Tensor) -> torch.Tensor:
        """u of the head bias u . P^T (see :attr:`head_output_weight`): [N, A, bs, E] for
        Domino, [N, A, bs, r] for Markov (scaled by logit_scale), [N, A, bs, 0] without a
        head."""
        if self.arch.head is None:
            return hidden.new_zeros(*hidden.shape[:-1], 0)
        if self.arch.head == DOMINO:
            return self.domino_head_input(hidden, self.prefix_states(tokens, anchors))
        return self.arch.logit_scale * self.markov_embedding(tokens, anchors)

    def markov_embedding(self, tokens: torch.Tensor, anchors: torch.Tensor) -> torch.Tensor:
        """[N, A, bs, r]: markov_w1 of each slot's previous token."""
        return self.markov_head.markov_w1(self.previous_tokens(tokens, anchors))

    def confidence_logits(self, hidden: torch.Tensor, tokens: torch.Tensor,
                          anchors: torch.Tensor) -> torch.Tensor | None:
        """[N, A, bs] logits of DSpark's confidence head (None without one)."""
        if not (self.arch.head == MARKOV and self.arch.confidence_head):
            return None
        inputs = hidden
        if self.arch.confidence_head_with_markov:
            inputs = torch.cat([hidden, self.markov_embedding(tokens, anchors)], dim=-1)
        return self.confidence_head.proj(inputs).squeeze(-1)

    def domino_head_input(self, hidden: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
        """[N, A, bs, E] input of ``embed_proj.2`` (bias-free, so a zero row is a zero bias);
        zero on the pure-draft prefix slots."""
        u = self.embed_proj[1](self.embed_proj[0](torch.cat([hidden, states], dim=-1)))
        prefix = self.arch.pure_draft_prefix_len
        if prefix:
            keep = torch.arange(u.shape[2], device=u.device) >= prefix
            u = u * keep.view(1, 1, -1, 1).to(u.dtype)
        return u

    def head_bias(self, hidden: torch.Tensor, tokens: torch.Tensor,
                  anchors: torch.Tensor) -> torch.Tensor:
        """Full-vocabulary bias [N, A, bs, V] (Domino: zero on the pure-draft prefix slots)."""
        return self.head_input(hidden, tokens, anchors) @ self.head_output_weight.T

    def forward(
        self,
        features: torch.Tensor,
        tokens: torch.Tensor,
        anchors: torch.Tensor,
        with_head: bool = True,
    ) -> DrafterOutput:
        """features [N, T, F], tokens [N, T], anchors [N, A] (each p in 1 .. T-1)."""
        hidden = self.backbone(features, tokens, anchors)
        base = hidden @ self.output_table(hidden.device.type).T
        corrected = None
        if with_head and self.arch.head is not None:
            corrected = base + self.head_bias(hidden, tokens, anchors)
        return DrafterOutput(hidden, base, corrected,
                             self.confidence_logits(hidden, tokens, anchors))


DominoDrafter = BlockDrafter  # its name before it took the Markov head too


def block_labels(
    tokens: torch.Tensor, anchors: torch.Tensor, lengths: torch.Tensor, block_size: int,
    shift: bool = True,
) -> torch.Tensor:
    """[N, A, bs] labels x_{p+j+1} (shift layout) or x_{p+j} with slot 0 ignored (z-lab's
    non-shift layout), IGNORE_INDEX past each sequence's length."""
    n, num_anchors = anchors.shape
    index = anchors.unsqueeze(-1) + int(shift) + torch.arange(block_size, device=tokens.device)
    inside = index < lengths.view(n, 1, 1)
    if not shift:
        inside = inside & (torch.arange(block_size, device=tokens.device) > 0)
    labels = tokens.gather(1, index.clamp(max=tokens.shape[1] - 1).view(n, -1))
    return torch.where(inside, labels.view(n, num_anchors, block_size), IGNORE_INDEX)
