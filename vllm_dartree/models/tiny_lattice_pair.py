"""A tiny target with a DFlash2 and a LiLiCorr drafter really trained on it, cached for the
end-to-end tests and the benchmark (vLLM's lattice drafters, see ``models/tiny_lattice.py``
for the random ones).

The target is :data:`~vllm_dartree.models.tiny_pair.TRAINED_TARGET` (vocab 32). One z-lab
backbone (head-less, non-shift layout, ``block_size`` 9: serve it with
``num_speculative_tokens = 8``, the block it was trained on) is trained with
``vllm-dartree train-drafter --head none``'s recipe; each lattice head (DFlash2's candidate
selector, LiLiCorr's correlator) is then trained on that frozen backbone
(:mod:`vllm_dartree.training.lattice`) and exported in vLLM's layout (DFlash2's convolutions
the identity; LiLiCorr without convolution keys).

``trained_tiny_lattice_pair(kind)`` writes each drafter once under ``.cache/models/tiny/``
(the backbone keyed by its settings, each drafter by all of them), atomically and under a
file lock, so concurrent callers train once. Run ``python -m
vllm_dartree.models.tiny_lattice_pair`` for the pure-torch acceptance proxy.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from vllm_dartree.checkpoint import DFLASH2, LILICORR
from vllm_dartree.env import cache_dir
from vllm_dartree.models.tiny import TargetSpec, _cached_dir, write_target
from vllm_dartree.models.tiny_pair import TRAINED_TARGET, _file_lock
from vllm_dartree.training.lattice import LatticeHeadConfig

LATTICE_PAIR_KINDS = (DFLASH2, LILICORR)
NUM_SPECULATIVE_TOKENS = 8  # block_size - 1: the depths one draft covers


@dataclass(frozen=True)
class TrainedBackboneSpec:
    """Everything the trained z-lab backbone depends on (its cache key)."""

    target: TargetSpec = field(default_factory=lambda: TRAINED_TARGET)
    block_size: int = NUM_SPECULATIVE_TOKENS + 1
    layers: int = 2
    target_layer_ids: tuple[int, ...] = (0, 1)
    steps: int = 1500
    lr: float = 5e-3
    loss_gamma: float = 7.0
    batch_size: int = 16
    anchors_per_sequence: int = 8
    num_sequences: int = 512
    seq_len: int = 112  # random prompts of 3..40 tokens + >= 72 target tokens
    seed: int = 0
    version: int = 1  # bump when a training-code change alters the result


@dataclass(frozen=True)
class TrainedLatticeSpec:
    """A lattice drafter: the backbone's settings plus its head's (the cache key)."""

    backbone: TrainedBackboneSpec = field(default_factory=TrainedBackboneSpec)
    head: LatticeHeadConfig = field(default_factory=LatticeHeadConfig)
    version: int = 1

    @property
    def kind(self) -> str:
        return self.head.kind


# Per kind: the selector is cheap to train longer (3000 steps ~5 s); LiLiCorr's correlator
# (~20 steps/s on one thread) keeps backbone + head under ~2 minutes.
HEAD_DEFAULTS = {DFLASH2: {"steps": 3000}, LILICORR: {"steps": 600}}


def lattice_spec(kind: str, **head_settings) -> TrainedLatticeSpec:
    """The default spec of ``kind`` (``head_settings``: :class:`LatticeHeadConfig` fields)."""
    if kind not in LATTICE_PAIR_KINDS:
        raise ValueError(f"kind={kind!r}: allowed {list(LATTICE_PAIR_KINDS)}")
    return TrainedLatticeSpec(head=LatticeHeadConfig(
        kind=kind, **(HEAD_DEFAULTS[kind] | head_settings)))


def trained_tiny_backbone(spec: TrainedBackboneSpec = TrainedBackboneSpec(),
                          progress: bool = False) -> tuple[Path, Path]:
    """(target_dir, backbone_dir): a head-less z-lab DFlash drafter (non-shift layout) and
    its training sequences (``data.pt``)."""
    target = write_target(spec.target)

    def write(out: Path) -> None:
        from vllm_dartree.training.train import NO_HEAD, TrainConfig, train

        with tempfile.TemporaryDirectory(prefix=".train-", dir=out.parent) as work:
            result = train(TrainConfig(
                target=str(target), out=work, steps=spec.steps, head=NO_HEAD,
                block_size=spec.block_size, layers=spec.layers,
                target_layer_ids=spec.target_layer_ids, lr=spec.lr,
                loss_gamma=spec.loss_gamma, batch_size=spec.batch_size,
                anchors_per_sequence=spec.anchors_per_sequence,
                num_sequences=spec.num_sequences, seq_len=spec.seq_len, seed=spec.seed,
                stop_at_eos=False,  # the e2e runs ignore eos (id 0 is an ordinary token)
                threads=1, progress=progress,
            ))
            for name in ("config.json", "model.safetensors"):
                shutil.copy2(result.drafter_dir / name, out / name)
            shutil.copy2(Path(work) / "data.pt", out / "data.pt")
            (out / "train_seconds.txt").write_text(f"{result.seconds:.1f}\n")
            (out / "losses.json").write_text(json.dumps(result.losses))

    with _file_lock(cache_dir() / "models" / "tiny" / ".trained-zlab.lock"):
        backbone = _cached_dir("trained-zlab", spec, write)
    return target, backbone


def trained_tiny_lattice_pair(kind: str = DFLASH2, spec: TrainedLatticeSpec | None = None,
                              progress: bool = False) -> tuple[Path, Path]:
    """(target_dir, drafter_dir) of a trained DFlash2 (``DFlash2DraftModel``) or LiLiCorr
    (``LiLiCorrDraftModel``) drafter for :data:`TRAINED_TARGET`; serve it with
    ``num_speculative_tokens = 8``."""
    spec = spec or lattice_spec(kind)
    if spec.kind != kind:
        raise ValueError(f"spec.head.kind = {spec.kind!r} but kind = {kind!r}")
    target, backbone_dir = trained_tiny_backbone(spec.backbone, progress)

    def write(out: Path) -> None:
        import torch

        from vllm_dartree.training.data import SequenceSet, load_target
        from vllm_dartree.training.lattice import collect_examples, export_lattice, train_head
        from vllm_dartree.training.train import load_drafter, target_tables, torch_threads

        started = time.perf_counter()
        with torch_threads(1):
            torch.manual_seed(spec.head.seed)
            target_model = load_target(target)
            embed, lm_head = target_tables(target_model)
            model = load_drafter(backbone_dir, embed, lm_head).eval()
            model.requires_grad_(False)
            data = SequenceSet.load(backbone_dir / "data.pt")
            examples = collect_examples(model, target_model, data.sequences, data.prompt_lens,
                                        spec.head.anchors_per_sequence, spec.head.top_k,
                                        seed=spec.head.seed + 1)
            result = train_head(spec.head, examples, model.arch, embed, progress=progress)
            export_lattice(model, result.head, spec.head, out)
        (out / "train_seconds.txt").write_text(f"{time.perf_counter() - started:.1f}\n")
        (out / "train_stats.json").write_text(json.dumps(
            result.stats | {"head_seconds": round(result.seconds, 1),
                            "final_ce": sum(result.losses[-20:]) / 20}, indent=2))

    with _file_lock(cache_dir() / "models" / "tiny" / f".trained-{kind}.lock"):
        drafter = _cached_dir(f"trained-{kind}", spec, write)
    return target, drafter


# ------------------------------------------------------------------------ proxy
def acceptance_proxy(target_dir: Path, drafter_dir: Path, num_prompts: int = 32,
                     max_new_tokens: int = 64, seed: int = 11) -> dict[str, float]:
    """Greedy decoding simulated against the target's greedy continuation of random prompts:
    mean tokens committed per round (accepted drafts + the bonus token) for vLLM's greedy
    walk over the lattice and for the backbone's plain argmax chain, plus per-depth hit
    rates and the top-K coverage."""
    import torch

    from vllm_dartree.models.tiny import random_prompts
    from vllm_dartree.training.data import generate_responses, load_target, target_features
    from vllm_dartree.training.lattice import (
        accepted_lengths,
        backbone_view,
        greedy_walk,
        lattice_scores,
        load_lattice,
    )
    from vllm_dartree.training.model import IGNORE_INDEX
    from vllm_dartree.training.train import decode_rounds, target_tables, torch_threads

    target = load_target(target_dir)
    model, head, cfg = load_lattice(drafter_dir, *target_tables(target))
    depths = model.arch.block_size - 1
    prompts = random_prompts(num_prompts, model.arch.vocab_size, seed=seed)
    prompts = [[t for t in p if t != model.arch.mask_token_id] or [1] for p in prompts]
    rounds: dict[str, list[int]] = {"walk": [], "chain": []}
    hits = {k: torch.zeros(depths) for k in rounds}
    covered, count = torch.zeros(depths), torch.zeros(depths)
    with torch_threads(1), torch.no_grad():
        seqs = generate_responses(target, prompts, max_new_tokens + depths + 1,
                                  stop_at_eos=False)
        for seq, prompt_len in zip(seqs.sequences, seqs.prompt_lens):
            tokens = seq.unsqueeze(0)
            features = target_features(target, tokens, model.arch.target_layer_ids)
            anchors = torch.arange(prompt_len, prompt_len + max_new_tokens).unsqueeze(0)
            ex = backbone_view(model, features, tokens, anchors, torch.tensor([len(seq)]),
                               cfg.top_k)
            drafts = {"walk": greedy_walk(lattice_scores(head, ex, model.embed), ex.candidates),
                      "chain": ex.candidates[..., 0]}
            valid = ex.labels != IGNORE_INDEX
            count += valid.float().sum(0)
            covered += ((ex.label_index() >= 0) & valid).float().sum(0)
            for name, draft in drafts.items():
                hits[name] += ((draft == ex.labels) & valid).float().sum(0)
                rounds[name] += decode_rounds(accepted_lengths(draft, ex.labels).tolist(),
                                              max_new_tokens)
    out: dict[str, float] = {}
    for name in rounds:
        out[f"tau_{name}"] = sum(rounds[name]) / max(1, len(rounds[name]))
        out[f"rounds_{name}"] = len(rounds[name])
    out |= {f"top1_{name}_per_depth": (hits[name] / count.clamp(min=1)).tolist()
            for name in rounds}
    out["topk_coverage_per_depth"] = (covered / count.clamp(min=1)).tolist()
    return out


def main() -> None:
    """Train (or reuse) both drafters and print the pure-torch acceptance proxy."""
    for kind in LATTICE_PAIR_KINDS:
        started = time.perf_counter()
        target_dir, drafter_dir = trained_tiny_lattice_pair(kind, progress=True)
        print(f"{kind}: ready in {time.perf_counter() - started:.1f} s: {drafter_dir}")
        backbone_seconds = (trained_tiny_backbone()[1] / "train_seconds.txt").read_text()
        print(f"  backbone training {backbone_seconds.strip()} s, head training "
              f"{(drafter_dir / 'train_seconds.txt').read_text().strip()} s; held-out "
              f"{(drafter_dir / 'train_stats.json').read_text()}")
        proxy = acceptance_proxy(target_dir, drafter_dir)
        fmt = lambda xs: " ".join(f"{x:.2f}" for x in xs)  # noqa: E731
        print(f"  tokens/round (block of {NUM_SPECULATIVE_TOKENS} depths): lattice walk "
              f"{proxy['tau_walk']:.2f} ({proxy['rounds_walk']} rounds), argmax chain "
              f"{proxy['tau_chain']:.2f} ({proxy['rounds_chain']} rounds)")
        print(f"  top1/depth walk: {fmt(proxy['top1_walk_per_depth'])}")
        print(f"  top1/depth chain: {fmt(proxy['top1_chain_per_depth'])}")
        print(f"  top-K coverage/depth: {fmt(proxy['topk_coverage_per_depth'])}")


if __name__ == "__main__":
    main()
