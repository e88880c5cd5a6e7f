"""In-process vLLM engines for tests and benchmarks: one per configuration, reused.

Call :func:`prepare_process` before vLLM is imported. Engines run in the calling process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``, uni executor), eager, with a small KV cache.
"""

from __future__ import annotations

import gc
import json
import os
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

from vllm_dartree.env import apply_process_defaults

MiB = 1 << 20

DEFAULT_ENGINE_ARGS: dict[str, Any] = {
    "dtype": "float32",
    "max_model_len": 512,
    "max_num_seqs": 8,
    "seed": 0,
    "enforce_eager": True,
    "distributed_executor_backend": "uni",
    "skip_tokenizer_init": True,
    "kv_cache_memory_bytes": 64 * MiB,
    "disable_log_stats": False,
}


def prepare_process() -> None:
    apply_process_defaults()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


def build_llm(**overrides: Any):
    """A fresh in-process ``LLM``; applies the harness fix for a second engine per process."""
    prepare_process()
    from vllm import LLM

    from vllm_dartree.integration.compat import fix_rebind_crash_if_present

    fix_rebind_crash_if_present()
    # vLLM runs about ten full collections while it builds an engine, each walking every
    # object of this process (torch, vLLM, pytest, earlier tests): frozen, they are skipped.
    # Shutting an engine down unfreezes them (``cleanup_dist_env_and_memory``), so nothing
    # an engine held stays frozen.
    gc.collect()
    gc.freeze()
    return LLM(**(DEFAULT_ENGINE_ARGS | overrides))


def shutdown_llm(llm, *, collect: bool = True) -> None:
    """Shut the engine down. ``collect=False`` (an engine cache, which builds the next engine
    at once) skips vLLM's full collections: the next :func:`build_llm`'s frees the engine."""
    from vllm_dartree.integration.compat import release_engine

    with _full_collections_deferred() if not collect else nullcontext():
        release_engine(llm)
    del llm


@contextmanager
def _full_collections_deferred() -> Iterator[None]:
    """vLLM's shutdown unfreezes the heap, then runs full collections (two in
    ``cleanup_dist_env_and_memory``, a third in V2's runner), each walking every object of
    this process (0.45 s at a V2 test's size) while ``llm`` still holds the engine."""
    collect = gc.collect
    gc.collect = lambda generation=2: 0
    try:
        yield
    finally:
        gc.collect = collect


class EngineCache:
    """Keeps the most recently used engines alive, keyed by their configuration."""

    def __init__(self, max_alive: int = 1) -> None:
        self.max_alive = max_alive
        self._engines: OrderedDict[str, Any] = OrderedDict()

    def get(self, **overrides: Any):
        key = json.dumps(overrides, sort_keys=True, default=str)
        if key in self._engines:
            self._engines.move_to_end(key)
            return self._engines[key]
        while len(self._engines) >= self.max_alive:
            _, old = self._engines.popitem(last=False)
            shutdown_llm(old, collect=False)
        llm = build_llm(**overrides)
        self._engines[key] = llm
        return llm

    def close(self) -> None:
        while self._engines:
            _, llm = self._engines.popitem(last=False)
            shutdown_llm(llm, collect=False)


def generate_ids(llm, prompts: list[list[int]], sampling_params,
                 lora_requests: list | None = None) -> list[list[int]]:
    """Token ids generated for each prompt, in prompt order (``lora_requests``: each
    prompt's ``LoRARequest`` or None)."""
    from vllm.inputs import TokensPrompt

    outputs = llm.generate(
        [TokensPrompt(prompt_token_ids=p) for p in prompts], sampling_params, use_tqdm=False,
        lora_request=lora_requests,
    )
    return [list(o.outputs[0].token_ids) for o in outputs]


def drafter_of(llm):
    """The drafter of an in-process engine (uni executor): V1's proposer, V2's speculator."""
    runner = llm.llm_engine.model_executor.driver_worker.worker.model_runner
    return runner.drafter if hasattr(runner, "drafter") else runner.speculator


def spec_decode_counters(llm) -> dict[str, Any]:
    """vLLM's speculative-decoding counters (drafts, draft/accepted tokens, per position)."""
    found: dict[str, Any] = {}
    for metric in llm.get_metrics():
        if metric.name.startswith("vllm:spec_decode"):
            value = getattr(metric, "value", None)
            found[metric.name.removeprefix("vllm:spec_decode_")] = (
                value if value is not None else list(getattr(metric, "values", []))
            )
    return found
