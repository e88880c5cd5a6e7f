"""The GDN tree-recurrence kernel (Triton, interpreted on CPU) against its torch twin
(``tree/gdn.py``, itself checked against a per-path oracle in tests/tree/test_gdn_tree.py),
on random trees in depth-first preorder, as the plugin hands them over.

Both compute in fp32 (summation order differs): fp32 inputs agree to 1e-5; bf16 inputs to
one bf16 rounding of the output.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from interpreted import run_interpreted

from vllm_dartree.kernels.gdn_tree import gdn_tree_outputs
from vllm_dartree.tree.gdn import tree_gated_delta_rule
from vllm_dartree.tree.types import DraftTree, depth_first

# (requests, budget, heads, key dim, value dim): value dims below and above one block.
SHAPES = [(1, 1, 1, 16, 8), (2, 12, 2, 16, 8), (3, 9, 2, 32, 40), (1, 20, 1, 128, 32)]


def preorder_tree(gen: torch.Generator, requests: int, budget: int) -> DraftTree:
    columns = torch.arange(budget)
    parents = (torch.rand(requests, budget, generator=gen) * (columns + 1)).long()
    depths = torch.ones(requests, budget, dtype=torch.int64)
    for j in range(budget):
        parent = parents[:, j]
        above = depths.gather(1, (parent - 1).clamp(min=0).unsqueeze(1)).squeeze(1)
        depths[:, j] = torch.where(parent == 0, 0, above) + 1
    tree = DraftTree(tokens=torch.zeros(requests, budget, dtype=torch.int64), parents=parents,
                     depths=depths, num_nodes=torch.full((requests,), budget),
                     valid=torch.ones(requests, budget, dtype=torch.bool),
                     scores=torch.zeros(requests, budget))
    return depth_first(tree)


def make_cases(dtype: torch.dtype):
    gen = torch.Generator().manual_seed(5)
    cases = []
    for requests, budget, heads, key_dim, value_dim in SHAPES:
        tree = preorder_tree(gen, requests, budget)
        rows = 1 + budget
        parents = tree.parents_with_root()
        depths = torch.cat([torch.zeros(requests, 1, dtype=torch.int64), tree.depths], dim=1)
        q = F.normalize(torch.randn(requests, rows, heads, key_dim, generator=gen), dim=-1)
        k = F.normalize(torch.randn(requests, rows, heads, key_dim, generator=gen), dim=-1)
        v = torch.randn(requests, rows, heads, value_dim, generator=gen)
        g = -torch.rand(requests, rows, heads, generator=gen)
        beta = torch.rand(requests, rows, heads, generator=gen)
        state = torch.randn(requests, heads, key_dim, value_dim, generator=gen)
        inputs = tuple(t.to(dtype) for t in (q * key_dim ** -0.5, k, v, g, beta))
        cases.append((*inputs, state, parents, depths, max(budget, 1)))
    return cases


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_the_kernel_matches_its_torch_twin(tmp_path: Path, dtype):
    cases = make_cases(dtype)
    inputs, outputs = tmp_path / "cases.pt", tmp_path / "out.pt"
    torch.save(cases, inputs)
    script = textwrap.dedent(f"""
        import torch
        import vllm_dartree.kernels.gdn_tree as gdn_tree
        from vllm_dartree.kernels import launch

        def forbidden(*args):
            raise AssertionError("gdn_tree_outputs fell back to the torch twin")

        assert launch.interpreter_loaded()
        cases = torch.load({str(inputs)!r})
        states = [case[5].clone() for case in cases]
        gdn_tree.tree_gated_delta_rule = forbidden  # the dispatcher must pick the kernel
        out = [gdn_tree.gdn_tree_outputs(*case) for case in cases]
        unchanged = all(torch.equal(case[5], s) for case, s in zip(cases, states))
        torch.save((out, unchanged), {str(outputs)!r})
    """)
    kernel_outputs, state_unchanged = run_interpreted(script, outputs)
    assert state_unchanged  # the committed state is read only
    tolerance = ({"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32
                 else {"rtol": 2 ** -7, "atol": 1e-2})
    for case, got in zip(cases, kernel_outputs, strict=True):
        q, k, v, g, beta, state, parents, _, _ = case
        expected = tree_gated_delta_rule(q, k, v, g, beta, state, parents)
        assert got.dtype == expected.dtype == dtype
        torch.testing.assert_close(got, expected, **tolerance)


def test_without_the_interpreter_the_twin_answers():
    q, k, v, g, beta, state, parents, depths, max_depth = make_cases(torch.float32)[1]
    assert torch.equal(gdn_tree_outputs(q, k, v, g, beta, state, parents, depths, max_depth),
                       tree_gated_delta_rule(q, k, v, g, beta, state, parents))


# ---- the engine-layout kernels: flat rows, states in slots, the tree conv ----------------
def flat_rows_case(gen: torch.Generator, rows_per_request: list[int], heads: int, key_dim: int,
                   value_dim: int, channels: int, dtype: torch.dtype, width: int = 4):
    """Arguments of ``delta_rule_in_slots`` and ``tree_conv_outputs`` for a random flat
    batch: a request's rows read parents among its earlier rows (or its committed slot) and
    write slots of their own; conv sources are the row itself, earlier rows of its request
    or committed columns. The kernels must follow these indices, whatever tree they encode."""
    total = sum(rows_per_request)
    num_slots = total + len(rows_per_request) + 3
    order = torch.randperm(num_slots, generator=gen)
    row_slot, parent_slot, sources, row_request = [], [], [], []
    starts = [0]
    free = iter(order.tolist())
    for request, rows in enumerate(rows_per_request):
        committed = next(free)
        first = starts[-1]
        for local in range(rows):
            row_slot.append(next(free))
            parent = int(torch.randint(-1, local, (1,), generator=gen)) if local else -1
            parent_slot.append(committed if parent < 0 else row_slot[first + parent])
            row_sources = [first + local]
            for _ in range(width - 1):
                pick = int(torch.randint(-(width - 1), local, (1,), generator=gen))
                row_sources.append(first + pick if pick >= 0 else pick)
            sources.append(row_sources)
            row_request.append(request)
        starts.append(first + rows)
    length = width - 1 + max(rows_per_request)
    q = F.normalize(torch.randn(total, heads, key_dim, generator=gen), dim=-1) * key_dim ** -0.5
    k = F.normalize(torch.randn(total, heads, key_dim, generator=gen), dim=-1)
    recurrence = dict(
        q=q.to(dtype), k=k.to(dtype),
        v=torch.randn(total, heads, value_dim, generator=gen).to(dtype),
        g=-torch.rand(total, heads, generator=gen), beta=torch.rand(total, heads, generator=gen),
        state=torch.randn(num_slots, heads, value_dim, key_dim, generator=gen).to(dtype),
        row_slot=torch.tensor(row_slot), parent_slot=torch.tensor(parent_slot),
        request_starts=torch.tensor(starts))
    # A strided window buffer (vLLM's [slots, C, L] view of a [slots, L, C] cache).
    conv_state = torch.randn(num_slots, length, channels, generator=gen).to(dtype)
    conv = dict(
        x=torch.randn(total, channels, generator=gen).to(dtype),
        conv_state=conv_state.transpose(1, 2),
        window_slot=torch.randint(0, num_slots, (len(rows_per_request),), generator=gen),
        window_start=torch.randint(0, length - width + 2, (len(rows_per_request),),
                                   generator=gen),
        row_request=torch.tensor(row_request), sources=torch.tensor(sources),
        weight=torch.randn(channels, width, generator=gen),
        bias=torch.randn(channels, generator=gen))
    return recurrence, conv


FLAT_SHAPES = [([1], 1, 16, 8, 8), ([3, 1, 5], 2, 32, 40, 200), ([7, 2], 2, 128, 32, 24)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_the_engine_layout_kernels_match_their_twins(tmp_path: Path, dtype):
    from vllm_dartree.tree.gdn import tree_conv_rows, tree_delta_rule_in_slots

    gen = torch.Generator().manual_seed(8)
    cases = [flat_rows_case(gen, *shape, dtype) for shape in FLAT_SHAPES]
    inputs, outputs = tmp_path / "cases.pt", tmp_path / "out.pt"
    torch.save(cases, inputs)
    script = textwrap.dedent(f"""
        import torch
        import vllm_dartree.kernels.gdn_tree as gdn_tree
        from vllm_dartree.kernels import launch

        def forbidden(*args, **kwargs):
            raise AssertionError("a dispatcher fell back to the torch twin")

        assert launch.interpreter_loaded()
        gdn_tree.tree_delta_rule_in_slots = gdn_tree.tree_conv_rows = forbidden
        results = []
        for recurrence, conv in torch.load({str(inputs)!r}):
            # The dispatcher's tiling (all heads, whole rows a program), then a GPU's.
            state = recurrence["state"].clone()
            out = gdn_tree.delta_rule_in_slots(**recurrence)
            gpu = gdn_tree.delta_rule_in_slots_triton(**{{**recurrence, "state": state}},
                                                      heads_per_program=1)
            conv_gpu = gdn_tree.tree_conv_rows_triton(**conv, block_rows=2, block_channels=16)
            results.append((out, recurrence["state"], gdn_tree.tree_conv_outputs(**conv),
                            gpu, state, conv_gpu))
        torch.save(results, {str(outputs)!r})
    """)
    results = run_interpreted(script, outputs)
    tolerance = ({"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32
                 else {"rtol": 2 ** -7, "atol": 2e-2})
    for (recurrence, conv), result in zip(cases, results, strict=True):
        out, state, conv_out, gpu_out, gpu_state, gpu_conv_out = result
        expected_state = recurrence["state"].clone()
        args = {**recurrence, "state": expected_state}
        args.pop("request_starts")
        expected = tree_delta_rule_in_slots(**args)
        expected_conv = tree_conv_rows(**conv)
        for got, got_state, got_conv in ((out, state, conv_out),
                                         (gpu_out, gpu_state, gpu_conv_out)):
            torch.testing.assert_close(got, expected, **tolerance)
            torch.testing.assert_close(got_state, expected_state, **tolerance)
            torch.testing.assert_close(got_conv, expected_conv, **tolerance)
        assert not torch.equal(state, recurrence["state"])  # rows' states were stored
