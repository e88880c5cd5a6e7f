"""Tree attention kernel (Triton, interpreted on CPU) against its torch twin, and the twin
against a naive per-request, per-row loop.

The interpreter only works in a process that had TRITON_INTERPRET=1 before triton was first
imported (see test_topb.py), so the kernel runs in a fresh subprocess; comparisons happen
here. The interpreter's tl.dot mishandles bfloat16 (numpy has no bfloat16), so the
half-precision case uses float16; bfloat16 is checked on a GPU by benchmarks/gpu_check.py.
"""

import math
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from interpreted import run_interpreted

from vllm_dartree.kernels.tree_attention import (
    choose_num_splits,
    tree_attention,
    tree_attention_torch,
    unpack_bits,
)
from vllm_dartree.tree import ancestor_mask, packed_ancestor_mask
from vllm_dartree.tree.types import padded_tree

SENTINEL = 7.0  # rows the kernel must not write keep this value


@dataclass
class Spec:
    heads: int
    kv_heads: int
    head_size: int
    block_size: int
    budget: int
    bases: list[int]
    drafts: list[int]  # scheduled nodes per request (rows = 1 + drafts)
    num_splits: int = 1
    dtype: torch.dtype = torch.float32


SPECS = [
    # GQA 1, one mask word, an empty prefix, a root-only request
    Spec(2, 2, 64, 16, 8, bases=[0, 37, 70], drafts=[8, 5, 0]),
    # GQA 4, B = 64: two mask words, padded second tree
    Spec(8, 2, 64, 32, 64, bases=[50, 130], drafts=[64, 40]),
    # GQA 4, prefix split in three (flash-decoding partials + merge)
    Spec(4, 1, 64, 16, 24, bases=[100, 3], drafts=[24, 20], num_splits=3),
    # head 128, GQA 4
    Spec(4, 1, 128, 16, 8, bases=[20, 45], drafts=[8, 3]),
    # head 128, GQA 1, B = 128 (three mask words)
    Spec(1, 1, 128, 32, 128, bases=[10], drafts=[128]),
    # GQA 1, two splits, splits left without prefix keys (base 20 < 2 tiles)
    Spec(2, 2, 64, 32, 8, bases=[20, 90], drafts=[3, 8], num_splits=2),
    # GQA 3 (query heads padded to a power of two inside the tile)
    Spec(6, 2, 64, 16, 5, bases=[17, 33], drafts=[5, 2]),
    # float16 cache and queries
    Spec(4, 2, 64, 16, 8, bases=[40, 9], drafts=[8, 6], dtype=torch.float16),
]


