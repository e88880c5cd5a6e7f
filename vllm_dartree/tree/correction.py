"""Domino correction head (GRU over realised tokens + low-rank vocabulary bias), pure torch.

One of the two :class:`~vllm_dartree.tree.heads.CorrectionHead` kinds (the other is DSpark's
Markov head, :mod:`vllm_dartree.tree.markov`).

The head rescores drafter candidates along a branch: its GRU state has consumed the target
embeddings of every token on the branch (root included), and the additive bias for a slot
is ``SiLU(proj0 . [z ; s]) . proj2^T`` with z the drafter hidden state of that slot.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F


@torch.no_grad()
def input_gate_table(embed_rows: Callable[[torch.Tensor], torch.Tensor], gru_ih: torch.Tensor,
                     vocab_size: int, chunk: int = 8192) -> torch.Tensor:
    """[V, 3G] = embed(v) . W_ih^T for every token v, ``chunk`` tokens at a time.

    ``embed_rows(ids)`` returns the embedding rows of ``ids``: a tensor lookup, or an
    embedding module whose forward gathers rows from a vocabulary-sharded table.
    """
    return torch.cat([embed_rows(torch.arange(start, min(start + chunk, vocab_size),
                                              device=gru_ih.device)) @ gru_ih.T
                      for start in range(0, vocab_size, chunk)])


@dataclass
class DominoHead:
    """Weights of a Domino head (names follow the checkpoint, shapes documented inline)."""

    # [V, H] the target's token embedding (GRU input); None when ``input_gate_table`` is given
    # (a tensor-parallel engine holds only a shard of the embedding).
    embed: torch.Tensor | None
    gru_ih: torch.Tensor  # [3G, H] nn.GRU weight_ih_l0, gate rows r, z, n
    gru_hh: torch.Tensor  # [3G, G] nn.GRU weight_hh_l0
    proj0: torch.Tensor  # [E, H+G] embed_proj.0; first H columns act on z, last G on s
    proj2: torch.Tensor  # [V, E] embed_proj.2
    # Leading draft slots left uncorrected (the checkpoint's dflash_config field; its default
    # when absent is set once, in vllm_dartree.checkpoint).
    pure_draft_prefix_len: int
    # Optional [V, 3G] table embed . gru_ih^T (DARTree's fast path): a GRU step becomes a row
    # gather plus the [3G, G] recurrent matmul. Build it with ``with_input_gate_table``.
    input_gate_table: torch.Tensor | None = None

    def __post_init__(self) -> None:
        hidden = self.gru_ih.shape[1]
        state = self.gru_hh.shape[1]
        if self.embed is None and self.input_gate_table is None:
            raise ValueError("a DominoHead needs the embedding or its input_gate_table")
        if self.embed is not None and self.embed.shape[1] != hidden:
            raise ValueError(f"embed must be [V, H] with H = {hidden}, got "
                             f"{list(self.embed.shape)}")
        if self.gru_ih.shape != (3 * state, hidden):
            raise ValueError(f"gru_ih must be [3G, H] = {[3 * state, hidden]}, got "
                             f"{list(self.gru_ih.shape)}")
        if self.proj0.shape[1] != hidden + state:
            raise ValueError(f"proj0 must have H+G = {hidden + state} columns, got "
                             f"{self.proj0.shape[1]}")
        if self.proj2.shape[1] != self.proj0.shape[0]:
            raise ValueError(f"proj2 must be [V, E] with E = {self.proj0.shape[0]}, got "
                             f"{list(self.proj2.shape)}")
        table = self.input_gate_table
        if table is not None and table.shape != (self.vocab_size, 3 * state):
            raise ValueError(f"input_gate_table must be [V, 3G] = "
                             f"{[self.vocab_size, 3 * state]}, got {list(table.shape)}")
        if self.pure_draft_prefix_len < 0:
            raise ValueError(f"pure_draft_prefix_len must be >= 0, got "
                             f"{self.pure_draft_prefix_len}")

    @property
    def hidden_size(self) -> int:
        return self.gru_ih.shape[1]

    @property
    def vocab_size(self) -> int:
        return self.proj2.shape[0]

    @property
    def device(self) -> torch.device:
        return self.proj0.device

    @property
    def state_size(self) -> int:
        return self.gru_hh.shape[1]

    @property
    def proj_z(self) -> torch.Tensor:
        """[E, H] the part of proj0 that acts on the drafter hidden state."""
        return self.proj0[:, : self.hidden_size]

    @property
    def proj_s(self) -> torch.Tensor:
        """[E, G] the part of proj0 that acts on the GRU state."""
        return self.proj0[:, self.hidden_size :]

    def corrects_depth(self, depth: int) -> bool:
        """Whether tree depth ``depth`` (1-based; draft slot depth-1) gets the bias."""
        return depth - 1 >= self.pure_draft_prefix_len

    # ----------------------------------------------------------------------------- GRU
    def gru_step(self, x_emb: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """One nn.GRU(bias=False) step: x_emb [..., H], h [..., G] -> h' [..., G]."""
        return self.gru_step_from_gates(x_emb @ self.gru_ih.T, h)

    def gru_step_from_gates(self, input_gates: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """GRU step given the input projection W_ih x [..., 3G] (lets callers batch it)."""
        in_r, in_z, in_n = input_gates.chunk(3, dim=-1)
        hid_r, hid_z, hid_n = (h @ self.gru_hh.T).chunk(3, dim=-1)
        reset = torch.sigmoid(in_r + hid_r)
        update = torch.sigmoid(in_z + hid_z)
        candidate = torch.tanh(in_n + reset * hid_n)
        return (1 - update) * candidate + update * h

    def input_gates(self, tokens: torch.Tensor) -> torch.Tensor:
        """[...] token ids -> W_ih . emb(token) [..., 3G] (a table gather when available)."""
        if self.input_gate_table is not None:
            return self.input_gate_table[tokens]
        return self.embed[tokens] @ self.gru_ih.T

    def with_input_gate_table(self, chunk: int = 8192) -> DominoHead:
        """A copy of the head with ``input_gate_table`` computed (once per model)."""
        table = input_gate_table(lambda ids: self.embed[ids], self.gru_ih, self.vocab_size,
                                 chunk)
        return replace(self, input_gate_table=table)

    def root_state(self, root_tokens: torch.Tensor) -> torch.Tensor:
        """[R] -> [R, G]: the state after consuming the root token from a zero state.

        With h = 0 the recurrent term W_hh h is 0, so it is left out (the same values as
        :meth:`gru_step_from_gates` with a zero state, without its [G, 3G] matmul)."""
        in_r, in_z, in_n = self.input_gates(root_tokens).chunk(3, dim=-1)
        del in_r  # the reset gate only scales W_hh h, which is 0
        return (1 - torch.sigmoid(in_z)) * torch.tanh(in_n)

    def advance(self, h: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """h [R, N, G], tokens [R, N] -> the states after consuming each token."""
        return self.gru_step_from_gates(self.input_gates(tokens), h)

    # ------------------------------------------------------------------------ scoring
    def project_hidden(self, z_hidden: torch.Tensor) -> torch.Tensor:
        """[..., H] -> [..., E]: W_z . z, shared by every parent of a depth."""
        return z_hidden @ self.proj_z.T

    def depth_context(self, draft_hidden: torch.Tensor) -> torch.Tensor:
        """[R, D, H] -> [R, D, E]: W_z . z of every depth (the CorrectionHead context)."""
        return self.project_hidden(draft_hidden.to(self.proj0.dtype))

    def candidate_weights(self, cand_ids: torch.Tensor) -> torch.Tensor:
        """[..., K] -> [..., K, E]: only the proj2 rows of the candidates."""
        return self.proj2[cand_ids]

    def bias_from_parts(
        self, z_proj: torch.Tensor, h: torch.Tensor, cand_weights: torch.Tensor
    ) -> torch.Tensor:
        """z_proj [R, E], h [R, N, G], cand_weights [R, K, E] -> bias [R, N, K]."""
        mid = F.silu(z_proj.unsqueeze(1) + h @ self.proj_s.T)
        return mid @ cand_weights.transpose(1, 2)

    def corrected_logprobs(self, base: torch.Tensor, z_proj: torch.Tensor,
                           cand_weights: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """base [R, K] + the bias for N parents -> log-probs [R, N, K] normalised over K."""
        logits = base.unsqueeze(1) + self.bias_from_parts(z_proj, h, cand_weights)
        return torch.log_softmax(logits, dim=-1)

    def candidate_bias(
        self, z_hidden: torch.Tensor, h: torch.Tensor, cand_ids: torch.Tensor
    ) -> torch.Tensor:
        """z_hidden [R, H], h [R, N, G], cand_ids [R, K] -> bias of each candidate [R, N, K]."""
        return self.bias_from_parts(
            self.project_hidden(z_hidden), h, self.candidate_weights(cand_ids)
        )

    def full_bias(self, z_hidden: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """Reference full-vocabulary bias: z [..., H], h [..., G] -> [..., V]."""
        return F.silu(torch.cat([z_hidden, h], dim=-1) @ self.proj0.T) @ self.proj2.T

    @classmethod
    def random(
        cls,
        vocab: int,
        hidden: int,
        state: int,
        proj: int,
        *,
        pure_draft_prefix_len: int = 1,
        generator: torch.Generator | None = None,
        scale: float = 1.0,
    ) -> DominoHead:
        """Random weights with roughly unit-variance activations (tests, benchmarks)."""

        def rand(*shape: int, fan_in: int) -> torch.Tensor:
            return torch.randn(*shape, generator=generator) * (scale / fan_in**0.5)

        return cls(
            embed=torch.randn(vocab, hidden, generator=generator),
            gru_ih=rand(3 * state, hidden, fan_in=hidden),
            gru_hh=rand(3 * state, state, fan_in=state),
            proj0=rand(proj, hidden + state, fan_in=hidden + state),
            proj2=rand(vocab, proj, fan_in=proj),
            pure_draft_prefix_len=pure_draft_prefix_len,
        )
