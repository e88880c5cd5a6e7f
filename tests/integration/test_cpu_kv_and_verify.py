"""The CPU KV-cache access used by tree attention and compaction, and the verify-step maths."""

from __future__ import annotations

import pytest
import torch

from vllm_dartree.integration.cpu_attention import copy_kv_slots, gather_kv
from vllm_dartree.step.verify_plan import (
    AcceptedPaths,
    accepted_row_order,
    compaction_pairs,
    depth_position_values,
    set_depth_positions,
)
from vllm_dartree.testing.plans import plan_of
from vllm_dartree.tree import DraftTree


@pytest.mark.parametrize(("isa", "block_size", "head_size", "dtype"), [
    ("vec", 128, 32, torch.float32), ("vec16", 16, 32, torch.float32),
    ("vec", 32, 64, torch.float32), ("vec16", 16, 64, torch.bfloat16),
    # A hybrid target's attention block (vLLM widens it to the GDN state's page): 1280
    # tokens x 32 dims of bfloat16 codes need three base-128 digits, not two.
    ("vec", 1280, 32, torch.bfloat16),
])
def test_gather_and_copy_match_vllms_cache_writes(isa, block_size, head_size, dtype):
    from vllm import _custom_ops as ops
    from vllm.platforms import current_platform

    current_platform.import_kernels()
    blocks, kv_heads, tokens = 5, 2, 50
    kv_cache = torch.zeros(blocks, kv_heads, block_size, 2 * head_size, dtype=dtype)
    key_cache, value_cache = kv_cache.view(blocks, kv_heads, 2 * block_size, -1).chunk(2, dim=2)
    keys = torch.randn(tokens, kv_heads, head_size).to(dtype)
    values = torch.randn(tokens, kv_heads, head_size).to(dtype)
    slots = torch.randperm(blocks * block_size, generator=torch.Generator().manual_seed(0))
    slots = slots[:tokens]
    ops.cpu_attn_reshape_and_cache(keys, values, key_cache, value_cache, slots, isa,
                                   k_scale=1.0, v_scale=1.0, kv_cache_dtype="auto")
    got_k, got_v = gather_kv(kv_cache, slots, isa)
    assert torch.equal(got_k, keys) and torch.equal(got_v, values)
    # Overlapping copy: every source is read before any destination is written.
    src, dst = slots[:10], torch.cat([slots[5:10], slots[20:25]])
    copy_kv_slots(kv_cache, src, dst, isa)
    moved_k, moved_v = gather_kv(kv_cache, dst, isa)
    assert torch.equal(moved_k, keys[:10]) and torch.equal(moved_v, values[:10])


def _tree(parents, depths, tokens):
    parents, depths, tokens = (torch.tensor([x]) for x in (parents, depths, tokens))
    budget = parents.shape[1]
    return DraftTree(tokens, parents, depths, torch.tensor([budget]),
                     torch.ones(1, budget, dtype=torch.bool), torch.zeros(1, budget), 4)


@pytest.mark.parametrize(("isa", "block_size", "dtype", "slot_dtype"), [
    ("vec16", 16, torch.float32, torch.int64), ("vec16", 32, torch.bfloat16, torch.int32),
])
def test_slot_moves_in_cpp_equal_the_torch_copy(isa, block_size, dtype, slot_dtype):
    """KV compaction's C++ move (all layers in one call) equals the torch copy layer by
    layer, with chained pairs: a slot that is one pair's source and another's destination."""
    from vllm.platforms import current_platform

    from vllm_dartree.integration.cpu_attention import fast_layout
    from vllm_dartree.kernels import cpu_kv_pages

    current_platform.import_kernels()
    gen = torch.Generator().manual_seed(1)
    layers = [torch.randn(4, 3, block_size, 2 * 64, generator=gen).to(dtype) for _ in range(3)]
    assert all(fast_layout(kv, isa) for kv in layers)
    src, dst = torch.tensor([5, 9, 40, 17]), torch.tensor([4, 5, 6, 9])
    expected = [kv.clone() for kv in layers]
    for kv in expected:
        copy_kv_slots(kv, src, dst, isa)
    assert not torch.equal(expected[0], layers[0])  # something moved
    cpu_kv_pages.move_slots(layers, src.to(slot_dtype), dst.to(slot_dtype))
    for got, want in zip(layers, expected):
        assert torch.equal(got, want)


