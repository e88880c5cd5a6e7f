"""Process hygiene for everything this project launches (tests, demo, benchmarks, CLI).

The plugin itself never calls this: it loads into every vLLM process of an environment
and must not change how other users' vLLM runs behave. Our own entry points call
:func:`apply_process_defaults` before vLLM is imported.
"""

from __future__ import annotations

import os
from pathlib import Path


def project_root() -> Path:
    """The checkout this package lives in (editable install), else the working directory."""
    here = Path(__file__).resolve().parent.parent
    return here if (here / "pyproject.toml").exists() else Path.cwd()


def shown_path(path: str | Path) -> str:
    """``path`` as written into results: relative to the checkout (or, for the shared folder
    beside it, ``../``) so reports do not carry one machine's absolute paths."""
    resolved, root = Path(path).resolve(), project_root().resolve()
    for base, prefix in ((root, ""), (root.parent, "../")):
        if resolved.is_relative_to(base):
            return prefix + str(resolved.relative_to(base))
    return str(resolved)


def cache_dir() -> Path:
    """The project's ignored cache folder; every cache (vLLM, HF, models) lives below it."""
    path = Path(os.environ.get("VLLM_DARTREE_CACHE", project_root() / ".cache"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def process_defaults() -> dict[str, str]:
    """Environment our processes run with unless the user already set a value."""
    cache = cache_dir()
    return {
        # No telemetry, no hub, nothing but loopback.
        "VLLM_NO_USAGE_STATS": "1",
        "VLLM_DO_NOT_TRACK": "1",
        "DO_NOT_TRACK": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "VLLM_HOST_IP": "127.0.0.1",
        # Caches inside the project.
        "VLLM_CACHE_ROOT": str(cache / "vllm"),
        "HF_HOME": str(cache / "hf"),
        "TRITON_CACHE_DIR": str(cache / "triton"),
        "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"),
        "XDG_CACHE_HOME": str(cache / "xdg"),
        # vLLM-CPU otherwise reserves 92 % of RAM for the KV cache (GiB, integer).
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }


def apply_process_defaults() -> None:
    """Set :func:`process_defaults` for variables the user has not set."""
    for key, value in process_defaults().items():
        os.environ.setdefault(key, value)
