"""Training data: the target's own continuations, its layer outputs, and anchor sampling.

The drafter learns to predict what the target itself generates, so responses come from the
target (greedy or sampled), never from a dataset's reference answers. Features are the
outputs of the target's decoder layers ``target_layer_ids`` before the final norm, captured
with forward hooks: that is what vLLM hands the drafter (aux hidden state ``id + 1`` is the
input of layer ``id + 1``), also for the last layer, whose HF ``hidden_states`` entry is
already normed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

PromptLike = str | Sequence[int]


# ---------------------------------------------------------------------------- overlap
class PromptOverlapError(ValueError):
    """Benchmark prompts leaked into the training prompts."""


def _normalise(prompt: PromptLike) -> str:
    if isinstance(prompt, str):
        return re.sub(r"\s+", " ", prompt).strip().casefold()
    return " ".join(str(int(t)) for t in prompt)  # token ids: exact sequence match


def check_no_overlap(
    train_prompts: Iterable[PromptLike],
    benchmark_prompts: Iterable[PromptLike],
    min_contained_chars: int = 32,
) -> None:
    """Raise :class:`PromptOverlapError` if a benchmark prompt appears among the training ones.

    Texts are compared after collapsing whitespace and case; a benchmark text of at least
    ``min_contained_chars`` characters also counts as leaked when it is contained in a
    training prompt (e.g. wrapped in a chat template). Token-id prompts must match exactly.
    """
    train = [_normalise(p) for p in train_prompts]
    exact = set(train)
    haystack = "\x00".join(train)
    leaked = []
    for prompt in benchmark_prompts:
        key = _normalise(prompt)
        if not key:
            continue
        contained = (isinstance(prompt, str) and len(key) >= min_contained_chars
                     and key in haystack)
        if key in exact or contained:
            leaked.append(key)
    if leaked:
        examples = "; ".join(repr(k[:60]) for k in leaked[:3])
        raise PromptOverlapError(
            f"{len(leaked)} benchmark prompt(s) appear in the training prompts, e.g. {examples}"
        )


# ------------------------------------------------------------------------------ target
def load_target(target_dir: str | Path, dtype: torch.dtype = torch.float32,
                device: str = "cpu"):
    """Any causal LM transformers can load (Qwen3, Llama, ...), in eval mode, no grads."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=dtype)
    model.eval().requires_grad_(False)
    return model.to(device)


def target_config(target_dir: str | Path) -> dict:
    return json.loads((Path(target_dir) / "config.json").read_text())


def decoder_layers(model) -> torch.nn.ModuleList:
    """The decoder stack of a HF causal LM (``model.model.layers`` for Llama/Qwen)."""
    inner = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    return inner.layers