def test_accepted_path_rows_compaction_and_positions():
    # root -> 1 -> 2;  root -> 3 -> 4 -> 5   (nodes 1..5 in topological order)
    tree = _tree(parents=[0, 1, 0, 3, 4], depths=[1, 2, 1, 2, 3], tokens=[7, 8, 9, 10, 11])
    # Request 0 prefills rows 0..9 (no drafts); request 1 verifies rows 10..15.
    step = plan_of([tree], num_drafts=[0, 5], num_scheduled=[10, 6])
    positions = torch.arange(100, 120)
    assert step.node_rows.tolist() == [[11, 12, 13, 14, 15]]
    assert depth_position_values(step, positions).tolist() == [[111, 112, 111, 112, 113]]
    # M-RoPE ([3 axes, N]): after an image the axes differ by the request's delta; each
    # axis of a node is its root's + depth, as along a chain of text tokens.
    mrope = torch.stack([positions, positions - 7, positions - 7])
    set_depth_positions(mrope, step)
    assert mrope[:, 11:16].tolist() == [[111, 112, 111, 112, 113], [104, 105, 104, 105, 106],
                                        [104, 105, 104, 105, 106]]
    assert torch.equal(mrope[:, :11], torch.stack([positions, positions - 7,
                                                   positions - 7])[:, :11])
    accepted = AcceptedPaths(step, torch.tensor([[0, 3, 4, -1, -1]]), torch.tensor([3]))
    order = accepted_row_order(accepted, 20)
    # Segment rows 10..15 become [root, node3, node4, node1, node2, node5].
    assert order[10:16].tolist() == [10, 13, 14, 11, 12, 15]
    assert order[:10].tolist() == list(range(10)) and order[16:].tolist() == [16, 17, 18, 19]
    slot_mapping = torch.arange(1000, 1020)
    src, dst = compaction_pairs(accepted, slot_mapping)
    # Path nodes 3, 4 move to rows 11, 12; the rest copy the root's slot onto itself.
    assert src.tolist() == [1013, 1014, 1010, 1010] and dst.tolist() == [1011, 1012, 1010, 1010]


def test_truncated_tree_keeps_a_topological_prefix():
    tree = _tree(parents=[0, 1, 0, 3, 4], depths=[1, 2, 1, 2, 3], tokens=[7, 8, 9, 10, 11])
    step = plan_of([tree], num_drafts=[3], num_scheduled=[4])
    assert step.tree.valid.tolist() == [[True, True, True, False, False]]
    assert step.node_in_batch.tolist() == [[True, True, True, False, False]]
    # Scheduled nodes see their ancestors; unscheduled ones become dummies under the root.
    assert step.ancestors[0, 2].tolist()[:3] == [True, True, True]
    assert step.ancestors[0, 4].tolist() == [True, False, False, False, True, False]


