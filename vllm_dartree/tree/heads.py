"""The one interface the tree builders use for a causal correction head.

A correction head rescores the K base candidates of a depth for each parent on a branch,
from a per-branch state that has consumed the branch's tokens (the root included). Two
kinds implement it: Domino's GRU head (:class:`~vllm_dartree.tree.correction.DominoHead`)
and DSpark's Markov head (:class:`~vllm_dartree.tree.markov.MarkovHead`). The builders
(``chain``, ``fixed``, ``pruned``, ``sequential``) and the fixed-shape step wrapper
(:mod:`~vllm_dartree.tree.graphs`) see only this protocol, so neither has a case per kind.

Shapes: R requests, D depths, K candidates per depth, N parents per request at a depth;
S the state size, C the per-depth context size, W the candidate-weight size of the head.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch


@runtime_checkable
class CorrectionHead(Protocol):
    """Batched, candidate-restricted correction steps (pure torch, no host sync)."""

    @property
    def hidden_size(self) -> int | None:
        """H of the drafter hidden states the head reads; None if it reads none."""

    @property
    def device(self) -> torch.device: ...

    def corrects_depth(self, depth: int) -> bool:
        """Whether tree depth ``depth`` (1-based) gets the head's bias."""

    def root_state(self, root_tokens: torch.Tensor) -> torch.Tensor:
        """[R] -> [R, S]: the state of a branch holding only the root token."""

    def advance(self, states: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """states [R, N, S], tokens [R, N] -> the states after consuming each token."""

    def depth_context(self, draft_hidden: torch.Tensor) -> torch.Tensor:
        """[R, D, H] -> [R, D, C]: the part of each depth's bias shared by its parents
        (C may be 0 for a head that reads no hidden state)."""

    def candidate_weights(self, cand_ids: torch.Tensor) -> torch.Tensor:
        """[..., K] candidate token ids -> [..., K, W]: only the candidates' output rows."""

    def corrected_logprobs(self, base: torch.Tensor, context: torch.Tensor,
                           cand_weights: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
        """base [R, K] + the bias for N parents -> log-probs [R, N, K] normalised over K.
        context [R, C], cand_weights [R, K, W], states [R, N, S]."""
