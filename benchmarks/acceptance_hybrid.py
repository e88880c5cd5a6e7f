"""Acceptance length of chains and trees on a tiny hybrid fixture (Qwen3-Next, or with
``--target qwen3_5`` Qwen3.5 as released: M-RoPE, text requests; random weights, bfloat16),
inside vLLM's V2 runner on CPU (test stand-in Triton, interpreter).

    VLLM_USE_V2_MODEL_RUNNER=1 PYTHONPATH=tests/v2/site .venv/bin/python benchmarks/acceptance_hybrid.py [--target qwen3_5]

8 random prompts, 32 greedy tokens each, one engine per variant, all with the random Domino
drafter of the fixture (untrained: the figures compare tree shapes on one drafter, they say
nothing about a trained pair). Counts how many outputs equal target-only decoding (random
prompts: bfloat16 near-ties may flip a token; tests/v2/test_v2_hybrid.py checks exactness
on prompts with clear margins). Writes ``benchmarks/results/hybrid_acceptance.json``
(``hybrid_acceptance_qwen3_5.json``) and prints a Markdown table (tokens per target forward, bonus included).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from vllm_dartree.harness.engine import prepare_process

VARIANTS = {
    "Domino chain, N=15": {"tree": "chain", "num_speculative_tokens": 15},
    "DARTree pruned, B=16 W=4 K=8": {"num_speculative_tokens": 16, "width": 4, "top_k": 8},
    "DARTree fixed, B=16": {"tree": "fixed", "num_speculative_tokens": 16},
    "DDTree, B=16": {"tree": "ddtree", "num_speculative_tokens": 16},
}
ENGINE = {"max_num_seqs": 8, "max_num_batched_tokens": 1024, "dtype": "bfloat16"}
RESULTS = Path(__file__).parent / "results"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", choices=("qwen3_next", "qwen3_5"), default="qwen3_next")
    qwen3_5 = parser.parse_args().target == "qwen3_5"
    prepare_process()
    from vllm import SamplingParams

    from vllm_dartree.harness.engine import (
        build_llm,
        generate_ids,
        shutdown_llm,
        spec_decode_counters,
    )
    from vllm_dartree.models import tiny

    target = tiny.write_qwen3_5_target() if qwen3_5 else tiny.write_hybrid_target()
    # Qwen3.5's drafter names its backbone by the target's text-model path, as released ones.
    drafter = tiny.write_drafter(tiny.DrafterSpec(
        target=tiny.HybridTargetSpec(), target_layer_ids=(0, 3), domino=True,
        text_weight_prefix="model.language_model." if qwen3_5 else ""))
    engine = {**ENGINE, "language_model_only": True} if qwen3_5 else ENGINE
    prompts = tiny.random_prompts(8, tiny.HybridTargetSpec().vocab_size, seed=7, min_len=4,
                                  max_len=40)
    greedy = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    llm = build_llm(model=str(target), **engine)
    expected = generate_ids(llm, prompts, greedy)
    shutdown_llm(llm)
    rows = {}
    for name, settings in VARIANTS.items():
        llm = build_llm(model=str(target), **engine, speculative_config={
            "method": "dartree", "model": str(drafter), **settings})
        got = generate_ids(llm, prompts, greedy)
        counters = spec_decode_counters(llm)
        shutdown_llm(llm)
        rows[name] = {
            "tokens_per_forward": 1 + counters["num_accepted_tokens"] / counters["num_drafts"],
            "equal_to_target_only": sum(g == e for g, e in zip(got, expected)),
            # (prompt, token) of each output's first difference, and the two tokens there
            "first_differences": [
                (p, t, e[t], g[t]) for p, (g, e) in enumerate(zip(got, expected)) if g != e
                for t in [next(i for i, (a, b) in enumerate(zip(g, e)) if a != b)]],
        }
    out = RESULTS / ("hybrid_acceptance_qwen3_5.json" if qwen3_5 else "hybrid_acceptance.json")
    out.write_text(json.dumps({"prompts": prompts, "target_only": expected, "rows": rows},
                                  indent=2) + "\n")
    print("| variant | tokens per target forward | outputs equal to target-only |")
    print("|---|---|---|")
    for name, row in rows.items():
        print(f"| {name} | {row['tokens_per_forward']:.2f} | "
              f"{row['equal_to_target_only']} of {len(prompts)} |")


if __name__ == "__main__":
    main()
