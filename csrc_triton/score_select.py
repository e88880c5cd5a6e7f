"""One DARTree depth step (score the candidates of every frontier parent, keep the global
top-Q pairs): a Triton kernel and its torch twin.

For R requests, W frontier parents and K candidates (the depth's base top-K):

    mid[r, w]       = SiLU(z_proj[r] + s_proj[r, w])                  [E]
    logit[r, w, k]  = base[r, k] + mid[r, w] . cand_weights[r, k]
    score[r, w, k]  = parent_scores[r, w] + logit[r, w, k] - logsumexp_k logit[r, w, :]

then the Q best of the W*K pairs of each request, sorted by score descending (ties: lower
flat index w * K + k first). Returns (parent slot w, candidate slot k, score), each [R, Q].
Without ``z_proj`` (an uncorrected depth) the logits are the base logits for every parent.
This is the step of ``vllm_dartree.tree.build.grow_supertree`` (``candidate_logprobs`` +
``stable_topk``), with ``s_proj = states @ head.proj_s.T`` computed by the caller.

Kernel: one program per request. The [W, K] logits are built with tl.dot over E chunks and
normalised per row; the pair scores go to a scratch row; after a CTA barrier each pair
counts the pairs ranked above it (score greater, or equal with a lower flat index), which is
its output position; pairs with rank < Q are written there. NaN scores are not supported.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F

from csrc_triton import topb
from csrc_triton.topb import interpreter_enabled, interpreter_loaded

triton = None
tl = None

MAX_PAIRS = 4096


def _load_triton() -> bool:
    """Bind this module's ``triton``/``tl`` (kernel bodies resolve them at JIT time)."""
    global triton, tl
    if triton is None and topb._load_triton():
        triton, tl = topb.triton, topb.tl
    return triton is not None


