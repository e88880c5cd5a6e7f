"""The converted SmolLM2-135M-Instruct checkpoint, made once per session (first run ~1 min)."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_dartree.models.smollm2 import ensure_smollm2


@pytest.fixture(scope="session")
def model_dir() -> Path:
    return ensure_smollm2()