@pytest.mark.parametrize(("isa", "dtype", "all_rows", "trees_only", "group"), [
    ("vec16", torch.float32, False, False, 3), ("vec16", torch.bfloat16, False, False, 3),
    ("vec", torch.float32, False, False, 3), ("vec16", torch.float32, True, False, 3),
    ("vec16", torch.bfloat16, True, False, 3), ("vec16", torch.float32, True, True, 3),
    ("vec16", torch.bfloat16, True, True, 3), ("vec16", torch.float32, False, True, 3),
    # the kernel tiles 2 rows when G <= 3 and 1 row otherwise
    ("vec16", torch.float32, False, False, 4), ("vec16", torch.float32, True, True, 1),
])
def test_kernel_and_block_path_equal_the_element_path_and_a_naive_loop(isa, dtype, all_rows,
                                                                       trees_only, group):
    """Tree attention by the C++ kernel reading the pages in place (float32) and by its
    torch twin through whole-block copies equals the element-gather path and a naive
    per-row softmax over prefix + ancestors, on caches written by vLLM's own op: the rows
    after each causal prefix, or (``all_rows``, the stock kernel skipped) every verify row.
    With ``trees_only`` the batch is two fully scheduled trees of equal size and nothing
    else, so with ``all_rows`` the queries and rows are read and written through views
    (``dense``); otherwise a plain request leads and one tree is cut to 3 of its 5 nodes.
    Rows that are not recomputed are left untouched."""
    from vllm import _custom_ops as ops
    from vllm.platforms import current_platform

    from vllm_dartree.integration.cpu_attention import (
        fast_layout,
        plan_tree_attention,
        tree_attention,
        tree_attention_by_blocks,
        tree_attention_by_elements,
        tree_attention_in_pages,
    )
    from vllm_dartree.kernels import cpu_kv_pages

    current_platform.import_kernels()
    gen = torch.Generator().manual_seed(3)
    block, head, kv_heads = 16, 64, 2
    heads = kv_heads * group
    trees = [_tree([0, 1, 0, 3, 4], [1, 2, 1, 2, 3], [7, 8, 9, 10, 11]),
             _tree([0, 0, 1, 2, 2], [1, 1, 2, 3, 3], [1, 2, 3, 4, 5])]
    prefixes = [37, 5]
    if trees_only:
        drafts, plain = [5, 5], []
    else:
        drafts, plain = [5, 3], [4]  # the second request scheduled 3 of its 5 nodes
    plan = plan_of(trees, num_drafts=[0] * len(plain) + drafts,
                   num_scheduled=plain + [1 + n for n in drafts])
    lengths = [p + 1 + n for p, n in zip(prefixes, drafts)]
    blocks = 8
    kv_cache = torch.zeros(blocks, kv_heads, block, 2 * head, dtype=dtype)
    key_cache, value_cache = kv_cache.view(blocks, kv_heads, 2 * block, -1).chunk(2, dim=2)
    table = torch.tensor([[5, 3, 1, 7], [4, 2, 6, 0]], dtype=torch.int32)
    if plain:
        table = torch.cat([torch.tensor([[0, 1, 2, 3]], dtype=torch.int32), table])
    seq_lens = torch.tensor(plain + lengths, dtype=torch.int32)
    keys = torch.randn(sum(lengths), kv_heads, head, generator=gen).to(dtype)
    values = torch.randn(sum(lengths), kv_heads, head, generator=gen).to(dtype)
    slots = torch.cat([table[b + len(plain), torch.arange(n) // block].long() * block
                       + torch.arange(n) % block for b, n in enumerate(lengths)])
    ops.cpu_attn_reshape_and_cache(keys, values, key_cache, value_cache, slots, isa,
                                   k_scale=1.0, v_scale=1.0, kv_cache_dtype="auto")
    num_rows = sum(plain) + sum(1 + n for n in drafts)
    query = torch.randn(num_rows + 2, heads, head, generator=gen).to(dtype)  # + 2 padding
    gather = plan_tree_attention(plan, seq_lens, table, block, all_rows=all_rows)
    assert gather.dense == (trees_only and all_rows)
    assert fast_layout(kv_cache, isa)
    untouched = 7.0
    fast = torch.full_like(query, untouched)
    by_blocks = torch.full_like(query, untouched)
    by_elements = torch.full_like(query, untouched)
    tree_attention(query, kv_cache, isa, gather, head**-0.5, fast)
    tree_attention_by_blocks(query, kv_cache, gather, head**-0.5, by_blocks)
    tree_attention_by_elements(query, kv_cache, isa, gather, head**-0.5, by_elements)
    atol = 2e-2 if dtype != torch.float32 else 1e-5
    torch.testing.assert_close(by_blocks.float(), by_elements.float(), atol=atol, rtol=0)
    torch.testing.assert_close(fast.float(), by_elements.float(), atol=atol, rtol=0)
    if dtype == torch.float32:  # the product's path on this machine is the kernel
        assert cpu_kv_pages.load() is not None, "the C++ kernel must build here"
        in_pages = torch.full_like(query, untouched)
        tree_attention_in_pages(query, kv_cache, gather, head**-0.5, in_pages)
        torch.testing.assert_close(in_pages, by_elements, atol=1e-5, rtol=0)
        assert torch.equal(fast, in_pages)
    # A naive loop over rows: softmax over the prefix and the row's ancestors.
    offset, starts = 0, []
    for n in lengths:
        starts.append(offset)
        offset += n
    expected = {}
    for t, (prefix, n) in enumerate(zip(prefixes, drafts)):
        root = int(plan.root_row[t])
        # Unless all_rows, rows up to the causal prefix are left to the stock kernel.
        for i in range(0 if all_rows else 1 + int(plan.causal_rows[t]), 1 + n):
            cols = [j for j in range(1 + n) if plan.ancestors[t, i, j]]
            keep = list(range(prefix)) + [prefix + j for j in cols]
            k = keys[starts[t] + torch.tensor(keep)].float().repeat_interleave(group, dim=1)
            v = values[starts[t] + torch.tensor(keep)].float().repeat_interleave(group, dim=1)
            q = query[root + i].float()
            weights = (torch.einsum("hd,khd->hk", q, k) * head**-0.5).softmax(-1)
            expected[root + i] = torch.einsum("hk,khd->hd", weights, v)
    assert plan.causal_rows.tolist() == [2, 1]
    assert sorted(gather.out_rows.tolist()) == sorted(expected)
    for row in range(query.shape[0]):
        if row in expected:
            torch.testing.assert_close(fast[row].float(), expected[row], atol=3e-2 if dtype
                                       != torch.float32 else 1e-4, rtol=0)
        else:
            assert bool((fast[row] == untouched).all())


def test_rows_on_the_causal_prefix_are_not_recomputed():
    """A depth-first tree's first branch, and a whole chain, are left to the stock kernel:
    only the rows after each request's causal prefix are gathered and written."""
    from vllm_dartree.integration.cpu_attention import plan_tree_attention
    from vllm_dartree.tree import chain_tree, depth_first

    # BFS: a, b at depth 1, c under a, d under c -> depth-first a c d b: 3 causal rows.
    bfs = _tree(parents=[0, 0, 1, 3], depths=[1, 1, 2, 3], tokens=[7, 8, 9, 10])
    tree = depth_first(bfs)
    assert tree.tokens.tolist() == [[7, 9, 10, 8]]
    chain = chain_tree(torch.tensor([[1, 2, 3, 4]]))
    plan = plan_of([tree, chain], num_drafts=[4, 4], num_scheduled=[5, 5])
    assert plan.causal_rows.tolist() == [3, 4]
    table = torch.tensor([[0], [1]], dtype=torch.int32)
    gather = plan_tree_attention(plan, torch.tensor([20, 30], dtype=torch.int32), table, 128)
    assert gather.out_rows.tolist() == [4]  # request 0's row 4 (node b); the chain: none
    only_chains = plan_of([chain], num_drafts=[4], num_scheduled=[5])
    assert plan_tree_attention(only_chains, torch.tensor([30], dtype=torch.int32),
                               table[:1], 128).empty


def test_without_a_compiler_the_torch_twin_serves(monkeypatch, caplog):
    """Where the C++ kernel cannot be built, ``load`` logs why and returns None (the
    engine then verifies through the block-copy twin, tested above against the kernel)."""
    from torch.utils import cpp_extension

    from vllm_dartree.kernels import cpu_kv_pages

    def no_compiler(*args, **kwargs):
        raise RuntimeError("no c++ compiler")

    cpu_kv_pages.load.cache_clear()
    monkeypatch.setattr(cpp_extension, "load_inline", no_compiler)
    try:
        with caplog.at_level("WARNING"):
            assert cpu_kv_pages.load() is None
        assert "could not be built" in caplog.text and "no c++ compiler" in caplog.text
    finally:
        cpu_kv_pages.load.cache_clear()  # the next caller builds (or finds) it again
