"""``vllm-dartree viz``: draw verification trees.

``vllm-dartree viz RESULTS.json`` draws trees a benchmark run kept (``--save-trees``);
``vllm-dartree viz --prompt TEXT`` runs the tree methods on one prompt first and draws
theirs (see :mod:`vllm_dartree.bench.viz` for the drawing).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from vllm_dartree.bench.methods import TREE_METHODS
from vllm_dartree.bench.viz import draw_runs, select_runs


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vllm-dartree viz", description="draw verification trees")
    p.add_argument("results", nargs="?", type=Path,
                   help="results.json of a bench run (or its folder)")
    p.add_argument("--prompt", help="run the tree methods on this user prompt and draw theirs")
    p.add_argument("--methods", nargs="+", help=f"default: {' '.join(TREE_METHODS)}")
    p.add_argument("--dataset")
    p.add_argument("--sample", type=int, help="source index of the sample")
    p.add_argument("--temperature", type=float)
    p.add_argument("--rounds", nargs="+", type=int, help="round indices (default: first 3)")
    p.add_argument("--target", help="--prompt mode: target checkpoint (default: SmolLM2)")
    p.add_argument("--drafter", help="--prompt mode: drafter checkpoint")
    p.add_argument("--dspark-drafter", help="--prompt mode: drafter of the dspark* methods")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--out", type=Path, help="output folder (default: beside the results, "
                   "or benchmarks/results/viz)")
    return p


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    if args.prompt is None and args.results is None:
        parser().error("give a results.json or --prompt TEXT")
    if args.prompt is not None:
        results, out = _prompt_results(args)
    else:
        path = args.results / "results.json" if args.results.is_dir() else args.results
        results, out = json.loads(path.read_text()), args.out or path.parent / "trees"
    runs = select_runs(results, args.methods, args.dataset, args.sample, args.temperature)
    if not runs:
        raise SystemExit("no kept trees match (bench keeps trees of the first sample of each "
                         "dataset; see --save-trees)")
    for path in draw_runs(runs, out, args.rounds):
        print(path)


def _prompt_results(args: argparse.Namespace) -> tuple[dict[str, Any], Path]:
    from vllm_dartree.bench.datasets import Sample
    from vllm_dartree.bench.run import BenchConfig, run_benchmark
    from vllm_dartree.env import project_root

    out = args.out or project_root() / "benchmarks" / "results" / "viz"
    config = BenchConfig.from_options(
        target=args.target, drafter=args.drafter, dspark_drafter=args.dspark_drafter,
        methods=args.methods or list(TREE_METHODS),
        datasets=["prompt"], temperatures=[args.temperature or 0.0],
        max_new_tokens=args.max_new_tokens, out=out, save_trees=10_000, write=False)
    samples = {"prompt": [Sample("prompt", 0, (args.prompt,))]}
    return run_benchmark(config, samples), out


if __name__ == "__main__":
    main()
