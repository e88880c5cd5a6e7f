"""``DARTreeProposer``: one drafter forward per step, one tree per request, tree acceptance.

Patched symbol: ``vllm.v1.worker.gpu_model_runner.DFlashProposer`` (module global read by
``GPUModelRunner.__init__``, vLLM 0.32/0.33) is replaced by :func:`make_dflash_proposer`,
which builds this proposer when the speculative config carries dartree settings and the stock
``DFlashProposer`` otherwise. The proposer subclasses ``DFlashProposer``, so vLLM's own
``isinstance`` checks and DFlash plumbing (aux hidden states, drafter KV, padded batches)
apply unchanged; only the query width (the checkpoint's block, not the verify budget B) and
what happens to the drafter's outputs differ.
"""

from __future__ import annotations

import logging
import time

import torch
from vllm.forward_context import set_forward_context
from vllm.v1.outputs import SamplerOutput
from vllm.v1.sample.metadata import SamplingMetadata
from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p
from vllm.v1.spec_decode.dflash import DFlashProposer
from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

from vllm_dartree.config import DARTreeConfig
from vllm_dartree.integration.drafter_model import DrafterLayout, read_layout
from vllm_dartree.integration.verify import (
    AcceptedPaths,
    ProposedTrees,
    VerifyStep,
    accepted_row_order,
    batch_needs_chain,
    compaction_pairs,
)
from vllm_dartree.tree import accept_tree, build_tree, race_sample
from vllm_dartree.tree.graphs import CorrectionGraphs, bucket_size

logger = logging.getLogger("vllm.dartree")

SETTINGS_ATTR = "dartree"  # attribute of vLLM's SpeculativeConfig holding DARTreeConfig
LOG_EVERY_S = 10.0


def dartree_settings(vllm_config) -> DARTreeConfig | None:
    spec = getattr(vllm_config, "speculative_config", None)
    return getattr(spec, SETTINGS_ATTR, None)


def make_dflash_proposer(vllm_config, device, runner=None):
    """Factory standing in for ``DFlashProposer`` in the runner module."""
    if dartree_settings(vllm_config) is None:
        return DFlashProposer(vllm_config, device, runner)
    return DARTreeProposer(vllm_config, device, runner)


