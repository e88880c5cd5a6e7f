"""KV compaction kernel (Triton, interpreted on CPU) against its torch twin and a naive
"copy of the old cache" reference, on slot pairs from real accepted paths
(``compaction_pairs``) and on adversarial overlaps (cycles, swaps, more pairs than a tile).

The kernel runs in a fresh subprocess with TRITON_INTERPRET=1 (see test_topb.py).
"""

import math
import textwrap
from pathlib import Path

import pytest
import torch
from interpreted import run_interpreted

from vllm_dartree.kernels.kv_compaction import copy_kv_slots, copy_kv_slots_torch, split_kv_caches
from vllm_dartree.step.verify_plan import AcceptedPaths, compaction_pairs
from vllm_dartree.testing.plans import layout_for_roots, plan_of
from vllm_dartree.tree.types import padded_tree


def random_tree(gen: torch.Generator, budget: int):
    """Parents close to their children: deep trees whose long accepted paths skip nodes, so
    a path node often moves onto a slot that a deeper path node has to leave."""
    parents = [max(0, j - int(torch.randint(0, 3, (), generator=gen))) for j in range(budget)]
    depths = [0]
    for parent in parents:
        depths.append(depths[parent] + 1)
    return padded_tree(
        torch.zeros(1, budget, dtype=torch.int64), torch.tensor([parents]),
        torch.tensor([depths[1:]]), torch.ones(1, budget, dtype=torch.bool),
        torch.zeros(1, budget), torch.zeros(1, dtype=torch.int64), budget, None)


def random_path(gen: torch.Generator, parents: list[int], scheduled: int, max_len: int
                ) -> list[int]:
    """Root, then a random scheduled child at every step until a leaf or a random stop."""
    path = [0]
    while len(path) < max_len:
        children = [j + 1 for j in range(scheduled) if parents[j] == path[-1]]
        if not children or torch.rand((), generator=gen) < 0.05:
            break
        path.append(children[int(torch.randint(0, len(children), (), generator=gen))])
    return path


