"""benchmarks/gpu_check.py starts and reports: its CPU dry run (Triton interpreter, tiny
shapes) passes every check, and every kernel compiles for sm_90 (no GPU needed: ptxas ships
with triton), within the shared memory of an H100/H200.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "gpu_check.py"


def run_script(*args: str, timeout: int) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # the script decides
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # silence triton 3.9's transition warning
    return subprocess.run([sys.executable, str(SCRIPT), *args], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)


def test_dry_run_passes_every_check(tmp_path):
    out = tmp_path / "gpu_check.json"
    proc = run_script("--dry-run", "--out", str(out), timeout=60)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    report = json.loads(out.read_text())
    assert report["mode"] == "dry-run" and report["all_ok"] is True
    assert report["environment"]["interpreter"] is True
    checks = report["checks"]
    assert set(checks) == {"top_b", "tree_attention", "compaction", "correction_graphs",
                           "positions_buffer", "gdn_tree", "gdn_rows"}
    assert checks["gdn_tree"]["cases"] == 4
    assert checks["gdn_rows"]["cases"] == 2
    assert checks["positions_buffer"]["ok"] and checks["positions_buffer"]["steps"] == 3
    assert all(check["ok"] for check in checks.values())
    # Every kernel case also ran on the views of a vLLM page that production passes.
    for name in ("tree_attention", "compaction"):
        layouts = [case["layout"] for case in checks[name]["cases"]]
        assert layouts.count("page") == layouts.count("contiguous") > 0, name
    assert all(case["moved"] and case["untouched"] for case in checks["compaction"]["cases"])
    graphs = checks["correction_graphs"]
    assert {(case["variant"], case["bucket"]) for case in graphs["cases"]} == {
        (variant, bucket) for variant in ("chain", "fixed", "pruned") for bucket in (1, 4)}
    assert {case["requests"] for case in graphs["cases"]} == {1, 3, 4}  # 3: a padded bucket
    assert all(case["ok"] and not case["mismatched"] for case in graphs["cases"])
    timings = report["timings"]
    assert set(timings["tree_build"]) == {"chain", "ddtree", "fixed", "pruned", "sequential"}
    assert all(row["median_ms"] > 0 for row in timings["tree_build"].values())
    for context in timings["tree_attention"].values():
        assert {"kernel_unsplit", "kernel_auto", "twin", "split_sweep"} <= set(context)
    assert timings["compaction"]["caches"] == 2 * report["config"]["layers"]
    for row in timings["gdn_tree"].values():
        assert row["chain"]["median_ms"] > 0 and row["tree6"]["median_ms"] > 0


def test_kernels_compile_for_sm90(tmp_path):
    pytest.importorskip("triton.backends.nvidia")
    out = tmp_path / "compile.json"
    proc = run_script("--dry-run", "--compile-only", "--out", str(out), timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    report = json.loads(out.read_text())
    kernels = {row["kernel"] for row in report["compile"]["kernels"]}
    assert kernels == {"_tree_attention_fwd", "_merge_splits", "_copy_slots",
                       "_top_b_rows", "_gdn_tree_rows", "_delta_rule_in_slots",
                       "_tree_conv_rows"}
    assert all(row["ok"] for row in report["compile"]["kernels"])  # fits in shared memory
