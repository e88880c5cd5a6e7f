"""Train a DFlash drafter with a Domino or DSpark Markov head on the target's own
continuations; export it for vLLM. ``head="none"`` trains a head-less backbone in z-lab's
non-shift layout instead (slot j >= 1 predicts x_{p+j}; loss CE(base)), the backbone of
vLLM's DFlash, DFlash2 and LiLiCorr drafters (see :mod:`vllm_dartree.training.lattice`).

Loss per the Domino recipe: ``(1 - lam) * CE(corrected) + lam * CE(base)`` with ``lam``
decaying linearly from ``lambda0`` to 0 over the run; AdamW, warmup then cosine (or linear)
decay, gradient clipping (the same for both heads; a DSpark confidence head adds a BCE term
on the detached backbone states, so it does not steer the drafter's hidden states; the Markov
embedding it also reads is shared and gets the BCE's gradient). Every batch is a pure
function of ``(seed, step)``, so a resumed run continues exactly where the interrupted one
stopped (``out/checkpoint.pt`` holds model, optimizer and step). The export (``out/drafter``)
is the released format of its head (Domino's, or DSpark's ``Qwen3DSparkModel``), written
through ``DrafterLayout``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from vllm_dartree.checkpoint import DOMINO, HEAD_PREFIXES, MARKOV, DrafterLayout, bare_weight_name
from vllm_dartree.training.data import (
    SequenceSet,
    generate_responses,
    load_target,
    pad_batch,
    sample_anchors,
    target_config,
    target_features,
)
from vllm_dartree.training.loss import (
    confidence_loss,
    fused_drafter_loss_and_hits,
    slot_weights,
)
from vllm_dartree.training.model import (
    IGNORE_INDEX,
    TRAINABLE_HEADS,
    BlockDrafter,
    DrafterOutput,
    block_labels,
)

CHECKPOINT = "checkpoint.pt"
DATA = "data.pt"
EXPORT = "drafter"
NO_HEAD = "none"  # TrainConfig.head of a head-less z-lab (non-shift layout) backbone
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class TrainConfig:
    target: str
    out: str
    steps: int = 1000
    block_size: int = 16
    layers: int = 1
    head: str = DOMINO  # or MARKOV (DSpark), or NO_HEAD (z-lab's non-shift layout)
    gru_hidden_dim: int = 64  # Domino
    emb_dim: int = 32  # Domino
    markov_rank: int = 64  # Markov: r of markov_w1 [V, r] / markov_w2 [V, r]
    confidence_head: bool = False  # Markov: DSpark's per-slot acceptance head
    confidence_weight: float = 0.1  # its BCE's weight in the loss
    intermediate_size: int | None = None  # default: the target's
    target_layer_ids: tuple[int, ...] | None = None  # default: default_target_layer_ids
    mask_token_id: int | None = None  # default: vocab_size - 1
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int | None = None  # default: 5 % of the steps
    schedule: str = "cosine"  # or "linear"
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    lambda0: float = 0.5
    loss_gamma: float | None = None  # DFlash position decay exp(-j / gamma); None = uniform
    batch_size: int = 16
    anchors_per_sequence: int = 8
    seq_len: int = 128  # prompt + response tokens per training sequence
    num_sequences: int = 256
    prompt_min_len: int = 3  # random token prompts when none are given
    prompt_max_len: int = 40
    temperature: float = 0.0
    gen_batch_size: int = 64
    stop_at_eos: bool = True
    seed: int = 0
    save_every: int = 0  # 0: checkpoint only at the end
    stop_after: int | None = None  # end this run at this step (resume later with resume=True)
    resume: bool = False
    freeze_backbone: bool = False
    init_from: str | None = None
    export_dtype: str = "float32"
    device: str = "cpu"  # drafter and target
    # matmul precision of the drafter's forward and backward (weights, optimizer and the
    # cross-entropy stay float32); "bfloat16" needs a GPU or a CPU with native bf16
    autocast: str = "float32"
    target_dtype: str = "float32"  # the target's weights (features are float32 either way)
    threads: int | None = None
    progress: bool = True
    feature_cache_bytes: int = 2 << 30  # precompute target features below this size

@dataclass
class TrainResult:
    drafter_dir: Path
    step: int
    losses: list[float] = field(default_factory=list)
    seconds: float = 0.0


# -------------------------------------------------------------------------- architecture
def default_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> tuple[int, ...]:
    """z-lab's spacing (evenly from layer 1 to n-3); every layer for targets of <= 4 layers."""
    if num_target_layers <= 4:
        return tuple(range(num_target_layers))
    if num_draft_layers == 1:
        return (num_target_layers // 2,)
    start, end = 1, num_target_layers - 3
    return tuple(round(start + i * (end - start) / (num_draft_layers - 1))
                 for i in range(num_draft_layers))


# New drafters leave depth 1 uncorrected, as the released b16 Domino drafters do.
NEW_DRAFTER_PURE_PREFIX = 1


def head_fields(cfg: TrainConfig) -> dict:
    """The layout fields of the new drafter's correction head ({"head": None}: none)."""
    if cfg.head == NO_HEAD:
        return {"head": None}
    if cfg.head == DOMINO:
        return {"head": DOMINO, "gru_hidden_dim": cfg.gru_hidden_dim, "emb_dim": cfg.emb_dim,
                "pure_draft_prefix_len": NEW_DRAFTER_PURE_PREFIX}
    if cfg.head == MARKOV:
        # DSpark corrects every slot (slot 0 from the anchor) and, as released, feeds its
        # confidence head the Markov embedding.
        return {"head": MARKOV, "markov_rank": cfg.markov_rank,
                "confidence_head": cfg.confidence_head,
                "confidence_head_with_markov": cfg.confidence_head}
    raise ValueError(f"head={cfg.head!r}: allowed {[*TRAINABLE_HEADS, NO_HEAD]}")


def arch_for_target(cfg: TrainConfig, config: dict) -> DrafterLayout:
    """A new drafter's shapes from the target's config.json and the training settings."""
    config = config.get("text_config", config)
    heads = config["num_attention_heads"]
    layers = config["num_hidden_layers"]
    rope = config.get("rope_parameters") or {}
    ids = cfg.target_layer_ids or default_target_layer_ids(layers, cfg.layers)
    return DrafterLayout(
        vocab_size=config["vocab_size"],
        hidden_size=config["hidden_size"],
        intermediate_size=cfg.intermediate_size or config["intermediate_size"],
        num_hidden_layers=cfg.layers,
        num_attention_heads=heads,
        num_key_value_heads=config.get("num_key_value_heads") or heads,
        head_dim=config.get("head_dim") or config["hidden_size"] // heads,
        num_target_layers=layers,
        target_layer_ids=tuple(ids),
        mask_token_id=(config["vocab_size"] - 1 if cfg.mask_token_id is None
                       else cfg.mask_token_id),
        block_size=cfg.block_size,
        shift_label=cfg.head != NO_HEAD,
        rms_norm_eps=config.get("rms_norm_eps", DrafterLayout.rms_norm_eps),
        rope_theta=float(config.get("rope_theta", rope.get("rope_theta", 10000.0))),
        max_position_embeddings=config.get("max_position_embeddings", 2048),
        **head_fields(cfg),
    )


def target_tables(target) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's (embedding, lm_head) weights: the drafter shares both, frozen."""
    embed = target.get_input_embeddings().weight.detach().float()
    lm_head = target.get_output_embeddings().weight.detach().float()
    return embed, lm_head


# ------------------------------------------------------------------------ checkpoints
def export_drafter(model: BlockDrafter, out_dir: str | Path, dtype: str = "float32") -> Path:
    """``config.json`` + ``model.safetensors`` under the released checkpoint names."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    weights = {k: v.detach().to(DTYPES[dtype]).contiguous().cpu()
               for k, v in model.state_dict().items()}
    save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(model.arch.to_config(dtype), indent=2))
    return out


def load_drafter(drafter_dir: str | Path, embed: torch.Tensor, lm_head: torch.Tensor,
                 generator: torch.Generator | None = None,
                 new_head: dict | None = None) -> BlockDrafter:
    """A drafter from a checkpoint. A z-lab DFlash one (no head) gets a fresh head with the
    layout fields ``new_head`` (see :func:`head_fields`) and is retrained to the shift
    layout; without ``new_head`` (or with ``{"head": None}``) it loads as it is, a head-less
    non-shift backbone."""
    drafter_dir = Path(drafter_dir)
    layout = DrafterLayout.from_dir(drafter_dir)
    if not layout.has_head and (new_head or {}).get("head") is not None:
        layout = replace(layout, shift_label=True, **new_head)
    model = BlockDrafter(layout, embed, lm_head)
    model.reset_parameters(generator or torch.Generator().manual_seed(0))
    load_weights(model, load_file(str(drafter_dir / "model.safetensors")))
    return model


def load_weights(model: BlockDrafter, weights: dict[str, torch.Tensor]) -> None:
    """Copy checkpoint tensors in; the backbone must be complete, the head may be absent."""
    weights = {bare_weight_name(k): v for k, v in weights.items()}
    own = model.state_dict()
    missing = [k for k in own if k not in weights and not k.startswith(HEAD_PREFIXES)]
    unknown = [k for k in weights if k not in own]
    if missing or unknown:
        raise ValueError(f"drafter checkpoint mismatch: missing {missing[:4]}, "
                         f"unexpected {unknown[:4]}")
    with torch.no_grad():
        for name, tensor in weights.items():
            if tuple(tensor.shape) != tuple(own[name].shape):
                raise ValueError(f"{name}: checkpoint shape {list(tensor.shape)}, drafter "
                                 f"expects {list(own[name].shape)}")
            own[name].copy_(tensor.to(own[name].dtype))


# What a resumed run must share with the run that wrote the checkpoint: the schedule is a
# function of these, so resuming under others would silently train a different recipe.
SCHEDULE_FIELDS = ("steps", "lr", "min_lr_ratio", "warmup_steps", "schedule", "weight_decay",
                   "grad_clip", "lambda0", "loss_gamma", "batch_size", "anchors_per_sequence",
                   "seed", "freeze_backbone", "autocast")


def schedule_of(cfg: TrainConfig) -> dict:
    return {name: getattr(cfg, name) for name in SCHEDULE_FIELDS}


def save_checkpoint(path: Path, model: BlockDrafter, optimizer: torch.optim.Optimizer,
                    step: int, losses: list[float], schedule: dict) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save({"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "arch": model.arch.as_dict(), "losses": losses, "schedule": schedule}, tmp)
    os.replace(tmp, path)  # never leave a half-written checkpoint behind


# -------------------------------------------------------------------------- schedules
def lr_at(cfg: TrainConfig, step: int) -> float:
    warmup = cfg.warmup_steps if cfg.warmup_steps is not None else max(1, cfg.steps // 20)
    if step < warmup:
        return cfg.lr * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, cfg.steps - warmup))
    decay = 0.5 * (1 + math.cos(math.pi * progress)) if cfg.schedule == "cosine" \
        else 1 - progress
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * decay)


def lambda_at(cfg: TrainConfig, step: int) -> float:
    """Weight of the base CE: lambda0 at step 0, linearly down to 0 at the last step."""
    return cfg.lambda0 * max(0.0, 1 - step / max(1, cfg.steps - 1))


# ------------------------------------------------------------------------------- loss
def fused_step_loss(model: BlockDrafter, features: torch.Tensor, tokens: torch.Tensor,
                    anchors: torch.Tensor, labels: torch.Tensor, lam: float,
                    gamma: float | None = None, confidence_weight: float = 0.1,
                    ) -> tuple[torch.Tensor, dict[str, float]]:
    """``drafter_loss(model(...), ...)`` without materialising the logits (see loss.py)."""
    hidden = model.backbone(features, tokens, anchors)
    head_in = model.head_input(hidden, tokens, anchors)
    loss, stats, hits = fused_drafter_loss_and_hits(
        hidden, head_in, model.output_table(hidden.device.type), model.head_output_weight,
        labels, slot_weights(labels.shape[-1], gamma, labels.device), lam)
    # The confidence head calibrates: the backbone's states reach it detached.
    confidence = model.confidence_logits(hidden.detach(), tokens, anchors)
    if confidence is None:
        return loss, stats
    bce = confidence_loss(confidence, hits, labels)
    return loss + confidence_weight * bce, stats | {"bce": bce.item()}


# ------------------------------------------------------------------------------- data
class Batches:
    """Batch ``step`` = a pure function of (seed, step): sequences, anchors, labels."""

    def __init__(self, cfg: TrainConfig, data: SequenceSet, target, arch: DrafterLayout) -> None:
        self.cfg, self.data, self.target, self.arch = cfg, data, target, arch
        self.prompt_lens = torch.tensor(data.prompt_lens)
        self.features: torch.Tensor | None = None
        tokens, lengths = pad_batch(data.sequences)
        width = len(arch.target_layer_ids) * arch.hidden_size
        if tokens.numel() * width * 4 <= cfg.feature_cache_bytes:
            self.tokens, self.lengths = tokens, lengths
            self.features = self._features(tokens, lengths)

    def _features(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        chunks = [target_features(self.target, tokens[i: i + 64], self.arch.target_layer_ids,
                                  lengths[i: i + 64])
                  for i in range(0, len(tokens), 64)]
        return torch.cat(chunks).cpu()  # the cache stays in host memory

    def get(self, step: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(features [N, T, F], tokens [N, T], anchors [N, A], labels [N, A, bs])."""
        gen = torch.Generator().manual_seed(self.cfg.seed * 1_000_003 + step)
        rows = torch.randint(len(self.data), (self.cfg.batch_size,), generator=gen)
        if self.features is not None:
            lengths = self.lengths[rows]
            width = int(lengths.max())
            tokens = self.tokens[rows, :width]
            features = self.features[rows, :width]
        else:
            tokens, lengths = pad_batch([self.data.sequences[i] for i in rows.tolist()])
            features = target_features(self.target, tokens, self.arch.target_layer_ids, lengths)
        anchors = sample_anchors(self.prompt_lens[rows], lengths,
                                 self.cfg.anchors_per_sequence, gen)
        labels = block_labels(tokens, anchors, lengths, self.arch.block_size,
                              shift=self.arch.shift_label)
        return features, tokens, anchors, labels


def training_prompts(cfg: TrainConfig, vocab_size: int, mask_id: int) -> list[list[int]]:
    """Random token prompts (never eos id 0 or the mask id), like models.tiny.random_prompts."""
    from vllm_dartree.models.tiny import random_prompts

    prompts = random_prompts(cfg.num_sequences, vocab_size, seed=cfg.seed + 7919,
                             min_len=cfg.prompt_min_len, max_len=cfg.prompt_max_len)
    return [[t for t in p if t != mask_id] or [1] for p in prompts]


def prepare_data(cfg: TrainConfig, target, arch: DrafterLayout,
                 prompts: Sequence[Sequence[int]] | None) -> SequenceSet:
    """Target continuations, cached in ``out/data.pt`` keyed by everything that shapes them."""
    if prompts is None:
        prompts = training_prompts(cfg, arch.vocab_size, arch.mask_token_id)
    prompts = [list(p)[: max(1, cfg.seq_len - 1)] for p in prompts[: cfg.num_sequences]]
    key = hashlib.sha256(json.dumps({
        "prompts": prompts, "seq_len": cfg.seq_len, "temperature": cfg.temperature,
        "seed": cfg.seed, "eos": cfg.stop_at_eos, "target": str(cfg.target),
    }).encode()).hexdigest()[:16]
    path = Path(cfg.out) / DATA
    if path.exists():
        cached = torch.load(path, weights_only=True)
        if cached.get("key") == key:
            return SequenceSet(list(cached["sequences"]), list(cached["prompt_lens"]))
    # Left-padded batches reproduce unpadded greedy generation exactly (HF derives the
    # positions from the attention mask); every sequence is then cut to seq_len tokens.
    generated = generate_responses(
        target, prompts, cfg.seq_len - min(len(p) for p in prompts),
        temperature=cfg.temperature, batch_size=cfg.gen_batch_size, seed=cfg.seed,
        stop_at_eos=cfg.stop_at_eos)
    sequences = [seq[: cfg.seq_len] for seq in generated.sequences]
    data = SequenceSet(sequences, [len(p) for p in prompts])
    torch.save({"key": key, "sequences": data.sequences, "prompt_lens": data.prompt_lens},
               path)
    return data


# ------------------------------------------------------------------------------ train
@contextlib.contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """Run with ``threads`` intra-op threads (1 is far faster on a busy 2-core machine)."""
    if threads is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def build_model(cfg: TrainConfig, target) -> BlockDrafter:
    embed, lm_head = target_tables(target)
    gen = torch.Generator().manual_seed(cfg.seed)
    if cfg.init_from:
        shift = DrafterLayout.from_dir(cfg.init_from).shift_label
        if cfg.freeze_backbone and not shift and cfg.head != NO_HEAD:
            # A z-lab backbone predicts its own slot, not the next one: it needs retraining.
            raise ValueError(f"--freeze-backbone needs a shift-layout (Domino) drafter; "
                             f"{cfg.init_from} has dflash_config.shift_label = {shift}")
        model = load_drafter(cfg.init_from, embed, lm_head, gen,
                             new_head=head_fields(cfg))
    else:
        model = BlockDrafter(arch_for_target(cfg, target_config(cfg.target)), embed, lm_head)
        model.reset_parameters(gen)
    if cfg.freeze_backbone:
        if model.arch.head is None:
            raise ValueError("--freeze-backbone with --head none leaves nothing to train")
        model.requires_grad_(False)
        for param in model.head_parameters():
            param.requires_grad_(True)
    return model.to(cfg.device)


def train(cfg: TrainConfig, prompts: Sequence[Sequence[int]] | None = None) -> TrainResult:
    """Generate (or reuse) the data, train (or resume), export to ``out/drafter``."""
    from tqdm.auto import tqdm

    started = time.perf_counter()
    check_autocast(cfg.autocast, cfg.device)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    with torch_threads(cfg.threads):
        torch.manual_seed(cfg.seed)
        target = load_target(cfg.target, DTYPES[cfg.target_dtype], cfg.device)
        model = build_model(cfg, target)
        data = prepare_data(cfg, target, model.arch, prompts)
        batches = Batches(cfg, data, target, model.arch)
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95),
                                      weight_decay=cfg.weight_decay)
        start, losses = 0, []
        if cfg.resume and (out / CHECKPOINT).exists():
            start, losses = resume_from(out / CHECKPOINT, model, optimizer, schedule_of(cfg))
        end = cfg.steps if cfg.stop_after is None else min(cfg.steps, cfg.stop_after)
        bar = tqdm(range(start, end), desc="train drafter", disable=not cfg.progress,
                   initial=start, total=cfg.steps)
        for step in bar:
            loss, stats = train_step(cfg, model, optimizer, batches, step)
            losses.append(loss)
            bar.set_postfix({k: f"{v:.3f}" for k, v in stats.items()}, refresh=False)
            if cfg.save_every and (step + 1) % cfg.save_every == 0:
                save_checkpoint(out / CHECKPOINT, model, optimizer, step + 1, losses,
                                schedule_of(cfg))
        final_step = max(start, end)
        save_checkpoint(out / CHECKPOINT, model, optimizer, final_step, losses, schedule_of(cfg))
        drafter_dir = export_drafter(model, out / EXPORT, cfg.export_dtype)
    (out / "train_config.json").write_text(json.dumps(asdict(cfg), indent=2, default=str))
    return TrainResult(drafter_dir, final_step, losses, time.perf_counter() - started)


