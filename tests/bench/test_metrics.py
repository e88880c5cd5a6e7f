"""Benchmark arithmetic on hand-made per-round records; table, figures and tree drawings."""

from __future__ import annotations

import pytest

from vllm_dartree.bench import metrics
from vllm_dartree.bench.report import render


def turn(accept: list[int], events_t: list[float], events_n: list[int], output=None,
         depth_counts=None) -> dict:
    rounds = {"accept": accept, "depth_counts": depth_counts or [[] for _ in accept]}
    return {"output_ids": output or list(range(events_n[-1] if events_n else 0)),
            "events_t": events_t, "events_n": events_n, "rounds": rounds, "trees": []}


def run(method: str, dataset: str, index: int, *turns: dict, temperature: float = 0.0) -> dict:
    return {"method": method, "temperature": temperature, "dataset": dataset,
            "source_index": index, "turns": list(turns)}


def test_tau_macro_averages_samples_micro_averages_rounds():
    a = run("x", "d", 0, turn([1, 3], [0.1, 0.2, 0.3], [1, 2, 5]))  # sample mean 2
    b = run("x", "d", 1, turn([5], [0.1, 0.2], [1, 6]))  # sample mean 5
    assert metrics.tau_macro([a, b]) == pytest.approx(3.5)
    assert metrics.tau_micro([a, b]) == pytest.approx(3.0)  # (1 + 3 + 5) / 3
    # Multi-turn samples pool their turns' rounds into one per-sample mean.
    c = run("x", "d", 2, turn([2], [0.1, 0.2], [1, 3]), turn([4, 6], [0.1, 0.2, 0.3], [1, 5, 11]))
    assert metrics.sample_tau(c) == pytest.approx(4.0)
    assert metrics.tau_macro([run("x", "d", 3, turn([], [0.1], [1]))]) is None


def test_tpot_excludes_the_first_token_and_speedup_is_a_tpot_ratio():
    # First token at 0.5 s; 4 more tokens by 1.1 s -> 0.6 s / 4 = 150 ms per token.
    one = run("x", "d", 0, turn([2, 2], [0.5, 0.7, 1.1], [1, 3, 5]))
    assert metrics.run_decode(one) == (pytest.approx(0.6), 4)
    assert metrics.tpot_micro([one]) == pytest.approx(0.15)
    two = run("x", "d", 1, turn([1], [0.2, 0.3], [1, 2]))  # 0.1 s / 1 token
    assert metrics.tpot_micro([one, two]) == pytest.approx(0.7 / 5)
    assert metrics.tpot_macro([one, two]) == pytest.approx((0.15 + 0.1) / 2)
    assert metrics.speedup(0.03, 0.015) == pytest.approx(2.0)
    assert metrics.speedup(None, 0.015) is None


def test_position_wise_acceptance_and_depth_profile():
    assert metrics.survival([1, 2, 2, 4]) == [1.0, 0.75, 0.25, 0.25]
    assert metrics.survival([1, 2], max_t=3) == [1.0, 0.5, 0.0]
    assert metrics.survival([]) == []
    trees = run("x", "d", 0, turn([2, 3], [0, 1, 2], [1, 3, 6],
                                  depth_counts=[[4, 2], [2, 4, 2]]))
    assert metrics.depth_profile([trees]) == [3.0, 3.0, 1.0]


def fake_results() -> dict:
    runs = []
    for index in range(2):
        runs.append(run("ar", "gsm8k", index, turn([1] * 4, [0.1, 0.2, 0.3, 0.4, 0.5],
                                                   [1, 2, 3, 4, 5], output=[1, 2, 3, 4, 5])))
        runs.append(run("dartree-pruned", "gsm8k", index,
                        turn([3, 2], [0.1, 0.15, 0.2], [1, 4, 5], output=[1, 2, 3, 4, 5],
                             depth_counts=[[3, 2, 1], [4, 1]])))
        runs.append(run("dflash", "gsm8k", index,
                        turn([2, 2], [0.1, 0.2, 0.3], [1, 3, 5],
                             output=[1, 2, 9, 4, 5] if index else [1, 2, 3, 4, 5],
                             depth_counts=[[1, 1], [1, 1]])))
    return {"meta": {"target_name": "t"}, "runs": runs, "summary": metrics.summarize(runs),
            "mismatches": metrics.mismatches(runs)}


def test_summary_speedup_average_and_mismatches():
    results = fake_results()
    rows = {(r["dataset"], r["method"]): r for r in results["summary"]}
    pruned = rows[("gsm8k", "dartree-pruned")]
    assert pruned["speedup"] == pytest.approx((0.4 / 4) / (0.1 / 4))  # AR 100 ms, 25 ms
    assert pruned["tau"] == pytest.approx(2.5) and rows[("gsm8k", "ar")]["tau"] == 1.0
    assert rows[("average", "dartree-pruned")]["speedup"] == pytest.approx(pruned["speedup"])
    assert results["mismatches"] == [{"method": "dflash", "dataset": "gsm8k", "source_index": 1,
                                      "turn": 0, "first_difference": 2, "length": 5,
                                      "ar_length": 5}]
    table = render(results)
    assert "| DARTree (pruned) | 4.00× | 2.50 | 4.00× | 2.50 |" in table
    assert "| AR | 1.00× | 1.00 |" in table and "1 output(s) differ from AR" in table


def test_figures_and_tree_drawing(tmp_path):
    pytest.importorskip("matplotlib")
    from vllm_dartree.bench.plots import write_figures
    from vllm_dartree.bench.viz import draw_tree, layout

    paths = write_figures(fake_results()["runs"], tmp_path)
    assert sorted(p.name for p in paths) == ["acceptance_t0.png", "depths_t0.png"]
    # root -> {1, 2}; 1 -> {3}; 3 -> {4}; node 5 is padding.
    tree = {"tokens": [7, 8, 9, 10, 7], "parents": [0, 0, 1, 3, 0], "depths": [1, 1, 2, 3, 1],
            "valid": [True, True, True, True, False], "accepted": [0, 1, 3], "root": 5,
            "bonus": 11}
    pos = layout(tree)
    assert sorted(pos) == [0, 1, 2, 3, 4] and pos[4] == (3.0, 0.0) and pos[2] == (1.0, 1.0)
    out = draw_tree(tree, "hand-made", tmp_path / "tree.png")
    assert out.stat().st_size > 1000
