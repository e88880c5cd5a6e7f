"""Lattice heads on a frozen z-lab backbone: vLLM's DFlash2 candidate selector and LiLiCorr
correlator, in pure torch, trained and exported in vLLM's released layouts.

What vLLM computes (0.32 to 0.34, ``v1/worker/gpu/spec_decode/dflash2|lilicorr``):

- the DFlash backbone in z-lab's non-shift layout: query ``[root x_p, mask x N]`` at
  positions ``p .. p+N`` over the context < p; ``sample_indices`` are slots 1..N, slot j's
  final-normed hidden state ``h_j`` drafts position ``p+j`` (depth j);
- ``compute_candidates(h_j)``: the top-K ids of ``h_j @ lm_head^T`` (the target's lm_head)
  with their values: DFlash2 the logits (times ``output_multiplier``, soft-capped by
  ``final_logit_softcapping``; neither set here), LiLiCorr the full-vocabulary log-softmax;
- ``_score_candidates`` -> scores [R, N, K, K], row i of depth d the transition from depth
  d-1's candidate i to depth d's candidates; depth 1's rows all follow the anchor:
  - DFlash2 (``qwen3_dflash2._score_edges``): ``unary[d, c] + (pred[prev] * (W_h h_d)) .
    succ[c]`` with ``prev`` the root token at depth 1;
  - LiLiCorr (``lilicorr.LiLiCorrHead``): ``logit_scale * cos(out[d-1, i], in[d, c])`` from a
    small transformer over the whole K x N lattice (candidate embeddings from the target's
    table, candidate log-prob features, the pass hidden states ``h_d``), depth 1 from
    ``anchor_out`` of the anchor hidden state ``hidden_norm(fc(target features at p-1))``;
- the greedy walk (``_selector_walk_kernel`` at temperature 0): start at row 0, take the
  argmax of the row, continue from that candidate's row.

Training (teacher forcing along the target's own tokens, the backbone frozen): at depth d the
row of the target's previous token (the root at depth 1; for LiLiCorr the previous token must
be a candidate of depth d-1, its row being indexed by candidate) is trained with CE over the K
candidates toward the target's token x_{p+d}, where that token is a candidate.

Parameter names equal vLLM's checkpoint names (``candidate_selector.*``, ``lilicorr.*``), so
the state dicts export directly; DFlash2's grouped convolutions are written as the identity
(base_kernel[:, 0] = 1, other taps and kernel_projection 0), the convolution the backbone
was trained without.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from vllm_dartree.checkpoint import DFLASH2, LILICORR, DrafterLayout
from vllm_dartree.training.model import IGNORE_INDEX, BlockDrafter
from vllm_dartree.tree import build_tree
from vllm_dartree.tree.lattice import Lattice

LATTICE_KINDS = (DFLASH2, LILICORR)
ARCHITECTURES = {DFLASH2: "DFlash2DraftModel", LILICORR: "LiLiCorrDraftModel"}
HEAD_PREFIX = {DFLASH2: "candidate_selector.", LILICORR: "lilicorr."}
CONV_NAMES = (".attention_conv.", ".mlp_conv.")


@dataclass(frozen=True)
class LatticeHeadConfig:
    """A lattice head's shape and training settings (``kind``: dflash2 or lilicorr)."""

    kind: str = DFLASH2
    top_k: int = 4  # selector_top_k / lilicorr_candidate_topk
    # DFlash2's selector and (identity) convolution
    selector_rank: int = 16
    conv_kernel_size: int = 3
    conv_group_size: int = 32
    # LiLiCorr's correlator (0 hidden size: the model's)
    lilicorr_hidden_size: int = 64
    lilicorr_num_heads: int = 2
    lilicorr_num_layers: int = 1
    lilicorr_mlp_ratio: float = 2.0
    lilicorr_factor_dim: int = 16
    lilicorr_logit_scale: float = 8.0
    lilicorr_vector_eps: float = 1e-6
    lilicorr_conv: bool = False  # also write the (identity) convolution keys for LiLiCorr
    # training
    steps: int = 600
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.0
    batch_size: int = 128  # anchors per step
    anchors_per_sequence: int = 24
    holdout: float = 0.1  # fraction of the anchors kept for the validation numbers
    seed: int = 0

    def __post_init__(self) -> None:
        if self.kind not in LATTICE_KINDS:
            raise ValueError(f"kind={self.kind!r}: allowed {list(LATTICE_KINDS)}")
        top_k = self.top_k
        if self.kind == LILICORR and (top_k <= 0 or top_k > 16 or top_k & (top_k - 1)):
            raise ValueError("LiLiCorr's candidate top-k is a power of two <= 16")

    @property
    def has_conv(self) -> bool:
        return self.kind == DFLASH2 or self.lilicorr_conv