def setting_changes(saved: dict, now: dict, where: str) -> str:
    """``"steps: 6 <where>, 12 now"`` for each setting that differs; empty when none does."""
    return ", ".join(f"{k}: {saved.get(k)!r} {where}, {v!r} now" for k, v in now.items()
                     if saved.get(k) != v)


def resume_from(path: Path, model: BlockDrafter, optimizer: torch.optim.Optimizer,
                schedule: dict) -> tuple[int, list[float]]:
    state = torch.load(path, weights_only=False)
    arch = state["arch"] | {"target_layer_ids": tuple(state["arch"]["target_layer_ids"])}
    if DrafterLayout(**arch) != model.arch:
        raise ValueError(f"{path} was trained with a different drafter architecture")
    saved = state.get("schedule", schedule)  # older checkpoints recorded none
    shown = setting_changes(saved, schedule, "in the checkpoint")
    if shown:
        raise ValueError(f"{path} was written under another schedule ({shown}); resume with "
                         "the same settings, or train into a new output folder")
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return int(state["step"]), list(state["losses"])


def check_autocast(autocast: str, device: str) -> None:
    """Refuse a matmul precision this machine lacks, before any model loads."""
    if autocast not in DTYPES:
        raise ValueError(f"autocast={autocast!r}: allowed {sorted(DTYPES)}")
    if (autocast == "bfloat16" and torch.device(device).type == "cpu"
            and not torch.ops.mkldnn._is_mkldnn_bf16_supported()):
        # emulated bf16 matmuls run ~100x slower than float32 on such CPUs
        raise ValueError("autocast='bfloat16' needs a CPU with native bf16 (AVX512-BF16 or "
                         "AMX); this one has none: use autocast='float32'")


