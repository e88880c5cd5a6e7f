"""``DARTreeModelState``: the target side of a tree step on vLLM's V2 runner.

vLLM's V2 runner asks the target's model state for the step's attention metadata
(``prepare_attn``), for input overrides (``prepare_inputs``) and for its samplers
(``custom_sampler``). ``DARTreeModelState`` adds, on top of the model state vLLM itself
chose for the target (:func:`on_top_of`: ``DefaultModelState`` for attention models; a hybrid
target's ``MambaHybridModelState`` keeps its recurrent-state bookkeeping, which a plain
default state would silently drop), per step:

- ``prepare_attn``: the verify plan (``TreeStep.plan``) laid over vLLM's batch, handed to
  the attention backends on the target layers' own metadata objects, and the target layers'
  KV caches and slot mappings recorded for the compaction after acceptance;
- ``prepare_inputs``: depth positions (root + node depth) for the tree rows, in one
  persistent buffer (graph replays read captured addresses); ``input_batch.positions``
  stays sequential, so slot mappings, the sampler's bookkeeping and the drafter's context
  see sequential positions. An M-RoPE target reads vLLM's per-axis positions buffer
  (``RopeState``, rebuilt every step): its tree rows get root + depth on every axis, in
  that buffer;
- ``custom_sampler``: ``sampler.TreeRejectionSampler``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from vllm_dartree.config import DARTreeConfigError
from vllm_dartree.integration import gdn_rows
from vllm_dartree.step import tree_context
from vllm_dartree.step.kv_mover import target_attention_layers, target_layers_kv
from vllm_dartree.step.tree_step import STEP_ATTR, TreeStep
from vllm_dartree.step.verify_plan import (
    VerifyPlan,
    set_depth_positions,
    verifies_as_chain,
    write_depth_positions,
)

_COMPOSED: dict[type, type] = {}


class DARTreeModelState:
    """The tree step's hooks; a mixin over vLLM's model state (built by :func:`on_top_of`),
    every hook calling vLLM's first."""

    def __init__(self, vllm_config, model, encoder_cache, device) -> None:
        super().__init__(vllm_config, model, encoder_cache, device)
        self.tree_step: TreeStep = getattr(model, STEP_ATTR)
        self.vllm_config = vllm_config
        max_tokens = vllm_config.scheduler_config.max_num_batched_tokens
        self.positions = torch.zeros(max_tokens, dtype=torch.int64, device=device)
        # Per request-state row: its drafts are a chain of its own (bad words, a grammar, a
        # thinking budget), whose rows vLLM's sampler processes in chain order.
        self.chain_request = np.zeros(vllm_config.scheduler_config.max_num_seqs, dtype=bool)
        self.plan: VerifyPlan | None = None  # this step's, between prepare_attn and sampling
        self.recurrent_layers: list[tuple[Any, Any]] = []  # this step's GDN (layer, metadata)

    def add_request(self, req_index: int, new_req_data) -> None:
        super().add_request(req_index, new_req_data)
        self.chain_request[req_index] = verifies_as_chain(new_req_data.sampling_params)

    def prepare_attn(self, input_batch, *args: Any, **kwargs: Any) -> dict[str, Any]:
        metadata = super().prepare_attn(input_batch, *args, **kwargs)
        num_reqs = input_batch.num_reqs
        drafts = input_batch.num_draft_tokens_per_req
        chains = self.chain_request[input_batch.idx_mapping_np[:num_reqs]].tolist()
        self.tree_step.plan(list(input_batch.req_ids[:num_reqs]),
                       None if drafts is None else drafts[:num_reqs].tolist(),
                       input_batch.num_scheduled_tokens[:num_reqs],
                       DraftsInBatch(input_batch), verify_as_chain=False, chain_rows=chains)
        # The drafter builds its own metadata; its layers are marked ``is_draft_layer``.
        layers = self.vllm_config.compilation_config.static_forward_context
        self.plan = self.tree_step.verify_forward(lambda: target_layers_kv(metadata, layers))
        recurrent = gdn_rows.gdn_layers(metadata, layers)
        self.recurrent_layers = recurrent if self.plan else []
        # Also without a plan (None): a backend may hand out the same metadata object again.
        target = target_attention_layers(metadata, layers)
        tree_context.attach({id(m): m for _, m in [*target, *recurrent]}.values(), self.plan)
        return metadata

    def commit_recurrent_state(self, paths) -> None:
        """After acceptance: a hybrid target's GDN state and conv window of each accepted
        path where the next step reads them (``gdn_rows.commit_accepted_paths``)."""
        layers, self.recurrent_layers = self.recurrent_layers, []
        gdn_rows.commit_accepted_paths(layers, paths)

    def prepare_inputs(self, input_batch, req_states) -> dict[str, Any]:
        inputs = super().prepare_inputs(input_batch, req_states)
        count = input_batch.num_tokens_after_padding
        # 1-D depth positions: the target's (without M-RoPE) and the tree sampler's.
        positions = write_depth_positions(self.positions, input_batch.positions[:count],
                                          self.plan)
        self.tree_step.forward_begins()  # vLLM runs the target forward next
        if "positions" in inputs:  # M-RoPE: [axes, count], vLLM's own persistent buffer
            set_depth_positions(inputs["positions"], self.plan)
            return inputs
        return {**inputs, "positions": positions}

    def prepare_dummy_inputs(self, num_reqs: int, num_tokens: int) -> dict[str, Any]:
        inputs = super().prepare_dummy_inputs(num_reqs, num_tokens)
        return inputs if "positions" in inputs else {**inputs,
                                                     "positions": self.positions[:num_tokens]}

    def custom_sampler(self, sampler: Any) -> tuple[Any, Any]:
        from vllm_dartree.integration.v2.sampler import TreeRejectionSampler

        # vLLM's state may wrap the sampler; a rejection sampler of its own would be dropped.
        sampler, rejection = super().custom_sampler(sampler) or (sampler, None)
        if rejection is not None:
            raise DARTreeConfigError(
                f"the target's model state {type(self).__mro__[2].__name__} brings its own "
                "rejection sampler; dartree verifies with its tree sampler and cannot run "
                "with it (use a target whose model state keeps vLLM's)")
        return sampler, TreeRejectionSampler(sampler, self.vllm_config, self)


class DraftsInBatch:
    """``chain_drafts`` for ``TreeStep.plan`` on V2: a request's drafted tokens read from the
    batch's input ids (V2's scheduler holds only placeholders). Read only for a request the
    last proposal has no tree for (rare), so the host copy is paid only then."""

    def __init__(self, input_batch) -> None:
        self.batch = input_batch
        self.index_of: dict[str, int] | None = None  # built at the first read

    def get(self, req_id: str, default: list[int]) -> list[int]:
        batch = self.batch
        if self.index_of is None:
            self.index_of = {req: i for i, req in enumerate(batch.req_ids)}
        index = self.index_of[req_id]
        drafts = int(batch.num_draft_tokens_per_req[index])
        end = int(batch.query_start_loc_np[index + 1])
        return batch.input_ids[end - drafts:end].tolist() if drafts else default


def on_top_of(stock: type) -> type:
    """``DARTreeModelState`` over ``stock``, the model state vLLM resolves for the target
    (one class per stock class, so engines of a process share it; a stock class that
    already is one, from an earlier load of the same model, is kept)."""
    if issubclass(stock, DARTreeModelState):
        return stock
    if stock not in _COMPOSED:
        _COMPOSED[stock] = type(f"DARTree{stock.__name__}", (DARTreeModelState, stock),
                                {"__module__": __name__})
    return _COMPOSED[stock]
