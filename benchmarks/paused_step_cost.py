"""What a dartree step costs when adaptive verification does not draft, next to AR's step.

Adaptive verification's floor: where trees do not pay, a dartree engine decodes plainly, and
any time its steps take beyond AR's is lost for good. Both engines are built in this one
process (SmolLM2 pair, float32, in-process) and measured in turn, round by round, on the
same prompts, so the machine's drift cancels in each round's ratio. Drafting is switched off
for the whole run (``AdaptiveVerification.should_draft``), and the dartree engine runs twice per
round: holding the drafter's context until drafting resumes (the product), and writing it
at every step (``PendingContext.limit = 1``, what a paused step did before).

    .venv/bin/python benchmarks/paused_step_cost.py --concurrency 1 --rounds 6

Prints the median engine-step time of each setting and its median per-round ratio to AR,
and the same for the whole request set (prefill, every step, and any held context written
when the hold fills: what a server's throughput sees, and a median step does not).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from vllm_dartree.bench.run import default_drafter, default_target
from vllm_dartree.harness.engine import build_llm, drafter_of, prepare_process

PROMPT_LEN = 300


def step_times(llm, concurrency: int, tag: str, max_tokens: int) -> tuple[float, float]:
    """Median ms of the engine steps after the first, and ms of all of them (prefill
    included), ``concurrency`` requests at once."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    sampling = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True,
                              detokenize=False)
    engine = llm.llm_engine
    for i in range(concurrency):
        ids = [(7 * i + 13 * j + len(tag)) % 5000 + 100 for j in range(PROMPT_LEN)]
        engine.add_request(f"{tag}-{i}", TokensPrompt(prompt_token_ids=ids), sampling)
    first = time.perf_counter()
    engine.step()  # the prefill (all of it where it fits one step's token budget)
    times = []
    while engine.has_unfinished_requests():
        started = time.perf_counter()
        engine.step()
        times.append((time.perf_counter() - started) * 1e3)
    return statistics.median(times), (time.perf_counter() - first) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    prepare_process()
    import torch

    from vllm_dartree.tree.adaptive import AdaptiveVerification

    torch.set_num_threads(2)
    os.environ["OMP_NUM_THREADS"] = "2"
    AdaptiveVerification.should_draft = lambda self, requests: False  # paused throughout
    common = {"model": str(default_target()), "max_model_len": 640,
              "max_num_seqs": args.concurrency, "kv_cache_memory_bytes": 256 << 20,
              # As in the serving bench: each round re-sends its prompts' ids pattern, and
              # a hidden-state drafter re-computes the last cached block (128 tokens here).
              "enable_prefix_caching": False}
    ar = build_llm(**common)
    dartree = build_llm(**common, speculative_config={
        "method": "dartree", "model": str(default_drafter()), "budget_policy": "adaptive"})
    pending = drafter_of(dartree).pending_context
    hold = pending.limit
    settings = {"ar": (ar, None), "held context": (dartree, hold),
                "context every step": (dartree, 1)}
    medians: dict[str, list[float]] = {name: [] for name in settings}
    totals: dict[str, list[float]] = {name: [] for name in settings}
    for round_index in range(args.rounds + 1):  # round 0 warms up
        for name, (llm, limit) in settings.items():
            if limit is not None:
                pending.limit = limit
            ms, total = step_times(llm, args.concurrency, f"{name}-{round_index}",
                                   args.max_tokens)
            if round_index:
                medians[name].append(ms)
                totals[name].append(total)
    for what, table in (("step", medians), ("request set", totals)):
        for name, values in table.items():
            ratio = statistics.median(v / a for v, a in zip(values, table["ar"]))
            print(f"C={args.concurrency} {name:20s} {what} {statistics.median(values):8.1f} ms"
                  f"  x{ratio:.3f} of AR  rounds {[round(v, 1) for v in values]}")
    os._exit(0)  # two in-process engines: skip their teardown


if __name__ == "__main__":
    main()