# ------------------------------------------------------------------------ candidates
@torch.no_grad()
def compute_candidates(hidden: torch.Tensor, lm_head: torch.Tensor, top_k: int
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """hidden [..., H] -> (ids, logits, log_probs) [..., K]: vLLM's ``get_top_k_tokens``
    (DFlash2's unary values are the logits, LiLiCorr's the log-softmax)."""
    logits = hidden.float() @ lm_head.float().T
    values, ids = logits.topk(top_k, dim=-1)
    return ids, values, values - logits.logsumexp(-1, keepdim=True)


# ------------------------------------------------------------------------ DFlash2 twin
class CandidateSelectorTwin(nn.Module):
    """``qwen3_dflash2.CandidateSelector`` in pure torch (same parameter names)."""

    def __init__(self, hidden_size: int, vocab_size: int, rank: int, top_k: int) -> None:
        super().__init__()
        self.top_k = top_k
        self.predecessor_codebook = nn.Parameter(torch.zeros(vocab_size, rank))
        self.successor_codebook = nn.Parameter(torch.zeros(vocab_size, rank))
        self.hidden_projection = nn.Linear(hidden_size, rank, bias=False)

    @torch.no_grad()
    def reset_parameters(self, gen: torch.Generator) -> None:
        """Unit codebooks and a small hidden projection: the edge term starts near zero, so
        the scores start as the unary logits (the plain argmax chain)."""
        for param in (self.predecessor_codebook, self.successor_codebook):
            param.copy_(torch.randn(param.shape, generator=gen))
        weight = self.hidden_projection.weight
        weight.copy_(torch.randn(weight.shape, generator=gen) * 0.01 * weight.shape[1] ** -0.5)

    def edge_rows(self, candidate_ids: torch.Tensor, unary: torch.Tensor,
                  hidden: torch.Tensor, prev_ids: torch.Tensor) -> torch.Tensor:
        """The row of predecessor token ``prev_ids`` [...]: [..., K] scores over the
        candidates ``candidate_ids`` [..., K] (unary [..., K], hidden [..., H])."""
        weighted = self.predecessor_codebook[prev_ids] * self.hidden_projection(hidden)
        edges = (self.successor_codebook[candidate_ids] * weighted.unsqueeze(-2)).sum(-1)
        return unary.float() + edges

    def forward(self, candidate_ids: torch.Tensor, unary_logits: torch.Tensor,
                hidden_states: torch.Tensor, anchor_token_ids: torch.Tensor) -> torch.Tensor:
        """vLLM's ``_score_edges``: [B, N, K] candidates -> [B, N, K, K] scores."""
        hidden = self.hidden_projection(hidden_states)
        top_k = candidate_ids.shape[-1]
        predecessor_ids = torch.cat(
            (anchor_token_ids[:, None, None].expand(-1, 1, top_k), candidate_ids[:, :-1]), dim=1)
        predecessors = self.predecessor_codebook[predecessor_ids]
        successors = self.successor_codebook[candidate_ids]
        return unary_logits[:, :, None] + torch.einsum(
            "blpr,blcr->blpc", predecessors * hidden[:, :, None], successors)


# ------------------------------------------------------------------------ LiLiCorr twin
class _MLP(nn.Module):
    """NemotronHMLP with bias, SiLU, not gated: down(silu(up(x)))."""

    def __init__(self, inputs: int, inner: int, outputs: int) -> None:
        super().__init__()
        self.up_proj = nn.Linear(inputs, inner, bias=True)
        self.down_proj = nn.Linear(inner, outputs, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.up_proj(x)))


