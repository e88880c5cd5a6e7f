"""Mixed serving traffic on a dartree engine: acceptance and throughput when requests carry
penalties, allowed token ids or logprobs, against a batch of plain requests.

    .venv/bin/python benchmarks/mixed_traffic.py [--out FILE]

On the trained tiny pair (``models/tiny_pair.py``), 30 requests in one batch, greedy,
64 tokens each, in three mixes: ``plain`` (every request plain), ``mixed`` (30 % repetition
and presence penalties, 20 % allowed token ids, 20 % logprobs, 30 % plain; the pair has no
tokenizer, so allowed token ids stand in for a grammar's constraint) and ``mixed-lora`` (the
same over two LoRA adapters and base requests). For each: target-only and dartree (CPU
defaults) tokens per second, the mean tokens per verify step over the batch and over its
plain requests (from the tree verifier's accepted paths), and whether every request's tokens
equal target-only's, and each kind's tokens per tree step. Run it at a commit before
per-request chains for "the batch-wide fallback" column. Wall times come from this 2-core CPU with vLLM's V1 runner: compare within
one run only.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from vllm_dartree.harness.engine import prepare_process

NUM_REQUESTS, MAX_TOKENS = 30, 64


def request_kind(i: int) -> str:
    """30 % penalties, 20 % allowed ids, 20 % logprobs, 30 % plain, interleaved."""
    return ("penalties", "plain", "allowed", "logprobs", "penalties", "plain", "allowed",
            "logprobs", "penalties", "plain")[i % 10]


def sampling(i: int, mix: str, vocab: int):
    from vllm import SamplingParams

    kind = "plain" if mix == "plain" else request_kind(i)
    extra = {"penalties": {"repetition_penalty": 1.3, "presence_penalty": 0.5},
             "allowed": {"allowed_token_ids": list(range(0, vocab, 2))},
             "logprobs": {"logprobs": 2}, "plain": {}}[kind]
    return SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, **extra)


def run(llm, prompts, mix: str, vocab: int, loras) -> dict:
    """One batch: tokens, seconds, the tree verifier's accepted counts per request (its
    tree steps only) and, with drafts, vLLM's tokens per verify step over the batch."""
    from vllm.inputs import TokensPrompt

    from vllm_dartree.harness.engine import spec_decode_counters
    from vllm_dartree.step.verifier import TreeVerifier

    accepted: dict[str, list[int]] = {}
    before = spec_decode_counters(llm) if llm.llm_engine.vllm_config.speculative_config else {}

    def record(paths) -> None:
        for req_id, count in zip(paths.plan.req_ids, paths.num_accepted.tolist()):
            accepted.setdefault(req_id, []).append(count)

    started = time.perf_counter()
    with TreeVerifier.observing(record):
        outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts],
                               [sampling(i, mix, vocab) for i in range(len(prompts))],
                               use_tqdm=False, lora_request=loras)
    seconds = time.perf_counter() - started
    tokens = [list(o.outputs[0].token_ids) for o in outputs]
    # vLLM's engine-side ids extend the output's request id ("<id>-<suffix>").
    steps = {o.request_id: next((v for k, v in accepted.items()
                                 if k == o.request_id or k.startswith(o.request_id + "-")), [])
             for o in outputs}
    result = {"tokens": tokens, "seconds": seconds, "steps": list(steps.values())}
    if before:  # vLLM's counters: every verify step, whoever verified it
        after = spec_decode_counters(llm)
        drafts = after["num_drafts"] - before["num_drafts"]
        result["tokens_per_step"] = 1 + (after["num_accepted_tokens"]
                                         - before["num_accepted_tokens"]) / drafts
    return result


def mean_per_step(step_lists: list[list[int]]) -> float:
    counts = [c for steps in step_lists for c in steps]
    return sum(counts) / len(counts) if counts else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    prepare_process()
    from vllm.lora.request import LoRARequest

    from vllm_dartree.harness.engine import build_llm, shutdown_llm
    from vllm_dartree.models.tiny import LoraSpec, random_prompts, write_lora_adapter
    from vllm_dartree.models.tiny_pair import TRAINED_TARGET, trained_tiny_pair

    target, drafter = trained_tiny_pair()
    vocab = TRAINED_TARGET.vocab_size
    prompts = random_prompts(NUM_REQUESTS, vocab, seed=47, min_len=3, max_len=30)
    adapters = [None] + [LoRARequest(f"tiny-{i}", i, str(write_lora_adapter(
        LoraSpec(target=TRAINED_TARGET, std=0.05, seed=10 + i)))) for i in (1, 2)]
    mixes = {"plain": None, "mixed": None,
             "mixed-lora": [adapters[i % 3] for i in range(NUM_REQUESTS)]}
    engine = {"max_num_seqs": NUM_REQUESTS, "max_num_batched_tokens": 4096,
              "enable_lora": True, "max_loras": 3, "max_lora_rank": 8}
    results = {}
    for spec in (None, {"method": "dartree", "model": str(drafter)}):
        name = "target-only" if spec is None else "dartree"
        llm = build_llm(model=str(target), speculative_config=spec, **engine)
        for mix, loras in mixes.items():
            run(llm, prompts[:4], mix, vocab, None if loras is None else loras[:4])  # warm up
            results[(name, mix)] = run(llm, prompts, mix, vocab, loras)
        shutdown_llm(llm)
    rows = []
    for mix in mixes:
        base, tree = results[("target-only", mix)], results[("dartree", mix)]
        plain = [s for i, s in enumerate(tree["steps"])
                 if mix == "plain" or request_kind(i) == "plain"]
        rows.append({
            "mix": mix,
            "target_only_tok_s": NUM_REQUESTS * MAX_TOKENS / base["seconds"],
            "dartree_tok_s": NUM_REQUESTS * MAX_TOKENS / tree["seconds"],
            "tokens_per_step": tree["tokens_per_step"],
            "plain_tokens_per_step": mean_per_step(plain),
            # Each kind's requests (by index; in the plain mix the same requests without
            # their parameter), from the tree verifier's steps
            "tokens_per_step_by_kind": {
                kind: round(mean_per_step([s for i, s in enumerate(tree["steps"])
                                           if request_kind(i) == kind]), 3)
                for kind in ("penalties", "allowed", "logprobs", "plain")},
            "equal_to_target_only": tree["tokens"] == base["tokens"],
        })
    print("| mix | target-only tok/s | dartree tok/s | speed-up | tokens/step (batch) | "
          "tokens/step (plain requests) | equal |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['mix']} | {r['target_only_tok_s']:.0f} | {r['dartree_tok_s']:.0f} | "
              f"{r['dartree_tok_s'] / r['target_only_tok_s']:.2f}x | "
              f"{r['tokens_per_step']:.2f} | {r['plain_tokens_per_step']:.2f} | "
              f"{r['equal_to_target_only']} |")
    for r in rows:
        print(f"{r['mix']}: tokens/step by kind {r['tokens_per_step_by_kind']}")
    if args.out:
        args.out.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
