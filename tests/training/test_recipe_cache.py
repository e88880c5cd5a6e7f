"""The SmolLM2 recipe's cache folder: a run on another prompt set is refused, not mixed in."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from vllm_dartree.training.smollm2 import RecipeConfig, mixture, prompt_ids, responses_dir

NO_MODEL = Path("/nonexistent")  # a cache hit or a refusal must not need the target


def write_prompt_cache(cfg: RecipeConfig, ids: list[list[int]]) -> None:
    record = {"mixture": asdict(mixture(cfg)), "max_prompt_tokens": cfg.max_prompt_tokens,
              "ids": ids, "sources": ["gsm8k-train"] * len(ids)}
    Path(cfg.out, "prompts.json").write_text(json.dumps(record))


def test_same_prompt_set_is_read_from_the_cache(tmp_path):
    cfg = RecipeConfig(out=str(tmp_path), gsm8k=3, math=0, sharegpt=0, code=0)
    write_prompt_cache(cfg, [[1, 2], [3], [4, 5, 6]])
    ids, sources = prompt_ids(cfg, NO_MODEL)
    assert ids == [[1, 2], [3], [4, 5, 6]] and sources == ["gsm8k-train"] * 3


def test_run_on_another_prompt_set_is_refused(tmp_path):
    old = RecipeConfig(out=str(tmp_path), gsm8k=280, math=100, sharegpt=120, code=140)
    write_prompt_cache(old, [[1, 2]])
    responses_dir(old).mkdir()
    (responses_dir(old) / "chunk_0000.pt").write_bytes(b"")
    new = RecipeConfig(out=str(tmp_path), gsm8k=840, math=100, sharegpt=120, code=140,
                       max_prompt_tokens=old.max_prompt_tokens + 1)
    with pytest.raises(ValueError, match=r"gsm8k: 280 there, 840 now, max_prompt_tokens: "
                                         rf"{old.max_prompt_tokens} there, "
                                         rf"{old.max_prompt_tokens + 1} now.*new --out"):
        prompt_ids(new, NO_MODEL)
