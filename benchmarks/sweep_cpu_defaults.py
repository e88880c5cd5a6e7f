"""Sweep DARTree pruned's B, W and K on training-split prompts (never the test prompts) on
this machine: every setting runs in its own ``vllm-dartree bench`` with AR in the same run,
so each speedup is an in-run ratio. Writes ``sweep.json`` and ``sweep.md`` into --out.

Run: .venv/bin/python benchmarks/sweep_cpu_defaults.py [--budgets 4 6 8] [--widths 2 3]
     [--top-ks 16] [--num-samples 4] [--max-new-tokens 128] [--out DIR]
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATASETS = ("gsm8k-train", "math-train")


def run_one(budget: int, width: int, top_k: int, args: argparse.Namespace) -> dict:
    out = args.out / f"B{budget}_W{width}_K{top_k}"
    cmd = [sys.executable, "-m", "vllm_dartree.cli", "bench", "--datasets", *DATASETS,
           "--num-samples", str(args.num_samples), "--max-new-tokens",
           str(args.max_new_tokens), "--methods", "ar", "dartree-pruned", "--budget",
           str(budget), "--width", str(width), "--top-k", str(top_k), "--dtype", "float32",
           "--threads", str(args.threads), "--out", str(out), "--no-progress"]
    subprocess.run(cmd, cwd=REPO, check=True, capture_output=True)
    results = json.loads((out / "results.json").read_text())
    rows = {(r["dataset"], r["method"]): r for r in results["summary"]
            if r["temperature"] == 0.0}
    row = {"budget": budget, "width": width, "top_k": top_k,
           "lossless": not results.get("mismatches")}
    for dataset in (*DATASETS, "average"):
        pruned = rows[(dataset, "dartree-pruned")]
        row[dataset] = {"speedup": pruned["speedup"], "tau": pruned["tau"],
                        "tpot_ms": pruned["tpot_ms"],
                        "ar_tpot_ms": rows[(dataset, "ar")]["tpot_ms"]}
    return row


def table(rows: list[dict]) -> str:
    lines = ["| B | W | K | " + " | ".join(f"{d} speedup | {d} τ" for d in DATASETS)
             + " | avg speedup | lossless |", "|" + "---|" * (5 + 2 * len(DATASETS))]
    for row in sorted(rows, key=lambda r: -r["average"]["speedup"]):
        cells = [str(row["budget"]), str(row["width"]), str(row["top_k"])]
        for dataset in DATASETS:
            cells += [f"{row[dataset]['speedup']:.2f}x", f"{row[dataset]['tau']:.2f}"]
        cells += [f"{row['average']['speedup']:.2f}x", str(row["lossless"])]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budgets", nargs="+", type=int, default=[4, 6, 8, 12, 16])
    parser.add_argument("--widths", nargs="+", type=int, default=[2, 3, 4])
    parser.add_argument("--top-ks", nargs="+", type=int, default=[16])
    parser.add_argument("--num-samples", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=REPO / ".cache" / "bench" / "sweep")
    args = parser.parse_args()
    rows = []
    for budget, width, top_k in itertools.product(args.budgets, args.widths, args.top_ks):
        if width > budget:
            continue
        rows.append(run_one(budget, width, top_k, args))
        print(json.dumps(rows[-1]), flush=True)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "sweep.json").write_text(json.dumps(rows, indent=2))
        (args.out / "sweep.md").write_text(table(rows))
    print(table(rows))


if __name__ == "__main__":
    main()
