"""GPU check of the DARTree Triton kernels: correctness against the torch twins, then timings
at Qwen3-8B shapes. Written for one H200, under 8 minutes; needs only torch and triton (it
imports ``vllm_dartree.kernels``, ``vllm_dartree.tree`` and the vLLM-free
``vllm_dartree.step.verify_plan``, never vLLM).

Checks (on the GPU; exit status 1 when any fails):
  top_b              top-B selection, kernel vs twin (exact, with ties).
  tree_attention     tree attention over a paged KV cache, kernel vs twin (fp32 and bf16, GQA
                     1 and 4, head 64 and 128, split and unsplit prefix, padded trees; rows
                     the kernel must not write keep a sentinel), every case on two cache
                     layouts: contiguous K and V caches, and the K / V views of one vLLM
                     Triton-backend page ``[blocks, kv_heads, block_size, 2 * head]`` that
                     production passes (``page_views``).
  compaction         KV compaction, kernel vs twin, on 72 contiguous caches (K and V of 36
                     layers) and on 36 page views ``[blocks, block_size, kv_heads, 2 * head]``
                     (``compaction_view``), overlapping pairs, bf16 and fp32: the moved
                     slots hold their sources, every other slot and a guard band around
                     each cache are unchanged.
  correction_graphs  trees of chain, fixed and pruned built with ``CorrectionGraphs`` (CUDA
                     graphs; the padded eager path on CPU) equal trees built without
                     (tokens, parents, depths, valid, num_nodes) for request counts in
                     different padded buckets, K, W and B as in the timings, for a Domino
                     head and a DSpark Markov head (rank 256, its per-depth context a
                     zero-width buffer); on CUDA graphs must have been captured. The same
                     capture serves V1 and V2 (``drafting.TreeDrafting`` captures it).
  positions_buffer   V2: depth positions written into one persistent buffer that a CUDA
                     graph captured (the target forward's positions), replayed over 3 steps
                     of pruned trees: every tree row reads root + depth. (Tree attention on
                     V2 runs the same Triton backend, metadata builder and page layout as on
                     V1: the tree_attention page-view cases cover it.)
  gdn_tree           hybrid targets: the Gated-DeltaNet tree recurrence, kernel vs twin
                     (``tree/gdn.py``) on random depth-first trees, fp32 and bf16; the
                     committed state is left unchanged.
  gdn_rows           the kernels a tree step on a GDN target launches per layer
                     (``integration/gpu_gdn.py``): the recurrence in vLLM's per-row state
                     slots and the tree conv over flat rows, vs their twins (bf16 inputs,
                     fp32 states, random trees of 16 and 64 nodes).

Timings (median of many runs, CUDA events): tree build per step for every
``vllm_dartree.tree.build_tree`` variant (drafter hidden 4096, GRU 1024, E 256, K 64, W 12,
B 64, 16 depths, vocabulary 151936, fp32 head with the input-gate table; chain, fixed and
pruned also with the head's per-depth calls replayed from CUDA graphs), top-B vs its twin,
tree attention for 1 + 64 rows over 1k/8k/32k context (32 query heads, 8 kv heads, head
128, bf16, block 16, contiguous caches; KV split sweep) vs the twin, compaction of 36 layers
(K and V caches) vs the twin, and the GDN tree recurrence of one layer at Qwen3.6-27B shapes
(48 value heads, K = V = 128, bf16 inputs, fp32 state) for trees of 16, 32 and 64 nodes
against the same kernel on the 16-row chain a DFlash N = 15 verify runs, 1 and 8 requests
(times 48 GDN layers for a step); the same for the engine-layout kernels (recurrence in
slots + tree conv of 10240 channels).

What the CPU lane cannot show and this script does not either: CUDA-graph capture of a
whole engine step and vLLM's routing to its fused CUDA chain kernel need vLLM, which this
machine does not have (``tests/v2/test_v2_cuda_path*.py`` run the same plugin code under the
Triton interpreter).

Modes:
  --dry-run       CPU, Triton interpreter, tiny shapes: proves the script runs (tests use it).
  --compile-only  compile every kernel for sm_90 without a GPU (ptxas ships with triton);
                  with --dry-run only a small set. Records shared memory per kernel.

Run: python benchmarks/gpu_check.py [--out PATH] [--dry-run] [--compile-only]
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

if __name__ == "__main__":
    # Triton fixes its interpreter mode when first imported: decide before importing anything.
    _argv = sys.argv[1:]
    if "--dry-run" in _argv and "--compile-only" not in _argv:
        os.environ["TRITON_INTERPRET"] = "1"
    elif "--compile-only" in _argv:
        os.environ["TRITON_INTERPRET"] = "0"

import torch  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


from vllm_dartree.kernels import gdn_tree, launch, topb  # noqa: E402
from vllm_dartree.kernels import kv_compaction as kv  # noqa: E402
from vllm_dartree.kernels import tree_attention as ta  # noqa: E402
from vllm_dartree.step.verify_plan import (  # noqa: E402
    Proposal,
    build_plan,
    write_depth_positions,
)
from vllm_dartree.tree import (  # noqa: E402
    CorrectionHead,
    DominoHead,
    MarkovHead,
    build_tree,
    packed_ancestor_mask,
)
from vllm_dartree.tree.gdn import (  # noqa: E402
    conv_ancestors,
    tree_conv_rows,
    tree_delta_rule_in_slots,
    tree_gated_delta_rule,
)
from vllm_dartree.tree.graphs import CorrectionGraphs, bucket_size  # noqa: E402
from vllm_dartree.tree.types import DraftTree, depth_first, padded_tree  # noqa: E402

VARIANTS = ("chain", "ddtree", "fixed", "pruned", "sequential")
GRAPH_VARIANTS = ("chain", "fixed", "pruned")  # the ones whose head calls CorrectionGraphs runs
TREE_FIELDS = ("tokens", "parents", "depths", "valid", "num_nodes")
LAYOUTS = ("contiguous", "page")  # KV caches as separate tensors, or views of a vLLM page
GUARD = 1024  # canary elements on each side of a compaction cache's storage
H100_SMEM_LIMIT = 232448  # bytes of shared memory one CTA may use on sm_90


@dataclass
class Config:
    device: str
    vocab: int = 151936
    hidden: int = 4096
    state: int = 1024
    proj: int = 256
    depths: int = 16
    top_k: int = 64
    width: int = 12
    budget: int = 64
    heads: int = 32
    kv_heads: int = 8
    head_size: int = 128
    block_size: int = 16
    contexts: tuple[int, ...] = (1024, 8192, 32768)
    split_sweep: tuple[int, ...] = (1, 2, 4, 8, 16)
    layers: int = 36
    cache_blocks: int = 1024
    moved_pairs: int = 64
    repeats: int = 50
    build_repeats: int = 20
    sequential_repeats: int = 3
    # Request counts of the graphs check, in buckets 1, 4, 4, 8: 4 then 3 replays the bucket-4
    # graphs with a padding row that last held a real request.
    graph_requests: tuple[int, ...] = (1, 4, 3, 8)
    # Hybrid GDN targets (Qwen3.6-27B: 48 GDN layers, 48 value heads, K = V = 128).
    gdn_heads: int = 48
    gdn_key: int = 128
    gdn_value: int = 128
    gdn_layers: int = 48
    gdn_nodes: tuple[int, ...] = (16, 32, 64)
    gdn_chain_rows: int = 16


FULL = Config(device="cuda")
# kv_heads 2: a page view then really swaps its head and slot axes.
DRY = Config(device="cpu", vocab=400, hidden=32, state=16, proj=16, depths=4, top_k=8,
             width=3, budget=8, heads=4, kv_heads=2, head_size=64, contexts=(40,),
             split_sweep=(1, 2), layers=2, cache_blocks=8, moved_pairs=6, repeats=2,
             build_repeats=2, sequential_repeats=1, graph_requests=(1, 4, 3), gdn_heads=2,
             gdn_key=16, gdn_value=40, gdn_layers=2, gdn_nodes=(6,), gdn_chain_rows=4)


# ---------------------------------------------------------------------------------- timing
def timed(fn: Callable[[], object], repeats: int, device: str, warmup: int = 3) -> dict:
    """Median / min milliseconds of ``fn`` (CUDA events on a GPU, perf_counter on CPU)."""
    for _ in range(warmup):
        fn()
    times = []
    if device == "cuda":
        torch.cuda.synchronize()
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(repeats)]
        for start, end in events:
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize()
        times = [start.elapsed_time(end) for start, end in events]
    else:
        for _ in range(repeats):
            begin = time.perf_counter()
            fn()
            times.append((time.perf_counter() - begin) * 1e3)
    return {"median_ms": statistics.median(times), "min_ms": min(times), "repeats": repeats}


# ---------------------------------------------------------------------------------- inputs
def random_bits(gen: torch.Generator, num_requests: int, budget: int, drafts: list[int]
                ) -> torch.Tensor:
    """Packed ancestor masks of random trees (parent of node j+1 in 0..j), padded."""
    parents, depths = [], []
    for _ in range(num_requests):
        row = [int(torch.randint(0, j + 1, (), generator=gen)) for j in range(budget)]
        depth = [0]
        for parent in row:
            depth.append(depth[parent] + 1)
        parents.append(row)
        depths.append(depth[1:])
    valid = torch.arange(budget) < torch.tensor(drafts).unsqueeze(1)
    tree = padded_tree(torch.zeros(num_requests, budget, dtype=torch.int64),
                       torch.tensor(parents), torch.tensor(depths), valid,
                       torch.zeros(num_requests, budget),
                       torch.zeros(num_requests, dtype=torch.int64), budget, None)
    return packed_ancestor_mask(tree)


def page_views(page: torch.Tensor, head_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Key and value caches ``[num_blocks, block_size, kv_heads, head_size]`` of a layer page
    ``[num_blocks, kv_heads, block_size, 2 * head_size]``: the non-contiguous views production
    passes to tree attention (vllm_dartree/integration/gpu_attention.py split_kv_cache)."""
    key_cache, value_cache = page.transpose(1, 2).split(head_size, dim=-1)
    return key_cache, value_cache


