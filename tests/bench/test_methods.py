"""The benchmark's methods: DSpark's chain and DARTree over DSpark's Markov head.

Each ``dspark*`` method is the Domino-drafter method of the same tree run on the DSpark
drafter (``--dspark-drafter``); a checkpoint without a Markov head is refused for them.
"""

from __future__ import annotations

import pytest

from vllm_dartree.bench.methods import (
    DEFAULT_METHODS,
    DSPARK_METHODS,
    LATTICE_METHODS,
    LATTICE_SAME_TREE_AS,
    SAME_TREE_AS,
    TreeParams,
    speculative_config,
)
from vllm_dartree.bench.run import BenchConfig, DrafterMissing, check_drafter, config_from_args
from vllm_dartree.bench.run import parser as bench_parser

PARAMS = TreeParams(budget=16, top_k=8, width=4, depth_bonus=-0.2)


@pytest.mark.parametrize("method", DSPARK_METHODS)
def test_a_dspark_method_is_the_same_tree_on_the_dspark_drafter(method, tiny_dspark):
    spec = speculative_config(method, tiny_dspark, PARAMS)
    assert spec == speculative_config(SAME_TREE_AS[method], tiny_dspark, PARAMS)
    assert spec["model"] == str(tiny_dspark) and spec["correction"] is True


def test_the_dspark_chain_drafts_one_node_per_block_slot(tiny_dspark):
    spec = speculative_config("dspark", tiny_dspark, PARAMS)
    assert (spec["tree"], spec["num_speculative_tokens"]) == ("chain", 7)  # block 7, anchor-first


@pytest.mark.parametrize("method", DSPARK_METHODS)
def test_a_dspark_method_refuses_a_drafter_without_a_markov_head(method, tiny_domino):
    with pytest.raises(ValueError, match="needs a DSpark drafter.*head='domino'"):
        speculative_config(method, tiny_domino, PARAMS)


def test_each_method_gets_its_drafter(tmp_path):
    args = bench_parser().parse_args(["--target", str(tmp_path), "--drafter", "d",
                                      "--dspark-drafter", "s", "--methods", "ar", "dspark",
                                      "dspark-pruned", "pruned"])
    config = config_from_args(args)
    assert config.methods == ["ar", "dspark", "dspark-pruned", "dartree-pruned"]
    assert [config.drafter_of(m) for m in config.methods] == ["d", "s", "s", "d"]


def test_default_methods_leave_the_dspark_ones_out(tmp_path):
    config = BenchConfig.from_options(target=str(tmp_path))
    assert config.methods == list(DEFAULT_METHODS)
    assert config.dspark_drafter.endswith("benchmarks/drafters/smollm2-135m-dspark")


def test_a_missing_dspark_drafter_is_named(tmp_path, tiny_domino):
    config = BenchConfig.from_options(target=str(tmp_path), drafter=str(tiny_domino),
                                      dspark_drafter=str(tmp_path / "none"),
                                      methods=["ar", "pruned", "dspark-pruned"])
    with pytest.raises(DrafterMissing, match="DSpark drafter checkpoint not found.*"
                       "dspark-pruned"):
        check_drafter(config)


@pytest.mark.e2e
def test_dspark_methods_are_lossless_in_a_bench_run(engines, trained_tiny_dspark, tmp_path):
    """Every DSpark method on a drafter from ``train-drafter --head markov`` (so vLLM's engine
    loads the training output): outputs identical to AR, and the trees accept more than one
    token per round."""
    from vllm_dartree.bench import metrics
    from vllm_dartree.bench.run import run_benchmark

    engines.close()  # the harness builds its own engines, one at a time
    target, drafter = trained_tiny_dspark
    config = BenchConfig(target=str(target), drafter=None, dspark_drafter=str(drafter),
                         methods=["ar", "dspark", "dspark-pruned", "dspark-fixed"],
                         datasets=["random"], num_samples=2, max_new_tokens=16, ignore_eos=True,
                         out=tmp_path, kv_cache_mib=64, dtype="float32", progress=False,
                         tree=PARAMS, save_trees=0, write=False)
    results = run_benchmark(config)
    assert results["mismatches"] == []
    by_method = {m: [r for r in results["runs"] if r["method"] == m] for m in config.methods}
    assert all(by_method.values())
    assert metrics.tau_micro(by_method["dspark-pruned"]) > 1.0


