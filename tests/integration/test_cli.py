"""``vllm-dartree serve`` forwards to vLLM's OpenAI server with the plugin loaded."""

from __future__ import annotations

import subprocess
import sys

import pytest

from vllm_dartree.harness.server import http_json, running_server
from vllm_dartree.models.tiny import TargetSpec, write_target


def test_cli_rejects_unknown_commands():
    out = subprocess.run(
        [sys.executable, "-m", "vllm_dartree.cli", "serv"], capture_output=True, text=True
    )
    assert out.returncode == 2 and "invalid choice: 'serv'" in out.stderr


@pytest.mark.parametrize(("args", "policy"), [
    (["serve", "m", "--speculative-config", '{"method": "dartree", "budget_policy": "adaptive"}'],
     "adaptive"),
    (["serve", "m", '--speculative-config={"budget_policy": "fixed"}'], "fixed"),
    (["serve", "m", "-sc", '{"method": "dartree"}'], None),
    (["serve", "m", "--speculative-config", "not json"], None),
    (["serve", "adaptive", "--served-model-name", '"adaptive"'], None),
    (["serve", "m", "--speculative-config"], None),
])
def test_the_launcher_reads_the_budget_policy_from_the_speculative_config(args, policy):
    from vllm_dartree.integration.launcher import requested_budget_policy

    assert requested_budget_policy(args) == policy


@pytest.mark.e2e
def test_serve_answers_completions_and_chat():
    model = write_target(TargetSpec(with_tokenizer=True))
    args = ("--dtype", "float32", "--max-model-len", "256", "--enforce-eager")
    with running_server(model, *args, log_name="test_cli.log") as base:
        completion = http_json(
            base + "/v1/completions",
            {"model": "tiny", "prompt": "def hello(self):", "max_tokens": 8, "temperature": 0},
        )
        chat = http_json(
            base + "/v1/chat/completions",
            {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8,
             "temperature": 0},
        )
    assert completion["usage"]["completion_tokens"] == 8
    assert completion["choices"][0]["text"]
    assert chat["choices"][0]["message"]["content"]