class _LatticeAttention(nn.Module):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        if heads <= 0 or hidden % heads:
            raise ValueError(f"LiLiCorr hidden_size={hidden} must be divisible by "
                             f"num_heads={heads}")
        self.hidden_size, self.num_heads = hidden, heads
        self.in_proj_weight = nn.Parameter(torch.zeros(3 * hidden, hidden))
        self.in_proj_bias = nn.Parameter(torch.zeros(3 * hidden))
        self.out_proj = nn.Linear(hidden, hidden, bias=True)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        bsz, length, _ = x.shape
        q, k, v = F.linear(x, self.in_proj_weight, self.in_proj_bias).chunk(3, dim=-1)
        shape = (bsz, length, self.num_heads, self.hidden_size // self.num_heads)
        q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        return self.out_proj(out.transpose(1, 2).reshape(bsz, length, self.hidden_size))


class _LatticeLayer(nn.Module):
    def __init__(self, hidden: int, heads: int, mlp_ratio: float, eps: float) -> None:
        super().__init__()
        self.attn_norm = nn.RMSNorm(hidden, eps=eps)
        self.attn = _LatticeAttention(hidden, heads)
        self.mlp_norm = nn.RMSNorm(hidden, eps=eps)
        self.mlp = _MLP(hidden, int(hidden * mlp_ratio), hidden)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), bias)
        return x + self.mlp(self.mlp_norm(x))


