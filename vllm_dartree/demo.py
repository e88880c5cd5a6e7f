"""`make demo`: DARTree in vLLM's OpenAI server, on a local target/drafter pair.

Serves the target on 127.0.0.1 twice with ``vllm-dartree serve``: plain decoding, then with
``--speculative-config {"method":"dartree",...}``; sends the same chat and completion requests
to each, prints DARTree's answers, the mean acceptance length read from ``/metrics`` and both
decode speeds, and whether the answers equal plain decoding's.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from vllm_dartree.env import apply_process_defaults, project_root

# Questions written for the demo (not from any benchmark or training set).
SMOLLM2_CHATS = [
    "A baker makes 24 muffins and sells them in boxes of 4. Each box costs $6. "
    "How much money does the baker make? Explain step by step.",
    "Write a Python function that returns the sum of the even numbers in a list.",
]
SMOLLM2_PROMPTS = ["The three primary colors are"]
TINY_PROMPTS = ["the cat sees a big red house and then", "moon over the river and"]
TINY_CHATS = ["the dog runs fast", "a happy old cat sleeps"]


def smollm2_pair() -> tuple[Path, Path, str]:
    """SmolLM2-135M-Instruct (converted offline by ``make models``) + the committed Domino
    drafter trained for it on this CPU (benchmarks/drafters/smollm2-135m-domino), its head
    cut to the 16k most frequent tokens (``models/draft_vocab.py``)."""
    from vllm_dartree.models.draft_vocab import ensure_reduced_smollm2_drafter
    from vllm_dartree.models.smollm2 import DRAFTER, ensure_smollm2

    if not (project_root() / DRAFTER / "config.json").exists():
        raise SystemExit(f"drafter not found at {project_root() / DRAFTER}; `--pair tiny` "
                         "runs without it")
    return (ensure_smollm2(), ensure_reduced_smollm2_drafter(), "SmolLM2-135M-Instruct + "
            "DFlash/Domino drafter trained for it on this CPU "
            "(benchmarks/drafters/smollm2-135m-domino, 16k-token head)")


def tiny_pair() -> tuple[Path, Path, str]:
    """The tiny target with a Domino drafter trained for it here (cached after the first run,
    ~40 s), plus a word-level tokenizer so its 32 token ids read as words."""
    import shutil

    from vllm_dartree.models.tiny import write_word_tokenizer
    from vllm_dartree.models.tiny_pair import trained_tiny_pair

    target, drafter = trained_tiny_pair()
    served = target.parent / f"{target.name}-words"
    if not (served / "tokenizer.json").exists():
        served.mkdir(parents=True, exist_ok=True)
        for name in ("config.json", "model.safetensors"):
            shutil.copy(target / name, served / name)
        vocab = json.loads((target / "config.json").read_text())["vocab_size"]
        write_word_tokenizer(served, vocab)
    return (served, drafter, "tiny random Qwen3 target (32-word vocabulary) + Domino drafter "
            "trained for it on this CPU; the words are the target's, DARTree only makes them "
            "cheaper")


def host_line() -> str:
    """The CPU's instruction set (what PyTorch's kernels use), and why it bounds the demo."""
    import os

    import torch

    return (f"host: {torch.backends.cpu.get_cpu_capability()} CPU, {os.cpu_count()} cores. "
            "On a CPU every verified tree row costs compute (the round's phases: "
            "benchmarks/results/cpu-speed.md), so the speed-up stays below the acceptance "
            "length; a GPU verifies the rows in the time of one (the "
            "paper: 12.97 tokens per round, 9.73x over plain decoding, arXiv 2608.13524).")


PAIRS = {"smollm2": (smollm2_pair, SMOLLM2_PROMPTS, SMOLLM2_CHATS, 160),
         "tiny": (tiny_pair, TINY_PROMPTS, TINY_CHATS, 48)}


def ask_all(target: Path, server_args: tuple[str, ...], requests: list, max_tokens: int,
            log_name: str) -> tuple[list[str], int, float, str]:
    """Serve ``target`` with ``server_args`` on 127.0.0.1, send ``requests`` one at a time
    (greedy); -> (answers, completion tokens, seconds spent decoding, /metrics page)."""
    from vllm_dartree.harness.server import http_json, http_text, running_server

    answers, decoded, seconds = [], 0, 0.0
    start = time.perf_counter()
    with running_server(target, *server_args, served_name="demo", log_name=log_name) as base:
        print(f"  server ready after {time.perf_counter() - start:.0f} s at {base}")
        for path, body, _ in requests:
            sent = time.perf_counter()
            answer = http_json(base + path, {"model": "demo", "max_tokens": max_tokens,
                                             "temperature": 0, **body})
            seconds += time.perf_counter() - sent
            decoded += answer["usage"]["completion_tokens"]
            choice = answer["choices"][0]
            answers.append(choice.get("text", choice.get("message", {}).get("content")))
        metrics = http_text(base + "/metrics")
    return answers, decoded, seconds, metrics


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="vllm-dartree demo")
    parser.add_argument("--tree", default="pruned", choices=["pruned", "fixed", "ddtree", "chain"])
    parser.add_argument("--pair", default="smollm2", choices=sorted(PAIRS))
    parser.add_argument("--max-tokens", type=int, help="per answer (default: 160 for smollm2, "
                        "48 for tiny)")
    args = parser.parse_args(argv or [])
    apply_process_defaults()
    from vllm_dartree.harness.server import metric_value

    make_pair, prompts, chats, max_tokens = PAIRS[args.pair]
    max_tokens = args.max_tokens or max_tokens
    target, drafter, description = make_pair()
    speculative = {"method": "dartree", "model": str(drafter), "tree": args.tree}
    print(f"pair: {description}\n  target:  {target}\n  drafter: {drafter}")
    print(host_line())
    start = time.perf_counter()
    plain_args = ("--dtype", "float32", "--max-model-len", "1024", "--enforce-eager")
    requests = [("/v1/completions", {"prompt": p}, p) for p in prompts] + [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": q}]}, q)
        for q in chats]
    print(f"1/2 plain decoding, for comparison: vllm-dartree serve {target.name}")
    plain, plain_tokens, plain_seconds, _ = ask_all(target, plain_args, requests, max_tokens,
                                                    "demo_plain.log")
    print(f"2/2 DARTree: vllm-dartree serve {target.name} --speculative-config "
          f"'{json.dumps(speculative)}'  (127.0.0.1, about 30 s on 2 cores)")
    answers, decoded, decode_seconds, metrics = ask_all(
        target, (*plain_args, "--speculative-config", json.dumps(speculative)), requests,
        max_tokens, "demo.log")
    print()
    for (path, _, shown), text in zip(requests, answers):
        kind = "chat" if "chat" in path else "completion"
        print(f"[{kind}] {shown!r}\n  -> {text!r}")
    drafts = metric_value(metrics, "vllm:spec_decode_num_drafts_total") or 0.0
    accepted = metric_value(metrics, "vllm:spec_decode_num_accepted_tokens_total") or 0.0
    mean = 1 + accepted / drafts if drafts else float("nan")
    plain_speed, speed = plain_tokens / plain_seconds, decoded / decode_seconds
    same = "identical to" if answers == plain else "DIFFERENT FROM"
    print(f"\ntree variant: {args.tree}   verify rounds: {drafts:.0f}   "
          f"accepted draft tokens: {accepted:.0f}")
    print(f"mean acceptance length (tokens per target forward, bonus included): {mean:.2f}")
    print(f"decode speed, one request at a time, prefill included: DARTree {speed:.1f} tok/s, "
          f"plain decoding {plain_speed:.1f} tok/s ({speed / plain_speed:.2f}x); answers "
          f"{same} plain decoding's")
    if speed < 1.05 * plain_speed:  # a tie is not a result to show as one
        print("verdict: on this host the tree does not beat plain decoding at batch 1 (the "
              "acceptance length bounds the speed-up here, see the host line); serve without "
              "speculation, or with \"budget_policy\": \"adaptive\", which stops drafting "
              "while trees do not pay (benchmarks/results/serving-adaptive.md)")
    print(f"total demo time {time.perf_counter() - start:.0f} s; server logs: "
          ".cache/logs/demo.log, .cache/logs/demo_plain.log")


if __name__ == "__main__":
    main()
