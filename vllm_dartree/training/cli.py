"""``vllm-dartree train-drafter``: train a DFlash drafter + correction head on a target's outputs.

The head is Domino's (``--head domino``, the default) or DSpark's Markov head (``--head
markov``: written in DSpark's ``Qwen3DSparkModel`` format). Example (a tiny target, random
token prompts)::

    vllm-dartree train-drafter --target DIR --out runs/d1 --steps 400 --target-layer-ids 0 1
    vllm-dartree train-drafter --target DIR --out runs/d2 --head markov --block-size 8
    vllm-dartree train-drafter --target DIR --out runs/d3 --head none --block-size 9

``--prompts FILE`` takes JSON lines (a string, or an object with ``prompt``/``text`` for text
or ``ids``/``prompt_token_ids`` for token ids) or plain text, one prompt per line; text goes
through the target's tokenizer and chat template. ``--benchmark-prompts FILE`` (same format)
aborts the run if any benchmark prompt is among the training prompts.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from vllm_dartree.training.model import TRAINABLE_HEADS
from vllm_dartree.training.train import DTYPES, NO_HEAD, TrainConfig


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vllm-dartree train-drafter",
                                description=__doc__.splitlines()[0])
    p.add_argument("--target", required=True, help="target checkpoint directory (HF causal LM)")
    p.add_argument("--out", required=True, help="run folder (data, checkpoint, drafter/)")
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--layers", type=int, default=1, help="drafter decoder layers")
    p.add_argument("--head", choices=[*TRAINABLE_HEADS, NO_HEAD], default=TrainConfig.head,
                   help="correction head: Domino's GRU head or DSpark's Markov head; none: a "
                        "head-less backbone in z-lab's non-shift layout (vLLM's DFlash)")
    p.add_argument("--gru-hidden-dim", type=int, default=64, help="Domino head")
    p.add_argument("--emb-dim", type=int, default=32, help="Domino head")
    p.add_argument("--markov-rank", type=int, default=TrainConfig.markov_rank,
                   help="Markov head: rank r of markov_w1 / markov_w2")
    p.add_argument("--confidence-head", action="store_true",
                   help="Markov head: also train DSpark's confidence head")
    p.add_argument("--confidence-weight", type=float, default=TrainConfig.confidence_weight,
                   help="weight of the confidence head's BCE in the loss")
    p.add_argument("--intermediate-size", type=int, default=None)
    p.add_argument("--target-layer-ids", type=int, nargs="+", default=None,
                   help="0-based target layers whose outputs feed the drafter")
    p.add_argument("--mask-token-id", type=int, default=None, help="default: vocab_size - 1")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--min-lr-ratio", type=float, default=0.1)
    p.add_argument("--warmup-steps", type=int, default=None)
    p.add_argument("--schedule", choices=["cosine", "linear"], default="cosine")
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--lambda0", type=float, default=0.5,
                   help="initial weight of CE(base); decays linearly to 0")
    p.add_argument("--loss-gamma", type=float, default=None,
                   help="weight slot j by exp(-j / gamma) (DFlash position decay)")
    p.add_argument("--batch-size", type=int, default=16, help="sequences per step")
    p.add_argument("--anchors-per-sequence", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=128, help="prompt + response tokens")
    p.add_argument("--num-sequences", type=int, default=256)
    p.add_argument("--prompts", type=Path, default=None)
    p.add_argument("--benchmark-prompts", type=Path, default=None)
    p.add_argument("--no-chat-template", action="store_true")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="0: greedy target continuations; > 0: sampled")
    p.add_argument("--ignore-eos", action="store_true", help="generate past eos")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--save-every", type=int, default=0)
    p.add_argument("--stop-after", type=int, default=None,
                   help="end this run at step N (checkpointed; continue with --resume)")
    p.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pt")
    p.add_argument("--freeze-backbone", action="store_true", help="train only the Domino head")
    p.add_argument("--init-from", default=None, help="start from this drafter checkpoint")
    p.add_argument("--export-dtype", choices=sorted(DTYPES), default="float32")
    p.add_argument("--device", default="cpu", help="for the drafter and the target")
    p.add_argument("--target-dtype", choices=sorted(DTYPES), default="float32")
    p.add_argument("--autocast", choices=sorted(DTYPES), default="float32",
                   help="matmul precision of the drafter's forward/backward")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--no-progress", action="store_true")
    return p


def read_prompts(path: Path) -> list[str | list[int]]:
    """One prompt per line: JSON (string, or object with text or ids) or plain text."""
    prompts: list[str | list[int]] = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError:
            item = line
        if isinstance(item, dict):
            item = next(item[k] for k in ("prompt_token_ids", "ids", "prompt", "text")
                        if k in item)
        prompts.append(item if isinstance(item, str) else [int(t) for t in item])
    return prompts


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    return TrainConfig(
        target=args.target, out=args.out, steps=args.steps, block_size=args.block_size,
        layers=args.layers, head=args.head, gru_hidden_dim=args.gru_hidden_dim,
        emb_dim=args.emb_dim, markov_rank=args.markov_rank,
        confidence_head=args.confidence_head, confidence_weight=args.confidence_weight,
        intermediate_size=args.intermediate_size,
        target_layer_ids=tuple(args.target_layer_ids) if args.target_layer_ids else None,
        mask_token_id=args.mask_token_id, lr=args.lr, min_lr_ratio=args.min_lr_ratio,
        warmup_steps=args.warmup_steps, schedule=args.schedule,
        weight_decay=args.weight_decay, grad_clip=args.grad_clip, lambda0=args.lambda0,
        loss_gamma=args.loss_gamma, batch_size=args.batch_size,
        anchors_per_sequence=args.anchors_per_sequence, seq_len=args.seq_len,
        num_sequences=args.num_sequences, temperature=args.temperature,
        stop_at_eos=not args.ignore_eos, seed=args.seed, save_every=args.save_every,
        stop_after=args.stop_after, resume=args.resume, freeze_backbone=args.freeze_backbone, init_from=args.init_from,
        export_dtype=args.export_dtype, device=args.device,
        target_dtype=args.target_dtype, threads=args.threads, autocast=args.autocast,
        progress=not args.no_progress,
    )


def main(argv: list[str]) -> None:
    """Parse ``argv`` (without the subcommand), train, print where the drafter went."""
    from vllm_dartree.training.data import check_no_overlap, encode_prompts
    from vllm_dartree.training.train import train

    args = build_parser().parse_args(argv)
    cfg = config_from_args(args)
    prompt_ids = None
    if args.prompts is not None:
        prompts = read_prompts(args.prompts)
        if args.benchmark_prompts is not None:
            check_no_overlap(prompts, read_prompts(args.benchmark_prompts))
        texts = [p for p in prompts if isinstance(p, str)]
        encoded = iter(encode_prompts(args.target, texts, chat=not args.no_chat_template)
                       if texts else [])
        prompt_ids = [next(encoded) if isinstance(p, str) else p for p in prompts]
    elif args.benchmark_prompts is not None:
        raise SystemExit("--benchmark-prompts needs --prompts (random prompts cannot leak)")
    result = train(cfg, prompt_ids)
    print(f"drafter written to {result.drafter_dir} after {result.step} steps "
          f"({result.seconds:.1f} s)")
