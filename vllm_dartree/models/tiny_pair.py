"""A tiny target and a Domino drafter really trained on it, cached for the end-to-end tests.

The random tiny targets of :mod:`vllm_dartree.models.tiny` give drafters nothing to learn at their default
init (std 0.5: greedy output is near-chaotic). :data:`TRAINED_TARGET` uses std 0.15, where the
target's greedy continuation is mostly a function of the last token with some dependence on
the context (a last-token predictor is right ~67 % of the time, two tokens ~75 %), and a
32-token vocabulary, so a 1-layer drafter learns it in well under a minute of CPU time.

``trained_tiny_pair()`` writes the pair once under ``.cache/models/tiny/`` (keyed by every
setting below), atomically and under a file lock, so concurrent callers train once.
Run ``python -m vllm_dartree.models.tiny_pair`` for the pure-torch acceptance proxy.
"""

from __future__ import annotations

import contextlib
import fcntl
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from vllm_dartree.env import cache_dir
from vllm_dartree.models.tiny import TargetSpec, _cached_dir, write_target

TRAINED_TARGET = TargetSpec(
    vocab_size=32, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=2, num_key_value_heads=1, head_dim=32, init_std=0.15, seed=3,
)


@dataclass(frozen=True)
class TrainedPairSpec:
    """Everything the trained drafter depends on (the cache key)."""

    target: TargetSpec = field(default_factory=lambda: TRAINED_TARGET)
    layers: int = 1
    gru_hidden_dim: int = 64
    emb_dim: int = 32
    target_layer_ids: tuple[int, ...] = (0, 1)
    steps: int = 400
    lr: float = 5e-3
    lambda0: float = 0.5
    loss_gamma: float = 7.0
    batch_size: int = 16
    anchors_per_sequence: int = 8
    num_sequences: int = 512
    seq_len: int = 112  # random prompts of 3..40 tokens + >= 72 target tokens
    seed: int = 0
    version: int = 1  # bump when a training-code change alters the result


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def trained_tiny_pair(
    spec: TrainedPairSpec = TrainedPairSpec(), progress: bool = False
) -> tuple[Path, Path]:
    """(target_dir, drafter_dir); trains the drafter on the first call (~40 s on 2 cores)."""
    target = write_target(spec.target)

    def write(out: Path) -> None:
        from vllm_dartree.training.train import TrainConfig, train

        with tempfile.TemporaryDirectory(prefix=".train-", dir=out.parent) as work:
            result = train(TrainConfig(
                target=str(target), out=work, steps=spec.steps, layers=spec.layers,
                gru_hidden_dim=spec.gru_hidden_dim, emb_dim=spec.emb_dim,
                target_layer_ids=spec.target_layer_ids, lr=spec.lr, lambda0=spec.lambda0,
                loss_gamma=spec.loss_gamma, batch_size=spec.batch_size,
                anchors_per_sequence=spec.anchors_per_sequence,
                num_sequences=spec.num_sequences, seq_len=spec.seq_len, seed=spec.seed,
                stop_at_eos=False,  # the e2e runs ignore eos (id 0 is an ordinary token)
                threads=1,  # far faster than 2 threads when another process shares the CPU
                progress=progress,
            ))
            for name in ("config.json", "model.safetensors"):
                shutil.copy2(result.drafter_dir / name, out / name)
            (out / "train_seconds.txt").write_text(f"{result.seconds:.1f}\n")

    with _file_lock(cache_dir() / "models" / "tiny" / ".trained-domino.lock"):
        drafter = _cached_dir("trained-domino", spec, write)
    return target, drafter


def main() -> None:
    """Train (or reuse) the pair and print the pure-torch acceptance proxy."""
    from vllm_dartree.models.tiny import random_prompts
    from vllm_dartree.training.data import load_target
    from vllm_dartree.training.train import (
        load_drafter,
        simulate_acceptance,
        target_tables,
        torch_threads,
    )

    started = time.perf_counter()
    target_dir, drafter_dir = trained_tiny_pair(progress=True)
    print(f"pair ready in {time.perf_counter() - started:.1f} s: {target_dir} {drafter_dir}")
    target = load_target(target_dir)
    drafter = load_drafter(drafter_dir, *target_tables(target))
    prompts = random_prompts(16, TRAINED_TARGET.vocab_size, seed=11)
    with torch_threads(1):
        report = simulate_acceptance(drafter, target, prompts, max_new_tokens=64)
    print(report.summary())


if __name__ == "__main__":
    main()
