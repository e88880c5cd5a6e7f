"""Patches on vLLM's V1 model runner (``vllm.v1.worker.gpu_model_runner.GPUModelRunner``,
vLLM 0.32/0.33; the CPU runner subclasses it). Each wrapper acts only when the runner's
drafter is a :class:`DARTreeProposer`; for every other engine it calls the original.
"""

from __future__ import annotations

import functools

import torch

from vllm_dartree.integration.patching import VllmPatch
from vllm_dartree.integration.proposer import DARTreeProposer, dartree_settings
from vllm_dartree.integration.tree_context import tree_verify
from vllm_dartree.integration.verify import (
    batch_needs_chain,
    build_verify_step,
    chain_tree,
    depth_positions,
    row_of,
)

RUNNER = "vllm.v1.worker.gpu_model_runner:GPUModelRunner"


def _dartree_drafter(runner) -> DARTreeProposer | None:
    drafter = getattr(runner, "drafter", None)
    return drafter if isinstance(drafter, DARTreeProposer) else None


class ProposerSwap(VllmPatch):
    """Build ``DARTreeProposer`` where the runner builds ``DFlashProposer`` for dartree."""

    target = RUNNER
    attribute = "__init__"

    @classmethod
    def replacement(cls, original):
        import vllm.v1.worker.gpu_model_runner as runner_module

        @functools.wraps(original)
        def __init__(self, vllm_config, *args, **kwargs):
            if dartree_settings(vllm_config) is None:
                return original(self, vllm_config, *args, **kwargs)
            stock = runner_module.DFlashProposer
            runner_module.DFlashProposer = DARTreeProposer  # only while this runner is built
            try:
                original(self, vllm_config, *args, **kwargs)
            finally:
                runner_module.DFlashProposer = stock

        return __init__


class VerifyLayout(VllmPatch):
    """After vLLM lays out the step's tokens, describe the trees being verified."""

    target = RUNNER
    attribute = "_prepare_inputs"

    @classmethod
    def replacement(cls, original):
        @functools.wraps(original)
        def _prepare_inputs(self, scheduler_output, num_scheduled_tokens_np, *args, **kwargs):
            result = original(self, scheduler_output, num_scheduled_tokens_np, *args, **kwargs)
            drafter = _dartree_drafter(self)
            if drafter is not None:
                drafter.verify = plan_verify(self, drafter, scheduler_output,
                                             num_scheduled_tokens_np, result[1])
            return result

        return _prepare_inputs


def plan_verify(runner, drafter: DARTreeProposer, scheduler_output, num_scheduled, spec_meta):
    """The VerifyStep for this step, or None for a plain chain step."""
    proposed, drafter.proposed = drafter.proposed, None
    if spec_meta is None:
        return None
    req_ids = runner.input_batch.req_ids[: len(spec_meta.num_draft_tokens)]
    if batch_needs_chain(runner, req_ids):
        return None
    ends = num_scheduled.cumsum()
    trees, batch_index, root_row, num_drafts = [], [], [], []
    device = runner.device
    for i, (req_id, drafts) in enumerate(zip(req_ids, spec_meta.num_draft_tokens)):
        if drafts == 0:
            continue
        row = None if proposed is None else proposed.row_of_request.get(req_id)
        if row is None:  # drafts that are not from a tree this proposer built: a chain
            tokens = scheduler_output.scheduled_spec_decode_tokens.get(req_id, [])
            padded = (list(tokens) + [0] * drafter.budget)[: drafter.budget]
            tree = chain_tree(torch.tensor([padded], device=device))
        else:
            tree = row_of(proposed.tree, row)
        trees.append(tree)
        batch_index.append(i)
        root_row.append(int(ends[i]) - drafts - 1)
        num_drafts.append(drafts)
    if not trees:
        return None
    return build_verify_step(trees, batch_index, root_row, num_drafts, device)


class DepthPositions(VllmPatch):
    """Run the target forward of a tree step with depth positions and the tree mask."""

    target = RUNNER
    attribute = "_model_forward"

    @classmethod
    def replacement(cls, original):
        @functools.wraps(original)
        def _model_forward(self, *args, **kwargs):
            drafter = _dartree_drafter(self)
            step = None if drafter is None else drafter.verify
            positions = kwargs.get("positions")
            if step is None or positions is None:
                return original(self, *args, **kwargs)
            drafter.target_kv = target_kv_caches()
            rows = step.node_rows[step.node_in_batch]
            sequential = positions[rows].clone()
            # In place: CUDA-graph replays read this buffer; restored before anyone else
            # (the drafter, the sampler) reads positions again.
            positions[rows] = depth_positions(step, positions)
            try:
                with tree_verify(step):
                    return original(self, *args, **kwargs)
            finally:
                positions[rows] = sequential

        return _model_forward


def target_kv_caches():
    """(kv cache, isa, slot mapping) of every attention layer in the current target forward."""
    from vllm.forward_context import get_forward_context

    context = get_forward_context()
    found = []
    for name, metadata in context.attn_metadata.items():
        layer = context.no_compile_layers.get(name)
        if layer is None or metadata is None:
            continue
        kv_cache = layer.kv_cache
        if isinstance(kv_cache, (list, tuple)):  # one entry per virtual engine in older vLLM
            kv_cache = kv_cache[0]
        found.append((kv_cache, getattr(layer, "isa", ""), metadata.slot_mapping))
    return found


class TreeSampler(VllmPatch):
    """Accept tree steps with the proposer's tree walk instead of vLLM's chain sampler."""

    target = RUNNER
    attribute = "_sample"

    @classmethod
    def replacement(cls, original):
        @functools.wraps(original)
        def _sample(self, logits, spec_decode_metadata):
            drafter = _dartree_drafter(self)
            if drafter is None or spec_decode_metadata is None or drafter.verify is None:
                if drafter is not None:
                    drafter.verify = None
                return original(self, logits, spec_decode_metadata)
            self.input_batch.update_async_output_token_ids()
            return drafter.sample_tree(logits, spec_decode_metadata,
                                       self.input_batch.sampling_metadata)

        return _sample


RUNNER_PATCHES = (ProposerSwap, VerifyLayout, DepthPositions, TreeSampler)