class LiLiCorrTwin(nn.Module):
    """``lilicorr.LiLiCorrHead`` in pure torch, differentiable (same parameter names; its
    inference buffers, the attention bias, the fused edge weights and the split factor input
    weights, are computed from the parameters on every call)."""

    num_candidate_features = 5

    def __init__(self, *, model_hidden_size: int, block_size: int, rms_norm_eps: float,
                 config: dict) -> None:
        super().__init__()
        hidden = config["lilicorr_hidden_size"] or model_hidden_size
        self.block_size = block_size
        self.num_candidate_slots = block_size - 1
        self.candidate_topk = int(config["lilicorr_candidate_topk"])
        self.hidden_size = hidden
        self.num_heads = int(config["lilicorr_num_heads"])
        self.factor_dim = int(config["lilicorr_factor_dim"])
        self.vector_eps = float(config["lilicorr_vector_eps"])
        self.logit_scale = float(config["lilicorr_logit_scale"])
        topk = self.candidate_topk
        self.token_proj = (nn.Identity() if hidden == model_hidden_size
                           else nn.Linear(model_hidden_size, hidden, bias=True))
        self.pass_hidden_proj = nn.Linear(model_hidden_size, hidden, bias=True)
        self.feature_norm = nn.LayerNorm(self.num_candidate_features)
        self.feature_mlp = _MLP(self.num_candidate_features, hidden, hidden)
        self.slot_embedding = nn.Parameter(torch.zeros(1, 1, self.num_candidate_slots, 1,
                                                       hidden))
        self.rank_embedding = nn.Parameter(torch.zeros(1, 1, 1, topk, hidden))
        self.relative_slot_bias = nn.Parameter(torch.zeros(self.num_heads, 2 * block_size - 1))
        self.same_slot_bias = nn.Parameter(torch.zeros(self.num_heads))
        self.context_proj = nn.Linear(model_hidden_size, hidden, bias=True)
        self.layers = nn.ModuleList(
            _LatticeLayer(hidden, self.num_heads, float(config["lilicorr_mlp_ratio"]),
                          rms_norm_eps)
            for _ in range(int(config["lilicorr_num_layers"])))
        self.output_norm = nn.RMSNorm(hidden, eps=rms_norm_eps)
        self.anchor_norm = nn.RMSNorm(hidden, eps=rms_norm_eps)
        self.factor_input_proj = nn.Linear(3 * hidden, hidden, bias=True)
        self.out_head = nn.Linear(hidden, self.factor_dim, bias=True)
        self.in_head = nn.Linear(hidden, self.factor_dim, bias=True)
        self.anchor_out_head = nn.Linear(hidden, self.factor_dim, bias=True)

    @torch.no_grad()
    def reset_parameters(self, gen: torch.Generator) -> None:
        """Seeded init: fan-in scaled matrices, zero biases, unit norms, small embeddings."""
        for name, param in self.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            if "norm." in name:
                param.fill_(1.0 if leaf == "weight" else 0.0)
            elif leaf in ("bias", "in_proj_bias") or name.endswith("_slot_bias"):
                param.zero_()
            elif name in ("slot_embedding", "rank_embedding"):
                param.copy_(torch.randn(param.shape, generator=gen) * 0.1)
            else:
                param.copy_(torch.randn(param.shape, generator=gen) * param.shape[-1] ** -0.5)

    def attention_bias(self, n_slots: int) -> torch.Tensor:
        """[heads, n_slots * K, n_slots * K]: relative slot bias + same-slot bias (the
        prefix of vLLM's ``_build_attention_bias`` for ``n_slots`` slots)."""
        device = self.relative_slot_bias.device
        slot_ids = torch.arange(n_slots, device=device).repeat_interleave(self.candidate_topk)
        rel = slot_ids.view(-1, 1) - slot_ids.view(1, -1)
        bias = self.relative_slot_bias[:, rel + self.block_size - 1]
        same = (slot_ids.view(-1, 1) == slot_ids.view(1, -1)).to(bias.dtype)
        return bias + same.unsqueeze(0) * self.same_slot_bias.view(-1, 1, 1)

    def candidate_features(self, log_probs: torch.Tensor) -> torch.Tensor:
        topk = self.candidate_topk
        rank = (torch.arange(topk, device=log_probs.device, dtype=torch.float32) / (topk - 1)
                if topk > 1 else torch.zeros(topk, device=log_probs.device))
        top1 = torch.zeros(topk, device=log_probs.device)
        top1[0] = 1.0
        return torch.stack([log_probs, log_probs.exp(),
                            log_probs - log_probs.max(dim=-1, keepdim=True).values,
                            rank.expand_as(log_probs), top1.expand_as(log_probs)], dim=-1)

    def score(self, *, token_embeddings: torch.Tensor, candidate_log_probs: torch.Tensor,
              pass_hidden: torch.Tensor, anchor_hidden: torch.Tensor,
              anchor_valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(start [B, K], pairs [B, N-1, K, K]) cosines, as ``LiLiCorrHead.score``."""
        bsz, n_slots, topk = candidate_log_probs.shape
        if not 1 <= n_slots <= self.num_candidate_slots or topk != self.candidate_topk:
            raise ValueError(f"LiLiCorr scores 1..{self.num_candidate_slots} slots of "
                             f"{self.candidate_topk} candidates; got {n_slots} x {topk}")
        token_states = self.token_proj(token_embeddings)
        pass_states = self.pass_hidden_proj(pass_hidden).unsqueeze(-2)
        features = self.candidate_features(candidate_log_probs.float())
        x = token_states + pass_states
        x = x + self.feature_mlp(self.feature_norm(features.to(token_states.dtype)))
        x = x + self.slot_embedding[:, 0, :n_slots]
        x = x + self.rank_embedding[:, 0]
        x = x.reshape(bsz, n_slots * topk, self.hidden_size)
        anchor = self.context_proj(anchor_hidden)
        anchor = anchor * anchor_valid[:, None].to(anchor.dtype)
        bias = self.attention_bias(n_slots).unsqueeze(0).to(x.dtype)
        for layer in self.layers:
            x = layer(x, bias)
        x = self.output_norm(x).reshape(bsz, n_slots, topk, self.hidden_size)
        anchor = self.anchor_norm(anchor)
        anchor_row = anchor[:, None, None, :]
        factor = F.silu(self.factor_input_proj(torch.cat(
            [x, anchor_row.expand_as(x), x * anchor_row], dim=-1)))
        out_vec = F.normalize(self.out_head(factor), dim=-1, eps=self.vector_eps)
        in_vec = F.normalize(self.in_head(factor), dim=-1, eps=self.vector_eps)
        anchor_out = F.normalize(self.anchor_out_head(anchor), dim=-1, eps=self.vector_eps)
        start = (anchor_out[:, None, :] * in_vec[:, 0]).sum(-1)
        pairs = torch.matmul(out_vec[:, :-1], in_vec[:, 1:].transpose(-1, -2))
        return start, pairs

    def forward(self, token_embeddings: torch.Tensor, candidate_log_probs: torch.Tensor,
                pass_hidden: torch.Tensor, anchor_hidden: torch.Tensor,
                anchor_valid: torch.Tensor) -> torch.Tensor:
        """[B, N, K, K] scores: depth 1's rows all the start scores."""
        start, pairs = self.score(
            token_embeddings=token_embeddings, candidate_log_probs=candidate_log_probs,
            pass_hidden=pass_hidden, anchor_hidden=anchor_hidden, anchor_valid=anchor_valid)
        start = self.logit_scale * start.float()
        pairs = self.logit_scale * pairs.float()
        first = start[:, None, None, :].expand(-1, 1, self.candidate_topk, -1)
        return torch.cat((first, pairs), dim=1)


# ------------------------------------------------------------------------ examples
@dataclass
class LatticeExamples:
    """Per (sequence, anchor p): the frozen backbone's view of the next N = bs-1 depths."""

    hidden: torch.Tensor  # [M, N, H] final-normed hidden states of slots 1..N
    candidates: torch.Tensor  # [M, N, K] top-K ids
    logits: torch.Tensor  # [M, N, K] their logits (DFlash2's unary)
    log_probs: torch.Tensor  # [M, N, K] their log-softmax (LiLiCorr's features)
    labels: torch.Tensor  # [M, N] the target's x_{p+1..p+N} (IGNORE_INDEX past the end)
    roots: torch.Tensor  # [M] x_p
    anchor_hidden: torch.Tensor  # [M, H] hidden_norm(fc(features at p - 1))

    def __len__(self) -> int:
        return len(self.roots)

    def select(self, index: torch.Tensor) -> LatticeExamples:
        return LatticeExamples(*(getattr(self, f)[index] for f in self.__dataclass_fields__))

    def label_index(self) -> torch.Tensor:
        """[M, N] index of each label among its depth's candidates, -1 if not one."""
        hit = self.candidates == self.labels.unsqueeze(-1)
        return torch.where(hit.any(-1), hit.float().argmax(-1), -1)


@torch.no_grad()
def backbone_view(model: BlockDrafter, features: torch.Tensor, tokens: torch.Tensor,
                  anchors: torch.Tensor, lengths: torch.Tensor, top_k: int) -> LatticeExamples:
    """Examples for anchors [n, A] of right-padded tokens [n, T] (features [n, T, F])."""
    from vllm_dartree.training.model import block_labels

    bs = model.arch.block_size
    hidden = model.backbone(features, tokens, anchors)[:, :, 1:]  # [n, A, N, H]
    ids, logits, log_probs = compute_candidates(hidden, model.lm_head, top_k)
    labels = block_labels(tokens, anchors, lengths, bs, shift=False)[:, :, 1:]
    context = model.context(features)
    anchor_hidden = context.gather(1, (anchors - 1).clamp(min=0).unsqueeze(-1).expand(
        -1, -1, context.shape[-1]))
    flat = lambda t: t.flatten(0, 1)  # noqa: E731
    return LatticeExamples(flat(hidden), flat(ids), flat(logits), flat(log_probs), flat(labels),
                           flat(tokens.gather(1, anchors)), flat(anchor_hidden))


@torch.no_grad()
def collect_examples(model: BlockDrafter, target, sequences: Sequence[torch.Tensor],
                     prompt_lens: Sequence[int], anchors_per_sequence: int, top_k: int,
                     seed: int = 0, chunk: int = 64) -> LatticeExamples:
    """Anchors drawn uniformly over each response (as the trainer draws them)."""
    from vllm_dartree.training.data import pad_batch, sample_anchors, target_features

    model.eval()
    gen = torch.Generator().manual_seed(seed)
    parts = []
    for lo in range(0, len(sequences), chunk):
        tokens, lengths = pad_batch(list(sequences[lo: lo + chunk]))
        features = target_features(target, tokens, model.arch.target_layer_ids, lengths)
        anchors = sample_anchors(torch.tensor(list(prompt_lens[lo: lo + chunk])), lengths,
                                 anchors_per_sequence, gen)
        parts.append(backbone_view(model, features.float(), tokens, anchors, lengths, top_k))
    return LatticeExamples(*(torch.cat([getattr(p, f) for p in parts])
                             for f in LatticeExamples.__dataclass_fields__))


# ------------------------------------------------------------------------ heads
def new_head(cfg: LatticeHeadConfig, arch: DrafterLayout) -> nn.Module:
    """An untrained twin of ``cfg.kind``'s head for a backbone of layout ``arch``."""
    if cfg.kind == DFLASH2:
        return CandidateSelectorTwin(arch.hidden_size, arch.vocab_size, cfg.selector_rank,
                                     cfg.top_k)
    return LiLiCorrTwin(model_hidden_size=arch.hidden_size, block_size=arch.block_size,
                        rms_norm_eps=arch.rms_norm_eps, config=lilicorr_keys(cfg))


def lattice_scores(head: nn.Module, ex: LatticeExamples, embed: torch.Tensor) -> torch.Tensor:
    """[M, N, K, K] scores as vLLM's ``_score_candidates`` computes them."""
    if isinstance(head, CandidateSelectorTwin):
        return head(ex.candidates, ex.logits, ex.hidden, ex.roots)
    valid = torch.ones(len(ex), dtype=torch.bool, device=ex.hidden.device)
    return head(embed[ex.candidates], ex.log_probs, ex.hidden, ex.anchor_hidden, valid)


def teacher_rows(head: nn.Module, ex: LatticeExamples, embed: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows [M, N, K], targets [M, N]): depth d's row of the target's previous token and
    the index of the target's token among depth d's candidates (IGNORE_INDEX where it is
    not one, or, for LiLiCorr, where the previous token is not one of depth d-1's)."""
    index = ex.label_index()
    targets = torch.where(index >= 0, index, IGNORE_INDEX)
    if isinstance(head, CandidateSelectorTwin):
        prev = torch.cat([ex.roots.unsqueeze(1), ex.labels[:, :-1]], dim=1).clamp(min=0)
        return head.edge_rows(ex.candidates, ex.logits, ex.hidden, prev), targets
    scores = lattice_scores(head, ex, embed)  # [M, N, K, K]
    prev_index = torch.cat([torch.zeros_like(index[:, :1]), index[:, :-1]], dim=1)
    rows = scores.gather(2, prev_index.clamp(min=0)[:, :, None, None].expand(
        -1, -1, 1, scores.shape[-1])).squeeze(2)
    return rows, torch.where(prev_index >= 0, targets, IGNORE_INDEX)


def greedy_walk(scores: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
    """vLLM's ``_selector_walk_kernel`` at temperature 0: [M, N, K, K] -> tokens [M, N]. It
    is the tree core's chain over the lattice (what a dartree engine drafts)."""
    num, depths = candidates.shape[:2]
    roots = candidates.new_zeros(num)  # a chain of every depth has no padding to fill
    return build_tree("chain", None, None, roots, None, budget=depths,
                      lattice=Lattice(candidates, scores.float())).tokens


def accepted_lengths(drafts: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """[M, N] drafts vs the target's tokens -> [M] tokens committed per round (the leading
    matches + the bonus token)."""
    match = (drafts == labels).long().cumprod(-1)
    return match.sum(-1) + 1


@dataclass
class LatticeTrainResult:
    head: nn.Module
    losses: list[float]
    seconds: float
    stats: dict[str, float]


def train_head(cfg: LatticeHeadConfig, ex: LatticeExamples, arch: DrafterLayout,
               embed: torch.Tensor, progress: bool = False) -> LatticeTrainResult:
    """Train the lattice head on examples of the frozen backbone (Adam, warmup + cosine)."""
    import math

    from tqdm.auto import tqdm

    started = time.perf_counter()
    gen = torch.Generator().manual_seed(cfg.seed)
    order = torch.randperm(len(ex), generator=gen)
    held = int(len(ex) * cfg.holdout)
    train_ex, val_ex = ex.select(order[held:]), ex.select(order[:held])
    head = new_head(cfg, arch)
    head.reset_parameters(gen)
    optimizer = torch.optim.AdamW(head.parameters(), lr=cfg.lr, betas=(0.9, 0.95),
                                  weight_decay=cfg.weight_decay)
    warmup = max(1, cfg.steps // 20)
    losses = []
    head.train()
    bar = tqdm(range(cfg.steps), desc=f"train {cfg.kind} head", disable=not progress)
    for step in bar:
        if step < warmup:
            lr = cfg.lr * (step + 1) / warmup
        else:
            decay = 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, cfg.steps - warmup)))
            lr = cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * decay)
        for group in optimizer.param_groups:
            group["lr"] = lr
        rows = torch.randint(len(train_ex), (cfg.batch_size,), generator=gen)
        scores, targets = teacher_rows(head, train_ex.select(rows), embed)
        loss = F.cross_entropy(scores.flatten(0, 1), targets.flatten(),
                               ignore_index=IGNORE_INDEX)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
        bar.set_postfix({"ce": f"{loss.item():.3f}"}, refresh=False)
    head.eval()
    stats = evaluate_head(head, val_ex if held else train_ex, embed)
    return LatticeTrainResult(head, losses, time.perf_counter() - started, stats)


@torch.no_grad()
def evaluate_head(head: nn.Module, ex: LatticeExamples, embed: torch.Tensor
                  ) -> dict[str, float]:
    """Teacher-forced row accuracy (where the target is a candidate) of the lattice and of
    the plain top-1, the top-K coverage, and tokens per round of the greedy walk and of the
    argmax chain over these anchors (no decode loop)."""
    rows, targets = teacher_rows(head, ex, embed)
    valid = targets != IGNORE_INDEX
    walk = greedy_walk(lattice_scores(head, ex, embed), ex.candidates)
    chain = ex.candidates[..., 0]
    return {
        "row_acc": (rows.argmax(-1) == targets)[valid].float().mean().item(),
        "top1_acc": (targets == 0)[valid].float().mean().item(),
        "coverage": (ex.label_index() >= 0)[ex.labels != IGNORE_INDEX].float().mean().item(),
        "tau_walk": accepted_lengths(walk, ex.labels).float().mean().item(),
        "tau_chain": accepted_lengths(chain, ex.labels).float().mean().item(),
    }


# ------------------------------------------------------------------------ export
def lilicorr_keys(cfg: LatticeHeadConfig) -> dict:
    return {
        "lilicorr_enabled": True,
        "lilicorr_hidden_size": cfg.lilicorr_hidden_size,
        "lilicorr_num_heads": cfg.lilicorr_num_heads,
        "lilicorr_num_layers": cfg.lilicorr_num_layers,
        "lilicorr_mlp_ratio": cfg.lilicorr_mlp_ratio,
        "lilicorr_factor_dim": cfg.lilicorr_factor_dim,
        "lilicorr_candidate_topk": cfg.top_k,
        "lilicorr_logit_scale": cfg.lilicorr_logit_scale,
        "lilicorr_vector_eps": cfg.lilicorr_vector_eps,
    }


def lattice_config(arch: DrafterLayout, cfg: LatticeHeadConfig, dtype: str = "float32"
                   ) -> dict:
    """config.json: the backbone's z-lab DFlash config with the format's architecture and
    ``dflash_config`` keys (as ``models/tiny_lattice.lattice_config`` writes them)."""
    if arch.head is not None or arch.shift_label:
        raise ValueError("a lattice drafter's backbone is a head-less z-lab (non-shift) one")
    config = replace(arch, lattice=None, lattice_top_k=None).to_config(dtype)
    config["architectures"] = [ARCHITECTURES[cfg.kind]]
    dflash = config["dflash_config"]
    # LiLiCorr reads dflash_config.block_size before the top-level one: both say the same.
    dflash["block_size"] = arch.block_size
    if cfg.has_conv:
        dflash |= {"conv_kernel_size": cfg.conv_kernel_size,
                   "conv_group_size": cfg.conv_group_size}
    if cfg.kind == LILICORR:
        dflash |= lilicorr_keys(cfg)
    else:
        dflash |= {"selector_rank": cfg.selector_rank, "selector_top_k": cfg.top_k}
    return config


def identity_conv_weights(arch: DrafterLayout, cfg: LatticeHeadConfig
                          ) -> dict[str, torch.Tensor]:
    """DFlashGroupedConv weights that leave every row as it is."""
    hidden, taps = arch.hidden_size, cfg.conv_kernel_size
    if hidden % cfg.conv_group_size:
        raise ValueError(f"conv_group_size {cfg.conv_group_size} must divide {hidden}")
    groups = hidden // cfg.conv_group_size
    base = torch.zeros(2, taps, hidden)
    base[:, 0] = 1.0
    weights = {}
    for i in range(arch.num_hidden_layers):
        for conv in ("attention_conv", "mlp_conv"):
            weights[f"layers.{i}.{conv}.base_kernel"] = base.clone()
            weights[f"layers.{i}.{conv}.kernel_projection.weight"] = torch.zeros(
                2 * taps * groups, hidden)
    return weights


def lattice_weights(model: BlockDrafter, head: nn.Module, cfg: LatticeHeadConfig
                    ) -> dict[str, torch.Tensor]:
    weights = dict(model.state_dict())
    if cfg.has_conv:
        weights |= identity_conv_weights(model.arch, cfg)
    weights |= {HEAD_PREFIX[cfg.kind] + k: v for k, v in head.state_dict().items()}
    return weights


def export_lattice(model: BlockDrafter, head: nn.Module, cfg: LatticeHeadConfig,
                   out_dir: str | Path, dtype: str = "float32") -> Path:
    """``config.json`` + ``model.safetensors`` in vLLM's released layout of ``cfg.kind``."""
    from vllm_dartree.training.train import DTYPES

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    weights = {k: v.detach().to(DTYPES[dtype]).contiguous().cpu()
               for k, v in lattice_weights(model, head, cfg).items()}
    save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(lattice_config(model.arch, cfg, dtype),
                                                indent=2))
    return out


