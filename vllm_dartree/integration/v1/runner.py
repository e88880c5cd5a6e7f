"""The runner patches: thin delegations from vLLM's V1 model runner to the engine's
:class:`~vllm_dartree.step.tree_step.TreeStep` (``vllm.v1.worker.gpu_model_runner.
GPUModelRunner``, vLLM 0.32/0.33; the CPU runner subclasses it).

Each wrapper acts only on a runner that ``ProposerSwap`` gave a tree step; for every other
engine it calls the original. They translate vLLM's objects (scheduler output, spec-decode
metadata, forward context, sampler output) into the step's plain arguments and back.

This module imports vLLM's V1 modules only inside the patches, so that the one patch list
(``activation.declared_patches``) can be read on every release; the patches apply on the
releases that still ship the V1 runner (``V1_RELEASES``).
"""

from __future__ import annotations

import functools

from vllm_dartree.config import DARTreeConfigError, carried_layout, is_dartree_engine
from vllm_dartree.integration.patching import ModuleGlobalSwap, Runner, VllmPatch
from vllm_dartree.integration.refusals import SUPPORTED_TEXT
from vllm_dartree.integration.touchpoints import V1_RELEASES
from vllm_dartree.integration.v1.sampling import (
    rows_of_requests,
    tree_logprobs,
    tree_rows_as_target_only,
)
from vllm_dartree.step.kv_mover import KvMover, LayerKv, target_layers_kv
from vllm_dartree.step.tree_step import STEP_ATTR, TreeStep
from vllm_dartree.step.verifier import TreeVerifier
from vllm_dartree.step.verify_plan import chain_requests_on_v1

RUNNER = "vllm.v1.worker.gpu_model_runner:GPUModelRunner"


def tree_step_of(runner) -> TreeStep | None:
    return getattr(runner, STEP_ATTR, None)


class DFlashProposerGlobal(ModuleGlobalSwap):
    """The runner module's ``DFlashProposer`` global, read by ``GPUModelRunner.__init__``."""

    target = "vllm.v1.worker.gpu_model_runner"
    attribute = "DFlashProposer"
    releases = V1_RELEASES
    runner = Runner.V1


class V1RunnerPatch(VllmPatch):
    """A patch of vLLM's V1 ``GPUModelRunner`` (the releases that ship it)."""

    target = RUNNER
    releases = V1_RELEASES
    runner = Runner.V1


class ProposerSwap(V1RunnerPatch):
    """Build ``DARTreeProposer`` where the runner builds ``DFlashProposer`` for dartree, and
    give the runner its tree step."""

    attribute = "__init__"

    @classmethod
    def replacement(cls, original):
        from vllm_dartree.integration.v1.proposer import DARTreeProposer

        @functools.wraps(original)
        def __init__(self, vllm_config, *args, **kwargs):
            if not is_dartree_engine(vllm_config):
                return original(self, vllm_config, *args, **kwargs)
            refuse_v2_only_target(vllm_config.model_config)
            with DFlashProposerGlobal.swapped(DARTreeProposer):
                original(self, vllm_config, *args, **kwargs)
            step = TreeStep(self.drafter.budget, self.device, TreeVerifier(), KvMover(),
                            policy=self.drafter.policy)
            setattr(self, STEP_ATTR, step)
            self.drafter.tree_step = step

        return __init__


def refuse_v2_only_target(model_config) -> None:
    """Targets dartree runs on vLLM's V2 runner only, refused on V1 before weights load:
    hybrid targets (their chains need V2's hybrid model state, one recurrent-state slot per
    draft position) and M-RoPE targets (V2's per-axis positions buffer carries the tree
    rows' depth positions; V1's path is not wired for them)."""
    arch = ", ".join(model_config.architectures or [])
    if model_config.is_hybrid or model_config.has_inner_state:
        what = "is hybrid (Mamba/linear attention layers)"
    elif model_config.uses_mrope:
        what = "uses M-RoPE (multi-axis positions)"
    else:
        return
    raise DARTreeConfigError(
        f"target {arch} {what}: dartree runs it on vLLM's V2 model runner only, and this "
        "engine runs V1 (set VLLM_USE_V2_MODEL_RUNNER=1 where vLLM offers V2, or use a "
        f"target with attention layers only and 1-D RoPE); {SUPPORTED_TEXT}")


class VerifyLayout(V1RunnerPatch):
    """After vLLM lays out the step's tokens: plan the tree verification."""

    attribute = "_prepare_inputs"

    @classmethod
    def replacement(cls, original):
        @functools.wraps(original)
        def _prepare_inputs(self, scheduler_output, num_scheduled_tokens, *args, **kwargs):
            result = original(self, scheduler_output, num_scheduled_tokens, *args, **kwargs)
            step = tree_step_of(self)
            if step is not None:
                spec = result[1]  # SpecDecodeMetadata, None for a step without drafts
                req_ids = list(self.input_batch.req_ids)
                chains = chain_requests_on_v1(
                    self.requests, req_ids, self.sampler.logprobs_mode.startswith("processed"))
                step.plan(req_ids, None if spec is None else list(spec.num_draft_tokens),
                          num_scheduled_tokens, scheduler_output.scheduled_spec_decode_tokens,
                          chain_rows=chains, verify_as_chain=all(chains))
            return result

        return _prepare_inputs