def test_the_report_names_the_drafters_the_methods_used():
    from vllm_dartree.bench.report import _drafters

    meta = {"drafter": "d", "dspark_drafter": "s"}
    assert _drafters(meta | {"methods": ["ar", "dspark", "dspark-pruned"]}) == \
        "DSpark drafter `s`"
    assert _drafters(meta | {"methods": ["ar", "domino", "dspark"]}) == \
        "drafter `d`, DSpark drafter `s`"
    assert _drafters(meta | {"methods": ["ar", "dartree-pruned"]}) == "drafter `d`"


def test_a_sized_method_carries_its_own_budget_and_width(tiny_domino):
    from vllm_dartree.bench.methods import canonical, label

    spec = speculative_config("pruned:b64w12", tiny_domino, PARAMS)
    assert (spec["num_speculative_tokens"], spec["width"], spec["top_k"]) == (64, 12, 8)
    assert canonical("pruned:b64w12") == "dartree-pruned:b64w12"
    assert label("dartree-pruned:b64w12") == "DARTree (pruned) B=64 W=12"
    with pytest.raises(ValueError, match="size suffix"):
        canonical("ar:b16")
    with pytest.raises(ValueError, match="size suffix"):
        canonical("pruned:big")


def test_the_adaptive_method_is_pruned_with_the_adaptive_verification(tiny_domino):
    spec = speculative_config("adaptive:b32", tiny_domino, PARAMS)
    assert spec == speculative_config("pruned:b32", tiny_domino, PARAMS) | {
        "budget_policy": "adaptive"}


def test_the_adaptive_method_can_leave_the_width_to_the_budget(tiny_domino):
    from vllm_dartree.bench.methods import canonical, label

    spec = speculative_config("adaptive:b16wauto", tiny_domino, PARAMS)
    assert (spec["num_speculative_tokens"], spec["width"], spec["budget_policy"]) == (
        16, "auto", "adaptive")
    assert label("dartree-adaptive:wauto") == "DARTree (adaptive) W=auto"
    with pytest.raises(ValueError, match="'wauto' .* dartree-adaptive only"):
        canonical("pruned:wauto")


def test_serving_rows_compare_with_ar_per_dataset_and_concurrency():
    from vllm_dartree.bench.report import _concurrency_lines
    from vllm_dartree.bench.serving import compare_with_ar

    def row(method, dataset, c, tps, texts):
        return {"method": method, "dataset": dataset, "concurrency": c, "tokens_per_s": tps,
                "requests": len(texts), "texts": [texts], "drafts_per_step": 2.5}

    rows = [row("ar", "gsm8k", 1, 10.0, ["a", "b"]), row("ar", "mt-bench", 1, 20.0, ["c"]),
            row("dartree-adaptive", "gsm8k", 1, 15.0, ["a", "x"]),
            row("dartree-adaptive", "mt-bench", 1, 10.0, ["c"])]
    compare_with_ar(rows, greedy=True)
    by = {(r["method"], r["dataset"]): r for r in rows}
    assert by[("dartree-adaptive", "gsm8k")]["speedup"] == pytest.approx(1.5)
    assert by[("dartree-adaptive", "mt-bench")]["speedup"] == pytest.approx(0.5)
    assert by[("dartree-adaptive", "gsm8k")]["mismatches"] == 1
    assert all("texts" not in r for r in rows)
    text = "\n".join(_concurrency_lines(rows))
    assert "### GSM8K" in text and "### MT-Bench" in text
    assert "15.0 (1.50×)" in text and "1 of 3 served completions differ" in text