def config_of_dir(drafter_dir: str | Path) -> LatticeHeadConfig:
    """The head settings a lattice checkpoint's config.json states."""
    config = json.loads((Path(drafter_dir) / "config.json").read_text())
    layout = DrafterLayout.from_config(config)
    if layout.lattice not in LATTICE_KINDS:
        raise ValueError(f"{drafter_dir} is not a DFlash2 or LiLiCorr drafter")
    d = config["dflash_config"]
    fields = {"kind": layout.lattice, "top_k": layout.lattice_top_k}
    if d.get("conv_kernel_size"):
        fields |= {"conv_kernel_size": d["conv_kernel_size"],
                   "conv_group_size": d["conv_group_size"],
                   "lilicorr_conv": layout.lattice == LILICORR}
    if layout.lattice == DFLASH2:
        fields["selector_rank"] = d["selector_rank"]
    else:
        fields |= {k: d[k] for k in lilicorr_keys(LatticeHeadConfig()) if k.startswith(
            "lilicorr_") and k not in ("lilicorr_enabled", "lilicorr_candidate_topk")}
    return LatticeHeadConfig(**fields)


def load_lattice(drafter_dir: str | Path, embed: torch.Tensor, lm_head: torch.Tensor
                 ) -> tuple[BlockDrafter, nn.Module, LatticeHeadConfig]:
    """(backbone, head twin, settings) of a DFlash2/LiLiCorr checkpoint whose convolutions
    (if any) are the identity (the pure-torch backbone has none)."""
    from vllm_dartree.training.train import load_weights

    drafter_dir = Path(drafter_dir)
    cfg = config_of_dir(drafter_dir)
    layout = DrafterLayout.from_dir(drafter_dir)
    arch = replace(layout, lattice=None, lattice_top_k=None)
    weights = load_file(str(drafter_dir / "model.safetensors"))
    prefix = HEAD_PREFIX[cfg.kind]
    conv = {k: v for k, v in weights.items() if any(c in k for c in CONV_NAMES)}
    if cfg.has_conv:
        identity = identity_conv_weights(arch, cfg)
        if conv.keys() != identity.keys() or any(
                not torch.equal(conv[k].float(), identity[k]) for k in conv):
            raise ValueError(f"{drafter_dir}: only identity convolutions can be loaded")
    model = BlockDrafter(arch, embed, lm_head)
    model.reset_parameters(torch.Generator().manual_seed(0))
    load_weights(model, {k: v for k, v in weights.items()
                         if k not in conv and not k.startswith(prefix)})
    head = new_head(cfg, arch)
    head.load_state_dict({k[len(prefix):]: v.float() for k, v in weights.items()
                          if k.startswith(prefix)})
    return model.eval(), head.eval(), cfg
