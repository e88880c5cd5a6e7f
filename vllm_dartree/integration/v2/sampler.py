"""``TreeRejectionSampler``: acceptance of a tree step on vLLM's V2 runner.

The target's token at every logits row comes from vLLM's own ``Sampler.sample`` (sampling
parameters, temperature, top-k/p, and V2's draws keyed by each request's seed and the row's
position), with each tree row at its depth position, root + depth: a node is drawn exactly
as target-only decoding would draw the token after that node's path, so every emitted
token is the target's own. The tree walk, KV compaction and statistics are the shared
verifier's; penalties count each row's path (``penalties.py``). A step without a plan
(no drafts) goes to vLLM's own ``RejectionSampler``.
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np
import torch
from vllm.v1.worker.gpu.input_batch import get_num_sampled_and_rejected
from vllm.v1.worker.gpu.sample.logprob import compute_topk_scores
from vllm.v1.worker.gpu.sample.output import SamplerOutput
from vllm.v1.worker.gpu.spec_decode.rejection_sampler import RejectionSampler

from vllm_dartree.integration.v2.penalties import TreePaths, tree_paths
from vllm_dartree.step.verify_plan import (
    AcceptedPaths,
    VerifyPlan,
    accepted_row_order,
    path_tokens,
)


class TreeRejectionSampler:
    def __init__(self, sampler: Any, vllm_config, model_state) -> None:
        self.sampler = sampler
        self.model_state = model_state
        # Chain batches; greedy drafts (no draft logits), vLLM's standard rejection.
        self.chain_sampler = RejectionSampler(sampler, vllm_config.speculative_config,
                                              model_state.device)

    def __call__(self, logits: torch.Tensor, input_batch, draft_logits=None,
                 *args: Any, **kwargs: Any) -> SamplerOutput:
        processed: list[torch.Tensor] = []  # the target_choice's processed logits

        def choose(plan: VerifyPlan) -> torch.Tensor:
            tokens, processed_logits = self.target_choice(logits, input_batch, plan)
            processed.append(processed_logits)
            return tokens

        accepted = self.model_state.tree_step.accept_with(
            choose, columns=self.chain_sampler.num_speculative_steps + 1)
        if accepted is None:  # drafts are tokens only: verified as vLLM verifies greedy drafts
            return self.chain_sampler(logits, input_batch, None, *args, **kwargs)
        sampled, paths = accepted
        self.model_state.commit_recurrent_state(paths)
        plan = paths.plan
        num_sampled = torch.ones(input_batch.num_reqs, dtype=torch.int32, device=logits.device)
        num_sampled[plan.batch_index] = paths.num_accepted.to(torch.int32)
        if self.sampler.logprobs_mode.startswith("processed"):
            logits = processed[0]
        logprobs = self.path_logprobs(logits, input_batch, sampled, num_sampled, paths)
        num_sampled, num_rejected = get_num_sampled_and_rejected(
            num_sampled, input_batch.seq_lens, input_batch.cu_num_logits,
            input_batch.idx_mapping, self.sampler.req_states.prefill_len.gpu)
        return SamplerOutput(sampled_token_ids=sampled, logprobs_tensors=logprobs,
                             num_nans=None, num_sampled=num_sampled,
                             num_rejected=num_rejected)

    def target_choice(self, logits: torch.Tensor, input_batch, plan: VerifyPlan
                      ) -> tuple[torch.Tensor, torch.Tensor]:
        """(the target's token at every logits row, each row at its (depth) position; the
        logits as vLLM's sampling parameters processed them)."""
        rows = input_batch.logits_indices
        positions = self.model_state.positions[rows]
        with self.penalized_on_paths(logits, input_batch, plan):
            tokens, processed = self.sampler.sample(
                logits, input_batch.expanded_idx_mapping, input_batch.idx_mapping,
                input_batch.idx_mapping_np, positions, input_batch.input_ids[rows],
                input_batch.expanded_local_pos, input_batch.seq_lens_cpu_upper_bound.numpy())
        return tokens.to(torch.int64), processed

    def penalized_on_paths(self, logits: torch.Tensor, input_batch, plan: VerifyPlan):
        """vLLM's penalties counting each row's tree path (``v2/penalties.py``) while the
        block runs, where a request of the batch has penalties."""
        state = self.sampler.penalties_state
        if not np.any(state.use_penalty[input_batch.idx_mapping_np]):
            return contextlib.nullcontext()
        paths = TreePaths(path_tokens(plan, logits.shape[1]), input_batch.cu_num_logits_np)
        return tree_paths(state, paths)

    def path_logprobs(self, logits: torch.Tensor, input_batch, sampled: torch.Tensor,
                      num_sampled: torch.Tensor, paths: AcceptedPaths):
        """vLLM's logprobs tensors of the sampled tokens, each from the logits row of the
        node it was drawn at (the accepted path's rows, in path order), as vLLM's samplers
        lay them out: request r's j-th token at logits row ``cu_num_logits[r] + j``
        (``logits``: raw or processed, as the engine's logprobs mode asks); None when no
        request asks for logprobs."""
        dims = self.sampler.get_logprobs_dims(input_batch.idx_mapping_np)
        if dims is None:
            return None
        plan = paths.plan
        order = accepted_row_order(paths, plan.num_logit_rows, plan.node_logit_rows[:, 0])
        cu = input_batch.cu_num_logits
        columns = torch.arange(sampled.shape[1], device=sampled.device)
        rows = cu[:-1].unsqueeze(1).to(torch.int64) + columns
        kept = columns < num_sampled.unsqueeze(1)
        flat = torch.zeros(plan.num_logit_rows + 1, dtype=sampled.dtype, device=sampled.device)
        flat[torch.where(kept, rows, plan.num_logit_rows)] = sampled  # scratch row last
        num_logprobs, per_request_ids = dims
        return compute_topk_scores(
            logits[order], num_logprobs, flat[:-1], input_batch.cu_num_logits_np.tolist(),
            logprob_token_ids_state=self.sampler.logprob_token_ids_state,
            expanded_idx_mapping=input_batch.expanded_idx_mapping,
            max_per_req_token_ids=per_request_ids,
            logits_mode=self.sampler.logprobs_mode in ("raw_logits", "processed_logits"))