def accepted_pairs(gen: torch.Generator, num_requests: int, budget: int, block_size: int
                   ) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(src, dst, num_slots) of ``compaction_pairs`` for random trees and accepted paths."""
    trees = [random_tree(gen, budget) for _ in range(num_requests)]
    drafts = [int(torch.randint(budget // 2, budget + 1, (), generator=gen))
              for _ in range(num_requests)]
    root_rows, row = [], 2
    for n in drafts:
        root_rows.append(row)
        row += 1 + n + 1  # one non-tree row between segments
    step = plan_of(trees, drafts, layout_for_roots(root_rows, drafts))
    max_len = budget + 1
    nodes = torch.full((num_requests, max_len), -1, dtype=torch.int64)
    for r, tree in enumerate(trees):
        path = random_path(gen, tree.parents[0].tolist(), drafts[r], max_len)
        nodes[r, : len(path)] = torch.tensor(path)
    accepted = AcceptedPaths(step, nodes, (nodes >= 0).sum(dim=1))
    # Rows of request r are positions base_r + i of its own (shuffled) blocks.
    num_slots = math.ceil((row + 40 * num_requests) / block_size) * block_size + block_size
    slot_mapping = torch.randperm(num_slots, generator=gen)[:row]
    src, dst = compaction_pairs(accepted, slot_mapping)
    return src, dst, num_slots


def make_cases() -> list[dict]:
    gen = torch.Generator().manual_seed(0)
    cases = []
    for dtype, block_size, budget, layers in ((torch.float32, 16, 8, 3),
                                              (torch.bfloat16, 32, 64, 2)):
        src, dst, num_slots = accepted_pairs(gen, 4, budget, block_size)
        assert src.numel() > 0
        shape = (2, num_slots // block_size, block_size, 2, 64)  # FlashAttention layer cache
        cases.append(dict(layers=[torch.randn(shape, generator=gen).to(dtype)
                                  for _ in range(layers)],
                          src=src, dst=dst, block_p=16))
    # Adversarial: every destination is another pair's source (a 40-cycle plus swaps),
    # more pairs than a tile, caches stored [blocks, heads, slots, D] (strided view), 1 byte.
    slots = torch.randperm(96, generator=gen)[:46]
    cycle, swaps = slots[:40], slots[40:]
    src = torch.cat([cycle, swaps])
    dst = torch.cat([cycle.roll(1), swaps.view(3, 2).flip(1).reshape(-1)])
    storage = [torch.randint(0, 256, (6, 2, 16, 32), generator=gen, dtype=torch.uint8)
               for _ in range(2)]
    # The scratch budget fits one cache's pairs: one launch per cache.
    cases.append(dict(caches=[s.transpose(1, 2) for s in storage], src=src, dst=dst, block_p=8,
                      max_scratch_bytes=46 * 2 * 32))
    # Two tiny caches with head_size 16 and a single pair; and no pairs at all.
    tiny = [torch.randn(2, 16, 1, 16, generator=gen) for _ in range(2)]
    cases.append(dict(caches=tiny, src=torch.tensor([5]), dst=torch.tensor([20]), block_p=16))
    cases.append(dict(caches=[t.clone() for t in tiny], src=torch.zeros(0, dtype=torch.int64),
                      dst=torch.zeros(0, dtype=torch.int64), block_p=16))
    return cases


def caches_of(case: dict) -> list[torch.Tensor]:
    return split_kv_caches(case["layers"]) if "layers" in case else case["caches"]


def naive_copy(caches: list[torch.Tensor], src: torch.Tensor, dst: torch.Tensor
               ) -> list[torch.Tensor]:
    """New caches where slot dst[p] holds what slot src[p] held before any copy."""
    result = []
    for cache in caches:
        block_size = cache.shape[1]
        old, new = cache.clone(), cache.clone()
        for s, d in zip(src.tolist(), dst.tolist()):
            new[d // block_size, d % block_size] = old[s // block_size, s % block_size]
        result.append(new)
    return result


def run_interpreted_kernel(cases: list[dict], tmp_path: Path) -> list[list[torch.Tensor]]:
    inputs, outputs = tmp_path / "cases.pt", tmp_path / "out.pt"
    torch.save(cases, inputs)
    script = textwrap.dedent(f"""
        import torch
        import vllm_dartree.kernels.kv_compaction as kv
        from vllm_dartree.kernels import launch

        def forbidden(*args, **kwargs):
            raise AssertionError("copy_kv_slots fell back to the torch twin")

        def caches_of(case):
            return kv.split_kv_caches(case["layers"]) if "layers" in case else case["caches"]

        assert launch.interpreter_loaded()
        cases = torch.load({str(inputs)!r})
        results = []
        for case in cases:
            caches = caches_of(case)
            kv.copy_kv_slots_triton(caches, case["src"], case["dst"], block_p=case["block_p"],
                                    max_scratch_bytes=case.get("max_scratch_bytes", 1 << 28))
            results.append([c.clone() for c in caches])
        kv.copy_kv_slots_torch = forbidden  # the dispatcher must pick the kernel
        case = torch.load({str(inputs)!r})[0]
        caches = caches_of(case)
        kv.copy_kv_slots(caches, case["src"], case["dst"], kv.cache_pointer_table(caches))
        torch.save((results, caches), {str(outputs)!r})
    """)
    results, dispatched = run_interpreted(script, outputs)
    assert all(torch.equal(a, b) for a, b in zip(results[0], dispatched))
    return results


def test_interpreted_kernel_equals_twin_and_naive(tmp_path):
    cases = make_cases()
    expected = [naive_copy(caches_of(case), case["src"], case["dst"]) for case in cases]
    kernel_results = run_interpreted_kernel(cases, tmp_path)
    for index, case in enumerate(cases):
        caches = [c.clone() for c in caches_of(case)]
        copy_kv_slots_torch(caches, case["src"], case["dst"])
        for twin, kernel, naive in zip(caches, kernel_results[index], expected[index]):
            assert torch.equal(twin, naive), index
            assert torch.equal(kernel, naive), index


def test_pairs_really_overlap():
    """Accepted paths move nodes onto slots other path nodes leave; the adversarial case
    would break a copy that writes while it still reads."""
    cases = make_cases()
    assert set(cases[1]["src"].tolist()) & set(cases[1]["dst"].tolist())
    case = cases[2]
    caches = [c.clone() for c in caches_of(case)]
    for cache in caches:  # in place, pair by pair
        for s, d in zip(case["src"].tolist(), case["dst"].tolist()):
            cache[d // 16, d % 16] = cache[s // 16, s % 16]
    expected = naive_copy(caches_of(case), case["src"], case["dst"])
    assert not all(torch.equal(a, b) for a, b in zip(caches, expected))


def test_dispatcher_uses_twin_on_cpu_without_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    case = make_cases()[0]
    caches = caches_of(case)
    expected = naive_copy(caches, case["src"], case["dst"])
    copy_kv_slots(caches, case["src"], case["dst"])
    assert all(torch.equal(a, b) for a, b in zip(caches, expected))


def test_argument_checks():
    cache = torch.zeros(2, 16, 1, 16)
    with pytest.raises(ValueError, match="same shape"):
        copy_kv_slots_torch([cache, torch.zeros(3, 16, 1, 16)], torch.tensor([0]),
                            torch.tensor([1]))
    with pytest.raises(ValueError, match=r"\[P\] slot indices"):
        copy_kv_slots_torch([cache], torch.tensor([0, 1]), torch.tensor([1]))
    with pytest.raises(ValueError, match="num_blocks, block_size"):
        copy_kv_slots_torch([torch.zeros(2, 16, 16)], torch.tensor([0]), torch.tensor([1]))


def page_view_case(gen: torch.Generator, dtype: torch.dtype, layers: int, kv_heads: int,
                   head_size: int) -> dict:
    """Accepted-path pairs over layer pages [num_blocks, kv_heads, block_size, 2 * head_size]
    (vLLM's Triton backend), passed as the views [num_blocks, block_size, kv_heads,
    2 * head_size] production compacts, one per layer (vllm_dartree/integration/
    gpu_attention.py GpuKvMover)."""
    src, dst, num_slots = accepted_pairs(gen, 4, 16, 16)
    pages = [torch.randn(num_slots // 16, kv_heads, 16, 2 * head_size, generator=gen).to(dtype)
             for _ in range(layers)]
    return dict(caches=[page.transpose(1, 2) for page in pages], src=src, dst=dst, block_p=16)


def test_interpreted_kernel_on_page_views(tmp_path):
    """Keys and values of a slot move together; every view covers its whole page, so the
    comparison with the naive copy also proves the slots not moved are untouched."""
    gen = torch.Generator().manual_seed(1)
    # kv_heads 3 x 2 x 16: slots of 96 elements, less than one element tile.
    cases = [page_view_case(gen, torch.bfloat16, 3, 2, 32),
             page_view_case(gen, torch.float32, 2, 3, 16)]
    expected = [naive_copy(case["caches"], case["src"], case["dst"]) for case in cases]
    kernel_results = run_interpreted_kernel(cases, tmp_path)
    for case, sent in zip(cases, torch.load(tmp_path / "cases.pt")):  # what the kernel got
        for cache, view in zip(case["caches"], sent["caches"]):
            assert view.stride() == cache.stride() and not view.is_contiguous()
    for index, case in enumerate(cases):
        caches = [c.clone() for c in case["caches"]]
        copy_kv_slots_torch(caches, case["src"], case["dst"])
        for twin, kernel, naive in zip(caches, kernel_results[index], expected[index]):
            assert torch.equal(twin, naive), index
            assert torch.equal(kernel, naive), index