class DARTreeProposer(DFlashProposer):
    """DFlash/Domino drafter + DARTree (or chain/fixed/DDTree) tree building."""

    def __init__(self, vllm_config, device, runner=None):
        super().__init__(vllm_config, device, runner)
        self.target_runner = runner
        self.settings: DARTreeConfig = dartree_settings(vllm_config)
        self.budget = self.settings.budget
        target = vllm_config.model_config
        self.layout: DrafterLayout = read_layout(
            self.draft_model_config.hf_config,
            target_vocab=target.get_vocab_size(),
            target_hidden=target.get_hidden_size(),
            target_layers=target.get_num_layers(vllm_config.parallel_config),
        )
        self.use_correction = (self.layout.has_head if self.settings.correction is None
                               else self.settings.correction)
        # Drafter -> verify -> accept -> drafter, one step at a time.
        self.proposed: ProposedTrees | None = None
        self.verify: VerifyStep | None = None
        self.accepted: AcceptedPaths | None = None
        self.target_kv: list[tuple[torch.Tensor, str, torch.Tensor]] = []
        self.stats = AcceptanceStats()

    # ---- drafting -------------------------------------------------------------------------

    def load_model(self, target_model) -> None:
        super().load_model(target_model)
        head = self.model.correction_head() if hasattr(self.model, "correction_head") else None
        self.head = head.with_input_gate_table() if (head and self.use_correction) else None
        self.graphs = self._correction_graphs()

    def _correction_graphs(self) -> CorrectionGraphs | None:
        """CUDA graphs of the per-depth head calls, unless the engine runs eagerly. On a CPU
        there are no launches to save, and padding would only add rows."""
        if self.head is None or not self.head.proj0.is_cuda:
            return None
        if self.vllm_config.model_config.enforce_eager:
            return None
        max_requests = self.vllm_config.scheduler_config.max_num_seqs
        return CorrectionGraphs(self.head, capture=True, max_bucket=bucket_size(max_requests))

    def propose(self, num_speculative_tokens, target_token_ids, target_positions,
                target_hidden_states, next_token_ids, token_indices_to_sample,
                common_attn_metadata, sampling_metadata, mm_embed_inputs=None,
                num_rejected_tokens_gpu=None, slot_mappings=None) -> torch.Tensor:
        accepted, self.accepted = self.accepted, None
        if accepted is not None:
            # Drafter context = target hidden states of the accepted path, in path order.
            order = accepted_row_order(accepted, target_hidden_states.shape[0])
            target_hidden_states = target_hidden_states[order]
        depth_hidden = self._draft_block(
            target_token_ids, target_positions, target_hidden_states, next_token_ids,
            common_attn_metadata, num_rejected_tokens_gpu)
        num_reqs, depths, hidden = depth_hidden.shape
        base_logits = self.model.compute_logits(depth_hidden.reshape(-1, hidden))
        base_logits = base_logits.view(num_reqs, depths, -1).float()
        settings = self.settings
        req_ids = self.target_runner.input_batch.req_ids[:num_reqs]
        # A batch that will be verified as a chain gets the drafter's best chain.
        variant = ("chain" if batch_needs_chain(self.target_runner, req_ids)
                   else settings.tree)
        tree = build_tree(
            variant, base_logits, depth_hidden.float(), next_token_ids.to(torch.int64),
            self.head, budget=self.budget, top_k=min(settings.top_k, base_logits.shape[-1]),
            width=settings.width, depth_bonus=settings.effective_depth_bonus,
            graphs=self.graphs,
        )
        self.proposed = ProposedTrees({r: i for i, r in enumerate(req_ids)}, tree)
        return tree.tokens

    def _draft_block(self, target_token_ids, target_positions, target_hidden_states,
                     next_token_ids, cad, num_rejected_tokens_gpu) -> torch.Tensor:
        """One drafter forward over [root, mask x (block-1)]: hidden state per depth [R, D, H]."""
        self.num_speculative_tokens = self.layout.block_size - 1  # mask slots per request
        context = self.model.combine_hidden_states(target_hidden_states)
        num_tokens, _, draft_cad = self.set_inputs_first_pass(
            target_token_ids=target_token_ids, next_token_ids=next_token_ids,
            target_positions=target_positions, target_hidden_states=context,
            token_indices_to_sample=None, cad=cad, num_rejected_tokens_gpu=num_rejected_tokens_gpu,
        )
        _, per_layer = self.build_per_group_and_layer_attn_metadata(draft_cad)
        mode, num_input_tokens, across_dp = self._determine_batch_execution_and_padding(num_tokens)
        kwargs, slot_size = self.build_model_inputs_first_pass(num_tokens, num_input_tokens, None)
        with set_forward_context(
            per_layer, self.vllm_config, num_tokens=num_input_tokens,
            num_tokens_across_dp=across_dp, cudagraph_runtime_mode=mode,
            slot_mapping=self._get_slot_mapping(slot_size, draft_cad.slot_mapping),
        ):
            out = self.model(**kwargs)
        block = self.layout.block_size
        out = out[:num_tokens].view(-1, block, out.shape[-1])
        # Shift layout: slot j predicts position root+j+1 (16 depths for b16); non-shift
        # (z-lab): slot j >= 1 predicts its own position (15 depths).
        return out if self.layout.shift_label else out[:, 1:]

    # ---- verification ---------------------------------------------------------------------

    def sample_tree(self, logits: torch.Tensor, metadata: SpecDecodeMetadata,
                    sampling: SamplingMetadata) -> SamplerOutput:
        """Replacement for vLLM's rejection sampler on tree steps (same output contract)."""
        step, self.verify = self.verify, None
        counts = torch.tensor(metadata.num_draft_tokens, dtype=torch.int64)
        num_reqs = counts.numel()
        choice = self._target_choice(logits, counts, sampling)  # [sum(n+1)]
        starts = torch.cumsum(counts + 1, 0) - counts - 1
        size = 1 + self.budget
        columns = torch.arange(size)
        index = (starts.unsqueeze(1) + torch.minimum(columns, counts.unsqueeze(1)))
        per_node = choice[index.to(choice.device)]  # [R, 1+B]
        out = torch.full((num_reqs, metadata.max_spec_len + 1), -1, dtype=torch.int64,
                         device=logits.device)
        out[:, 0] = per_node[:, 0]  # requests without drafts emit the root's choice
        if step is not None and step.num_requests:
            result = accept_tree(step.tree, per_node[step.batch_index])
            width = min(result.accepted_tokens.shape[1], out.shape[1])
            out[step.batch_index, :width] = result.accepted_tokens[:, :width]
            accepted = AcceptedPaths(step, result.accepted_nodes, result.num_accepted)
            self._compact_kv(accepted)
            self.accepted = accepted
            self.stats.record(result.num_accepted, step.tree.num_nodes)
        return SamplerOutput(sampled_token_ids=out.to(torch.int32), logprobs_tensors=None)

    def _target_choice(self, logits, counts, sampling: SamplingMetadata) -> torch.Tensor:
        """The target's token at every verify row: argmax, or a sample under the request's
        temperature/top-k/top-p from its own generator when it has a seed."""
        greedy = logits.argmax(dim=-1)
        if sampling.all_greedy:
            return greedy
        rows_per_req = (counts + 1).to(logits.device)
        expand = lambda t: None if t is None else t.repeat_interleave(rows_per_req)  # noqa: E731
        temperature = expand(sampling.temperature).float()
        is_greedy = temperature < 1e-5
        scaled = logits.float() / torch.where(is_greedy, 1.0, temperature).unsqueeze(1)
        scaled = apply_top_k_top_p(scaled, expand(sampling.top_k), expand(sampling.top_p))
        starts = (torch.cumsum(counts + 1, 0) - counts - 1).tolist()
        request_rows = [(slice(starts[req], starts[req] + int(counts[req]) + 1), generator)
                        for req, generator in sampling.generators.items()]
        sampled = race_sample(scaled.softmax(dim=-1), request_rows)
        return torch.where(is_greedy, greedy, sampled)

    def _compact_kv(self, accepted: AcceptedPaths) -> None:
        """Move the accepted path's target KV to the slots right after the root."""
        if self.target_kv and self.target_kv[0][0].is_cuda:
            # vLLM's GPU page layout: the Triton compaction kernel, one launch per group.
            from vllm_dartree.integration.gpu_attention import compact_kv_caches

            compact_kv_caches(self.target_kv, accepted)
            return
        # vLLM's CPU layout packs K/V per ISA: copy element by element through it.
        from vllm_dartree.integration.cpu_attention import copy_kv_slots

        for kv_cache, isa, slot_mapping in self.target_kv:
            src, dst = compaction_pairs(accepted, slot_mapping)
            copy_kv_slots(kv_cache, src, dst, isa)


class AcceptanceStats:
    """Running acceptance length, logged periodically (vLLM's counters carry the totals)."""

    def __init__(self) -> None:
        self.rounds = 0
        self.accepted = 0
        self.nodes = 0
        self._last_log = time.monotonic()

    def record(self, num_accepted: torch.Tensor, num_nodes: torch.Tensor) -> None:
        self.rounds += int(num_accepted.numel())
        self.accepted += int(num_accepted.sum())
        self.nodes += int(num_nodes.sum())
        now = time.monotonic()
        if now - self._last_log >= LOG_EVERY_S and self.rounds:
            self._last_log = now
            logger.info("dartree: mean acceptance length %.2f over %d rounds (%.1f nodes/tree)",
                        self.accepted / self.rounds, self.rounds, self.nodes / self.rounds)
