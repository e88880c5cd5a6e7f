"""The harness end to end on the trained tiny pair (token-id prompts): AR and DARTree pruned,
3 prompts x 24 tokens, in process and over an OpenAI server (concurrency 1). Its acceptance
lengths must agree with vLLM's own counters: the in-process engine's and the server's
``/metrics``."""

from __future__ import annotations

import json

import pytest
import torch

from vllm_dartree.bench import metrics
from vllm_dartree.bench.run import BenchConfig, DrafterMissing, config_from_args, parser
from vllm_dartree.models.tiny_pair import trained_tiny_pair

pytestmark = pytest.mark.e2e
TOKENS = 24


@pytest.fixture(scope="module")
def bench(engines, tmp_path_factory):
    from vllm_dartree.bench.run import run_benchmark

    engines.close()  # the harness builds its own engines, one at a time
    target, drafter = trained_tiny_pair()
    out = tmp_path_factory.mktemp("bench")
    config = BenchConfig(target=str(target), drafter=str(drafter),
                         methods=["ar", "dartree-pruned"], datasets=["random"], num_samples=3,
                         max_new_tokens=TOKENS, ignore_eos=True, out=out, kv_cache_mib=64,
                         dtype="float32", progress=False, save_trees=4, concurrency=[1], repeats=2)
    return run_benchmark(config), out


def test_outputs_are_lossless_and_complete(bench):
    results, _ = bench
    assert results["mismatches"] == []
    assert len(results["runs"]) == 6
    assert all(len(r["turns"][0]["output_ids"]) == TOKENS for r in results["runs"])


def test_acceptance_agrees_with_vllm_counters(bench):
    results, _ = bench
    counters = next(c for c in results["counters"] if c["method"] == "dartree-pruned")
    runs = [r for r in results["runs"] if r["method"] == "dartree-pruned"]
    lengths = [n for r in runs for n in metrics.acceptance_lengths(r)]
    assert len(lengths) == counters["num_drafts"] > 0
    assert sum(lengths) - len(lengths) == counters["num_accepted_tokens"]
    assert metrics.tau_micro(runs) == pytest.approx(counters["tau_vllm"])
    assert metrics.tau_micro(runs) > 1.5  # a trained drafter: deep paths are accepted


def test_acceptance_agrees_with_server_metrics(bench):
    """Concurrency 1 sends the same 3 prompts one at a time to a server; at T = 0 its rounds are
    the in-process rounds, so /metrics must give the harness's own acceptance length."""
    results, _ = bench
    runs = [r for r in results["runs"] if r["method"] == "dartree-pruned"]
    served = next(r for r in results["concurrency"] if r["method"] == "dartree-pruned")
    assert served["requests"] == len(runs) == 3
    assert served["completion_tokens"] == 3 * TOKENS
    assert served["tau_vllm"] == pytest.approx(metrics.tau_micro(runs))
    assert next(r for r in results["concurrency"] if r["method"] == "ar")["speedup"] == 1.0


def test_repeated_server_rounds_are_identical_at_greedy(bench):
    """--repeats 2: the method with the best first round is measured twice (median reported),
    any other only if its first round reached CONTENDER_SHARE of the best, and every round of
    both methods gives AR's first-round completions. (The first round decides: the median of
    two rounds can fall below a once-measured method's rate when the second round is slow.)"""
    from vllm_dartree.bench.serving import CONTENDER_SHARE

    results, _ = bench
    rows = results["concurrency"]
    best = max(r["rounds_tokens_per_s"][0] for r in rows)
    for row in rows:
        contender = row["rounds_tokens_per_s"][0] >= CONTENDER_SHARE * best
        assert len(row["rounds_tokens_per_s"]) == (2 if contender else 1), row["method"]
    assert all(r["mismatches"] == 0 for r in rows)
    assert sum(r["checked"] for r in rows) >= 3 * 2  # AR's second round or dartree's two


def test_per_round_records(bench):
    results, _ = bench
    for run in results["runs"]:
        turn = run["turns"][0]
        rounds = turn["rounds"]
        assert all(t is not None and t > 0 for t in rounds["time_s"])
        assert 1 + sum(rounds["emitted"]) == TOKENS  # first token + every round's commits
        if run["method"] == "ar":
            assert set(rounds["accept"]) == {1}
            continue
        assert all(sum(c) == n for c, n in zip(rounds["depth_counts"], rounds["nodes"]))
    first = next(r for r in results["runs"] if r["method"] == "dartree-pruned")
    trees = first["turns"][0]["trees"]
    assert 0 < len(trees) <= 4
    tree = trees[0]
    assert tree["root"] is not None and tree["accepted"][0] == 0
    assert len(tree["accepted"]) == first["turns"][0]["rounds"]["accept"][0]


def test_written_outputs_and_viz(bench, tmp_path):
    from vllm_dartree.bench.viz_cli import main as viz_main

    results, out = bench
    stored = json.loads((out / "results.json").read_text())
    assert stored["summary"] == json.loads(json.dumps(results["summary"]))
    table = (out / "table.md").read_text()
    assert "| DARTree (pruned) |" in table and "equals AR's on every sample" in table
    isa = torch.backends.cpu.get_cpu_capability()  # the vector ISA the results depend on
    assert stored["meta"]["machine"]["cpu_capability"] == isa and f"CPUs ({isa})" in table
    assert (out / "acceptance_t0.png").exists() and (out / "depths_t0.png").exists()
    assert list((out / "trees").glob("tree_dartree-pruned_random0_*.png"))
    viz_main([str(out), "--rounds", "1", "--out", str(tmp_path)])
    assert [p.name for p in tmp_path.glob("*.png")] == [
        "tree_dartree-pruned_random0_T0_turn0_round1.png"]


def test_quick_profile_and_missing_drafter(tmp_path):
    from vllm_dartree.bench.run import run_benchmark

    args = parser().parse_args(["--quick", "--target", str(tmp_path), "--drafter",
                                str(tmp_path / "none"), "--budget", "8"])
    config = config_from_args(args)
    assert config.temperatures == [0.0] and len(config.methods) == 6
    assert len(config.datasets) == 7 and config.tree.budget == 8 and config.tree.width == 4
    assert config.out.name == "quick"
    with pytest.raises(DrafterMissing, match="drafter checkpoint not found"):
        run_benchmark(config)
