"""``DARTreeProposer``: one drafter forward per step, one draft tree per request.

vLLM's V1 runner builds this proposer in place of its ``DFlashProposer`` for a dartree engine
(``runner.ProposerSwap``). It subclasses ``DFlashProposer``, so vLLM's own ``isinstance``
checks and DFlash plumbing (aux hidden states, drafter KV, padded batches) apply unchanged;
what differs is the query width (the checkpoint's block cut to the depths a tree of B
nodes can reach, not B itself) and what happens to the drafter's outputs: they become trees
(``drafting.TreeDrafting``, shared with the V2 speculator), handed to the engine's
:class:`~vllm_dartree.integration.step.TreeStep` for the next step's verification.
Acceptance is not here (``verifier.py``).

A step that does not draft (the adaptive budget's pause) owes the drafter's cache its
committed tokens' context K/V; :class:`PendingContext` keeps them and the next drafted step
writes them in one pass (see there why that is exact).
"""

from __future__ import annotations

import dataclasses
import time

import torch
from vllm.forward_context import set_forward_context
from vllm.v1.spec_decode.dflash import DFlashProposer
from vllm.v1.spec_decode.utils import PADDING_SLOT_ID

from vllm_dartree.checkpoint import DrafterLayout
from vllm_dartree.config import LAYOUT_ATTR
from vllm_dartree.integration.drafting import TreeDrafting
from vllm_dartree.integration.profile import StepProfile
from vllm_dartree.integration.step import TreeStep
from vllm_dartree.integration.verify_plan import needs_chain_verification


def same_on_every_rank(decision: bool) -> bool:
    """Rank 0's ``decision`` on every rank of the tensor-parallel group (itself at TP=1)."""
    from vllm.distributed.parallel_state import get_tp_group

    group = get_tp_group()
    if group.world_size == 1:
        return decision
    return bool(group.broadcast_object(decision, src=0))


