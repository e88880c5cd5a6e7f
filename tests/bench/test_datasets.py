"""Dataset loaders on the offline sources: counts, selection, prompt formats, chat turns."""

from __future__ import annotations

import numpy as np
import pytest

from vllm_dartree.bench import datasets as ds
from vllm_dartree.bench.prompts import PromptBuilder
from vllm_dartree.models.tiny import TargetSpec, write_target


@pytest.fixture(scope="module")
def loaded() -> dict[str, list[ds.Sample]]:
    return {name: ds.load_dataset(name) for name in ds.DATASETS}


def test_reference_counts_and_selection(loaded):
    expected = {"gsm8k": 128, "math500": 128, "aime25": 30, "humaneval": 164, "mbpp": 128,
                "mt-bench": 80, "alpaca": 80}  # EAGLE's alpaca file has only 80 prompts
    assert {k: len(v) for k, v in loaded.items()} == expected
    # Sources with more rows than N: HF shuffle(seed=0) = default_rng(0).permutation.
    for name, rows in (("gsm8k", 1319), ("math500", 500), ("mbpp", 257)):
        pick = np.random.default_rng(0).permutation(rows)[:128].tolist()
        assert [s.source_index for s in loaded[name]] == pick, name
    for name in ("aime25", "humaneval", "mt-bench", "alpaca"):  # kept in source order
        assert [s.source_index for s in loaded[name]] == list(range(len(loaded[name])))


def test_select_indices_semantics():
    assert ds.select_indices(5, 8) == [0, 1, 2, 3, 4]
    assert ds.select_indices(10, 3) == np.random.default_rng(0).permutation(10)[:3].tolist()
    assert len(ds.load_dataset("humaneval", 2)) == 2  # N < len: a shuffled pick


def test_prompt_formats(loaded):
    gsm8k = loaded["gsm8k"][0].turns[0]
    assert gsm8k.endswith("\nPlease reason step by step, and put your final answer within "
                          "\\boxed{}.")
    assert loaded["math500"][0].turns[0].endswith(ds.MATH_SUFFIX)
    human = loaded["humaneval"][0].turns[0]
    assert human.startswith("Write a solution to the following problem and make sure that it "
                            "passes the tests:\n```python\nfrom typing import List")
    assert human.endswith("\n```")
    assert all(s.num_turns == 2 for s in loaded["mt-bench"])
    assert loaded["mt-bench"][0].turns[0].startswith("Compose an engaging travel blog post")
    assert all(s.num_turns == 1 for name in ds.DATASETS if name != "mt-bench"
               for s in loaded[name])


def test_mbpp_and_aime_sources(loaded):
    import json

    rows = json.loads((ds.default_data_dir() / "mbpp/sanitized-mbpp.json").read_text())
    test_split = [r for r in rows if 11 <= r["task_id"] <= 510]
    assert len(test_split) == 257
    first = loaded["mbpp"][0]
    assert first.turns == (test_split[first.source_index]["prompt"],)
    aime = [s.turns[0] for s in loaded["aime25"]]
    assert not any("\x0c" in p or "\t" in p for p in aime)  # single-backslash LaTeX repaired
    assert sum("\\frac" in p for p in aime) >= 6 and any("\\triangle" in p for p in aime)
    assert all(p.endswith(ds.MATH_SUFFIX) for p in aime)


def test_missing_data_dir_names_the_file(tmp_path):
    with pytest.raises(ds.DatasetError, match="mbpp/sanitized-mbpp.json"):
        ds.load_dataset("mbpp", data_dir=tmp_path)


def test_chat_turns_append_answers():
    builder = PromptBuilder.for_model(write_target(TargetSpec(with_tokenizer=True)))
    sample = ds.Sample("mt-bench", 0, ("first question", "second question"))
    first = builder.tokenizer.decode(builder.turn_ids(sample, []))
    assert first.endswith("first question<|im_end|>\n<|im_start|>assistant\n")
    answer = builder.tokenizer("an answer", add_special_tokens=False)["input_ids"]
    second = builder.tokenizer.decode(builder.turn_ids(sample, [answer]))
    assert second.startswith(first)
    assert second.endswith("an answer<|im_end|>\n<|im_start|>user\nsecond question<|im_end|>\n"
                           "<|im_start|>assistant\n")
    assert builder.length_bound(sample, 10) >= len(builder.turn_ids(sample, [answer]))


def test_token_id_samples_need_no_tokenizer():
    builder = PromptBuilder(None)
    sample = ds.random_id_samples(3, vocab_size=32)[1]
    assert builder.turn_ids(sample, []) == list(sample.prompt_ids)
    with pytest.raises(ValueError, match="no tokenizer"):
        builder.turn_ids(ds.Sample("gsm8k", 0, ("text",)), [])
