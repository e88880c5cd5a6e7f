"""`vllm-dartree bench --runner v2` on the trained tiny pair (token-id prompts): a functional
check on this CPU (V2's kernels in Triton's interpreter): every output identical to AR, the
run says its times are not speeds, and the acceptance lengths are V1's for the same trees
(the same command with --runner v1, in a process without the Triton stand-in)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from vllm_dartree.bench import metrics
from vllm_dartree.bench.run import INTERPRETED_NOTE, config_from_args, parser
from vllm_dartree.models.tiny_pair import trained_tiny_pair

pytestmark = pytest.mark.e2e
ARGS = ["--methods", "ar", "dartree-pruned", "--datasets", "random", "--num-samples", "3",
        "--max-new-tokens", "24", "--ignore-eos", "--kv-cache-mib", "64", "--dtype", "float32",
        "--no-progress"]


def acceptance_lengths(results: dict) -> list[list[int]]:
    runs = [r for r in results["runs"] if r["method"] == "dartree-pruned"]
    return [metrics.acceptance_lengths(r) for r in runs]


def test_bench_on_v2_is_a_lossless_functional_check_with_v1s_acceptance(engines,
                                                                          tmp_path):
    from vllm_dartree.bench.run import run_benchmark

    engines.close()  # the harness builds its own engines, one at a time
    target, drafter = trained_tiny_pair()
    # The same settings as the V1 command below (the CLI's, with this machine's defaults).
    config = config_from_args(parser().parse_args(
        ["--target", str(target), "--drafter", str(drafter), "--runner", "v2", *ARGS,
         "--out", str(tmp_path / "v2")]))
    v2 = run_benchmark(config)
    assert v2["meta"]["runner_used"] == "v2"
    assert v2["mismatches"] == []
    assert v2["meta"]["speed_note"] == INTERPRETED_NOTE
    assert INTERPRETED_NOTE in (tmp_path / "v2" / "table.md").read_text()
    env = {k: v for k, v in os.environ.items()
           if k not in ("VLLM_USE_V2_MODEL_RUNNER", "TRITON_INTERPRET", "PYTHONPATH")}
    out = subprocess.run([sys.executable, "-m", "vllm_dartree.cli", "bench", "--target",
                          str(target), "--drafter", str(drafter), "--runner", "v1", *ARGS,
                          "--out", str(tmp_path / "v1")], capture_output=True, text=True,
                         env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    v1 = json.loads((tmp_path / "v1" / "results.json").read_text())
    assert v1["meta"]["runner_used"] == "v1" and v1["meta"]["speed_note"] is None
    assert acceptance_lengths(v2) == acceptance_lengths(v1)
    assert metrics.tau_micro([r for r in v2["runs"] if r["method"] == "dartree-pruned"]) > 1.5