class PendingContext:
    """Context the drafter's cache is owed: the target states, positions and cache slots of
    the tokens committed by steps that did not draft, in step order.

    Writing them late is exact. Only a drafted step's query reads the drafter's cache, and
    every drafted step first writes whatever is pending; each write goes to the same slot,
    in the same order, as it would have at its own step, so any slot a query reads holds
    the same K/V (a slot freed and handed to another request is overwritten by the newer
    write, as before). What it saves: per paused step the combining projection of the
    target's layers and the K/V projections of every drafter layer, each a weight read for
    a few rows (SmolLM2 pair on the CPU: 1.1 of 1.4 ms a step at batch 1, next to a 53 ms
    AR step), paid instead once per pause as a batched matmul. ``limit`` (vLLM's
    per-step token budget) bounds what is held: reaching it writes the lot.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.tokens = 0
        self._parts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def add(self, states: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor) -> bool:
        """Hold one step's context (copies: vLLM reuses these buffers); True when the
        held tokens reached ``limit`` and should be written now."""
        self._parts.append((states.clone(), positions.clone(), slots.clone()))
        self.tokens += states.shape[0]
        return self.tokens >= self.limit

    def take(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """Everything held, in step order, each slot once (None when nothing is held).

        A slot freed and handed to another request within one hold appears twice; one
        batched cache write with a repeated slot keeps either value (threads race), so only
        the last write of each slot is kept: the one that would have stood last."""
        parts, self._parts, self.tokens = self._parts, [], 0
        if not parts:
            return None
        states, positions, slots = (torch.cat(column) for column in zip(*parts))
        unique, which = torch.unique(slots, return_inverse=True)
        order = torch.arange(slots.numel(), device=slots.device)
        last = torch.full_like(unique, -1, dtype=order.dtype).scatter_reduce_(
            0, which, order, reduce="amax")
        keep = last.sort().values
        return states[keep], positions[keep], slots[keep]


class DARTreeProposer(DFlashProposer, TreeDrafting):
    """DFlash/Domino/DSpark drafter + DARTree (or chain/fixed/DDTree) tree building."""

    def __init__(self, vllm_config, device, runner=None):
        spec = vllm_config.speculative_config
        layout: DrafterLayout = getattr(spec, LAYOUT_ATTR)  # read and checked at config time
        # vLLM sizes the drafter's query buffers by num_speculative_tokens (B), but the
        # drafter queries a whole block per request: size them for the larger of the two.
        budget = spec.num_speculative_tokens
        object.__setattr__(spec, "num_speculative_tokens", max(budget, layout.block_size - 1))
        try:
            super().__init__(vllm_config, device, runner)
        finally:
            object.__setattr__(spec, "num_speculative_tokens", budget)
        self.target_runner = runner
        self.init_tree_drafting(vllm_config, device)
        self.tree_step: TreeStep | None = None  # the engine's step, set by runner.ProposerSwap
        self.pending_context = PendingContext(
            vllm_config.scheduler_config.max_num_batched_tokens)

    def load_model(self, target_model) -> None:
        super().load_model(target_model)
        self.load_tree_head()

    def propose(self, num_speculative_tokens, target_token_ids, target_positions,
                target_hidden_states, next_token_ids, token_indices_to_sample,
                common_attn_metadata, sampling_metadata, mm_embed_inputs=None,
                num_rejected_tokens_gpu=None, slot_mappings=None) -> torch.Tensor:
        started = time.perf_counter()
        target_hidden_states = self.tree_step.draft_context(target_hidden_states)
        if not self._drafts_this_step(next_token_ids.shape[0]):
            # Context only: the committed tokens' K/V are owed to the drafter's cache (the
            # next drafted step writes them), no block is queried, and the next step
            # verifies nothing (plain decoding).
            written_ms = self._hold_context(
                target_token_ids, target_positions, target_hidden_states, next_token_ids,
                common_attn_metadata, num_rejected_tokens_gpu)
            self.budget_policy.record_drafting(False, (time.perf_counter() - started) * 1e3,
                                               set_aside_ms=written_ms)
            return [[] for _ in range(next_token_ids.shape[0])]
        written_ms = self._write_pending_context()
        with StepProfile.phase("drafter_forward", self.device):
            depth_hidden = self._draft_block(
                target_token_ids, target_positions, target_hidden_states, next_token_ids,
                common_attn_metadata, num_rejected_tokens_gpu)
        depth_hidden = self.depth_hidden_of(depth_hidden)
        runner = self.target_runner
        req_ids = runner.input_batch.req_ids[: depth_hidden.shape[0]]
        # A batch vLLM verifies as a chain gets the drafter's best chain.
        chain = any(needs_chain_verification(getattr(runner.requests.get(r), "sampling_params",
                                                     None)) for r in req_ids)
        tree = self.build_trees(depth_hidden, next_token_ids, chain)
        chains = chain or self.settings.tree == "chain"
        if self.budget_policy is None:
            self.tree_step.hand_over(list(req_ids), tree, chains=chains)
            return tree.tokens
        tree = self.with_chain_confidence(tree, depth_hidden, next_token_ids)
        choice = self.budget_policy.choose(tree)
        self.budget_report.record(choice, self.budget_policy, self.tree_width)
        self.tree_step.hand_over(list(req_ids), choice.tree, chains=chains)
        tokens = choice.tree.tokens.tolist()
        self.budget_policy.record_drafting(True, (time.perf_counter() - started) * 1e3,
                                           set_aside_ms=written_ms)
        return [row[:count] for row, count in zip(tokens, choice.counts)]

    def _drafts_this_step(self, num_requests: int) -> bool:
        """The adaptive budget's call (always True without it); every tensor-parallel rank
        takes rank 0's, since the drafter's forward and logits run collectives."""
        policy = self.budget_policy
        if policy is None:
            return True
        drafting = same_on_every_rank(policy.should_draft(num_requests))
        if not drafting:
            self.budget_report.record_no_drafting()
        return drafting

    def _lay_out(self, target_token_ids, target_positions, target_hidden_states,
                 next_token_ids, cad, num_rejected_tokens_gpu, mask_slots: int,
                 combine: bool = True):
        """vLLM's DFlash input layout for this step: the context (every token the target
        computed) and a query of [root, mask x ``mask_slots``] per request. Returns the
        query's token count and attention metadata. ``combine=False`` leaves the target's
        states uncombined (a held context is combined when it is written)."""
        self.num_speculative_tokens = mask_slots  # vLLM's DFlash reads it as the mask count
        context = (self.model.combine_hidden_states(target_hidden_states) if combine
                   else target_hidden_states)
        num_tokens, _, draft_cad = self.set_inputs_first_pass(
            target_token_ids=target_token_ids, next_token_ids=next_token_ids,
            target_positions=target_positions, target_hidden_states=context,
            token_indices_to_sample=None, cad=cad, num_rejected_tokens_gpu=num_rejected_tokens_gpu,
        )
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

    def _write_pending_context(self) -> float:
        """Write every held context into the drafter's cache (one combining projection and
        one K/V pass over all of it); returns the ms it took."""
        held = self.pending_context.take()
        if held is None:
            return 0.0
        started = time.perf_counter()
        states, positions, slots = held
        with StepProfile.phase("drafter_forward", self.device):
            self.model.precompute_and_store_context_kv(
                self.model.combine_hidden_states(states), positions, slots)
        return (time.perf_counter() - started) * 1e3

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
        block = 1 + self.num_speculative_tokens
        return out[:num_tokens].view(-1, block, out.shape[-1])

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