def train_step(cfg: TrainConfig, model: BlockDrafter, optimizer: torch.optim.Optimizer,
               batches: Batches, step: int) -> tuple[float, dict[str, float]]:
    features, tokens, anchors, labels = (t.to(cfg.device) for t in batches.get(step))
    for group in optimizer.param_groups:
        group["lr"] = lr_at(cfg, step)
    model.train()
    with torch.autocast(torch.device(cfg.device).type, dtype=DTYPES[cfg.autocast],
                        enabled=cfg.autocast != "float32"):
        loss, stats = fused_step_loss(model, features, tokens, anchors, labels,
                                      lambda_at(cfg, step), cfg.loss_gamma,
                                      cfg.confidence_weight)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(
        [p for g in optimizer.param_groups for p in g["params"]], cfg.grad_clip)
    optimizer.step()
    return loss.item(), stats


# ------------------------------------------------------------------------- evaluation
@dataclass
class AcceptanceReport:
    """Pure-torch proxy of a greedy vLLM run (bonus included, micro-averaged like vLLM)."""

    tau: dict[str, float]  # per tree variant: mean accepted tokens per round
    base_top1: list[float]  # per depth: argmax(base) == target's greedy token
    corrected_top1: list[float]  # per depth, teacher forced along the target's tokens
    rounds: int = 0

    def summary(self) -> str:
        taus = ", ".join(f"{k} {v:.2f}" for k, v in self.tau.items())
        fmt = lambda xs: " ".join(f"{x:.2f}" for x in xs)  # noqa: E731
        return (f"tau: {taus} | base top1/depth: {fmt(self.base_top1)} | "
                f"corrected top1/depth: {fmt(self.corrected_top1)}")


