"""Tree-construction time per decoding step at Qwen3-8B Domino head shapes (CPU, float32).

Shapes: drafter hidden H = 4096, GRU state G = 1024, projection E = 256, vocabulary
V = 151936, D = 16 depths, K = 64 candidates, W = 12 supertree width, B = 64 nodes, R = 1.
Weights are random. Two tables that would be silly to allocate here are overlapping strided
views of random buffers (distinct rows, the right shape and the same row-gather access
pattern, but no 2.5 GB / 1.9 GB of random numbers): the [V, H] embedding, and the [V, 3G]
GRU input-gate table (embed . W_ih^T, DARTree's fast path, whose values would take minutes of
CPU GEMM to derive from the random embedding; timings do not depend on the values). Every
other weight (W_ih, W_hh, proj0, proj2) is a dense random tensor.

Two configurations are timed, each with all five variants run round-robin:
- "variants": the head with the input-gate table (a GRU step = row gather + [3G, G] matmul),
  as the DARTree reference runs it; this is the headline.
- "without_input_gate_table": the GRU input projection computed as emb . W_ih^T every step
  (a [N, 4096] x [4096, 3072] matmul per depth, or per node for ``sequential``).

Also checks the top-B selection: Triton kernel (interpreted) vs torch twin vs Python heap,
correctness only (interpreter timings mean nothing).

Run: .venv/bin/python benchmarks/bench_tree.py [--repeats N] [--out PATH]
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

# Triton's interpreter mode is fixed when triton is first imported: load it interpreted for
# the top-B check, then unset the variable so the timed builders use the torch twin on CPU.
os.environ["TRITON_INTERPRET"] = "1"
try:
    import triton  # noqa: F401
except ImportError:  # the top-B check is skipped without triton
    triton = None
del os.environ["TRITON_INTERPRET"]

import torch  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from vllm_dartree.kernels.topb import top_b_torch, top_b_triton  # noqa: E402
from vllm_dartree.tree import DominoHead, build_tree  # noqa: E402

VOCAB, HIDDEN, STATE, PROJ = 151936, 4096, 1024, 256
DEPTHS, TOP_K, WIDTH, BUDGET, BETA = 16, 64, 12, 64, -0.2
VARIANTS = ("chain", "ddtree", "fixed", "pruned", "sequential")


def strided_table(rows: int, cols: int, gen: torch.Generator) -> torch.Tensor:
    """[rows, cols] view whose row v is flat[v : v + cols] of a (rows + cols) buffer."""
    return torch.randn(rows + cols, generator=gen).as_strided((rows, cols), (1, 1))


def make_head(gen: torch.Generator) -> DominoHead:
    def dense(*shape: int, fan_in: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) / fan_in**0.5

    embed = strided_table(VOCAB, HIDDEN, gen)
    return DominoHead(
        embed=embed,
        gru_ih=dense(3 * STATE, HIDDEN, fan_in=HIDDEN),
        gru_hh=dense(3 * STATE, STATE, fan_in=STATE),
        proj0=dense(PROJ, HIDDEN + STATE, fan_in=HIDDEN + STATE),
        proj2=dense(VOCAB, PROJ, fan_in=PROJ),
        pure_draft_prefix_len=1,
    )


def time_variants(inputs, head, repeats, sequential_repeats):
    """Round-robin over the variants (one run each per round) so that load from other
    processes on the machine hits every variant alike; two warm-up rounds first."""
    base, hidden, root = inputs

    def run(variant):
        variant_head = None if variant == "ddtree" else head
        return build_tree(variant, base, hidden, root, variant_head, budget=BUDGET,
                          top_k=TOP_K, width=WIDTH, depth_bonus=BETA)

    times = {variant: [] for variant in VARIANTS}
    nodes = {variant: int(run(variant).num_nodes[0]) for variant in VARIANTS}
    for variant in VARIANTS:
        run(variant)
    for round_index in range(repeats):
        for variant in VARIANTS:
            if variant == "sequential" and round_index >= sequential_repeats:
                continue
            start = time.perf_counter()
            run(variant)
            times[variant].append(time.perf_counter() - start)
    return {
        variant: {"median_s": statistics.median(runs), "min_s": min(runs),
                  "repeats": len(runs), "num_nodes": nodes[variant]}
        for variant, runs in times.items()
    }


def check_top_b() -> str:
    if triton is None:
        return "skipped (triton not installed)"
    os.environ["TRITON_INTERPRET"] = "1"  # the interpreter also reads it while running
    gen = torch.Generator().manual_seed(1)
    mismatches = []
    for rows, n, b in ((2, 192, 64), (3, 65, 64), (2, 40, 7)):
        scores = torch.randint(-4, 4, (rows, n), generator=gen).float()
        scores[:, -5:] = float("-inf")
        kernel = top_b_triton(scores, b)
        twin = top_b_torch(scores, b)
        heap = torch.tensor([sorted(heapq.nsmallest(b, range(n), key=lambda i: (-row[i], i)))
                             for row in scores.tolist()])
        if not (torch.equal(kernel, twin) and torch.equal(twin, heap)):
            mismatches.append((rows, n, b))
    return "identical" if not mismatches else f"mismatch at (R, N, B) = {mismatches}"


def compute_ratios(results: dict) -> dict:
    median = {variant: row["median_s"] for variant, row in results.items()}
    return {
        "sequential_over_pruned": median["sequential"] / median["pruned"],
        "pruned_over_chain": median["pruned"] / median["chain"],
    }


def print_table(title: str, results: dict, ratios: dict) -> None:
    print(title)
    print(f"  {'variant':<12}{'median ms':>12}{'min ms':>10}{'nodes':>7}")
    for variant, row in results.items():
        print(f"  {variant:<12}{row['median_s'] * 1e3:>12.2f}{row['min_s'] * 1e3:>10.2f}"
              f"{row['num_nodes']:>7}")
    for name, value in ratios.items():
        print(f"  {name}: {value:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--sequential-repeats", type=int, default=7)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks/results/tree_build.json")
    args = parser.parse_args()

    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    head = make_head(gen)
    base = torch.randn(1, DEPTHS, VOCAB, generator=gen) * 3.0
    hidden = torch.randn(1, DEPTHS, HIDDEN, generator=gen)
    root = torch.tensor([1234])
    table_head = replace(head, input_gate_table=strided_table(VOCAB, 3 * STATE, gen))
    inputs = (base, hidden, root)
    with torch.inference_mode():
        results = time_variants(inputs, table_head, args.repeats, args.sequential_repeats)
        direct = time_variants(inputs, head, args.repeats, args.sequential_repeats)
    ratios, direct_ratios = compute_ratios(results), compute_ratios(direct)
    top_b = check_top_b()

    print_table("with input-gate table (headline)", results, ratios)
    print_table("without input-gate table (emb . W_ih^T every step)", direct, direct_ratios)
    print(f"top-B kernel (interpreted) vs torch twin vs heap: {top_b}")

    report = {
        "variants": results,
        "ratios": ratios,
        "without_input_gate_table": {"variants": direct, "ratios": direct_ratios},
        "targets": {"sequential_over_pruned_min": 5.0, "pruned_over_chain_max": 2.0},
        "top_b_check": top_b,
        "config": {
            "vocab": VOCAB, "hidden": HIDDEN, "gru_state": STATE, "proj": PROJ,
            "depths": DEPTHS, "top_k": TOP_K, "width": WIDTH, "budget": BUDGET,
            "depth_bonus": BETA, "requests": 1, "dtype": "float32", "device": "cpu",
            "threads": torch.get_num_threads(), "torch": torch.__version__,
            "machine": platform.processor() or platform.machine(),
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
