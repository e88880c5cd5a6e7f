"""The drafter's training loss, fused over the vocabulary and computed in row chunks.

Loss (reference: :func:`drafter_loss`, which takes the materialised logits):

    (1 - lam) * CE(h W^T + u P^T, y) + lam * CE(h W^T, y)    (weighted means over slots)

with ``h`` the drafter's final hidden states, ``W`` the target's frozen lm_head and the head
bias ``u P^T``: Domino's projection input (``embed_proj.1`` output) and ``embed_proj.2.weight``,
or DSpark's Markov embedding of the previous token (``markov_w1[x]``) and ``markov_w2``.
A head-less drafter (z-lab layout) passes a [V, 0] ``P``: the loss is then CE(h W^T, y).

Why fused: two [rows, 49k] logit tensors per step are hundreds of MB, and on a CPU the
softmax, its backward, the dtype copies and the zero-fills over them cost more than the
matmuls. Here each chunk of rows is computed, turned into its gradient (softmax - one-hot)
and reduced to [rows, H], [rows, E] and [V, E] gradients while it is still in cache; the
backward pass only scales what the forward pass already computed.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from vllm_dartree.training.model import IGNORE_INDEX, DrafterOutput

CHUNK_ROWS = 128  # a [128, 49k] float32 chunk is 25 MB


# -------------------------------------------------------------------------- reference
def masked_ce(logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Weighted mean CE over labelled slots: logits [..., bs, V], labels/weights [..., bs]."""
    ce = F.cross_entropy(logits.flatten(0, -2).float(), labels.flatten(),
                         ignore_index=IGNORE_INDEX, reduction="none").view(labels.shape)
    weights = weights * (labels != IGNORE_INDEX)
    return (ce * weights).sum() / weights.sum().clamp(min=1e-9)


def slot_weights(block_size: int, gamma: float | None, device) -> torch.Tensor:
    slots = torch.arange(block_size, device=device, dtype=torch.float32)
    return torch.ones_like(slots) if gamma is None else torch.exp(-slots / gamma)