@torch.no_grad()
def simulate_acceptance(
    model: BlockDrafter,
    target,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int = 64,
    variants: Sequence[str] = ("pruned", "chain"),
    budget: int = 64,
    width: int = 12,
    top_k: int = 64,
    depth_bonus: float = -0.2,
) -> AcceptanceReport:
    """Greedy decoding with tree verification, simulated against the target's continuation.

    Under greedy decoding the output is the target's greedy continuation whatever the tree,
    so the drafter's output at every possible root position is computed in one batched
    forward; the decode loop then jumps from root to root by each round's acceptance.
    """
    from vllm_dartree.tree import accept_tree, build_tree

    model.eval()
    device = model.embed.device
    bs = model.arch.block_size
    seqs = generate_responses(target, prompts, max_new_tokens + bs + 1, stop_at_eos=False)
    head = detached_head(model)
    per_variant: dict[str, list[int]] = {v: [] for v in variants}
    hits = torch.zeros(2, bs)
    count = torch.zeros(bs)
    for seq, prompt_len in zip(seqs.sequences, seqs.prompt_lens):
        tokens = seq.unsqueeze(0).to(device)
        features = target_features(target, tokens, model.arch.target_layer_ids).to(device)
        anchors = torch.arange(prompt_len, prompt_len + max_new_tokens).unsqueeze(0)
        out = model(features, tokens, anchors.to(device))
        out = DrafterOutput(*(t.cpu() for t in (out.hidden, out.base_logits,
                                                 out.corrected_logits)))
        tokens = tokens.cpu()
        labels = block_labels(tokens, anchors, torch.tensor([len(seq)]), bs)[0]
        hits[0] += (out.base_logits[0].argmax(-1) == labels).float().sum(0)
        hits[1] += (out.corrected_logits[0].argmax(-1) == labels).float().sum(0)
        count += (labels != IGNORE_INDEX).float().sum(0)
        roots = tokens[0, anchors[0]]
        for variant in variants:
            tree = build_tree(variant, out.base_logits[0], out.hidden[0], roots, head,
                              budget=budget, top_k=min(top_k, model.arch.vocab_size),
                              width=width, depth_bonus=depth_bonus)
            depth = torch.cat([torch.zeros_like(tree.depths[:, :1]), tree.depths], dim=1)
            choice = seq[(anchors[0].unsqueeze(1) + 1 + depth).clamp(max=len(seq) - 1)]
            accepted = accept_tree(tree, choice).num_accepted.tolist()
            per_variant[variant] += decode_rounds(accepted, max_new_tokens)
    rates = (hits / count.clamp(min=1)).tolist()
    return AcceptanceReport(
        tau={v: sum(r) / max(1, len(r)) for v, r in per_variant.items()},
        base_top1=rates[0], corrected_top1=rates[1],
        rounds=len(per_variant[variants[0]]) if variants else 0,
    )


def detached_head(model: BlockDrafter):
    """The tree core's head on CPU copies of the weights (Domino: with its input-gate table)."""
    if model.arch.head == MARKOV:
        head = model.markov_tree_head()
        return replace(head, markov_w1=head.markov_w1.detach().cpu(),
                       markov_w2=head.markov_w2.detach().cpu())
    head = model.domino_head()
    head = replace(head, **{k: getattr(head, k).detach().cpu()
                            for k in ("embed", "gru_ih", "gru_hh", "proj0", "proj2")})
    return head.with_input_gate_table()


def decode_rounds(accepted_at: list[int], max_new_tokens: int) -> list[int]:
    """Tokens committed per round when round k's root sits at offset sum(previous rounds)
    (the prefill emitted the first token, so rounds run until max_new_tokens are out)."""
    rounds, offset, produced = [], 0, 1
    while produced < max_new_tokens and offset < len(accepted_at):
        committed = accepted_at[offset]
        rounds.append(committed)
        offset += committed
        produced += committed
    return rounds
