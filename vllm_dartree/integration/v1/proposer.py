"""``DARTreeProposer``: one drafter forward per step, one draft tree per request.

vLLM's V1 runner builds this proposer in place of its ``DFlashProposer`` for a dartree engine
(``runner.ProposerSwap``). It subclasses ``DFlashProposer``, so vLLM's own ``isinstance``
checks and DFlash plumbing (aux hidden states, drafter KV, padded batches) apply unchanged;
what differs is the query width (the checkpoint's block cut to the depths a tree of B
nodes can reach, not B itself) and what happens to the drafter's outputs: they become trees
(``drafting.TreeDrafting``, shared with the V2 speculator), handed to the engine's
:class:`~vllm_dartree.step.tree_step.TreeStep` for the next step's verification.
Acceptance is not here (``verifier.py``).

A step that does not draft (adaptive verification's pause) owes the drafter's cache its
committed tokens' context K/V; ``drafting.PendingContext`` keeps them and the next drafted step
writes them in one pass (see there why that is exact).
"""

from __future__ import annotations

import dataclasses
import time

import torch
from vllm.forward_context import set_forward_context
from vllm.v1.spec_decode.dflash import DFlashProposer
from vllm.v1.spec_decode.utils import PADDING_SLOT_ID

from vllm_dartree.config import carried_layout, carried_settings
from vllm_dartree.integration.lora import use_base_layers
from vllm_dartree.integration.tensor_parallel import same_on_every_rank
from vllm_dartree.step.drafting import TreeDrafting
from vllm_dartree.step.profile import StepProfile