def encode_prompts(target_dir: str | Path, texts: Sequence[str], chat: bool = True
                   ) -> list[list[int]]:
    """Tokenise text prompts with the target's tokenizer (chat template, thinking off)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(target_dir))
    if not chat or tok.chat_template is None:
        return [tok.encode(t) for t in texts]
    out = []
    for text in texts:
        rendered = tok.apply_chat_template(
            [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True,
            enable_thinking=False,
        )
        out.append(tok.encode(rendered, add_special_tokens=False))
    return out


@dataclass
class SequenceSet:
    """Prompt + target continuation per sequence (1-D int64), and where the response starts."""

    sequences: list[torch.Tensor]
    prompt_lens: list[int]

    def __len__(self) -> int:
        return len(self.sequences)

    def save(self, path: Path) -> None:
        torch.save({"sequences": self.sequences, "prompt_lens": self.prompt_lens}, path)

    @classmethod
    def load(cls, path: Path) -> SequenceSet:
        data = torch.load(path, weights_only=True)
        return cls(list(data["sequences"]), list(data["prompt_lens"]))


@torch.no_grad()
def generate_responses(
    model,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    *,
    temperature: float = 0.0,
    batch_size: int = 32,
    seed: int = 0,
    stop_at_eos: bool = True,
    progress: bool = False,
) -> SequenceSet:
    """Continue every prompt with the target itself (HF ``generate``, left-padded batches)."""
    from tqdm.auto import tqdm

    eos = model.generation_config.eos_token_id if stop_at_eos else None
    eos_ids = set([eos] if isinstance(eos, int) else (eos or []))
    pad = model.generation_config.pad_token_id
    pad = pad if isinstance(pad, int) else next(iter(eos_ids), 0)
    # Batches of equal prompt length need no padding (exact positions, fewer wasted rows).
    order = sorted(range(len(prompts)), key=lambda i: (len(prompts[i]), i))
    sequences: dict[int, torch.Tensor] = {}
    batches = [order[i: i + batch_size] for i in range(0, len(order), batch_size)]
    for b, batch in enumerate(tqdm(batches, desc="generate", disable=not progress)):
        width = max(len(prompts[i]) for i in batch)
        ids = torch.full((len(batch), width), pad, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, i in enumerate(batch):
            ids[row, width - len(prompts[i]):] = torch.tensor(list(prompts[i]))
            mask[row, width - len(prompts[i]):] = 1
        torch.manual_seed(seed * 1_000_003 + b)  # sampling noise per batch, resumable
        out = model.generate(
            ids.to(model.device), attention_mask=mask.to(model.device), max_new_tokens=max_new_tokens,
            do_sample=temperature > 0, temperature=temperature if temperature > 0 else None,
            top_k=None, top_p=None, pad_token_id=pad, eos_token_id=eos,
        )
        for row, i in enumerate(batch):
            sequences[i] = torch.cat(
                [torch.tensor(list(prompts[i])), _until_eos(out[row, width:].cpu(), eos_ids)])
    return SequenceSet([sequences[i] for i in range(len(prompts))],
                       [len(p) for p in prompts])


def _until_eos(response: torch.Tensor, eos_ids: set[int]) -> torch.Tensor:
    """The response up to and including its first eos (generate pads after it)."""
    for j, token in enumerate(response.tolist()):
        if token in eos_ids:
            return response[: j + 1]
    return response


@torch.no_grad()
def target_features(
    model, tokens: torch.Tensor, layer_ids: Sequence[int], lengths: torch.Tensor | None = None
) -> torch.Tensor:
    """[N, T] right-padded ids -> [N, T, len(layer_ids) * H] float32 outputs of those
    decoder layers, on the target's device.

    Right padding leaves every real position unchanged in a causal model, so positions are
    plain 0..T-1 as at inference.
    """
    layers = decoder_layers(model)
    captured: dict[int, torch.Tensor] = {}

    def hook(index: int):
        def save(_module, _inputs, output):
            captured[index] = output[0] if isinstance(output, tuple) else output
        return save

    handles = [layers[i].register_forward_hook(hook(i)) for i in layer_ids]
    try:
        mask = None
        if lengths is not None:
            mask = (torch.arange(tokens.shape[1]) < lengths.unsqueeze(1)).long()
            mask = mask.to(model.device)
        model(input_ids=tokens.to(model.device), attention_mask=mask, use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    return torch.cat([captured[i].float() for i in layer_ids], dim=-1)


def pad_batch(sequences: Sequence[torch.Tensor], pad: int = 0
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad to [N, T]; also return the lengths [N]."""
    lengths = torch.tensor([len(s) for s in sequences])
    out = torch.full((len(sequences), int(lengths.max())), pad, dtype=torch.long)
    for row, seq in enumerate(sequences):
        out[row, : len(seq)] = seq
    return out, lengths


def sample_anchors(
    prompt_lens: torch.Tensor, lengths: torch.Tensor, per_sequence: int,
    generator: torch.Generator,
) -> torch.Tensor:
    """[N] -> [N, A] anchors p, uniform over the response: p in [prompt_len, length - 2].

    At inference the root x_p is always a target-produced token (the first one right after
    the prompt) and the drafter sees the target's states at positions < p. Sequences with
    fewer candidate anchors than ``per_sequence`` repeat some.
    """
    low = prompt_lens.clamp(min=1)
    count = (lengths - 1 - low).clamp(min=1)  # p = length - 2 still has one label
    draws = torch.rand(len(lengths), per_sequence, generator=generator)
    return (low.unsqueeze(1) + (draws * count.unsqueeze(1)).long()).clamp(
        max=(lengths - 1).unsqueeze(1))


