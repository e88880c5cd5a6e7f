"""Top-B kernel (Triton, interpreted on CPU) against its torch twin and a Python heap.

triton.language decorates its own helpers when triton is first imported, so the
interpreter only works in a process that had TRITON_INTERPRET=1 before that import. The
kernel therefore runs in a fresh subprocess; the comparisons happen here.
"""

import heapq
import textwrap
from pathlib import Path

import pytest
import torch
from interpreted import run_interpreted

from vllm_dartree.kernels.topb import select_top_b, top_b_torch

SHAPES = [(1, 1, 1), (3, 10, 4), (2, 64, 64), (4, 65, 64), (2, 192, 64), (3, 256, 17),
          (2, 300, 299), (2, 5, 0), (5, 33, 1)]


def make_cases() -> list[tuple[torch.Tensor, int]]:
    gen = torch.Generator().manual_seed(0)
    cases = []
    for rows, n, b in SHAPES:
        for kind in ("normal", "ties", "padded"):
            if kind == "normal":
                scores = torch.randn(rows, n, generator=gen)
            else:
                scores = torch.randint(-3, 3, (rows, n), generator=gen).float()
            if kind == "padded":
                scores[:, n - n // 3 :] = float("-inf")  # supertree padding at the end
                scores[torch.rand(rows, n, generator=gen) < 0.1] = float("-inf")
            cases.append((scores, b))
    return cases


def heap_top_b(row: list[float], b: int) -> list[int]:
    return sorted(heapq.nsmallest(b, range(len(row)), key=lambda i: (-row[i], i)))


def run_interpreted_kernel(cases, tmp_path: Path) -> list[torch.Tensor]:
    inputs, outputs = tmp_path / "cases.pt", tmp_path / "kept.pt"
    torch.save(cases, inputs)
    script = textwrap.dedent(f"""
        import torch
        import vllm_dartree.kernels.topb as topb
        from vllm_dartree.kernels import launch

        def forbidden(*args):
            raise AssertionError("select_top_b fell back to the torch twin")

        assert launch.interpreter_loaded()
        cases = torch.load({str(inputs)!r})
        kept = [topb.top_b_triton(scores, b) for scores, b in cases]
        topb.top_b_torch = forbidden  # the dispatcher must pick the kernel
        dispatched = [topb.select_top_b(scores, b) for scores, b in cases]
        torch.save((kept, dispatched), {str(outputs)!r})
    """)
    kept, dispatched = run_interpreted(script, outputs)
    for a, b in zip(kept, dispatched):
        assert torch.equal(a, b)
    return kept


def test_interpreted_kernel_equals_twin_and_heap(tmp_path):
    cases = make_cases()
    kernel_results = run_interpreted_kernel(cases, tmp_path)
    for (scores, b), kept in zip(cases, kernel_results):
        twin = top_b_torch(scores, b)
        assert kept.dtype == torch.int64 and kept.shape == (scores.shape[0], b)
        assert torch.equal(kept, twin), (scores.shape, b)
        for row, kept_row in zip(scores.tolist(), kept.tolist()):
            assert kept_row == heap_top_b(row, b)


def test_twin_matches_heap_on_random_rows():
    for scores, b in make_cases():
        kept = top_b_torch(scores, b)
        for row, kept_row in zip(scores.tolist(), kept.tolist()):
            assert kept_row == heap_top_b(row, b)


def test_dispatcher_uses_twin_on_cpu_without_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    scores = torch.randn(3, 40)
    assert torch.equal(select_top_b(scores, 9), top_b_torch(scores, 9))


def test_argument_checks():
    with pytest.raises(ValueError, match="b must be in 0..N=4"):
        top_b_torch(torch.zeros(2, 4), 5)
    with pytest.raises(ValueError, match=r"\[R, N\]"):
        top_b_torch(torch.zeros(4), 1)
