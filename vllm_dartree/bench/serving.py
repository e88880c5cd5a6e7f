"""Concurrency mode: one OpenAI server per method, C concurrent clients on loopback.

Each method gets its own ``vllm-dartree serve`` process (same engine settings as the
in-process run, ``--max-num-seqs`` = the largest C), used for every dataset and C. All
servers run side by side (an idle one waits on its queue) and the methods are measured in
turn at each dataset and C, so the ratios of one C come from minutes, not from an hour of a
shared machine's drift. For every dataset and C, ``max(2C, #prompts)`` requests (first turns
of that dataset's samples, chat template applied here and sent as token ids to
``/v1/completions``) are sent by C client threads; aggregate completion tokens/s =
completion tokens / wall time, speedup = method tokens/s / AR tokens/s at that dataset and C
(the paper's Table 4). At T = 0 every completion is compared with AR's for the same request
(``mismatches``); ``drafts_per_step`` is vLLM's draft tokens per verified request-step (the
adaptive verification's chosen size), ``drafted_share`` the share of decode request-steps that
verified a draft (vLLM's drafts over completion tokens less each request's prefill token and
the accepted ones) and ``mean_width`` the pruned tree's width per drafted step (adaptive
verification only).

``--repeats N`` measures each dataset and C in N rounds, every method once per round, and
reports each method's median tokens/s (its counters and mismatches summed over its rounds).
A 20-second cell of a shared 2-core host moved a method by up to 12% between runs, more than
the margins adaptive verification is judged by. A method below ``CONTENDER_SHARE`` of the
cell's best rate in the first round is not measured again: neither it nor a ratio to it can
be near the best, and the slow fixed trees would otherwise multiply the run's hours. For
the same reason a method's first round is cut short once it provably cannot reach half of
the best rate measured before it in the cell (:func:`measure`'s ``floor``): at 1 tok/s one
cell of a 64-node tree held the machine for half an hour. Its row then reports the requests
it completed (``cut``).
"""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from itertools import cycle, islice
from typing import Any

from vllm_dartree.bench.datasets import Sample
from vllm_dartree.bench.methods import speculative_config
from vllm_dartree.harness.server import http_json, http_text, metric_value, running_server

SERVED_NAME = "bench"
COUNTERS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")
# Adaptive verification's width histogram (``step.policy_report``): summed widths and
# drafted steps, absent for other methods.
WIDTH_METRIC = "vllm_dartree:budget_width"
# With --repeats: methods under this share of a cell's best first-round rate run once there.
CONTENDER_SHARE = 0.5
# A round is not judged for a cut before this many seconds (see CutShort).
CUT_AFTER_S = 30.0


def server_args(config: Any, max_len: int, max_seqs: int, spec: dict[str, Any] | None,
                has_tokenizer: bool) -> list[str]:
    # Every cell sends the same prompts again, so with prefix caching later cells skip most
    # prefill, and unevenly: an engine with a hidden-state drafter re-computes the last
    # matched block of each prompt (vLLM drops it for EAGLE-style drafting), a whole
    # 128-token block on the CPU, which is most of a benchmark prompt. Off for every method.
    args = ["--dtype", config.dtype, "--max-model-len", str(max_len), "--enforce-eager",
            "--max-num-seqs", str(max_seqs), "--max-num-batched-tokens",
            str(max(2048, max_len)), "--kv-cache-memory-bytes", str(config.kv_cache_mib << 20),
            "--seed", str(config.seed), "--no-enable-prefix-caching"]
    if not has_tokenizer:
        args.append("--skip-tokenizer-init")
    if spec:
        args += ["--speculative-config", json.dumps(spec)]
    return args


def request_body(prompt: list[int], config: Any, index: int) -> dict[str, Any]:
    temperature = config.temperatures[0]
    body = {"model": SERVED_NAME, "prompt": prompt, "max_tokens": config.max_new_tokens,
            "temperature": temperature, "ignore_eos": bool(config.ignore_eos)}
    return body | ({"seed": config.seed + index} if temperature > 0 else {})


def spec_counters(base: str) -> dict[str, float]:
    text = http_text(base + "/metrics")
    counters = {name: metric_value(text, f"vllm:spec_decode_{name}_total") or 0.0
                for name in COUNTERS}
    return counters | {f"width_{part}": metric_value(text, f"{WIDTH_METRIC}_{part}") or 0.0
                       for part in ("sum", "count")}