def compaction_view(page: torch.Tensor) -> torch.Tensor:
    """``[num_blocks, block_size, kv_heads, 2 * head_size]`` view of a layer page, a slot's
    keys and values together: what production compacts, one cache per layer
    (vllm_dartree/integration/gpu_attention.py compact_kv_caches)."""
    return page.transpose(1, 2)


def attention_caches(gen: torch.Generator, device: str, dtype: torch.dtype, layout: str,
                     num_blocks: int, block_size: int, kv_heads: int, head_size: int
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Random key and value caches ``[num_blocks, block_size, kv_heads, head_size]``: two
    contiguous tensors, or the ``page_views`` of one contiguous page (made on the device in
    ``dtype`` first: ``.to`` would make a copy of a view contiguous)."""
    if layout == "page":
        page = torch.randn(num_blocks, kv_heads, block_size, 2 * head_size, generator=gen)
        return page_views(page.to(device, dtype), head_size)
    shape = (num_blocks, block_size, kv_heads, head_size)
    return (torch.randn(shape, generator=gen).to(device, dtype),
            torch.randn(shape, generator=gen).to(device, dtype))


def attention_case(gen, device, *, heads, kv_heads, head_size, block_size, budget, bases,
                   drafts, dtype, layout="contiguous") -> dict:
    """Inputs of tree attention: shuffled block tables, a verify segment per request."""
    num_requests = len(bases)
    lengths = [b + 1 + d for b, d in zip(bases, drafts)]
    per_req = [math.ceil(n / block_size) for n in lengths]
    num_blocks = sum(per_req) + 2
    perm = torch.randperm(num_blocks, generator=gen)
    table = torch.zeros(num_requests, max(per_req), dtype=torch.int32)
    start = 0
    for r, count in enumerate(per_req):
        table[r, :count] = perm[start : start + count]
        start += count
    size = 1 + budget
    root = torch.tensor([2 + r * (size + 2) for r in range(num_requests)])
    tensors = dict(
        query=torch.randn(int(root[-1]) + size + 2, heads, head_size, generator=gen),
        block_table=table, base=torch.tensor(bases), ancestor_bits=random_bits(
            gen, num_requests, budget, drafts),
        num_rows=1 + torch.tensor(drafts), root_row=root)
    case = {k: v.to(device) for k, v in tensors.items()}
    case["query"] = case["query"].to(dtype)
    case["key_cache"], case["value_cache"] = attention_caches(
        gen, device, dtype, layout, num_blocks, block_size, kv_heads, head_size)
    case["scale"] = head_size**-0.5
    return case


ATTN_ARGS = ("query", "key_cache", "value_cache", "block_table", "base", "ancestor_bits",
             "num_rows", "root_row", "scale")


def attn_args(case: dict) -> tuple:
    return tuple(case[name] for name in ATTN_ARGS)


def attention_twin(case: dict, out: torch.Tensor | None = None) -> torch.Tensor:
    """The twin with SDPA's math backend on a GPU (no reduced-precision fused kernels)."""
    if case["query"].is_cuda:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel(SDPBackend.MATH):
            return ta.tree_attention_torch(*attn_args(case), out=out)
    return ta.tree_attention_torch(*attn_args(case), out=out)


def overlapping_pairs(gen, num_slots: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Distinct destinations that are mostly other pairs' sources (a permuted slot set, plus
    fresh destinations), the hard case for an in-place copy."""
    slots = torch.randperm(num_slots, generator=gen)[: count + count // 4]
    src = slots[:count]
    dst = torch.cat([src[torch.randperm(count, generator=gen)][: count - count // 4],
                     slots[count:][: count // 4]])
    return src, dst


def make_head(cfg: Config, gen: torch.Generator, device: str) -> DominoHead:
    """Random Domino head; the [V, H] embedding and the [V, 3G] input-gate table are strided
    views of short random buffers (right shapes and access pattern, no gigabytes)."""

    def dense(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) / shape[-1] ** 0.5).to(device)

    def strided(rows: int, cols: int) -> torch.Tensor:
        return torch.randn(rows + cols, generator=gen).to(device).as_strided((rows, cols), (1, 1))

    head = DominoHead(embed=strided(cfg.vocab, cfg.hidden),
                      gru_ih=dense(3 * cfg.state, cfg.hidden), gru_hh=dense(3 * cfg.state,
                                                                            cfg.state),
                      proj0=dense(cfg.proj, cfg.hidden + cfg.state),
                      proj2=dense(cfg.vocab, cfg.proj), pure_draft_prefix_len=1)
    return replace(head, input_gate_table=strided(cfg.vocab, 3 * cfg.state))


def make_markov_head(cfg: Config, gen: torch.Generator, device: str) -> MarkovHead:
    """Random DSpark Markov head of the released rank (256; ``cfg.proj`` in a dry run)."""
    rank = cfg.proj
    return MarkovHead(markov_w1=torch.randn(cfg.vocab, rank, generator=gen).to(device),
                      markov_w2=(torch.randn(cfg.vocab, rank, generator=gen) / rank**0.5
                                 ).to(device))


HEAD_MAKERS = {"domino": make_head, "markov": make_markov_head}


# ---------------------------------------------------------------------------------- checks
def check_top_b(cfg: Config, gen: torch.Generator) -> dict:
    shapes = [(1, 192, 64), (8, 192, 64), (4, 300, 17)] if cfg.device == "cuda" else \
        [(2, 40, 8)]
    failures = []
    for rows, n, b in shapes:
        for ties in (False, True):
            scores = (torch.randint(-3, 3, (rows, n), generator=gen).float() if ties
                      else torch.randn(rows, n, generator=gen))
            scores[:, n - n // 4 :] = float("-inf")
            scores = scores.to(cfg.device)
            if not torch.equal(topb.top_b_triton(scores, b), topb.top_b_torch(scores, b)):
                failures.append([rows, n, b, ties])
    return {"ok": not failures, "cases": len(shapes) * 2, "failures": failures}


def attention_check_specs(cfg: Config) -> list[dict]:
    if cfg.device != "cuda":
        return [dict(heads=4, kv_heads=2, head_size=64, block_size=16, budget=8,
                     bases=[30, 5], drafts=[8, 4], dtype=torch.float32, splits=(1, 2))]
    qwen = dict(heads=32, kv_heads=8, head_size=128, block_size=16, budget=64)
    return [
        dict(heads=4, kv_heads=4, head_size=64, block_size=16, budget=8, bases=[0, 37, 700],
             drafts=[8, 5, 0], dtype=torch.float32, splits=(1, 3)),
        dict(heads=8, kv_heads=2, head_size=128, block_size=32, budget=64, bases=[50, 1300],
             drafts=[64, 40], dtype=torch.float32, splits=(1, 4)),
        dict(heads=2, kv_heads=2, head_size=64, block_size=16, budget=128, bases=[300],
             drafts=[128], dtype=torch.float32, splits=(1,)),
        dict(**qwen, bases=[1000, 5000, 17, 3000], drafts=[64, 30, 64, 1],
             dtype=torch.bfloat16, splits=(1, 4)),
    ]


def check_tree_attention(cfg: Config, gen: torch.Generator) -> dict:
    """Every spec on both cache layouts (``LAYOUTS``), every split count of the spec."""
    results = []
    for spec in attention_check_specs(cfg):
        spec = dict(spec)
        splits = spec.pop("splits")
        for layout in LAYOUTS:
            case = attention_case(gen, cfg.device, **spec, layout=layout)
            results += [dict(row, layout=layout)
                        for row in attention_case_results(case, spec, splits)]
    return {"ok": all(r["ok"] for r in results), "cases": results}


def attention_case_results(case: dict, spec: dict, splits: tuple[int, ...]) -> list[dict]:
    """Kernel vs twin for each split count; rows not scheduled must keep the sentinel."""
    sentinel = torch.full_like(case["query"], 7.0)
    twin = attention_twin(case, out=sentinel.clone())
    tolerance = 1e-4 if spec["dtype"] == torch.float32 else 3e-2
    results = []
    for num_splits in splits:
        out = ta.tree_attention_triton(*attn_args(case), out=sentinel.clone(),
                                       num_splits=num_splits)
        untouched = torch.equal(out == 7.0, twin == 7.0)
        err = (out.float() - twin.float()).abs().max().item()
        results.append({"heads": spec["heads"], "kv_heads": spec["kv_heads"],
                        "head_size": spec["head_size"], "budget": spec["budget"],
                        "dtype": str(spec["dtype"]), "num_splits": num_splits,
                        "max_abs_err": err, "padding_untouched": untouched,
                        "ok": err < tolerance and untouched})
    return results


def check_compaction(cfg: Config, gen: torch.Generator) -> dict:
    blocks = min(cfg.cache_blocks, 64)  # random contents for 72 caches: keep them small
    results = [compaction_case(cfg, gen, blocks, dtype, layout)
               for dtype in (torch.bfloat16, torch.float32) for layout in LAYOUTS]
    return {"ok": all(r["ok"] for r in results), "cases": results}


def compaction_buffers(cfg: Config, gen: torch.Generator, blocks: int, dtype: torch.dtype,
                       layout: str) -> list[torch.Tensor]:
    """Random flat storage of the caches (contiguous: K and V of every layer; page: one page
    per layer), each with GUARD canary elements on both sides to catch stray writes."""
    count = 2 * cfg.layers if layout == "contiguous" else cfg.layers
    numel = blocks * cfg.block_size * cfg.kv_heads * cfg.head_size * (1 + (layout == "page"))
    return [torch.randn(numel + 2 * GUARD, generator=gen).to(cfg.device, dtype)
            for _ in range(count)]


def compaction_caches(cfg: Config, blocks: int, buffers: list[torch.Tensor], layout: str
                      ) -> list[torch.Tensor]:
    """The caches ``copy_kv_slots`` gets, carved out of ``buffers`` (between the guards)."""
    if layout == "page":
        shape = (blocks, cfg.kv_heads, cfg.block_size, 2 * cfg.head_size)
        return [compaction_view(b[GUARD:-GUARD].view(shape)) for b in buffers]
    shape = (blocks, cfg.block_size, cfg.kv_heads, cfg.head_size)
    return [b[GUARD:-GUARD].view(shape) for b in buffers]


def compaction_case(cfg: Config, gen: torch.Generator, blocks: int, dtype: torch.dtype,
                    layout: str) -> dict:
    """Kernel vs twin on one group of caches, and vs the original contents: each moved slot
    holds its source's old values; every other slot and the guards are bit-for-bit unchanged."""
    buffers = compaction_buffers(cfg, gen, blocks, dtype, layout)
    before, twin = [b.clone() for b in buffers], [b.clone() for b in buffers]
    src, dst = overlapping_pairs(gen, blocks * cfg.block_size, cfg.moved_pairs)
    src, dst = src.to(cfg.device), dst.to(cfg.device)
    caches = compaction_caches(cfg, blocks, buffers, layout)
    kv.copy_kv_slots_triton(caches, src, dst)
    kv.copy_kv_slots_torch(compaction_caches(cfg, blocks, twin, layout), src, dst)
    written = torch.zeros_like(buffers[0], dtype=torch.bool)  # same for every cache
    size = cfg.block_size
    compaction_caches(cfg, blocks, [written], layout)[0][dst // size, dst % size] = True
    moved = all(torch.equal(c[dst // size, dst % size], old[src // size, src % size])
                for c, old in zip(caches, compaction_caches(cfg, blocks, before, layout)))
    untouched = all(torch.equal(b[~written], old[~written]) for b, old in zip(buffers, before))
    same_as_twin = all(torch.equal(b, t) for b, t in zip(buffers, twin))
    return {"dtype": str(dtype), "layout": layout, "caches": len(caches),
            "pairs": int(src.numel()), "moved": moved, "untouched": untouched,
            "same_as_twin": same_as_twin, "ok": moved and untouched and same_as_twin}


def tree_inputs(cfg: Config, gen: torch.Generator, num_requests: int
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Drafter base logits [R, D, V], hidden states [R, D, H] and root tokens [R]."""
    base = (3 * torch.randn(num_requests, cfg.depths, cfg.vocab, generator=gen)).to(cfg.device)
    hidden = torch.randn(num_requests, cfg.depths, cfg.hidden, generator=gen).to(cfg.device)
    root = torch.randint(0, cfg.vocab, (num_requests,), generator=gen).to(cfg.device)
    return base, hidden, root


def build(cfg: Config, variant: str, head: CorrectionHead, inputs: tuple,
          graphs: CorrectionGraphs | None = None) -> DraftTree:
    """``build_tree`` with the tree settings of every check and timing (K, W, B of cfg)."""
    return build_tree(variant, *inputs, None if variant == "ddtree" else head,
                      budget=cfg.budget, top_k=cfg.top_k, width=cfg.width, depth_bonus=-0.2,
                      graphs=graphs)


def graphs_row(cfg: Config, variant: str, head: CorrectionHead, inputs: tuple,
               graphs: CorrectionGraphs) -> dict:
    """One build without and one with ``graphs``: which tree fields differ (scores may
    differ in the last bit, BLAS sums padded batches in another order; trees may not)."""
    with torch.inference_mode():
        eager, graphed = build(cfg, variant, head, inputs), build(cfg, variant, head, inputs,
                                                                   graphs)
    mismatched = [name for name in TREE_FIELDS
                  if not torch.equal(getattr(eager, name), getattr(graphed, name))]
    both = eager.valid & graphed.valid  # padding nodes score -inf
    score_diff = (eager.scores - graphed.scores)[both].abs().max().item() if both.any() else 0.0
    return {"variant": variant, "requests": int(inputs[2].numel()), "mismatched": mismatched,
            "max_score_diff": score_diff, "ok": not mismatched}


def check_positions_buffer(cfg: Config, gen: torch.Generator) -> dict:
    """V2: each step's depth positions go into one persistent buffer
    (``verify_plan.write_depth_positions``, what ``DARTreeModelState.prepare_inputs`` does)
    that the target forward's graphs captured: a graph reading it, replayed after each step's
    write, sees that step's root + depth for every tree row (trees of the pruned builder,
    depth-first; every request with B drafts after a prefill chunk of its own length)."""
    requests = 4
    head = make_head(cfg, gen, cfg.device)
    with torch.inference_mode():
        tree = depth_first(build(cfg, "pruned", head, tree_inputs(cfg, gen, requests)))
    prefix = torch.randint(1, 9, (requests,), generator=gen)
    scheduled = (prefix + 1 + cfg.budget).numpy()
    ids = [f"r{i}" for i in range(requests)]
    plan = build_plan(1, ids, [cfg.budget] * requests, scheduled,
                      Proposal(0, {r: i for i, r in enumerate(ids)}, tree), {}, cfg.budget,
                      torch.device(cfg.device))
    rows = int(scheduled.sum())
    buffer = torch.zeros(rows + 16, dtype=torch.int64, device=cfg.device)
    seen = torch.zeros(rows, dtype=torch.int64, device=cfg.device)
    graph = None
    if cfg.device == "cuda":
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            seen.copy_(buffer[:rows] * 1)
    failures = []
    depths = tree.depths.cpu()
    for step in range(3):
        starts = [int(s) for s in torch.randint(0, 1000, (requests,), generator=gen)]
        sequential = torch.cat([torch.arange(s, s + int(n)) for s, n in zip(starts, scheduled)])
        write_depth_positions(buffer, sequential.to(cfg.device), plan)
        if graph is None:
            seen.copy_(buffer[:rows])
        else:
            graph.replay()
        expected, offset = sequential.clone(), 0
        for r in range(requests):
            root = offset + int(scheduled[r]) - cfg.budget - 1
            expected[root + 1: root + 1 + cfg.budget] = sequential[root] + depths[r]
            offset += int(scheduled[r])
        if not torch.equal(seen.cpu(), expected):
            failures.append(step)
    return {"ok": not failures, "graph": graph is not None, "steps": 3, "failures": failures}


def check_correction_graphs(cfg: Config, gen: torch.Generator) -> dict:
    """Graphs vs eager trees for every request count of ``cfg.graph_requests`` and both head
    kinds; one graphs object per variant and head serves them all, as the proposer's does."""
    capture = cfg.device == "cuda"
    results, captured = [], {}
    for kind, make in HEAD_MAKERS.items():
        head = make(cfg, gen, cfg.device)
        graphs = {variant: CorrectionGraphs(head, capture=capture) for variant in GRAPH_VARIANTS}
        for requests in cfg.graph_requests:
            inputs = tree_inputs(cfg, gen, requests)
            results += [dict(graphs_row(cfg, variant, head, inputs, variant_graphs),
                             bucket=bucket_size(requests), head=kind)
                        for variant, variant_graphs in graphs.items()]
        captured |= {f"{kind}/{variant}": g.num_captured() for variant, g in graphs.items()}
        del head, graphs
    captured_ok = not capture or all(count > 0 for count in captured.values())
    return {"ok": captured_ok and all(r["ok"] for r in results), "capture": capture,
            "graphs_captured": captured, "cases": results}


# --------------------------------------------------------------------------------- timings
def time_tree_build(cfg: Config, gen: torch.Generator) -> dict:
    head = make_head(cfg, gen, cfg.device)
    inputs = tree_inputs(cfg, gen, 1)
    results = {}
    for variant in VARIANTS:
        repeats = cfg.sequential_repeats if variant == "sequential" else cfg.build_repeats
        with torch.inference_mode():
            results[variant] = timed(lambda v=variant: build(cfg, v, head, inputs), repeats,
                                     cfg.device, warmup=1)
            results[variant]["num_nodes"] = int(build(cfg, variant, head, inputs).num_nodes[0])
        if variant in GRAPH_VARIANTS:
            results[variant].update(time_with_graphs(cfg, variant, head, inputs))
    return results


def time_with_graphs(cfg: Config, variant: str, head: CorrectionHead, inputs: tuple) -> dict:
    """The same build with ``CorrectionGraphs`` (what the proposer uses on a GPU; the padded
    eager path on CPU), and whether it gives the same tree (the check covers more)."""
    graphs = CorrectionGraphs(head, capture=cfg.device == "cuda")
    same = graphs_row(cfg, variant, head, inputs, graphs)["ok"]  # also captures the graphs
    with torch.inference_mode():
        row = timed(lambda: build(cfg, variant, head, inputs, graphs), cfg.build_repeats,
                    cfg.device, warmup=1)
    return {"graphs_median_ms": row["median_ms"], "graphs_captured": graphs.num_captured(),
            "graphs_same_tree": same}


def time_top_b(cfg: Config, gen: torch.Generator) -> dict:
    results = {}
    nodes = cfg.width * cfg.depths  # pruned supertree size
    for requests in (1, 8):
        scores = torch.randn(requests, nodes, generator=gen).to(cfg.device)
        results[f"R{requests}_N{nodes}_B{cfg.budget}"] = {
            "kernel": timed(lambda s=scores: topb.top_b_triton(s, cfg.budget), cfg.repeats,
                            cfg.device),
            "twin": timed(lambda s=scores: topb.top_b_torch(s, cfg.budget), cfg.repeats,
                          cfg.device)}
    return results


def time_tree_attention(cfg: Config, gen: torch.Generator) -> dict:
    return {f"ctx{context}": time_attention_context(cfg, gen, context)
            for context in cfg.contexts}


def time_attention_context(cfg: Config, gen: torch.Generator, context: int) -> dict:
    """One request, 1 + B rows over ``context`` prefix keys: a sweep of KV splits, the
    dispatcher with its split heuristic, and the twin."""
    case = attention_case(gen, cfg.device, heads=cfg.heads, kv_heads=cfg.kv_heads,
                          head_size=cfg.head_size, block_size=cfg.block_size,
                          budget=cfg.budget, bases=[context], drafts=[cfg.budget],
                          dtype=torch.bfloat16 if cfg.device == "cuda" else torch.float32)
    out = torch.empty_like(case["query"])
    auto = ta.auto_num_splits(case["query"], case["key_cache"], case["ancestor_bits"], context)
    sweep = {}
    for splits in sorted(set(cfg.split_sweep) | {auto}):
        sweep[str(splits)] = timed(lambda s=splits: ta.tree_attention_triton(
            *attn_args(case), out=out, num_splits=s), cfg.repeats, cfg.device)
    best = min(sweep, key=lambda s: sweep[s]["median_ms"])
    return {"kernel_unsplit": sweep["1"], "auto_splits": auto, "best_splits": int(best),
            "kernel_auto": timed(lambda: ta.tree_attention(*attn_args(case), out=out,
                                                           max_prefix=context),
                                 cfg.repeats, cfg.device),
            "split_sweep": sweep,
            "twin": timed(lambda: ta.tree_attention_torch(*attn_args(case), out=out),
                          max(3, cfg.repeats // 5), cfg.device)}


def time_compaction(cfg: Config, gen: torch.Generator) -> dict:
    shape = (cfg.cache_blocks, cfg.block_size, cfg.kv_heads, cfg.head_size)
    dtype = torch.bfloat16 if cfg.device == "cuda" else torch.float32
    caches = [torch.empty(shape, dtype=dtype, device=cfg.device) for _ in range(2 * cfg.layers)]
    src, dst = overlapping_pairs(gen, cfg.cache_blocks * cfg.block_size, cfg.moved_pairs)
    src, dst = src.to(cfg.device), dst.to(cfg.device)
    ptrs = kv.cache_pointer_table(caches)
    return {
        "layers": cfg.layers, "caches": len(caches), "pairs": int(src.numel()),
        "kernel": timed(lambda: kv.copy_kv_slots_triton(caches, src, dst, ptrs), cfg.repeats,
                        cfg.device),
        "twin": timed(lambda: kv.copy_kv_slots_torch(caches, src, dst), cfg.repeats,
                      cfg.device)}


# ---------------------------------------------------------------------------- compile-only
def gdn_case(cfg: Config, gen: torch.Generator, requests: int, nodes: int,
             dtype: torch.dtype, chain: bool = False) -> tuple:
    """Arguments of ``gdn_tree.tree_gated_delta_rule_triton`` for random depth-first trees
    (or chains) of ``nodes`` nodes, plus their parents for the twin."""
    if chain:
        parents = torch.arange(nodes).expand(requests, nodes).clone()
    else:
        parents = (torch.rand(requests, nodes, generator=gen) * (torch.arange(nodes) + 1)).long()
    depths = torch.ones(requests, nodes, dtype=torch.int64)
    for j in range(nodes):
        above = depths.gather(1, (parents[:, j:j + 1] - 1).clamp(min=0)).squeeze(1)
        depths[:, j] = torch.where(parents[:, j] == 0, 0, above) + 1
    tree = depth_first(DraftTree(
        tokens=torch.zeros(requests, nodes, dtype=torch.int64), parents=parents, depths=depths,
        num_nodes=torch.full((requests,), nodes), valid=torch.ones(requests, nodes, dtype=bool),
        scores=torch.zeros(requests, nodes)))
    rows, heads, key, value = 1 + nodes, cfg.gdn_heads, cfg.gdn_key, cfg.gdn_value
    q = torch.nn.functional.normalize(torch.randn(requests, rows, heads, key, generator=gen), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(requests, rows, heads, key, generator=gen), dim=-1)
    inputs = [q * key ** -0.5, k, torch.randn(requests, rows, heads, value, generator=gen),
              -torch.rand(requests, rows, heads, generator=gen),
              torch.rand(requests, rows, heads, generator=gen)]
    inputs = [t.to(dtype).to(cfg.device) for t in inputs]
    state = torch.randn(requests, heads, key, value, generator=gen).to(cfg.device)
    row_depths = torch.cat([torch.zeros(requests, 1, dtype=torch.int64), tree.depths], 1)
    return (*inputs, state, row_depths.to(cfg.device), int(tree.depths.max()),
            tree.parents_with_root().to(cfg.device))


def check_gdn_tree(cfg: Config, gen: torch.Generator) -> dict:
    failures, cases = [], 0
    for dtype in (torch.float32, torch.bfloat16):
        tolerance = {"rtol": 1e-4, "atol": 1e-4} if dtype == torch.float32 else \
            {"rtol": 2 ** -7, "atol": 2e-2}
        for requests, nodes in ((1, cfg.gdn_nodes[0]), (3, cfg.gdn_nodes[-1])):
            *args, parents = gdn_case(cfg, gen, requests, nodes, dtype)
            state = args[5].clone()
            got = gdn_tree.tree_gated_delta_rule_triton(*args)
            expected = tree_gated_delta_rule(*args[:6], parents)
            cases += 1
            close = torch.allclose(got.float(), expected.float(), **tolerance)
            if not (close and torch.equal(state, args[5])):
                failures.append({"dtype": str(dtype), "requests": requests, "nodes": nodes,
                                 "max_abs_diff": float((got.float() - expected.float()).abs().max())})
    return {"ok": not failures, "cases": cases, "failures": failures}


def time_gdn_tree(cfg: Config, gen: torch.Generator) -> dict:
    """One GDN layer's tree recurrence per verify step vs the chain of a DFlash verify."""
    results = {}
    for requests in (1, 8):
        *chain, _ = gdn_case(cfg, gen, requests, cfg.gdn_chain_rows - 1, torch.bfloat16,
                             chain=True)
        row = {"chain_rows": cfg.gdn_chain_rows,
               "chain": timed(lambda a=chain: gdn_tree.tree_gated_delta_rule_triton(*a),
                              cfg.repeats, cfg.device)}
        for nodes in cfg.gdn_nodes:
            *tree, _ = gdn_case(cfg, gen, requests, nodes, torch.bfloat16)
            row[f"tree{nodes}"] = timed(
                lambda a=tree: gdn_tree.tree_gated_delta_rule_triton(*a), cfg.repeats,
                cfg.device)
            row[f"tree{nodes}_depth"] = tree[7]
        results[f"R{requests}"] = row
    return results


def gdn_rows_case(cfg: Config, gen: torch.Generator, requests: int, nodes: int,
                  chain: bool = False) -> tuple[dict, dict]:
    """Arguments of the engine-layout kernels (``gdn_tree.delta_rule_in_slots_triton``,
    ``tree_conv_rows_triton``) for ``requests`` trees (or chains) of ``nodes`` nodes laid
    out flat as vLLM verifies them: bf16 inputs, fp32 states in per-row slots, a bf16 conv
    window of Qwen3.6-27B's 10240 channels (2 x 16 key heads + 48 value heads of 128 in the
    full config) at each request's first slot."""
    rows, width = 1 + nodes, 4
    key_heads = max(cfg.gdn_heads // 3, 1)
    channels = (2 * key_heads * cfg.gdn_key + cfg.gdn_heads * cfg.gdn_value)
    parents = (torch.arange(rows) - 1).clamp(min=0).expand(requests, rows).clone()
    if not chain:
        parents = (torch.rand(requests, rows, generator=gen) * torch.arange(rows)).long()
        parents[:, 0] = 0
    slots = torch.randperm(requests * rows, generator=gen).view(requests, rows)
    starts = torch.arange(requests + 1) * rows
    row_request = torch.arange(requests).repeat_interleave(rows)
    local = torch.arange(requests * rows) % rows
    window = conv_ancestors(parents, width)[row_request, local]
    sources = torch.where(window >= width - 1, starts[row_request, None] + window - (width - 1),
                          -1 - window)
    n = requests * rows
    q = torch.nn.functional.normalize(torch.randn(n, cfg.gdn_heads, cfg.gdn_key, generator=gen),
                                      dim=-1) * cfg.gdn_key ** -0.5
    k = torch.nn.functional.normalize(torch.randn(n, cfg.gdn_heads, cfg.gdn_key, generator=gen),
                                      dim=-1)
    dev = cfg.device
    recurrence = dict(
        q=q.bfloat16().to(dev), k=k.bfloat16().to(dev),
        v=torch.randn(n, cfg.gdn_heads, cfg.gdn_value, generator=gen).bfloat16().to(dev),
        g=(-torch.rand(n, cfg.gdn_heads, generator=gen)).to(dev),
        beta=torch.rand(n, cfg.gdn_heads, generator=gen).to(dev),
        state=torch.randn(requests * rows, cfg.gdn_heads, cfg.gdn_value, cfg.gdn_key,
                          generator=gen).to(dev),
        row_slot=slots.flatten().to(dev),
        parent_slot=torch.where(local == 0, slots[row_request, 0],
                                slots[row_request, parents[row_request, local]]).to(dev),
        request_starts=starts.to(dev))
    conv = dict(
        x=torch.randn(n, channels, generator=gen).bfloat16().to(dev),
        conv_state=torch.randn(requests * rows, width - 1 + nodes, channels,
                               generator=gen).bfloat16().to(dev).transpose(1, 2),
        window_slot=slots[:, 0].to(dev), window_start=torch.zeros(requests, dtype=torch.int64,
                                                                  device=dev),
        row_request=row_request.to(dev), sources=sources.to(dev),
        weight=torch.randn(channels, width, generator=gen).bfloat16().to(dev),
        bias=None)
    return recurrence, conv


def check_gdn_rows(cfg: Config, gen: torch.Generator) -> dict:
    """The engine-layout GDN kernels (what ``integration/gpu_gdn.py`` launches in a tree
    step) vs their twins: outputs, every row's stored state, the conv outputs."""
    failures, cases = [], 0
    tolerance = {"rtol": 2 ** -7, "atol": 2e-2}
    for requests, nodes in ((1, cfg.gdn_nodes[0]), (3, cfg.gdn_nodes[-1])):
        recurrence, conv = gdn_rows_case(cfg, gen, requests, nodes)
        state = recurrence["state"].clone()
        got = gdn_tree.delta_rule_in_slots_triton(**recurrence)
        twin_args = {**recurrence, "state": state}
        twin_args.pop("request_starts")
        expected = tree_delta_rule_in_slots(**twin_args)
        conv_got = gdn_tree.tree_conv_rows_triton(**conv)
        conv_expected = tree_conv_rows(**conv)
        cases += 1
        checks = {"outputs": torch.allclose(got.float(), expected.float(), **tolerance),
                  "states": torch.allclose(recurrence["state"], state, **tolerance),
                  "conv": torch.allclose(conv_got.float(), conv_expected.float(), **tolerance)}
        if not all(checks.values()):
            failures.append({"requests": requests, "nodes": nodes, **checks})
    return {"ok": not failures, "cases": cases, "failures": failures}


def time_gdn_rows(cfg: Config, gen: torch.Generator) -> dict:
    """One GDN layer of a tree step on the Triton path (tree conv + recurrence in slots) for
    trees of 16/32/64 nodes, against the same kernels on a 16-row chain."""
    results = {}
    for requests in (1, 8):
        row = {}
        for name, nodes, chain in [("chain", cfg.gdn_chain_rows - 1, True),
                                   *((f"tree{n}", n, False) for n in cfg.gdn_nodes)]:
            recurrence, conv = gdn_rows_case(cfg, gen, requests, nodes, chain)
            row[name] = {
                "recurrence": timed(lambda a=recurrence: gdn_tree.delta_rule_in_slots_triton(**a),
                                    cfg.repeats, cfg.device),
                "conv": timed(lambda a=conv: gdn_tree.tree_conv_rows_triton(**a), cfg.repeats,
                              cfg.device)}
        results[f"R{requests}"] = row
    return results


AOT_TYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16",
             torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8",
             torch.uint8: "u8"}


def aot_compile(fn: Callable, kwargs: dict, arch: int = 90) -> dict:
    """Compile one launch (python kernel function + its kwargs) for CUDA sm_<arch>."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime.jit import JITFunction

    kwargs = dict(kwargs)
    options = {name: kwargs.pop(name) for name in ("num_warps", "num_stages") if name in kwargs}
    signature, constexprs = {}, {}
    for name, param in inspect.signature(fn).parameters.items():
        value = kwargs[name]
        if "constexpr" in str(param.annotation):
            signature[name], constexprs[name] = "constexpr", value
        elif isinstance(value, torch.Tensor):
            signature[name] = "*" + AOT_TYPES[value.dtype]
        elif isinstance(value, bool):
            signature[name] = "i1"
        elif isinstance(value, int):
            signature[name] = "i32" if -(2**31) <= value < 2**31 else "i64"
        else:
            signature[name] = "fp32"
    begin = time.perf_counter()
    source = ASTSource(fn=JITFunction(launch.bind(fn)), signature=signature, constexprs=constexprs)
    compiled = triton.compile(source, target=GPUTarget("cuda", arch, 32), options=options)
    shared = int(compiled.metadata.shared)
    return {"kernel": fn.__name__, "compile_s": time.perf_counter() - begin,
            "shared_bytes": shared, "ok": shared <= H100_SMEM_LIMIT,
            "constexprs": {k: str(v) for k, v in constexprs.items()}}


def compile_launches(dry: bool) -> list[tuple[Callable, dict]]:
    """Kernel launches built from small CPU tensors (only dtypes and constexprs matter)."""
    launch.load_triton()
    gen = torch.Generator().manual_seed(0)
    launches = []
    attn = [(torch.bfloat16, 64, 4, 1)] if dry else [
        (dtype, head, heads, kv_heads) for dtype in (torch.bfloat16, torch.float32)
        for head in (64, 128) for heads, kv_heads in ((32, 8), (4, 4))]
    for dtype, head, heads, kv_heads in attn:
        case = attention_case(gen, "cpu", heads=heads, kv_heads=kv_heads, head_size=head,
                              block_size=16, budget=64, bases=[40], drafts=[64], dtype=dtype)
        for splits in (1, 4):
            for fn, _, kwargs in ta.tree_attention_launches(
                    *attn_args(case), torch.empty_like(case["query"]), num_splits=splits):
                if not (dry and splits == 1):  # dry: the split path (partials + merge) only
                    launches.append((fn, kwargs))
    for dtype in (torch.bfloat16,) if dry else (torch.bfloat16, torch.float32):
        caches = [torch.zeros(4, 16, 8, 128, dtype=dtype) for _ in range(2)]
        fn, _, kwargs = kv.copy_kv_slots_launch(caches, torch.arange(3), torch.arange(3))
        launches.append((fn, kwargs))
    fn, _, kwargs = gdn_tree.gdn_tree_launch(*gdn_case(
        replace(FULL, device="cpu", gdn_heads=2), gen, 1, 4, torch.bfloat16)[:8])
    launches.append((fn, kwargs))
    recurrence, conv = gdn_rows_case(replace(FULL, device="cpu", gdn_heads=3), gen, 1, 4)
    launches.append(gdn_tree.delta_rule_in_slots_launch(**recurrence)[::2])
    launches.append(gdn_tree.tree_conv_rows_launch(**conv)[::2])
    scores = torch.zeros(2, 192)
    launches.append((topb._top_b_rows, dict(
        scores_ptr=scores, kept_ptr=torch.zeros(2, 64, dtype=torch.int64), n=192, b=64,
        stride_s=192, stride_k=64, BLOCK_N=256, CHUNK_N=topb.CHUNK)))
    return launches


def run_compile_only(dry: bool) -> dict:
    compiled = [aot_compile(fn, kwargs) for fn, kwargs in compile_launches(dry)]
    return {"ok": all(c["ok"] for c in compiled), "target": "cuda sm_90", "kernels": compiled}


# ------------------------------------------------------------------------------------ main
def environment(cfg: Config) -> dict:
    import triton

    info = {"torch": torch.__version__, "triton": triton.__version__,
            "python": platform.python_version(), "device": cfg.device,
            "interpreter": launch.interpreter_enabled()}
    if cfg.device == "cuda" and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def run_checks_and_timings(cfg: Config) -> dict:
    gen = torch.Generator().manual_seed(0)
    report = {"checks": {}, "timings": {}}
    steps = [("checks", "top_b", check_top_b),
             ("checks", "tree_attention", check_tree_attention),
             ("checks", "compaction", check_compaction),
             ("checks", "correction_graphs", check_correction_graphs),
             ("checks", "positions_buffer", check_positions_buffer),
             ("checks", "gdn_tree", check_gdn_tree),
             ("checks", "gdn_rows", check_gdn_rows),
             ("timings", "tree_build", time_tree_build),
             ("timings", "top_b", time_top_b),
             ("timings", "tree_attention", time_tree_attention),
             ("timings", "compaction", time_compaction),
             ("timings", "gdn_tree", time_gdn_tree),
             ("timings", "gdn_rows", time_gdn_rows)]
    for section, name, step in steps:
        begin = time.perf_counter()
        report[section][name] = step(cfg, gen)
        elapsed = time.perf_counter() - begin
        status = report[section][name].get("ok", "-") if section == "checks" else "-"
        print(f"{section:>8} {name:<17} ok={status!s:<5} {elapsed:7.1f}s", flush=True)
        if cfg.device == "cuda":
            torch.cuda.empty_cache()
    report["all_ok"] = all(check["ok"] for check in report["checks"].values())
    return report


def print_timings(timings: dict) -> None:
    for variant, row in timings["tree_build"].items():
        graphs = (f"  graphs {row['graphs_median_ms']:9.3f} ms (same tree: "
                  f"{row['graphs_same_tree']})" if "graphs_median_ms" in row else "")
        print(f"  tree build {variant:<11} {row['median_ms']:9.3f} ms  ({row['num_nodes']} nodes)"
              f"{graphs}")
    for shape, row in timings["top_b"].items():
        print(f"  top_b {shape:<14} kernel {row['kernel']['median_ms']:8.3f} ms  "
              f"twin {row['twin']['median_ms']:8.3f} ms")
    for context, row in timings["tree_attention"].items():
        print(f"  tree attention {context:<9} unsplit {row['kernel_unsplit']['median_ms']:8.3f}"
              f" ms  auto({row['auto_splits']}) {row['kernel_auto']['median_ms']:8.3f} ms  "
              f"best({row['best_splits']})  twin {row['twin']['median_ms']:8.3f} ms")
    row = timings["compaction"]
    print(f"  compaction {row['caches']} caches {row['pairs']} pairs  kernel "
          f"{row['kernel']['median_ms']:8.3f} ms  twin {row['twin']['median_ms']:8.3f} ms")
    for requests, row in timings["gdn_tree"].items():
        trees = "  ".join(f"{name} {value['median_ms']:8.3f} ms" for name, value in row.items()
                          if name.startswith("tree") and not name.endswith("_depth"))
        print(f"  gdn tree, one layer, {requests}: chain({row['chain_rows']} rows) "
              f"{row['chain']['median_ms']:8.3f} ms  {trees}")
    for requests, row in timings["gdn_rows"].items():
        print(f"  gdn rows in slots, one layer, {requests}: " + "  ".join(
            f"{name} {value['recurrence']['median_ms']:.3f} + {value['conv']['median_ms']:.3f} ms"
            for name, value in row.items()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks/results/gpu_check.json")
    parser.add_argument("--dry-run", action="store_true",
                        help="CPU + Triton interpreter + tiny shapes (checks the script runs)")
    parser.add_argument("--compile-only", action="store_true",
                        help="compile every kernel for sm_90 (no GPU needed) and stop")
    args = parser.parse_args(argv)
    begin = time.perf_counter()
    cfg = DRY if args.dry_run else FULL
    if args.compile_only:
        report = {"mode": "compile-only", "compile": run_compile_only(args.dry_run)}
        report["all_ok"] = report["compile"]["ok"]
        for row in report["compile"]["kernels"]:
            print(f"  {row['kernel']:<22} {row['compile_s']:6.1f}s  smem {row['shared_bytes']}")
    else:
        if cfg.device == "cuda" and not torch.cuda.is_available():
            print("no CUDA device: run with --dry-run or --compile-only", file=sys.stderr)
            return 2
        if args.dry_run and not launch.interpreter_loaded():
            print("--dry-run needs triton imported with TRITON_INTERPRET=1 (run this file as a "
                  "script)", file=sys.stderr)
            return 2
        report = {"mode": "dry-run" if args.dry_run else "gpu", **run_checks_and_timings(cfg)}
        print_timings(report["timings"])
    report.update(config={k: str(v) if isinstance(v, tuple) else v
                          for k, v in asdict(cfg).items()},
                  environment=environment(cfg), elapsed_s=time.perf_counter() - begin)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"all_ok={report['all_ok']}  wrote {args.out}  ({report['elapsed_s']:.1f}s)")
    return 0 if report["all_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