def random_parents(gen: torch.Generator, budget: int, kind: str) -> list[int]:
    """Parent (0..j) of node j+1 for a chain, a star, a bushy or a random tree."""
    if kind == "chain":
        return list(range(budget))
    if kind == "star":
        return [0] * budget
    if kind == "bushy":
        return [j // 3 for j in range(budget)]
    return [int(torch.randint(0, j + 1, (), generator=gen)) for j in range(budget)]


def tree_depths(parents: list[int]) -> list[int]:
    depth = [0]
    for parent in parents:
        depth.append(depth[parent] + 1)
    return depth[1:]


def make_case(spec: Spec, seed: int) -> dict:
    gen = torch.Generator().manual_seed(seed)
    num_requests, budget = len(spec.bases), spec.budget
    kinds = ["random", "chain", "star", "bushy"]
    parents = [random_parents(gen, budget, kinds[(seed + r) % 4]) for r in range(num_requests)]
    drafts = torch.tensor(spec.drafts)
    valid = torch.arange(budget) < drafts.unsqueeze(1)  # unscheduled nodes become padding
    tree = padded_tree(
        torch.zeros(num_requests, budget, dtype=torch.int64), torch.tensor(parents),
        torch.tensor([tree_depths(p) for p in parents]), valid,
        torch.zeros(num_requests, budget), torch.zeros(num_requests, dtype=torch.int64),
        budget, None)
    bases = torch.tensor(spec.bases)
    lengths = bases + 1 + drafts
    blocks_per_req = [math.ceil(int(n) / spec.block_size) + 1 for n in lengths]
    max_blocks = max(blocks_per_req) + 2
    num_blocks = sum(blocks_per_req) + 5
    perm = torch.randperm(num_blocks, generator=gen)
    table = torch.randint(0, num_blocks, (num_requests, max_blocks), generator=gen)
    start = 0
    for r, count in enumerate(blocks_per_req):  # distinct blocks per request, junk after
        table[r, :count] = perm[start : start + count]
        start += count
    shape = (num_blocks, spec.block_size, spec.kv_heads, spec.head_size)
    key_cache = torch.randn(shape, generator=gen).to(spec.dtype)
    value_cache = torch.randn(shape, generator=gen).to(spec.dtype)
    # Verify segments of 1 + B rows with other (non-tree) rows in between.
    size = 1 + budget
    root_row = torch.tensor([3 + r * (size + 4) for r in range(num_requests)])
    num_tokens = int(root_row[-1]) + size + 3
    query = torch.randn(num_tokens, spec.heads, spec.head_size, generator=gen).to(spec.dtype)
    return dict(
        query=query, key_cache=key_cache, value_cache=value_cache,
        block_table=table.to(torch.int32), base=bases, ancestor_bits=packed_ancestor_mask(tree),
        num_rows=1 + drafts, root_row=root_row, scale=spec.head_size**-0.5,
        num_splits=spec.num_splits, ancestors=ancestor_mask(tree),
    )


KERNEL_ARGS = ("query", "key_cache", "value_cache", "block_table", "base", "ancestor_bits",
               "num_rows", "root_row", "scale")


def call_args(case: dict) -> tuple:
    return tuple(case[name] for name in KERNEL_ARGS)


def run_interpreted_kernel(cases: list[dict], tmp_path: Path) -> list[torch.Tensor]:
    inputs, outputs = tmp_path / "cases.pt", tmp_path / "out.pt"
    torch.save(cases, inputs)
    script = textwrap.dedent(f"""
        import torch
        import vllm_dartree.kernels.tree_attention as ta
        from vllm_dartree.kernels import launch

        def forbidden(*args, **kwargs):
            raise AssertionError("tree_attention fell back to the torch twin")

        assert launch.interpreter_loaded()
        names = {KERNEL_ARGS!r}
        results = []
        for case in torch.load({str(inputs)!r}):
            args = [case[name] for name in names]
            out = torch.full_like(case["query"], {SENTINEL})
            ta.tree_attention_triton(*args, out=out, num_splits=case["num_splits"])
            results.append(out)
        ta.tree_attention_torch = forbidden  # the dispatcher must pick the kernel
        case = torch.load({str(inputs)!r})[0]
        dispatched = ta.tree_attention(*[case[name] for name in names])
        torch.save((results, dispatched), {str(outputs)!r})
    """)
    results, dispatched = run_interpreted(script, outputs)
    first = results[0].clone()
    scheduled = scheduled_rows(cases[0])
    assert torch.equal(dispatched[scheduled], first[scheduled])
    return results


def scheduled_rows(case: dict) -> torch.Tensor:
    rows = [int(root) + i for root, n in zip(case["root_row"], case["num_rows"])
            for i in range(int(n))]
    return torch.tensor(rows, dtype=torch.int64)


def naive_tree_attention(case: dict) -> torch.Tensor:
    """Per request, per scheduled row: the prefix plus the row's ancestors (bool mask from
    the DraftTree, not the packed bits), keys fetched slot by slot, softmax in float64."""
    query, key_cache, value_cache = case["query"], case["key_cache"], case["value_cache"]
    block_size = key_cache.shape[1]
    group = query.shape[1] // key_cache.shape[2]
    out = torch.full_like(query, SENTINEL, dtype=torch.float64)
    for r in range(len(case["base"])):
        base, rows = int(case["base"][r]), int(case["num_rows"][r])
        table = case["block_table"][r].tolist()
        slots = [(table[p // block_size], p % block_size) for p in range(base + rows)]
        keys = torch.stack([key_cache[s] for s in slots]).double()  # [N, kvh, D]
        values = torch.stack([value_cache[s] for s in slots]).double()
        keys, values = keys.repeat_interleave(group, 1), values.repeat_interleave(group, 1)
        for i in range(rows):
            visible = list(range(base)) + [base + j for j in range(rows)
                                           if case["ancestors"][r, i, j]]
            q = query[int(case["root_row"][r]) + i].double()  # [H, D]
            logits = torch.einsum("hd,nhd->hn", q, keys[visible]) * case["scale"]
            out[int(case["root_row"][r]) + i] = torch.einsum(
                "hn,nhd->hd", torch.softmax(logits, -1), values[visible])
    return out


@pytest.fixture(scope="module")
def cases() -> list[dict]:
    return [make_case(spec, seed) for seed, spec in enumerate(SPECS)]


def tolerance(case: dict) -> float:
    return 1e-4 if case["query"].dtype == torch.float32 else 2e-3


def test_interpreted_kernel_equals_twin(cases, tmp_path):
    results = run_interpreted_kernel(cases, tmp_path)
    for spec, case, kernel_out in zip(SPECS, cases, results):
        twin = tree_attention_torch(*call_args(case),
                                    out=torch.full_like(case["query"], SENTINEL))
        rows = scheduled_rows(case)
        untouched = torch.ones(case["query"].shape[0], dtype=torch.bool)
        untouched[rows] = False
        assert torch.all(kernel_out[untouched] == SENTINEL), spec  # padding rows not written
        err = (kernel_out[rows].float() - twin[rows].float()).abs().max().item()
        assert err < tolerance(case), (spec, err)


def test_twin_equals_naive_loop(cases):
    for spec, case in zip(SPECS, cases):
        twin = tree_attention_torch(*call_args(case),
                                    out=torch.full_like(case["query"], SENTINEL))
        naive = naive_tree_attention(case)
        assert torch.all(twin[naive == SENTINEL] == SENTINEL), spec
        err = (twin.double() - naive).abs().max().item()
        assert err < tolerance(case), (spec, err)


def test_dispatcher_uses_twin_on_cpu_without_interpreter(cases, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    case = cases[0]
    assert torch.equal(tree_attention(*call_args(case)), tree_attention_torch(*call_args(case)))


def test_unpack_bits_inverts_packing(cases):
    for case in cases:
        size = case["ancestors"].shape[-1]
        assert torch.equal(unpack_bits(case["ancestor_bits"], size), case["ancestors"])


def test_choose_num_splits():
    assert choose_num_splits(1, 5, 8, 32768) == 4  # 40 programs -> 4 splits fill 132 SMs
    assert choose_num_splits(1, 5, 8, 1000) == 1  # too short to be worth splitting
    assert choose_num_splits(64, 5, 8, 32768) == 1  # already enough programs


def test_argument_checks(cases):
    case = dict(cases[0])
    with pytest.raises(ValueError, match="ancestor_bits must be int64"):
        tree_attention_torch(*call_args({**case, "ancestor_bits": case["ancestors"]}))
    with pytest.raises(ValueError, match="num_rows must be"):
        tree_attention_torch(*call_args({**case, "num_rows": case["num_rows"][:1]}))
    with pytest.raises(ValueError, match="do not fit"):
        tree_attention_torch(*call_args({**case, "query": case["query"][:, :, :32]}))


def page_view_case(case: dict) -> dict:
    """The case with its caches stored as one vLLM Triton-backend page [num_blocks, kv_heads,
    block_size, 2 * head_size] and passed as the strided key and value views production takes
    (vllm_dartree/integration/gpu_attention.py split_kv_cache)."""
    head_size = case["key_cache"].shape[-1]
    both = torch.cat([case["key_cache"], case["value_cache"]], dim=-1)
    page = both.transpose(1, 2).contiguous()
    key_cache, value_cache = page.transpose(1, 2).split(head_size, dim=-1)
    return {**case, "key_cache": key_cache, "value_cache": value_cache}


# GQA 4 with two mask words, head 128, two KV splits, GQA 3, float16 (most with kv_heads 2,
# where the page really swaps the head and slot axes).
PAGE_SPECS = (1, 3, 5, 6, 7)


def test_interpreted_kernel_on_page_views_equals_twin(cases, tmp_path):
    paged = [page_view_case(cases[index]) for index in PAGE_SPECS]
    results = run_interpreted_kernel(paged, tmp_path)
    for case, sent in zip(paged, torch.load(tmp_path / "cases.pt")):  # what the kernel got
        key, value = sent["key_cache"], sent["value_cache"]
        assert key.stride() == case["key_cache"].stride() and not key.is_contiguous()
        assert key.untyped_storage().data_ptr() == value.untyped_storage().data_ptr()
    for index, case, kernel_out in zip(PAGE_SPECS, paged, results):
        sentinel = torch.full_like(case["query"], SENTINEL)
        twin = tree_attention_torch(*call_args(case), out=sentinel.clone())
        contiguous_twin = tree_attention_torch(*call_args(cases[index]), out=sentinel.clone())
        assert torch.equal(twin, contiguous_twin), SPECS[index]  # same keys, other strides
        rows = scheduled_rows(case)
        untouched = torch.ones(case["query"].shape[0], dtype=torch.bool)
        untouched[rows] = False
        assert torch.all(kernel_out[untouched] == SENTINEL), SPECS[index]
        err = (kernel_out[rows].float() - twin[rows].float()).abs().max().item()
        assert err < tolerance(case), (SPECS[index], err)
