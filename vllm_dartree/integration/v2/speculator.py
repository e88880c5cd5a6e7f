"""``DARTreeSpeculator``: vLLM's V2 DFlash speculator with one tree per request.

vLLM's ``DFlashSpeculator.propose`` does the drafter's context K/V and its one query forward
as for DFlash; what differs:

- the drafter's context: the target's hidden states with each accepted path's rows first
  (the accepted paths' K/V were compacted to those rows' slots by the tree sampler);
- the query is [root, mask x ``query_slots``] (the block cut to the depths a tree of B nodes
  can reach), and its hidden states are kept instead of sampled (:meth:`_generate_draft`);
- those become trees (``drafting.TreeDrafting``), flattened depth-first into the B draft
  slots vLLM keeps on the device for the next step, their shapes handed to the engine's
  ``TreeStep`` for the next step's verify plan;
- with adaptive verification, each request's chosen node count rides on the input batch to
  vLLM's draft-token handler (``draft_counts``: the scheduler schedules that many), and a
  step that does not draft runs no query and holds its context K/V (``PendingContext``)
  for the next drafted step to write.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from vllm.config.compilation import CUDAGraphMode
from vllm.v1.attention.backends.utils import PAD_SLOT_ID
from vllm.v1.worker.gpu.model_states import resolve_model_state_cls
from vllm.v1.worker.gpu.spec_decode.dflash.speculator import DFlashSpeculator
from vllm.v1.worker.gpu.spec_decode.dflash2.speculator import DFlash2Speculator
from vllm.v1.worker.gpu.spec_decode.lilicorr.speculator import LiLiCorrSpeculator

from vllm_dartree.checkpoint import DFLASH2, LILICORR
from vllm_dartree.config import DARTreeConfigError, carried_layout, carried_settings
from vllm_dartree.integration.lora import use_base_layers
from vllm_dartree.integration.refusals import SUPPORTED_TEXT
from vllm_dartree.integration.tensor_parallel import same_on_every_rank
from vllm_dartree.integration.v2.draft_counts import COUNTS_ATTR
from vllm_dartree.integration.v2.lattice import LatticeDrafting
from vllm_dartree.integration.v2.model_state import STEP_ATTR, on_top_of
from vllm_dartree.step.drafting import TreeDrafting
from vllm_dartree.step.kv_mover import KvMover
from vllm_dartree.step.profile import StepProfile
from vllm_dartree.step.tree_step import TreeStep
from vllm_dartree.step.verifier import TreeVerifier


class DARTreeSpeculator(DFlashSpeculator, TreeDrafting):
    """DFlash/Domino/DSpark drafter + DARTree (or chain/fixed/DDTree) trees, on V2."""

    _speculator_name = "DARTree"

    def __new__(cls, vllm_config, *args: Any, **kwargs: Any) -> DARTreeSpeculator:
        """vLLM names one speculator class for the method; a lattice drafter (DFlash2,
        LiLiCorr) gets this class built on vLLM's own speculator for it (``v2.lattice``)."""
        if cls is DARTreeSpeculator:
            layout = carried_layout(vllm_config.speculative_config)
            if layout is not None and layout.has_lattice:
                cls = SPECULATOR_OF_LATTICE[layout.lattice]
        return super().__new__(cls)

    def __init__(self, vllm_config, device: torch.device) -> None:
        require_validated_settings(vllm_config)  # before vLLM loads any weight
        super().__init__(vllm_config, device)
        self.init_tree_drafting(vllm_config, device, same_on_every_rank)
        # The query block: root + the mask slots a tree can use (<= B, so vLLM's per-request
        # sample buffers, sized by B, hold it).
        self.num_query_per_req = 1 + self.query_slots
        self.tree_step = TreeStep(self.budget, device, TreeVerifier(), KvMover(),
                                  policy=self.policy)
        # The query's hidden states, kept by _generate_draft (a persistent buffer: a FULL
        # drafter graph replays _generate_draft into the same addresses).
        self.query_hidden = torch.zeros(self.max_num_reqs * self.num_query_per_req,
                                        self.hidden_size, dtype=self.dtype, device=device)
        self._holding = False  # this step does not draft: hold its context, skip the query
        self._written_ms = 0.0  # held context written this step (the hold was full)

    def load_model(self, target_model: torch.nn.Module) -> None:
        super().load_model(target_model)
        use_base_layers(self.model)
        self.load_tree_head()
        install_model_state(self.vllm_config, target_model, self.tree_step)

    def _generate_draft(self, num_reqs: int, num_tokens_padded: int, attn_metadata,
                        slot_mappings, num_tokens_across_dp,
                        cudagraph_runtime_mode: CUDAGraphMode = CUDAGraphMode.NONE) -> None:
        """The drafter's query forward; its outputs are kept for the trees (no sampling).
        None on a step that does not draft."""
        if self._holding:
            return
        if slot_mappings:
            self._write_nothing_past_the_limit(num_reqs, slot_mappings)
        hidden = self._run_model(num_tokens_padded, attn_metadata, slot_mappings,
                                 num_tokens_across_dp, cudagraph_runtime_mode)
        rows = min(num_tokens_padded, self.query_hidden.shape[0])
        self.query_hidden[:rows].copy_(hidden[:rows])

    def _precompute_context_kv(self, start: int, end: int, dummy_run: bool = False) -> None:
        """The step's context K/V into the drafter's cache; held instead on a step that does
        not draft, where every drafter layer is in one KV group (its slot mapping is held;
        a single tensor serves every layer)."""
        groups = self._layer_group_idx
        if not self._holding or dummy_run or (groups is not None and len(set(groups)) > 1):
            return super()._precompute_context_kv(start, end, dummy_run)
        full = self.pending_context.add(self.hidden_states[start:end],
                                        self.context_positions[start:end],
                                        self._context_slot_mappings[0][start:end])
        if full:
            self._written_ms += self._write_pending_context()

    def _write_nothing_past_the_limit(self, num_reqs: int, slot_mappings) -> None:
        """Queries at or past ``max_model_len`` write no drafter K/V.

        vLLM's DFlash clamps such a query's position to the limit but takes its slot from
        the unclamped position with the block index clamped to the request's last block:
        the write would land on a committed position's slot of that block. The root row
        sits below the limit, so query j's true position is the root's plus j. (Device
        arithmetic only: a captured drafter graph replays it.)"""
        block = self.num_query_per_req
        rows = num_reqs * block
        positions = self.input_buffers.positions[:rows].view(num_reqs, block)
        true_positions = positions[:, :1] + torch.arange(block, device=positions.device)
        past = (true_positions >= self.max_model_len).view(-1)
        for slots in {id(s): s for s in slot_mappings.values()}.values():
            slots[:rows].masked_fill_(past, PAD_SLOT_ID)

    def propose(self, input_batch, attn_metadata: dict[str, Any], slot_mappings,
                last_hidden_states: torch.Tensor, aux_hidden_states: list[torch.Tensor] | None,
                num_sampled: torch.Tensor, num_rejected: torch.Tensor, *args: Any,
                **kwargs: Any) -> torch.Tensor:
        started = time.perf_counter()
        order = self.tree_step.accepted_order(last_hidden_states.shape[0])
        if order is not None:  # each accepted path's rows first, in path order
            last_hidden_states = last_hidden_states[order]
            if aux_hidden_states:
                aux_hidden_states = [states[order] for states in aux_hidden_states]
        num_reqs = input_batch.num_reqs
        dummy = kwargs.get("dummy_run", False)
        drafting = dummy or self.drafts_this_step(num_reqs)
        # A paused step holds its context only where the query runs eagerly: a FULL drafter
        # graph writes the context rows inside the replay.
        self._holding = not drafting and self.query_cudagraph_manager_is_eager()
        self._written_ms = 0.0 if self._holding or dummy else self._write_pending_context()
        try:
            with StepProfile.phase("drafter_forward", self.device):
                super().propose(input_batch, attn_metadata, slot_mappings, last_hidden_states,
                                aux_hidden_states, num_sampled, num_rejected, *args, **kwargs)
        finally:
            self._holding = False
        if dummy or kwargs.get("num_speculative_tokens") == 0:
            return self.draft_tokens[:num_reqs]  # no query ran (0.33+: context only)
        if not drafting:  # the next step verifies nothing (plain decoding)
            setattr(input_batch, COUNTS_ATTR, [0] * num_reqs)
            self.record_pause(started, self._written_ms)
            return self.draft_tokens[:num_reqs]
        block = self.num_query_per_req
        query = self.query_hidden[: num_reqs * block].view(num_reqs, block, -1)
        roots = self.input_buffers.input_ids[: num_reqs * block: block]
        tree, counts = self.finish_proposal(
            self.depth_hidden_of(query), roots, list(input_batch.req_ids[:num_reqs]),
            self.tree_step.chain_rows[:num_reqs], started, self._written_ms)
        if counts is not None:
            setattr(input_batch, COUNTS_ATTR, counts)
        self.draft_tokens[:num_reqs].copy_(tree.tokens)
        return self.draft_tokens[:num_reqs]

    def query_cudagraph_manager_is_eager(self) -> bool:
        manager = self.query_cudagraph_manager
        return manager is None or getattr(manager, "cudagraph_mode", None) in (
            None, CUDAGraphMode.NONE)


