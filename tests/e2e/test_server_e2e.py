"""The OpenAI server with dartree under concurrent load (real processes, loopback only), with
structured-output requests among the others: JSON schema, regex, choice and tool calling
(``tools`` with ``tool_choice="required"``), each greedy answer equal to target-only's."""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor

import pytest

from vllm_dartree.harness.server import (
    http_json,
    http_text,
    metric_value,
    running_server,
    stream_and_hang_up,
)
from vllm_dartree.models.tiny import DrafterSpec, TargetSpec, write_drafter, write_target

pytestmark = pytest.mark.e2e

SPEC = TargetSpec(with_tokenizer=True)
# JSON without free whitespace (a random target would fill max_tokens with it); tool calls,
# which vLLM serves with tool_choice="required" only with a parser enabled (the calls
# themselves come from vLLM's JSON schema of the tools, whatever the parser).
STRUCTURED_SERVER_ARGS = (
    "--structured-outputs-config", '{"backend": "xgrammar", "disable_any_whitespace": true}',
    "--enable-auto-tool-choice", "--tool-call-parser", "pythonic")
SERVER_ARGS = ("--dtype", "float32", "--max-model-len", "512", "--enforce-eager",
               "--max-num-seqs", "16", "--max-num-batched-tokens", "2048",
               *STRUCTURED_SERVER_ARGS)
WORDS = ["def", "class", "import", "return", "self", "for", "while", "print", "lambda", "yield"]


SCHEMA = {"type": "object", "additionalProperties": False, "required": ["answer", "mood"],
          "properties": {"answer": {"enum": ["yes", "no", "maybe"]},
                         "mood": {"enum": ["calm", "busy"]}}}
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "required": ["city"], "additionalProperties": False,
                   "properties": {"city": {"enum": ["Paris", "Oslo", "Lima"]}}}}}]
REGEX = r"[a-z]{1,8} = [0-9]{1,3}(, [0-9]{1,3}){0,3}"
CHOICES = ["yes please", "no thanks", "maybe later"]
# (kind, body keys): greedy structured requests, sent as well (the grammar checked below).
STRUCTURED_BODIES = [
    ("json_schema", {"messages": [{"role": "user", "content": "import os"}], "response_format": {
        "type": "json_schema", "json_schema": {"name": "reply", "schema": SCHEMA}}}),
    ("regex", {"prompt": "for i in", "structured_outputs": {"regex": REGEX}}),
    ("choice", {"prompt": "def foo", "structured_outputs": {"choice": CHOICES}}),
    ("tools", {"messages": [{"role": "user", "content": "class A"}], "tools": TOOLS,
               "tool_choice": "required"}),
]


def _requests() -> list[dict]:
    """32 requests: greedy and sampled, short and long, completions and chat, 4 aborted;
    then the structured ones."""
    out = []
    for i in range(32):
        prompt = " ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(2 + i % 9))
        body = {"model": "tiny", "max_tokens": 8 + (i * 13) % 57}
        if i % 4 == 3:
            body |= {"temperature": 0.9, "top_p": 0.95, "seed": i}
        else:
            body |= {"temperature": 0.0}
        if i % 5 == 4:
            body |= {"messages": [{"role": "user", "content": prompt}]}
        else:
            body |= {"prompt": prompt}
        out.append({"body": body, "abort": i % 8 == 5})
    return out + structured_requests()


def structured_requests() -> list[dict]:
    """The greedy structured requests (V1 and V2 server tests), each tagged with its kind."""
    return [{"body": {"model": "tiny", "max_tokens": 48, "temperature": 0.0} | keys,
             "abort": False, "structured": kind} for kind, keys in STRUCTURED_BODIES]


def answer(base: str, body: dict, timeout: float) -> dict:
    """A completion's or chat answer's text and tool calls (name, arguments)."""
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    choice = http_json(base + path, body, timeout)["choices"][0]
    message = choice.get("message", {})
    calls = [(c["function"]["name"], c["function"]["arguments"])
             for c in message.get("tool_calls") or []]
    return {"text": choice.get("text", message.get("content")), "tool_calls": calls}


def _send(base: str, request: dict) -> dict:
    if request["abort"]:
        return {"aborted": stream_and_hang_up(base, request["body"], 200, 120)}
    return answer(base, request["body"], 120)


def check_structured(kind: str, reply: dict) -> None:
    """The grammar held (the tiny random target's free text never fits it)."""
    text = reply["text"]
    if kind == "json_schema":
        fields = json.loads(text)
        assert fields["answer"] in SCHEMA["properties"]["answer"]["enum"], text
        assert fields["mood"] in SCHEMA["properties"]["mood"]["enum"], text
    elif kind == "regex":
        assert re.fullmatch(REGEX, text), text
    elif kind == "choice":
        assert text in CHOICES, text
    else:
        assert reply["tool_calls"], reply
        for name, arguments in reply["tool_calls"]:
            assert name == "get_weather" and json.loads(arguments)["city"], arguments


