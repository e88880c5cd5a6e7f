"""The OpenAI server on V2 (real processes, loopback only): concurrent greedy and seeded
sampled requests, completions and chat, streaming requests hung up on mid-way, and the
structured-output requests of the V1 server test (JSON schema, regex, choice, tool calling
with ``tool_choice="required"``). On V2 a seeded sampled answer equals target-only's too
(draws keyed by seed and position)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest
from test_server_e2e import (
    STRUCTURED_SERVER_ARGS,
    answer,
    check_structured,
    structured_requests,
)

from vllm_dartree.harness.server import (
    http_text,
    metric_value,
    running_server,
    stream_and_hang_up,
)
from vllm_dartree.models.tiny import DrafterSpec, TargetSpec, write_drafter, write_target

pytestmark = pytest.mark.e2e

SPEC = TargetSpec(with_tokenizer=True)
SERVER_ARGS = ("--dtype", "float32", "--max-model-len", "512", "--enforce-eager",
               "--max-num-seqs", "8", "--max-num-batched-tokens", "1024",
               *STRUCTURED_SERVER_ARGS)
WORDS = ["def", "class", "import", "return", "self", "for", "while", "print", "lambda", "yield"]


def _requests() -> list[dict]:
    """16 requests: greedy and seeded sampled (temperature only: vLLM's top-k/top-p kernel
    does not run in Triton's interpreter), completions and chat, 2 streamed and aborted."""
    out = []
    for i in range(16):
        prompt = " ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(2 + i % 9))
        body = {"model": "tiny", "max_tokens": 8 + (i * 13) % 33}
        body |= {"temperature": 0.9, "seed": i} if i % 4 == 3 else {"temperature": 0.0}
        if i % 5 == 4:
            body |= {"messages": [{"role": "user", "content": prompt}]}
        else:
            body |= {"prompt": prompt}
        out.append({"body": body, "abort": i % 8 == 5})
    return out + structured_requests()


def _send(base: str, request: dict) -> dict:
    if request["abort"]:
        return {"aborted": stream_and_hang_up(base, request["body"], 100, 300)}
    return answer(base, request["body"], 300)


def _serve_all(base: str) -> list[dict]:
    with ThreadPoolExecutor(max_workers=16) as pool:
        return list(pool.map(lambda r: _send(base, r), _requests()))


@pytest.fixture(scope="module")
def target_only_answers():
    with running_server(write_target(SPEC), *SERVER_ARGS, log_name="v2_server_target.log",
                        startup_timeout=600) as base:
        return _serve_all(base)


def test_a_profiled_adaptive_v2_server_answers_like_target_only(target_only_answers):
    """One served spelling (vLLM 0.34's ``speculator_options`` nesting; the other spellings of
    a request are compared at the parser, tests/integration/test_config.py): the adaptive
    budget with VLLM_DARTREE_PROFILE=1 under concurrent load. The target-only answers; every
    tree round's phases and the budget's metrics in /metrics; vLLM's counters count the rows
    the budget chose."""
    drafter = str(write_drafter(DrafterSpec(target=SPEC, domino=True)))
    spec = json.dumps({"method": "dartree", "model": drafter, "speculator_options": {
        "budget_policy": "adaptive", "num_speculative_tokens": 16, "width": "auto"}})
    with running_server(write_target(SPEC), *SERVER_ARGS, "--speculative-config", spec,
                        startup_timeout=600, log_name="v2_server_dartree.log",
                        env={"VLLM_DARTREE_PROFILE": "1"}) as base:
        answers = _serve_all(base)
        assert http_text(base + "/health") is not None  # still serving after the aborts
        metrics = http_text(base + "/metrics")
    for request, got, expected in zip(_requests(), answers, target_only_answers):
        if request["abort"]:
            assert got["aborted"]
        elif "structured" in request:
            check_structured(request["structured"], expected)
            assert got == expected, request
        else:
            assert got["text"] and got == expected, request
    drafts = metric_value(metrics, "vllm:spec_decode_num_drafts_total")
    draft_tokens = metric_value(metrics, "vllm:spec_decode_num_draft_tokens_total")
    assert drafts and 0 < draft_tokens <= 16 * drafts
    rounds = metric_value(metrics, 'vllm_dartree:phase_ms_count{phase="round"}')
    assert rounds and rounds > 0
    for phase in ("drafter_forward", "tree_build", "target_forward", "accept"):
        assert metric_value(metrics, f'vllm_dartree:phase_ms_count{{phase="{phase}"}}') == rounds
    assert metric_value(metrics, 'vllm_dartree:phase_ms_sum{phase="tree_attention"}') is not None
    assert metric_value(metrics, 'vllm_dartree:phase_ms_sum{phase="target_forward"}') > 0
    chosen = metric_value(metrics, "vllm_dartree:budget_nodes_sum")
    widths = metric_value(metrics, "vllm_dartree:budget_width_count")
    assert chosen is not None and widths and widths > 0
    assert draft_tokens <= chosen