class DepthPositions(V1RunnerPatch):
    """Run the target forward of a tree step with depth positions and the tree mask."""

    attribute = "_model_forward"

    @classmethod
    def replacement(cls, original):
        @functools.wraps(original)
        def _model_forward(self, *args, **kwargs):
            step = tree_step_of(self)
            if step is None:
                return original(self, *args, **kwargs)
            with step.target_forward(kwargs.get("positions"), lambda: target_kv_caches(self)):
                return original(self, *args, **kwargs)

        return _model_forward


def target_kv_caches(runner) -> list[LayerKv]:
    """The KV of every target attention layer in the forward in progress; the drafter's
    layers share the KV group but not the tree, so they are left out."""
    from vllm.forward_context import get_forward_context

    context = get_forward_context()
    return target_layers_kv(context.attn_metadata or {}, context.no_compile_layers,
                            getattr(runner.drafter, "_draft_attn_layer_names", set()))


class TreeSampler(V1RunnerPatch):
    """Accept tree steps with the tree verifier instead of vLLM's chain sampler."""

    attribute = "_sample"

    @classmethod
    def replacement(cls, original):
        import torch
        from vllm.v1.outputs import SamplerOutput

        @functools.wraps(original)
        def _sample(self, logits, spec_decode_metadata):
            step = tree_step_of(self)
            if step is None or spec_decode_metadata is None:
                return original(self, logits, spec_decode_metadata)
            if spec_decode_metadata.max_spec_len == 0:
                # No request drafted (a paused adaptive step): sample as plain decoding.
                # vLLM would run its rejection sampler over zero drafts for the same
                # tokens.
                self.input_batch.update_async_output_token_ids()
                return self.sampler(logits=logits,
                                    sampling_metadata=self.input_batch.sampling_metadata)
            if not step.has_plan():  # a step vLLM verifies itself
                return original(self, logits, spec_decode_metadata)
            chains = [i for i, chain in enumerate(step.chain_rows) if chain]
            # Requests verified as chains of their own (bad words, a grammar, a thinking
            # budget) go through vLLM's rejection sampler; it runs over the whole batch,
            # whose other rows are dropped. The tree rows get allowed ids, logit bias,
            # min_tokens, penalties and min p here, and logprobs from their nodes' rows.
            by_vllm = original(self, logits, spec_decode_metadata) if chains else None
            self.input_batch.update_async_output_token_ids()
            sampling = self.input_batch.sampling_metadata

            def choose(plan):  # the target's token at every row, its sampling applied
                rows = tree_rows_as_target_only(logits, sampling, plan)
                return step.verifier.target_choice(rows, plan, sampling)

            sampled, paths = step.accept_with(choose, spec_decode_metadata.max_spec_len + 1)
            logprobs = tree_logprobs(self.sampler, logits, sampling.max_num_logprobs,
                                     sampled, paths)
            if by_vllm is None:
                return SamplerOutput(sampled_token_ids=sampled, logprobs_tensors=logprobs)
            rows = torch.tensor(chains, device=sampled.device)
            sampled[rows] = by_vllm.sampled_token_ids[rows].to(sampled.dtype)
            return SamplerOutput(sampled_token_ids=sampled, logprobs_tensors=rows_of_requests(
                logprobs, by_vllm.logprobs_tensors, chains, sampled.shape[1]))

        return _sample


class DrafterFitsPerRequest(V1RunnerPatch):
    """Let a dartree drafter run whenever the step has drafter metadata.

    vLLM skips drafting for the whole batch while any request is within the drafter's query
    of ``max_model_len``; the skipped steps also leave the committed tokens' K/V out of the
    drafter cache, so every request drafts worse afterwards. The dartree proposer instead
    fits each request's query itself (``DARTreeProposer._fit_queries``), and the scheduler
    trims a tree to the rows that fit (ancestors first, so the trimmed tree stays a tree)."""

    attribute = "_input_fits_in_drafter"

    @classmethod
    def replacement(cls, original):
        @functools.wraps(original)
        def _input_fits_in_drafter(self, common_attn_metadata):
            if tree_step_of(self) is None:
                return original(self, common_attn_metadata)
            return common_attn_metadata is not None

        return _input_fits_in_drafter


class DrafterBlockLookahead(VllmPatch):
    """V1: reserve KV slots for the drafter's whole query block (V2's query is cut to
    1 + query_slots <= B + 1 rows, inside what vLLM reserves for DFlash).

    vLLM reserves ``num_speculative_tokens + 1`` slots past the scheduled tokens for a
    DFlash drafter, which queries that many. Ours queries the checkpoint's block (16) for
    any budget B; with B < block - 1 the last queries would write K/V into block-table
    entries the request does not own (stale ids of a row's earlier request, i.e. another
    request's drafter cache). The scheduler and the warmup read this property.

    V1 only, by design: on V2 (the only runner of 0.34, where this would be the method
    config's ``num_lookahead_tokens``) the query never exceeds what vLLM reserves."""

    target = "vllm.config.vllm:VllmConfig"
    attribute = "num_lookahead_tokens"
    releases = V1_RELEASES
    runner = Runner.V1

    @classmethod
    def replacement(cls, original):
        def num_lookahead_tokens(self) -> int:
            reserved = original.fget(self)
            layout = carried_layout(getattr(self, "speculative_config", None))
            return reserved if layout is None else max(reserved, layout.block_size)

        return property(num_lookahead_tokens, doc=original.__doc__)


RUNNER_PATCHES = (ProposerSwap, VerifyLayout, DepthPositions, TreeSampler,
                  DrafterFitsPerRequest)
