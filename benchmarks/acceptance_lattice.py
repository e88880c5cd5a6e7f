"""Trees over vLLM's lattice drafters against vLLM's own chain, on the trained tiny pair.

    VLLM_USE_V2_MODEL_RUNNER=1 PYTHONPATH=tests/v2/site .venv/bin/python \
        benchmarks/acceptance_lattice.py

For each lattice family (DFlash2, LiLiCorr; ``models/tiny_lattice_pair.py``: one z-lab
backbone trained for the tiny trained target, each family's head trained on it), inside
vLLM's V2 runner (the only runner vLLM gives these drafters; here its kernels run in Triton's
interpreter, so wall times are not speeds): vLLM's own speculator (its greedy walk through
the lattice, method "dflash"), dartree's chain over the same lattice, DDTree over the
candidate head's logits, and DARTree fixed and pruned over the lattice, each at B = 8 (the
chain's node count: 8 depths) and B = 16. Two prompt sets the drafters were not trained on:
``random`` (uniform token prompts, 3-40 tokens, another seed than training's) and ``text``
(the target's own sampled continuations at T = 1, so the prompt is in the target's
distribution). Every output is checked against target-only decoding. Writes
``benchmarks/results/lattice_acceptance.json`` and prints a Markdown table (tokens per
target forward, bonus included).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from vllm_dartree.harness.engine import prepare_process

RESULTS = Path(__file__).parent / "results" / "lattice_acceptance.json"
NUM_PROMPTS, MAX_TOKENS = 16, 64
ENGINE = {"max_num_seqs": 16, "max_num_batched_tokens": 2048}


def methods(drafter: Path, depths: int) -> dict[str, dict]:
    """Each method's speculative config (B = node budget; the chains' B is their depth)."""
    dartree = {"method": "dartree", "model": str(drafter)}
    rows = {"vLLM walk (B=8)": {"method": "dflash", "model": str(drafter),
                                "num_speculative_tokens": depths},
            "dartree chain (B=8)": dartree | {"tree": "chain",
                                              "num_speculative_tokens": depths}}
    for budget in (depths, 2 * depths):
        rows[f"DDTree (B={budget})"] = dartree | {"tree": "ddtree",
                                                  "num_speculative_tokens": budget}
        rows[f"DARTree fixed (B={budget})"] = dartree | {"tree": "fixed",
                                                         "num_speculative_tokens": budget}
        rows[f"DARTree pruned (B={budget}, W=4)"] = dartree | {
            "tree": "pruned", "num_speculative_tokens": budget, "width": 4}
    return rows


def prompt_sets(target: Path, vocab: int) -> dict[str, list[list[int]]]:
    """``random``: uniform token prompts; ``text``: the target's own T = 1 samples."""
    from vllm import SamplingParams

    from vllm_dartree.harness.engine import build_llm, generate_ids, shutdown_llm
    from vllm_dartree.models.tiny import random_prompts

    llm = build_llm(model=str(target), **ENGINE)
    seeds = random_prompts(NUM_PROMPTS, vocab, seed=301, min_len=2, max_len=4)
    sampled = generate_ids(llm, seeds, [SamplingParams(temperature=1.0, seed=400 + i,
                                                       max_tokens=36, ignore_eos=True)
                                        for i in range(NUM_PROMPTS)])
    shutdown_llm(llm)
    return {"random": random_prompts(NUM_PROMPTS, vocab, seed=303, min_len=3, max_len=40),
            "text": [s + t for s, t in zip(seeds, sampled)]}


def main() -> None:
    prepare_process()
    from vllm import SamplingParams

    from vllm_dartree.harness.engine import (
        build_llm,
        generate_ids,
        shutdown_llm,
        spec_decode_counters,
    )
    from vllm_dartree.models.tiny_lattice_pair import (
        LATTICE_PAIR_KINDS,
        NUM_SPECULATIVE_TOKENS,
        trained_tiny_lattice_pair,
    )

    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    target = trained_tiny_lattice_pair(LATTICE_PAIR_KINDS[0])[0]
    vocab = json.loads((target / "config.json").read_text())["vocab_size"]
    sets = prompt_sets(target, vocab)
    llm = build_llm(model=str(target), **ENGINE)
    baselines = {name: generate_ids(llm, prompts, greedy) for name, prompts in sets.items()}
    shutdown_llm(llm)
    rows: dict[str, dict] = {}
    for kind in LATTICE_PAIR_KINDS:
        pair_target, drafter = trained_tiny_lattice_pair(kind)
        assert pair_target == target
        for method, spec in methods(drafter, NUM_SPECULATIVE_TOKENS).items():
            started = time.perf_counter()
            llm = build_llm(model=str(target), **ENGINE, speculative_config=spec)
            row = {}
            for name, prompts in sets.items():
                before = spec_decode_counters(llm)
                output = generate_ids(llm, prompts, greedy)
                after = spec_decode_counters(llm)
                drafts = after["num_drafts"] - before.get("num_drafts", 0)
                accepted = after["num_accepted_tokens"] - before.get("num_accepted_tokens", 0)
                row[name] = {"tau": 1 + accepted / drafts, "rounds": drafts,
                             "identical_to_target": output == baselines[name]}
            shutdown_llm(llm)
            row["wall_s"] = round(time.perf_counter() - started, 1)
            rows[f"{kind}: {method}"] = row
            print(f"{kind}: {method}: " + ", ".join(
                f"{n} {r['tau']:.2f}" for n, r in row.items() if n in sets), flush=True)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(rows, indent=2))
    print("| drafter: method | tokens per target forward, random | text | identical |")
    print("|---|---|---|---|")
    for name, row in rows.items():
        same = all(row[n]["identical_to_target"] for n in sets)
        print(f"| {name} | {row['random']['tau']:.2f} | {row['text']['tau']:.2f} | {same} |")


if __name__ == "__main__":
    main()
