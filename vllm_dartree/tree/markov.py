"""DSpark's Markov correction head (low-rank transition bias), pure torch.

DSpark (deepseek-ai/DeepSpec ``VanillaMarkov``; vLLM ``qwen3_dspark.DSparkMarkovHead`` and
``dspark/speculator.py``) adds to the base logits of each draft slot a bias that depends
only on the token chosen at the slot before: ``bias = scale * markov_w2 . markov_w1[prev]``
(``scale``: the drafter's logit scale, applied to base logits and bias alike). The first
slot's ``prev`` is the anchor, i.e. the tree's root (the last verified token), so every
depth is corrected. On a tree the state of a branch is the Markov embedding of its last
token; advancing it is a row gather that ignores the previous state.

Only the K candidates of a depth are scored: their markov_w2 rows are gathered once per
depth (vLLM's ``apply_bias_gathered`` does the same for its top-k chain).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class MarkovHead:
    """Weights of a DSpark Markov head (names follow the checkpoint)."""

    markov_w1: torch.Tensor  # [V, r] embedding of the previous token (target vocabulary)
    markov_w2: torch.Tensor  # [V', r] r -> V' bias rows (draft vocabulary)
    scale: float = 1.0  # the drafter's logit_scale
    # [V] the markov_w2 row of each target token when V' < V (from the checkpoint's d2t);
    # tokens outside the draft vocabulary map to row 0: their base logit is -inf anyway.
    draft_row_of_target: torch.Tensor | None = None

    def __post_init__(self) -> None:
        rank = self.markov_w1.shape[1]
        if self.markov_w2.dim() != 2 or self.markov_w2.shape[1] != rank:
            raise ValueError(f"markov_w2 must be [V', r] with r = {rank}, got "
                             f"{list(self.markov_w2.shape)}")
        rows = self.draft_row_of_target
        if rows is None and self.markov_w2.shape[0] != self.vocab_size:
            raise ValueError(f"markov_w2 has {self.markov_w2.shape[0]} rows for a "
                             f"{self.vocab_size}-token vocabulary: a reduced draft "
                             "vocabulary needs draft_row_of_target")
        if rows is not None and rows.shape != (self.vocab_size,):
            raise ValueError(f"draft_row_of_target must be [V] = [{self.vocab_size}], got "
                             f"{list(rows.shape)}")

    @property
    def vocab_size(self) -> int:
        return self.markov_w1.shape[0]

    @property
    def hidden_size(self) -> None:
        return None  # the Markov bias reads no drafter hidden state

    @property
    def device(self) -> torch.device:
        return self.markov_w1.device

    def corrects_depth(self, depth: int) -> bool:
        return True  # depth 1 is corrected too: its previous token is the root

    # ----------------------------------------------------------------------- states
    def root_state(self, root_tokens: torch.Tensor) -> torch.Tensor:
        """[R] -> [R, r]: the Markov embedding of the root (DSpark's anchor)."""
        return self.markov_w1[root_tokens]

    def advance(self, states: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """[R, N, r], [R, N] -> [R, N, r]: memoryless, the embedding of the new token."""
        return self.markov_w1[tokens]

    # ----------------------------------------------------------------------- scoring
    def depth_context(self, draft_hidden: torch.Tensor) -> torch.Tensor:
        """[R, D, H] -> [R, D, 0]: nothing of the bias is shared by a depth's parents."""
        return draft_hidden.new_zeros(*draft_hidden.shape[:2], 0)

    def candidate_weights(self, cand_ids: torch.Tensor) -> torch.Tensor:
        """[..., K] target ids -> [..., K, r]: the candidates' markov_w2 rows."""
        rows = cand_ids if self.draft_row_of_target is None else self.draft_row_of_target[
            cand_ids]
        return self.markov_w2[rows]

    def candidate_bias(self, states: torch.Tensor, cand_weights: torch.Tensor) -> torch.Tensor:
        """states [R, N, r], cand_weights [R, K, r] -> bias [R, N, K]."""
        return self.scale * (states @ cand_weights.transpose(1, 2))

    def corrected_logprobs(self, base: torch.Tensor, context: torch.Tensor,
                           cand_weights: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
        """base [R, K] + the bias for N parents -> log-probs [R, N, K] normalised over K
        (``context`` is the empty [R, 0] of :meth:`depth_context`)."""
        logits = base.unsqueeze(1) + self.candidate_bias(states, cand_weights).to(base.dtype)
        return torch.log_softmax(logits, dim=-1)

    def full_bias(self, prev_tokens: torch.Tensor) -> torch.Tensor:
        """Reference full-draft-vocabulary bias: [...] previous tokens -> [..., V']."""
        return self.scale * (self.markov_w1[prev_tokens] @ self.markov_w2.T)

    # ---------------------------------------------------------------------- helpers
    @staticmethod
    def draft_rows_from_d2t(d2t: torch.Tensor, vocab_size: int) -> torch.Tensor:
        """[V'] d2t offsets (draft id i is target id i + d2t[i]) -> [V] draft row per
        target id (0 for target ids outside the draft vocabulary)."""
        draft_ids = torch.arange(d2t.shape[0], device=d2t.device)
        rows = torch.zeros(vocab_size, dtype=torch.int64, device=d2t.device)
        return rows.index_copy(0, draft_ids + d2t.to(torch.int64), draft_ids)

    @classmethod
    def random(cls, vocab: int, rank: int, *, generator: torch.Generator | None = None,
               scale: float = 1.0) -> MarkovHead:
        """Random full-vocabulary weights with roughly unit-variance biases (tests)."""
        return cls(
            markov_w1=torch.randn(vocab, rank, generator=generator),
            markov_w2=torch.randn(vocab, rank, generator=generator) / rank**0.5,
            scale=scale,
        )