class DARTreeProposer(DFlashProposer, TreeDrafting):
    """DFlash/Domino/DSpark drafter + DARTree (or chain/fixed/DDTree) tree building."""

    def __init__(self, vllm_config, device, runner=None):
        spec = vllm_config.speculative_config
        # Set before vLLM's __init__, which sizes its buffers through num_speculative_tokens
        # (below): the most mask slots a step may query, the block's or B, whichever is
        # larger; vLLM's B itself is left as the user set it.
        self.max_mask_slots = max(carried_settings(spec).num_speculative_tokens,
                                  carried_layout(spec).block_size - 1)
        self.step_mask_slots: int | None = None  # the step being laid out (_lay_out)
        super().__init__(vllm_config, device, runner)
        self.target_runner = runner
        self.init_tree_drafting(vllm_config, device, same_on_every_rank)
        # self.tree_step, the engine's step, is set by runner.ProposerSwap.

    @property
    def num_speculative_tokens(self) -> int:
        """What vLLM's V1 DFlash reads under this name: mask slots per request. Its
        ``__init__`` sizes the query buffers (and registers kernel warmups) by it, and its
        ``set_inputs_first_pass`` lays out [root, mask x this] per request (vLLM 0.32/0.33,
        the releases with this runner). Ours varies by step (none on a step that does not
        draft, ``query_slots`` otherwise), so the name answers with the step's count while
        a step is laid out and with the most any step queries otherwise (buffer sizing).
        B itself stays ``SpeculativeConfig.num_speculative_tokens``."""
        if self.step_mask_slots is not None:
            return self.step_mask_slots
        return self.max_mask_slots

    @num_speculative_tokens.setter
    def num_speculative_tokens(self, value: int) -> None:
        """vLLM's ``SpecDecodeBaseProposer.__init__`` copies B here (its ``propose``, which
        this class replaces, the step's count); not kept: the getter answers from the
        mask slots above, and B is read from the settings where the tree needs it."""

    def load_model(self, target_model) -> None:
        super().load_model(target_model)
        use_base_layers(self.model)
        self.load_tree_head()

    def propose(self, num_speculative_tokens, target_token_ids, target_positions,
                target_hidden_states, next_token_ids, token_indices_to_sample,
                common_attn_metadata, sampling_metadata, mm_embed_inputs=None,
                num_rejected_tokens_gpu=None, slot_mappings=None) -> torch.Tensor:
        started = time.perf_counter()
        order = self.tree_step.accepted_order(target_hidden_states.shape[0])
        if order is not None:  # each accepted path's rows first, in path order
            target_hidden_states = target_hidden_states[order]
        if not self.drafts_this_step(next_token_ids.shape[0]):
            # Context only: the committed tokens' K/V are owed to the drafter's cache (the
            # next drafted step writes them), no block is queried, and the next step
            # verifies nothing (plain decoding).
            written_ms = self._hold_context(
                target_token_ids, target_positions, target_hidden_states, next_token_ids,
                common_attn_metadata, num_rejected_tokens_gpu)
            self.record_pause(started, written_ms)
            return [[] for _ in range(next_token_ids.shape[0])]
        written_ms = self._write_pending_context()
        with StepProfile.phase("drafter_forward", self.device):
            depth_hidden = self._draft_block(
                target_token_ids, target_positions, target_hidden_states, next_token_ids,
                common_attn_metadata, num_rejected_tokens_gpu)
        depth_hidden = self.depth_hidden_of(depth_hidden)
        runner = self.target_runner
        req_ids = runner.input_batch.req_ids[: depth_hidden.shape[0]]
        # Requests verified as chains get the drafter's best chain (the plan's verdict).
        chains = self.tree_step.chain_rows[: len(req_ids)]
        tree, counts = self.finish_proposal(depth_hidden, next_token_ids, req_ids, chains,
                                            started, written_ms)
        if counts is None:
            return tree.tokens
        return [row[:count] for row, count in zip(tree.tokens.tolist(), counts)]

    def _lay_out(self, target_token_ids, target_positions, target_hidden_states,
                 next_token_ids, cad, num_rejected_tokens_gpu, mask_slots: int,
                 combine: bool = True):
        """vLLM's DFlash input layout for this step: the context (every token the target
        computed) and a query of [root, mask x ``mask_slots``] per request. Returns the
        query's token count and attention metadata. ``combine=False`` leaves the target's
        states uncombined (a held context is combined when it is written)."""
        context = (self.model.combine_hidden_states(target_hidden_states) if combine
                   else target_hidden_states)
        self.step_mask_slots = mask_slots  # read by vLLM as num_speculative_tokens (above)
        try:
            num_tokens, _, draft_cad = self.set_inputs_first_pass(
                target_token_ids=target_token_ids, next_token_ids=next_token_ids,
                target_positions=target_positions, target_hidden_states=context,
                token_indices_to_sample=None, cad=cad,
                num_rejected_tokens_gpu=num_rejected_tokens_gpu)
        finally:
            self.step_mask_slots = None
        return num_tokens, draft_cad

    def _hold_context(self, *step_inputs) -> float:
        """A step that does not draft: its committed tokens' states, positions and slots
        are held for the drafter's cache (so a later block sees them) and no query runs.
        Returns the ms spent writing held context (when the hold reached its limit)."""
        self._lay_out(*step_inputs, mask_slots=0, combine=False)
        count = self._dflash_num_context  # the context rows DFlash's layout wrote
        full = self.pending_context.add(self._dflash_hidden_states[:count],
                                        self._context_positions_buffer[:count],
                                        self._context_slot_mapping_buffer[:count])
        return self._write_pending_context() if full else 0.0

    def _combine_held(self, states: torch.Tensor) -> torch.Tensor:
        """Held context is the target's states, uncombined (``_hold_context``): one
        combining projection over all of it when it is written."""
        return self.model.combine_hidden_states(states)

    def _draft_block(self, *step_inputs) -> torch.Tensor:
        """One drafter forward over [root, mask x query_slots]: its outputs [R, 1+slots, H]."""
        num_tokens, draft_cad = self._lay_out(*step_inputs, mask_slots=self.query_slots)
        draft_cad = self._fit_queries(num_tokens, draft_cad)
        _, per_layer = self.build_per_group_and_layer_attn_metadata(draft_cad)
        mode, num_input_tokens, across_dp = self._determine_batch_execution_and_padding(num_tokens)
        kwargs, slot_size = self.build_model_inputs_first_pass(num_tokens, num_input_tokens, None)
        with set_forward_context(
            per_layer, self.vllm_config, num_tokens=num_input_tokens,
            num_tokens_across_dp=across_dp, cudagraph_runtime_mode=mode,
            slot_mapping=self._get_slot_mapping(slot_size, draft_cad.slot_mapping),
        ):
            out = self.model(**kwargs)
        return out[:num_tokens].view(-1, 1 + self.query_slots, out.shape[-1])

    def _fit_queries(self, num_tokens: int, cad):
        """The query block of a request near ``max_model_len``, cut at the model length:
        queries past it write no K/V (its block-table row has no block there) and no query
        attends to them. The other requests' queries are unchanged, and so are the depths
        this request can still verify (the scheduler trims its tree to the rows that fit)."""
        limit = self.max_model_len
        if cad.max_seq_len <= limit:  # host int, the block included: nothing reaches it
            return cad
        cad.slot_mapping.masked_fill_(self.positions[:num_tokens] >= limit, PADDING_SLOT_ID)
        upper = cad.seq_lens_cpu_upper_bound
        return dataclasses.replace(
            cad, seq_lens=cad.seq_lens.clamp(max=limit), max_seq_len=min(cad.max_seq_len, limit),
            seq_lens_cpu_upper_bound=None if upper is None else upper.clamp(max=limit))
