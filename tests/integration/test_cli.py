"""``vllm-dartree``'s command line: its parser and the launcher's reading of the request. The
served path (``vllm-dartree serve`` answering completions and chat) is
tests/e2e/test_server_e2e.py."""

from __future__ import annotations

import subprocess
import sys

import pytest


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