def drafter_loss(out: DrafterOutput, labels: torch.Tensor, lam: float,
                 gamma: float | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """(1 - lam) CE(corrected) + lam CE(base); also top-1 accuracies for the progress bar."""
    weights = slot_weights(labels.shape[-1], gamma, labels.device).expand(labels.shape)
    base = masked_ce(out.base_logits, labels, weights)
    if out.corrected_logits is None:
        return base, {"ce_base": base.item()}
    corrected = masked_ce(out.corrected_logits, labels, weights)
    loss = (1 - lam) * corrected + lam * base
    valid = labels != IGNORE_INDEX
    acc = (out.corrected_logits.argmax(-1) == labels)[valid].float().mean().item()
    return loss, {"ce": corrected.item(), "ce_base": base.item(), "acc": acc}


# ------------------------------------------------------------------------------ fused
def _ce_and_grad(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per-row CE; ``logits`` becomes softmax(logits) - onehot(labels) (its gradient) in place."""
    rows = torch.arange(len(labels), device=labels.device)
    lse = logits.logsumexp(-1)
    ce = lse - logits[rows, labels]
    logits.sub_(lse.unsqueeze(1)).exp_()
    logits[rows, labels] -= 1
    return ce


class _FusedBlockCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, head_in, lm_head, proj, labels, weights, lam, chunk):
        mm = lm_head.dtype  # bfloat16 under autocast (the caller casts the frozen table)
        proj_mm = proj.to(mm)
        d_hidden = torch.empty(hidden.shape, dtype=torch.float32, device=hidden.device)
        d_head = torch.empty(head_in.shape, dtype=torch.float32, device=hidden.device)
        d_proj = torch.zeros(proj.shape, dtype=torch.float32, device=hidden.device)
        # weighted CE sums (corrected, base) and the count of correct argmaxes
        sums = torch.zeros(3, dtype=torch.float32, device=hidden.device)
        hits = torch.empty(hidden.shape[0], dtype=torch.bool, device=hidden.device)
        for lo in range(0, hidden.shape[0], chunk):
            rows = slice(lo, lo + chunk)
            h, u = hidden[rows].to(mm), head_in[rows].to(mm)
            y = labels[rows].clamp(min=0)  # ignored rows have zero coefficients
            w = weights[rows]
            base = (h @ lm_head.T).float()
            if proj.shape[-1] == 0:  # no head (z-lab layout): corrected == base
                hits[rows] = base.argmax(-1) == labels[rows]
                sums[2] += hits[rows].float().sum()
                ce = (w * _ce_and_grad(base, y)).sum()
                sums[0] += ce
                sums[1] += ce
                d_hidden[rows] = base.mul_(w.unsqueeze(1)).to(mm) @ lm_head
                d_head[rows] = 0
                continue
            corr = base + (u @ proj_mm.T).float()
            hits[rows] = corr.argmax(-1) == labels[rows]
            sums[2] += hits[rows].float().sum()
            sums[0] += (w * _ce_and_grad(corr, y)).sum()
            sums[1] += (w * _ce_and_grad(base, y)).sum()
            g_corr = corr.mul_(((1 - lam) * w).unsqueeze(1))
            # base feeds both terms: d(loss)/d(base) = lam w (p_base - e_y) + g_corr
            g_base = base.mul_((lam * w).unsqueeze(1)).add_(g_corr)
            g_corr, g_base = g_corr.to(mm), g_base.to(mm)
            d_hidden[rows] = g_base @ lm_head
            d_head[rows] = g_corr @ proj_mm
            d_proj += (g_corr.T @ u).float()
        ctx.save_for_backward(d_hidden, d_head, d_proj)
        ctx.dtypes = hidden.dtype, head_in.dtype, proj.dtype
        stats = sums.clone()
        ctx.mark_non_differentiable(stats, hits)
        return (1 - lam) * sums[0] + lam * sums[1], stats, hits

    @staticmethod
    def backward(ctx, grad_loss, _grad_stats, _grad_hits):
        d_hidden, d_head, d_proj = ctx.saved_tensors
        h_dtype, u_dtype, p_dtype = ctx.dtypes
        return ((d_hidden * grad_loss).to(h_dtype), (d_head * grad_loss).to(u_dtype), None,
                (d_proj * grad_loss).to(p_dtype), None, None, None, None)


def fused_drafter_loss(
    hidden: torch.Tensor,
    head_in: torch.Tensor,
    lm_head: torch.Tensor,
    proj: torch.Tensor,
    labels: torch.Tensor,
    weight_per_slot: torch.Tensor,
    lam: float,
    chunk: int = CHUNK_ROWS,
) -> tuple[torch.Tensor, dict[str, float]]:
    """hidden [..., bs, H], head_in [..., bs, E], labels [..., bs], weight_per_slot [bs];
    lm_head [V, H] (frozen; its dtype is the matmul dtype), proj [V, E]. Returns the loss and
    the progress-bar stats of ``drafter_loss`` (ce, ce_base, acc)."""
    loss, stats, _ = fused_drafter_loss_and_hits(hidden, head_in, lm_head, proj, labels,
                                                 weight_per_slot, lam, chunk)
    return loss, stats


def fused_drafter_loss_and_hits(
    hidden: torch.Tensor, head_in: torch.Tensor, lm_head: torch.Tensor, proj: torch.Tensor,
    labels: torch.Tensor, weight_per_slot: torch.Tensor, lam: float, chunk: int = CHUNK_ROWS,
) -> tuple[torch.Tensor, dict[str, float], torch.Tensor]:
    """:func:`fused_drafter_loss`, plus the [..., bs] mask of slots whose corrected argmax is
    the label (the confidence head's target)."""
    valid = labels != IGNORE_INDEX
    weights = (weight_per_slot.expand(labels.shape) * valid).flatten().float()
    norm = weights.sum().clamp(min=1e-9)
    loss, sums, hits = _FusedBlockCE.apply(
        hidden.flatten(0, -2), head_in.flatten(0, -2), lm_head, proj, labels.flatten(),
        weights / norm, float(lam), chunk)
    ce, ce_base, correct = sums.tolist()
    stats = {"ce": ce, "ce_base": ce_base, "acc": correct / max(1, int(valid.sum()))}
    return loss, stats, hits.view(labels.shape)


def confidence_loss(logits: torch.Tensor, hits: torch.Tensor,
                    labels: torch.Tensor) -> torch.Tensor:
    """Mean BCE of the confidence logits [..., bs] against ``hits`` over labelled slots: under
    teacher forcing a hit is "accepted, given every earlier slot was"."""
    valid = labels != IGNORE_INDEX
    return F.binary_cross_entropy_with_logits(logits[valid].float(), hits[valid].float())