# ------------------------------------------------------------------------------ torch twin
def score_select_torch(
    parent_scores: torch.Tensor,
    base: torch.Tensor,
    quota: int,
    z_proj: torch.Tensor | None = None,
    s_proj: torch.Tensor | None = None,
    cand_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Torch twin: the operations of ``candidate_logprobs`` and ``grow_supertree``.

    The selection is a stable descending sort, which is what ``stable_topk`` does for rows of
    at most 4096 entries (``SMALL_SORT``), the most this step allows (``MAX_PAIRS``).
    """
    _check_args(parent_scores, base, quota, z_proj, s_proj, cand_weights)
    top_k = base.shape[1]
    logits = base.float().unsqueeze(1)  # [R, 1, K]
    if z_proj is not None:
        mid = F.silu(z_proj.unsqueeze(1) + s_proj)  # [R, W, E], in the head's dtype
        logits = logits + mid @ cand_weights.transpose(1, 2)
    logprobs = logits - logits.logsumexp(dim=-1, keepdim=True)
    pair_scores = (parent_scores.float().unsqueeze(-1) + logprobs).flatten(1)
    scores, pair = torch.sort(pair_scores, dim=1, descending=True, stable=True)
    return pair[:, :quota] // top_k, pair[:, :quota] % top_k, scores[:, :quota]


# ---------------------------------------------------------------------------------- kernel
def _score_select(
    parent_ptr, base_ptr, z_ptr, s_ptr, cw_ptr, pair_ptr, out_w_ptr, out_k_ptr, out_s_ptr,
    num_parents, top_k, proj, quota,
    stride_pr, stride_br, stride_zr, stride_sr, stride_sw, stride_cr, stride_ck,
    stride_pair, stride_out,
    HAS_BIAS: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_E: tl.constexpr, BLOCK_PAIRS: tl.constexpr, CHUNK: tl.constexpr,
):
    req = tl.program_id(0).to(tl.int64)
    offs_w = tl.arange(0, BLOCK_W)
    offs_k = tl.arange(0, BLOCK_K)
    in_w = offs_w < num_parents
    in_k = offs_k < top_k
    base = tl.load(base_ptr + req * stride_br + offs_k, mask=in_k, other=0.0).to(tl.float32)
    logits = tl.zeros([BLOCK_W, BLOCK_K], tl.float32) + base[None, :]
    if HAS_BIAS:
        for e0 in range(0, proj, BLOCK_E):
            offs_e = e0 + tl.arange(0, BLOCK_E)
            in_e = offs_e < proj
            z = tl.load(z_ptr + req * stride_zr + offs_e, mask=in_e, other=0.0)
            s = tl.load(s_ptr + req * stride_sr + offs_w[:, None] * stride_sw + offs_e[None, :],
                        mask=in_w[:, None] & in_e[None, :], other=0.0)
            x = z.to(tl.float32)[None, :] + s.to(tl.float32)
            mid = x * tl.sigmoid(x)  # SiLU; padded entries are 0
            cw = tl.load(cw_ptr + req * stride_cr + offs_k[:, None] * stride_ck + offs_e[None, :],
                         mask=in_k[:, None] & in_e[None, :], other=0.0).to(tl.float32)
            # "ieee": pair ranks must match the fp32 twin, tf32 would reorder near-ties
            logits += tl.dot(mid, tl.trans(cw), input_precision="ieee")
    logits = tl.where(in_k[None, :], logits, float("-inf"))
    row_max = tl.max(logits, 1)
    lse = row_max + tl.log(tl.sum(tl.exp(logits - row_max[:, None]), 1))
    parent = tl.load(parent_ptr + req * stride_pr + offs_w, mask=in_w, other=0.0)
    score = parent.to(tl.float32)[:, None] + (logits - lse[:, None])
    flat = offs_w[:, None] * top_k + offs_k[None, :]
    tl.store(pair_ptr + req * stride_pair + flat, score, mask=in_w[:, None] & in_k[None, :])
    tl.debug_barrier()  # the scratch row is complete before any thread ranks against it

    num_pairs = num_parents * top_k
    offs_i = tl.arange(0, BLOCK_PAIRS)
    in_i = offs_i < num_pairs
    s_i = tl.load(pair_ptr + req * stride_pair + offs_i, mask=in_i, other=float("-inf"))
    rank = tl.zeros([BLOCK_PAIRS], dtype=tl.int32)
    for start in range(0, num_pairs, CHUNK):
        offs_j = start + tl.arange(0, CHUNK)
        in_j = offs_j < num_pairs
        s_j = tl.load(pair_ptr + req * stride_pair + offs_j, mask=in_j, other=float("-inf"))
        better = (s_j[None, :] > s_i[:, None]) | (
            (s_j[None, :] == s_i[:, None]) & (offs_j[None, :] < offs_i[:, None]))
        rank += tl.sum((better & in_j[None, :]).to(tl.int32), axis=1)
    keep = (rank < quota) & in_i
    out = req * stride_out + rank
    tl.store(out_w_ptr + out, (offs_i // top_k).to(tl.int64), mask=keep)
    tl.store(out_k_ptr + out, (offs_i % top_k).to(tl.int64), mask=keep)
    tl.store(out_s_ptr + out, s_i, mask=keep)


_KERNELS: dict[bool, object] = {}


def _kernel(interpret: bool):
    if interpret not in _KERNELS:
        if interpret:  # triton.jit would consult the environment variable, not the import
            from triton.runtime.interpreter import InterpretedFunction

            _KERNELS[interpret] = InterpretedFunction(_score_select)
        else:
            _KERNELS[interpret] = triton.jit(_score_select)
    return _KERNELS[interpret]


def _pow2(n: int, at_least: int = 1) -> int:
    return max(at_least, 1 << (max(n, 1) - 1).bit_length())


def score_select_launch(parent_scores, base, quota, z_proj, s_proj, cand_weights, *,
                        chunk: int | None = None) -> tuple[tuple, tuple]:
    """((python function, grid, kwargs), outputs) of the launch (launcher and AOT check)."""
    num_requests, num_parents = parent_scores.shape
    top_k = base.shape[1]
    device = base.device
    has_bias = z_proj is not None
    proj = cand_weights.shape[2] if has_bias else 1
    if not has_bias:  # unused pointers: any tensor of the right kind
        z_proj = s_proj = cand_weights = base
    pairs = torch.empty(num_requests, num_parents * top_k, dtype=torch.float32, device=device)
    out_w = torch.empty(num_requests, quota, dtype=torch.int64, device=device)
    out_k = torch.empty_like(out_w)
    out_s = torch.empty(num_requests, quota, dtype=torch.float32, device=device)
    # A narrow comparison chunk keeps the [pairs, CHUNK] compare tile in registers on a GPU;
    # the interpreter prefers few wide numpy steps.
    chunk = (16 if base.is_cuda else 128) if chunk is None else chunk
    kwargs = dict(
        parent_ptr=parent_scores, base_ptr=base, z_ptr=z_proj, s_ptr=s_proj, cw_ptr=cand_weights,
        pair_ptr=pairs, out_w_ptr=out_w, out_k_ptr=out_k, out_s_ptr=out_s,
        num_parents=num_parents, top_k=top_k, proj=proj, quota=quota,
        stride_pr=parent_scores.stride(0), stride_br=base.stride(0),
        stride_zr=z_proj.stride(0), stride_sr=s_proj.stride(0),
        stride_sw=s_proj.stride(1) if has_bias else 0, stride_cr=cand_weights.stride(0),
        stride_ck=cand_weights.stride(1) if has_bias else 0,
        stride_pair=pairs.stride(0), stride_out=out_w.stride(0),
        HAS_BIAS=has_bias, BLOCK_W=_pow2(num_parents, 16), BLOCK_K=_pow2(top_k, 16),
        BLOCK_E=min(64, _pow2(proj, 16)), BLOCK_PAIRS=_pow2(num_parents * top_k, chunk),
        CHUNK=chunk, num_warps=8 if base.is_cuda else 4,
    )
    return (_score_select, (num_requests,), kwargs), (out_w, out_k, out_s)


def score_select_triton(
    parent_scores: torch.Tensor,
    base: torch.Tensor,
    quota: int,
    z_proj: torch.Tensor | None = None,
    s_proj: torch.Tensor | None = None,
    cand_weights: torch.Tensor | None = None,
    *,
    chunk: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Triton kernel (CUDA, or CPU tensors under TRITON_INTERPRET=1); fp32 math whatever the
    input dtype (the twin computes the bias in the head's dtype)."""
    _check_args(parent_scores, base, quota, z_proj, s_proj, cand_weights)
    if not _load_triton():
        raise RuntimeError("triton is not installed; use score_select_torch")
    interpret = interpreter_loaded()
    if not base.is_cuda and not (interpret and interpreter_enabled()):
        raise RuntimeError("score_select_triton on CPU tensors needs the Triton interpreter: "
                           "set TRITON_INTERPRET=1 before triton is first imported")
    contiguous = [None if t is None else _last_dim_contiguous(t)
                  for t in (parent_scores, base, z_proj, s_proj, cand_weights)]
    (fn, grid, kwargs), outputs = score_select_launch(*contiguous[:2], quota, *contiguous[2:],
                                                      chunk=chunk)
    if quota > 0 and parent_scores.shape[0] > 0:
        _kernel(interpret)[grid](**kwargs)
    return outputs


def score_select(
    parent_scores: torch.Tensor,
    base: torch.Tensor,
    quota: int,
    z_proj: torch.Tensor | None = None,
    s_proj: torch.Tensor | None = None,
    cand_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Dispatch: the Triton kernel on CUDA or with TRITON_INTERPRET=1, else the torch twin."""
    args = (parent_scores, base, quota, z_proj, s_proj, cand_weights)
    if base.is_cuda:
        return score_select_triton(*args) if _load_triton() else score_select_torch(*args)
    if not interpreter_enabled() or not _load_triton():
        return score_select_torch(*args)
    if not interpreter_loaded():
        warnings.warn("TRITON_INTERPRET=1 was set after triton was imported; using the "
                      "torch twin of score_select", RuntimeWarning, stacklevel=2)
        return score_select_torch(*args)
    return score_select_triton(*args)


def _last_dim_contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def _check_args(parent_scores, base, quota, z_proj, s_proj, cand_weights) -> None:
    if parent_scores.dim() != 2 or base.dim() != 2 or base.shape[0] != parent_scores.shape[0]:
        raise ValueError(f"parent_scores must be [R, W] and base [R, K], got "
                         f"{list(parent_scores.shape)} and {list(base.shape)}")
    num_requests, num_parents = parent_scores.shape
    top_k = base.shape[1]
    if not 0 <= quota <= num_parents * top_k:
        raise ValueError(f"quota must be in 0..W*K={num_parents * top_k}, got {quota}")
    if num_parents * top_k > MAX_PAIRS:
        raise ValueError(f"W*K must be at most {MAX_PAIRS}, got {num_parents * top_k}")
    given = [t is not None for t in (z_proj, s_proj, cand_weights)]
    if any(given) and not all(given):
        raise ValueError("z_proj, s_proj and cand_weights go together (all or none)")
    if all(given):
        proj = z_proj.shape[-1]
        expected = {"z_proj": (num_requests, proj), "s_proj": (num_requests, num_parents, proj),
                    "cand_weights": (num_requests, top_k, proj)}
        for name, t in (("z_proj", z_proj), ("s_proj", s_proj), ("cand_weights", cand_weights)):
            if tuple(t.shape) != expected[name]:
                raise ValueError(f"{name} must be {list(expected[name])}, got {list(t.shape)}")