class DARTreeDFlash2Speculator(LatticeDrafting, DARTreeSpeculator, DFlash2Speculator):
    """Trees over a DFlash2 drafter's selector lattice."""


class DARTreeLiLiCorrSpeculator(LatticeDrafting, DARTreeSpeculator, LiLiCorrSpeculator):
    """Trees over a LiLiCorr drafter's correlator lattice."""


SPECULATOR_OF_LATTICE: dict[str, type[DARTreeSpeculator]] = {
    DFLASH2: DARTreeDFlash2Speculator, LILICORR: DARTreeLiLiCorrSpeculator}


def install_model_state(vllm_config, target_model: torch.nn.Module, step: TreeStep) -> None:
    """vLLM builds the target's model state right after the speculator loads
    (``resolve_model_state_cls`` honours a model's ``get_model_state_cls``): ours, sharing
    this engine's step, over the one vLLM would have chosen, asked first.

    Not a declared patch (``activation.declared_patches``), by design: this sets vLLM's
    per-model hook on this engine's own target model instance. No vLLM module or class
    changes, another engine of the process keeps its own model, and the hook goes with
    the model, so there is nothing process-wide to revert."""
    stock = resolve_model_state_cls(vllm_config, target_model)
    setattr(target_model, STEP_ATTR, step)
    state_cls = on_top_of(stock)
    target_model.get_model_state_cls = lambda: state_cls


def require_validated_settings(vllm_config) -> None:
    """A dartree speculator only from settings the plugin validated (refused otherwise, when
    vLLM builds the speculator)."""
    settings = carried_settings(vllm_config.speculative_config)
    if settings is None:
        raise DARTreeConfigError(
            "speculative method 'dartree' reached vLLM without its validated settings: build "
            "dartree engines through EngineArgs (vllm serve, LLM(...), AsyncEngineArgs), "
            f"whose speculative_config the plugin reads; {SUPPORTED_TEXT}")