def _serve_all(base: str) -> list[dict]:
    with ThreadPoolExecutor(max_workers=32) as pool:
        return list(pool.map(lambda r: _send(base, r), _requests()))


def _metric(text: str, name: str) -> float:
    value = metric_value(text, name)
    assert value is not None, f"{name} missing from /metrics"
    return value


@pytest.fixture(scope="module")
def target_only_answers():
    with running_server(write_target(SPEC), *SERVER_ARGS, log_name="server_target.log") as base:
        return _serve_all(base)


def test_the_target_only_server_answers_completions_and_chat(target_only_answers):
    """``vllm-dartree serve`` without dartree: every completion and chat request answered."""
    kinds = set()
    for request, reply in zip(_requests(), target_only_answers):
        if "structured" in request:
            check_structured(request["structured"], reply)
        elif not request["abort"]:
            assert reply["text"], request
            kinds.add("messages" in request["body"])
    assert kinds == {True, False}


def test_a_profiled_dartree_server_answers_concurrent_load(target_only_answers):
    """VLLM_DARTREE_PROFILE=1 under concurrent load: the target-only answers, vLLM's counters,
    and every phase of every tree round in /metrics."""
    drafter = write_drafter(DrafterSpec(target=SPEC, domino=True))
    spec = json.dumps({"method": "dartree", "model": str(drafter)})
    with running_server(write_target(SPEC), *SERVER_ARGS, "--speculative-config", spec,
                        log_name="server_dartree.log",
                        env={"VLLM_DARTREE_PROFILE": "1"}) as base:
        answers = _serve_all(base)
        assert http_text(base + "/health") is not None  # still serving after the aborts
        metrics = http_text(base + "/metrics")
    _check_answers(answers, target_only_answers)
    drafts = _metric(metrics, "vllm:spec_decode_num_drafts_total")
    draft_tokens = _metric(metrics, "vllm:spec_decode_num_draft_tokens_total")
    accepted = _metric(metrics, "vllm:spec_decode_num_accepted_tokens_total")
    assert drafts > 0 and 0 < draft_tokens <= 64 * drafts
    assert 0 < accepted <= draft_tokens
    rounds = _metric(metrics, 'vllm_dartree:phase_ms_count{phase="round"}')
    assert rounds > 0
    for phase in ("drafter_forward", "tree_build", "target_forward", "tree_attention",
                  "target_logits", "accept"):
        assert _metric(metrics, f'vllm_dartree:phase_ms_count{{phase="{phase}"}}') == rounds
    assert _metric(metrics, 'vllm_dartree:phase_ms_sum{phase="target_forward"}') > 0


def _check_answers(answers, target_only_answers) -> None:
    for request, got, expected in zip(_requests(), answers, target_only_answers):
        if request["abort"]:
            assert got["aborted"]
        elif request["body"]["temperature"] == 0.0:
            assert got == expected, request
        else:
            assert got["text"]


def test_tensor_parallel_server(target_only_answers):
    """Two ranks (one core each): the same greedy answers as the TP=1 target alone."""
    drafter = write_drafter(DrafterSpec(target=SPEC, domino=True))
    spec = json.dumps({"method": "dartree", "model": str(drafter)})
    with running_server(write_target(SPEC), *SERVER_ARGS, "--speculative-config", spec,
                        "--tensor-parallel-size", "2", "--distributed-executor-backend", "mp",
                        log_name="server_tp2.log",
                        env={"VLLM_CPU_OMP_THREADS_BIND": "0|1"}) as base:
        answers = _serve_all(base)
        metrics = http_text(base + "/metrics")
    _check_answers(answers, target_only_answers)
    assert _metric(metrics, "vllm:spec_decode_num_accepted_tokens_total") > 0


def test_data_parallel_server(target_only_answers):
    """Two data-parallel engines (one core each) behind one server: the same greedy answers."""
    drafter = write_drafter(DrafterSpec(target=SPEC, domino=True))
    spec = json.dumps({"method": "dartree", "model": str(drafter)})
    with running_server(write_target(SPEC), *SERVER_ARGS, "--speculative-config", spec,
                        "--data-parallel-size", "2", log_name="server_dp2.log",
                        env={"VLLM_CPU_OMP_THREADS_BIND": "0|1"}) as base:
        answers = _serve_all(base)
        metrics = http_text(base + "/metrics")
    _check_answers(answers, target_only_answers)
    drafts = re.findall(r'^vllm:spec_decode_num_drafts_total{[^}]*engine="(\d+)"[^}]*} (\S+)$',
                        metrics, re.M)
    assert {engine for engine, _ in drafts} == {"0", "1"}  # both engines served
    assert sum(float(value) for _, value in drafts) > 0
