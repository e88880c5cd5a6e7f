"""Serving rounds of a method that cannot contend are cut short: against a fake server
whose two methods differ 10x in speed, the slow one's first round stops at its first
completion and is not measured again, and its row says so."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from vllm_dartree.bench import serving
from vllm_dartree.bench.report import _concurrency_lines

TOKENS = 8
SECONDS = {"fast": 0.02, "slow": 0.2}  # per request: 400 and 40 tok/s at one client


@pytest.fixture
def fake_server(monkeypatch):
    monkeypatch.setattr(serving, "CUT_AFTER_S", 0.0)  # these rounds take a second at most
    sent: dict[str, int] = {"fast": 0, "slow": 0}

    def http_json(url, body, timeout=None):
        base = url.split("/")[0]
        sent[base] += 1
        time.sleep(SECONDS[base])
        return {"usage": {"completion_tokens": TOKENS},
                "choices": [{"text": f"completion of {body['prompt']}"}]}

    monkeypatch.setattr(serving, "http_json", http_json)
    monkeypatch.setattr(serving, "spec_counters", lambda base: {
        name: 0.0 for name in (*serving.COUNTERS, "width_sum", "width_count")})
    return sent


def config(repeats: int) -> SimpleNamespace:
    return SimpleNamespace(max_new_tokens=TOKENS, temperatures=[0.0], ignore_eos=True, seed=0,
                           repeats=repeats)


PROMPTS = [[i] for i in range(8)]


def test_a_round_is_cut_only_where_it_cannot_reach_the_floor(fake_server):
    reachable = serving.measure("slow", PROMPTS, 1, config(2), floor=10.0)
    assert not reachable["cut"] and reachable["requests"] == 8
    cut = serving.measure("slow", PROMPTS, 1, config(2), floor=200.0)
    assert cut["cut"] and cut["requests"] == 1 and cut["completion_tokens"] == TOKENS
    assert cut["texts"][0] == "completion of [0]" and cut["texts"][1:] == [None] * 7
    assert cut["tokens_per_s"] < 200.0
    # Four clients: judged at the first completion, before any client sends a second
    # request, so only the first wave is sent (waiting for four completions sent seven).
    wave = serving.measure("slow", PROMPTS, 4, config(2), floor=200.0)
    assert wave["cut"] and wave["requests"] == 4 and wave["texts"][4:] == [None] * 4


def test_only_a_slow_method_of_a_repeated_cell_is_cut(fake_server):
    rows = serving.measure_cell({"ar": "fast", "dartree-pruned": "slow"}, PROMPTS, 1, config(2))
    assert len(rows["ar"]["rounds_tokens_per_s"]) == 2 and not rows["ar"]["cut"]
    slow = rows["dartree-pruned"]
    assert slow["cut"] and slow["requests"] == 1 and len(slow["rounds_tokens_per_s"]) == 1
    assert fake_server == {"fast": 16, "slow": 1}
    table = [{"method": m, "dataset": "gsm8k"} | row for m, row in rows.items()]
    serving.compare_with_ar(table, greedy=True)
    assert table[1]["mismatches"] == 0 and table[1]["checked"] == 1  # the completed request
    text = "\n".join(_concurrency_lines(table))
    assert "×)†" in text and "GSM8K C=1 DARTree" in text.split("† Cut short")[1]


def test_no_round_is_cut_before_its_first_seconds(fake_server, monkeypatch):
    monkeypatch.setattr(serving, "CUT_AFTER_S", 1.0)  # the slow round needs 1.6 s
    early = serving.measure("slow", PROMPTS, 1, config(2), floor=200.0)
    assert early["cut"] and early["requests"] < 8 and early["wall_s"] >= 1.0


def test_a_single_round_is_never_cut(fake_server):
    rows = serving.measure_cell({"ar": "fast", "dartree-pruned": "slow"}, PROMPTS, 1, config(1))
    assert not rows["dartree-pruned"]["cut"] and rows["dartree-pruned"]["requests"] == 8
