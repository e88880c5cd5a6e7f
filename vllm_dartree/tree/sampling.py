"""The target's choice at every verify row: argmax, or a sample under temperature, top-k and
top-p, each request drawing from its own generator when it has a seed.

The filtering rules are vLLM's (so a tree step samples from exactly the distribution the
target alone would): top-k keeps every logit >= the k-th largest (ties stay); top-p then
drops, in ascending order of probability, the tokens whose cumulative probability is still
<= 1 - p, and always keeps the most likely token. Sampling is the exponential race
argmax(p / q), q ~ Exp(1).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

GREEDY_TEMPERATURE = 1e-5  # below this temperature a row takes the argmax (as in vLLM)


def filter_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor | None,
                       top_p: torch.Tensor | None) -> torch.Tensor:
    """logits [N, V] -> a copy with -inf outside each row's top-k / top-p set.

    ``top_k`` [N] (a value >= V keeps every token) and ``top_p`` [N] (1.0 keeps every
    token) may each be None.
    """
    if top_k is None and top_p is None:
        return logits
    ascending, order = logits.sort(dim=-1)
    vocab = logits.shape[-1]
    if top_k is not None:
        kth_largest = ascending.gather(1, (vocab - top_k.to(torch.int64)).clamp(0, vocab - 1)
                                       .unsqueeze(1))
        ascending = ascending.masked_fill(ascending < kth_largest, float("-inf"))
    if top_p is not None:
        mass_up_to = ascending.softmax(dim=-1).cumsum(dim=-1)
        outside = mass_up_to <= 1 - top_p.unsqueeze(1)
        outside[:, -1] = False  # the most likely token always stays
        ascending = ascending.masked_fill(outside, float("-inf"))
    return torch.empty_like(logits).scatter_(1, order, ascending)


def race_sample(probs: torch.Tensor,
                generators: Iterable[tuple[int | slice, torch.Generator]] = ()) -> torch.Tensor:
    """probs [..., V] -> one index per row, drawn from probs: the exponential race
    argmax(p / q), q ~ Exp(1). For each ``(rows, generator)`` pair, ``probs[rows]`` draws its
    noise from that generator (a request's own seed); every other row from the default RNG.
    (Pairs, not a dict: slices are unhashable before Python 3.12.)"""
    noise = torch.empty_like(probs).exponential_()
    for rows, generator in generators:
        noise[rows].exponential_(generator=generator)
    return (probs / noise).argmax(dim=-1)


def choose_tokens(logits: torch.Tensor, temperature: torch.Tensor | None,
                  top_k: torch.Tensor | None = None, top_p: torch.Tensor | None = None,
                  generators: Iterable[tuple[int | slice, torch.Generator]] = ()
                  ) -> torch.Tensor:
    """logits [N, V] and per-row settings [N] -> the target's token per row [N] int64.

    ``temperature`` None means every row is greedy. Rows with temperature below
    ``GREEDY_TEMPERATURE`` take the argmax; the others sample the filtered softmax.
    """
    greedy = logits.argmax(dim=-1)
    if temperature is None:
        return greedy
    temperature = temperature.float()
    is_greedy = temperature < GREEDY_TEMPERATURE
    scaled = logits.float() / torch.where(is_greedy, 1.0, temperature).unsqueeze(1)
    probs = filter_top_k_top_p(scaled, top_k, top_p).softmax(dim=-1)
    return torch.where(is_greedy, greedy, race_sample(probs, generators))


@torch.no_grad()
def sample_every_node(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    generators: dict[int, torch.Generator] | None = None,
) -> torch.Tensor:
    """logits [R, 1+B, V], temperature [R] -> one target token per node [R, 1+B] int64
    (request r draws from ``generators[r]`` when present)."""
    num_requests, size, vocab = logits.shape
    rows = [(slice(r * size, (r + 1) * size), g) for r, g in (generators or {}).items()]
    chosen = choose_tokens(logits.reshape(-1, vocab), temperature.repeat_interleave(size),
                           generators=rows)
    return chosen.view(num_requests, size)
