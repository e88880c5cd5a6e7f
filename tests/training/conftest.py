"""Shared fixtures: the small target of the trained tiny pair, loaded once."""

from __future__ import annotations

import pytest
import torch

from vllm_dartree.models.tiny_pair import TRAINED_TARGET


@pytest.fixture(autouse=True)
def one_thread():
    """One intra-op thread: much faster when the CPU is shared with vLLM test runs."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def target_dir():
    from vllm_dartree.models.tiny import write_target

    return write_target(TRAINED_TARGET)


@pytest.fixture(scope="session")
def target(target_dir):
    from vllm_dartree.training.data import load_target

    return load_target(target_dir)