class CutShort:
    """Whether a round can still reach ``floor`` tokens/s; once it cannot, the requests not
    yet sent are dropped.

        most(t) = completed tokens + max_new_tokens * requests in flight
        cut     iff  t >= CUT_AFTER_S  and  a request completed  and  most(t) < floor * t

    most(t) bounds from above what the requests sent so far will have produced when they
    finish, and they finish after t, so a cut round's final rate is below ``floor`` too.
    But a round's rate so far need not be its rate over all requests: the first request at
    a server can be slow (a tiny model's 24-token round at C = 1 was cut after its first
    request in a check, at under half of a slower method's rate). So nothing is judged in
    the first half minute; the slow trees the cut is for take minutes per cell. The round is
    judged whenever a client asks to send, that is at each completion: waiting for a whole
    wave of C completions instead let every client send its next request first, and cut
    rounds at C = 8 and 16 still completed 15 of 16 and 31 of 32 requests (run 19).
    """

    def __init__(self, floor: float | None, max_new_tokens: int) -> None:
        self.floor, self.max_new_tokens = floor, max_new_tokens
        self.started = time.perf_counter()
        self.tokens = self.completed = self.in_flight = 0
        self.cut = False
        self._lock = threading.Lock()

    def admit(self) -> bool:
        """Whether the next request may be sent (counted in flight if so)."""
        with self._lock:
            elapsed = time.perf_counter() - self.started
            if self.floor and not self.cut and self.completed and elapsed >= CUT_AFTER_S:
                most = self.tokens + self.max_new_tokens * self.in_flight
                self.cut = most < self.floor * elapsed
            if self.cut:
                return False
            self.in_flight += 1
            return True

    def done(self, tokens: int) -> None:
        with self._lock:
            self.in_flight -= 1
            self.completed += 1
            self.tokens += tokens


def measure(base: str, prompts: list[list[int]], concurrency: int, config: Any,
            floor: float | None = None) -> dict[str, Any]:
    """One round of one cell: ``max(2C, #prompts)`` requests from C clients, and what vLLM's
    counters moved meanwhile. With ``floor`` (tokens/s) the round stops sending requests
    once it cannot reach that rate (:class:`CutShort`); ``requests`` counts those completed
    and ``texts`` holds None for the ones not sent."""
    count = max(2 * concurrency, len(prompts))
    bodies = [request_body(p, config, i) for i, p in enumerate(islice(cycle(prompts), count))]
    before = spec_counters(base)
    gate = CutShort(floor, config.max_new_tokens)

    def send(body: dict[str, Any]) -> tuple[int, float, str] | None:
        if not gate.admit():
            return None
        started = time.perf_counter()
        answer = http_json(base + "/v1/completions", body, timeout=3600)
        tokens = int(answer["usage"]["completion_tokens"])
        gate.done(tokens)
        return tokens, time.perf_counter() - started, answer["choices"][0]["text"]

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        answers = list(pool.map(send, bodies))
    wall = time.perf_counter() - gate.started
    after = spec_counters(base)
    done = [a for a in answers if a is not None]
    tokens = sum(n for n, _, _ in done)
    return {"concurrency": concurrency, "requests": len(done), "completion_tokens": tokens,
            "wall_s": round(wall, 3), "tokens_per_s": tokens / wall if wall else None,
            "mean_latency_s": sum(t for _, t, _ in done) / len(done), "cut": gate.cut,
            "moved": {name: after[name] - before[name] for name in after},
            "texts": [None if a is None else a[2] for a in answers]}


