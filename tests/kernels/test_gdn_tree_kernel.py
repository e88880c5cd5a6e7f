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