def test_repeated_serving_rounds_report_the_median_and_check_every_round():
    from vllm_dartree.bench.report import _concurrency_lines
    from vllm_dartree.bench.serving import combine, compare_with_ar, contenders

    def measured(tps, texts, drafts=0, draft_tokens=0, accepted=0):
        moved = {"num_drafts": drafts, "num_draft_tokens": draft_tokens,
                 "num_accepted_tokens": accepted, "width_sum": 4.0 * drafts,
                 "width_count": drafts}
        return {"concurrency": 2, "requests": len(texts), "completion_tokens": 10,
                "wall_s": 10 / tps, "tokens_per_s": tps, "mean_latency_s": 1.0 / tps,
                "moved": moved, "texts": texts}

    # Slow methods are not measured again: under half of the best first-round rate.
    assert contenders({"ar": 10.0, "dartree-adaptive": 12.0, "dartree-pruned": 5.9}) == [
        "ar", "dartree-adaptive"]
    ar = combine([measured(10.0, ["a", "b"]), measured(8.0, ["a", "b"]),
                  measured(12.0, ["a", "c"])])
    adaptive = combine([measured(9.0, ["a", "b"], 2, 8, 3), measured(11.0, ["a", "x"], 1, 4, 1),
                        measured(13.0, ["a", "b"], 1, 4, 2)])
    assert ar["tokens_per_s"] == 10.0 and ar["wall_s"] == 1.0
    # An even count reports the lower middle round: its rate, wall time and latency agree.
    even = combine([measured(10.0, ["a", "b"]), measured(8.0, ["a", "b"])])
    assert (even["tokens_per_s"], even["wall_s"], even["mean_latency_s"]) == (8.0, 1.25, 0.125)
    assert adaptive["tokens_per_s"] == 11.0 and adaptive["rounds_tokens_per_s"] == [9.0, 11.0, 13.0]
    assert adaptive["tau_vllm"] == pytest.approx(1 + 6 / 4)  # counters summed over rounds
    assert adaptive["drafts_per_step"] == pytest.approx(4.0) and adaptive["mean_width"] == 4.0
    # 3 rounds x (10 tokens - 2 prefill tokens) - 6 accepted = 18 decode request-steps, 4 drafted.
    assert adaptive["drafted_share"] == pytest.approx(4 / 18)
    rows = [{"method": "ar", "dataset": "gsm8k"} | ar,
            {"method": "dartree-adaptive", "dataset": "gsm8k"} | adaptive]
    compare_with_ar(rows, greedy=True)
    assert rows[1]["speedup"] == pytest.approx(1.1)
    # Against AR's first round: one adaptive completion and one of AR's own later ones differ.
    assert (rows[0]["mismatches"], rows[0]["checked"]) == (1, 4)
    assert (rows[1]["mismatches"], rows[1]["checked"]) == (1, 6)
    text = "\n".join(_concurrency_lines(rows))
    assert "Median of 3 interleaved rounds" in text and "9.0, 11.0, 13.0" in text
    assert "a method under 50% of a cell's best rate in the first round" in text
    assert "verified a draft (C=2: 22%)" in text
    assert "2 of 10 served completions differ" in text


def test_a_serving_only_report_leaves_the_in_process_losslessness_line_out():
    """Its served completions are checked in the concurrency section instead."""
    from vllm_dartree.bench.report import _lossless_lines

    assert _lossless_lines({"runs": [], "mismatches": None}) == []
    assert "not checked" in _lossless_lines({"runs": [{}], "mismatches": None})[0]


@pytest.mark.parametrize("method", sorted(LATTICE_SAME_TREE_AS))
def test_a_lattice_method_is_the_same_tree_on_the_lattice_drafter(method, tiny_dflash2):
    spec = speculative_config(method, tiny_dflash2, PARAMS)
    assert spec == speculative_config(LATTICE_SAME_TREE_AS[method], tiny_dflash2, PARAMS)
    assert spec["method"] == "dartree" and "top_k" not in spec  # K is the lattice's own


def test_the_lattice_method_is_vllms_own_speculator(tiny_lilicorr, tiny_domino):
    spec = speculative_config("lattice", tiny_lilicorr, PARAMS)
    assert spec == {"method": "dflash", "model": str(tiny_lilicorr),
                    "num_speculative_tokens": 15}  # b16 in z-lab's layout
    for method in LATTICE_METHODS:
        with pytest.raises(ValueError, match="needs a lattice drafter"):
            speculative_config(method, tiny_domino, PARAMS)