def combine(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """One method's row of a cell from its rounds: the median round's rate, wall time and
    latency (the lower middle round for an even count, so the three stay one round's),
    every round's rate, counters summed, every round's completions (for the AR check)."""
    median = sorted(rounds, key=lambda r: r["tokens_per_s"] or 0.0)[(len(rounds) - 1) // 2]
    moved = {name: sum(r["moved"][name] for r in rounds) for name in rounds[0]["moved"]}
    drafts, width_steps = moved["num_drafts"], moved["width_count"]
    decode_steps = sum(r["completion_tokens"] - r["requests"] for r in rounds) - moved[
        "num_accepted_tokens"]
    return {"concurrency": rounds[0]["concurrency"], "requests": rounds[0]["requests"],
            "completion_tokens": rounds[0]["completion_tokens"],
            "cut": any(r.get("cut", False) for r in rounds),
            "wall_s": median["wall_s"], "tokens_per_s": median["tokens_per_s"],
            "rounds_tokens_per_s": [r["tokens_per_s"] for r in rounds],
            "mean_latency_s": median["mean_latency_s"],
            "tau_vllm": 1 + moved["num_accepted_tokens"] / drafts if drafts else None,
            "drafts_per_step": moved["num_draft_tokens"] / drafts if drafts else 0.0,
            "drafted_share": drafts / decode_steps if decode_steps > 0 else 0.0,
            "mean_width": moved["width_sum"] / width_steps if width_steps else None,
            "texts": [r["texts"] for r in rounds]}


def measure_cell(bases: dict[str, str], prompts: list[list[int]], concurrency: int,
                 config: Any) -> dict[str, dict[str, Any]]:
    """Every method's row at one dataset and C, over ``config.repeats`` interleaved rounds.
    With more than one round, a first round is cut short where it cannot reach
    ``CONTENDER_SHARE`` of the best rate measured before it (it would not be measured again
    anyway)."""
    rounds: dict[str, list[dict[str, Any]]] = {}
    for method, base in bases.items():
        best = max((r[0]["tokens_per_s"] or 0.0 for r in rounds.values()), default=0.0)
        floor = CONTENDER_SHARE * best if config.repeats > 1 and best else None
        rounds[method] = [measure(base, prompts, concurrency, config, floor)]
    again = contenders({m: r[0]["tokens_per_s"] for m, r in rounds.items()})
    for _ in range(config.repeats - 1):
        for method in again:
            rounds[method].append(measure(bases[method], prompts, concurrency, config))
    return {method: combine(measured) for method, measured in rounds.items()}


def contenders(first_rates: dict[str, float | None]) -> list[str]:
    """The methods measured again: at least ``CONTENDER_SHARE`` of the best first rate."""
    best = max((rate or 0.0 for rate in first_rates.values()), default=0.0)
    return [m for m, rate in first_rates.items() if (rate or 0.0) >= CONTENDER_SHARE * best]


def start_server(stack: ExitStack, config: Any, method: str, first_prompt: list[int],
                 max_len: int, has_tokenizer: bool) -> str:
    """Start (and warm up) ``method``'s server inside ``stack``; returns its base URL."""
    spec = speculative_config(method, config.drafter_of(method), config.tree)
    args = server_args(config, max_len, max(config.concurrency), spec, has_tokenizer)
    base = stack.enter_context(running_server(
        config.target, *args, served_name=SERVED_NAME,
        log_name=f"bench_serve_{method.replace(':', '_')}.log"))
    http_json(base + "/v1/completions", request_body(first_prompt, config, 0) | {
        "max_tokens": 4})  # warm-up
    return base


def run_concurrency(config: Any, builder: Any, samples: dict[str, list[Sample]],
                    max_len: int) -> list[dict[str, Any]]:
    prompts = {dataset: [builder.turn_ids(s, []) for s in group]
               for dataset, group in samples.items() if group}
    first = next(iter(prompts.values()))[0]
    rows = []
    with ExitStack() as stack:
        bases = {method: start_server(stack, config, method, first, max_len,
                                      builder.tokenizer is not None)
                 for method in config.methods}
        for dataset, group in prompts.items():
            for c in config.concurrency:
                for method, row in measure_cell(bases, group, c, config).items():
                    rows.append({"method": method, "dataset": dataset} | row)
                    if config.progress:
                        rates = " ".join(f"{r:.1f}" for r in row["rounds_tokens_per_s"])
                        print(f"serving {dataset} C={c} {method}: {row['tokens_per_s']:.1f} "
                              f"tok/s (rounds: {rates})", flush=True)
    compare_with_ar(rows, greedy=config.temperatures[0] == 0)
    return rows


def compare_with_ar(rows: list[dict[str, Any]], greedy: bool) -> None:
    """Speedup over AR at the same dataset and C (median rates); at T = 0 the completions of
    every round that differ from AR's first round (``mismatches``, None without AR; AR's own
    later rounds are checked against its first too). The texts are dropped afterwards."""
    ar = {(r["dataset"], r["concurrency"]): r for r in rows if r["method"] == "ar"}
    for row in rows:
        base = ar.get((row["dataset"], row["concurrency"]))
        speed = base and base["tokens_per_s"]
        row["speedup"] = row["tokens_per_s"] / speed if speed and row["tokens_per_s"] else None
        rounds = row["texts"][1:] if row is base else row["texts"]
        pairs = [(a, b) for texts in rounds for a, b in zip(texts, base["texts"][0])
                 if a is not None and b is not None] if base else []
        row["mismatches"] = None if base is None or not greedy else sum(a != b for a, b in pairs)
        row["checked"] = len(pairs) if base else sum(
            t is not None for texts in rounds for t in texts)
    for row in rows:
        row.pop("texts")
