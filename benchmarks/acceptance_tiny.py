"""Acceptance length of every tree variant on the trained tiny pair, inside vLLM (CPU).

    .venv/bin/python benchmarks/acceptance_tiny.py

16 random prompts, 64 greedy tokens each, one engine per variant; every output is checked
against target-only decoding. Writes ``benchmarks/results/tiny_acceptance.json`` and prints
a Markdown table (mean acceptance length = tokens per target forward, bonus included).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from vllm_dartree.harness.engine import prepare_process

# The paper's B = 64 and W = 12 (K capped at the pair's 32-token vocabulary), stated
# explicitly: on a CPU the plugin's own defaults are smaller trees.
PAPER = {"num_speculative_tokens": 64}
VARIANTS = {
    "DARTree pruned": PAPER | {"width": 12, "top_k": 32},
    "DARTree fixed": PAPER | {"tree": "fixed", "top_k": 32},
    "DDTree": PAPER | {"tree": "ddtree"},
    "Domino (chain)": PAPER | {"tree": "chain", "top_k": 32},
    "DFlash (chain)": PAPER | {"tree": "chain", "correction": False},
}
RESULTS = Path(__file__).parent / "results" / "tiny_acceptance.json"


def main() -> None:
    prepare_process()
    from vllm import SamplingParams

    from vllm_dartree.harness.engine import (
        build_llm,
        generate_ids,
        shutdown_llm,
        spec_decode_counters,
    )
    from vllm_dartree.models.tiny import random_prompts
    from vllm_dartree.models.tiny_pair import trained_tiny_pair

    target, drafter = trained_tiny_pair()
    vocab = json.loads((target / "config.json").read_text())["vocab_size"]
    prompts = random_prompts(16, vocab, seed=11)
    sampling = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
    engine = {"model": str(target), "max_num_seqs": 16, "max_num_batched_tokens": 2048}
    llm = build_llm(**engine)
    baseline = generate_ids(llm, prompts, sampling)
    shutdown_llm(llm)
    rows = {}
    for name, settings in VARIANTS.items():
        start = time.perf_counter()
        llm = build_llm(**engine, speculative_config={"method": "dartree", "model": str(drafter),
                                                      **settings})
        output = generate_ids(llm, prompts, sampling)
        counters = spec_decode_counters(llm)
        shutdown_llm(llm)
        rows[name] = {
            "mean_acceptance_length": 1 + counters["num_accepted_tokens"] / counters["num_drafts"],
            "identical_to_target": output == baseline,
            "verify_rounds": counters["num_drafts"],
            "wall_s": time.perf_counter() - start,
        }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(rows, indent=2))
    print("| method | mean acceptance length | identical to target |")
    print("|---|---|---|")
    for name, row in rows.items():
        print(f"| {name} | {row['mean_acceptance_length']:.2f} | {row['identical_to_target']} |")


if __name__ == "__main__":
    main()
