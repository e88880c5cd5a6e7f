"""``DARTreeProposer``: one drafter forward per step, one draft tree per request.

vLLM's V1 runner builds this proposer in place of its ``DFlashProposer`` for a dartree engine
(``runner.ProposerSwap``). It subclasses ``DFlashProposer``, so vLLM's own ``isinstance``
checks and DFlash plumbing (aux hidden states, drafter KV, padded batches) apply unchanged;
what differs is the query width (the checkpoint's block cut to the depths a tree of B
nodes can reach, not B itself) and what
happens to the drafter's outputs: they become trees, handed to the engine's
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
from vllm_dartree.config import LAYOUT_ATTR, SETTINGS_ATTR, DARTreeConfig
from vllm_dartree.integration.budget_report import BudgetReport
from vllm_dartree.integration.profile import StepProfile
from vllm_dartree.integration.step import TreeStep
from vllm_dartree.integration.verify_plan import needs_chain_verification
from vllm_dartree.tree import DraftTree, build_tree, depth_first
from vllm_dartree.tree.budget import AdaptiveBudget, AutoWidth, depth_leaders, with_confidence
from vllm_dartree.tree.build import capture_all_shapes
from vllm_dartree.tree.graphs import CorrectionGraphs, bucket_size


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


def dartree_settings(vllm_config) -> DARTreeConfig | None:
    spec = getattr(vllm_config, "speculative_config", None)
    return getattr(spec, SETTINGS_ATTR, None)


class DARTreeProposer(DFlashProposer):
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
        self.settings: DARTreeConfig = dartree_settings(vllm_config)
        self.budget = self.settings.budget
        self.layout: DrafterLayout = layout
        self.use_correction = (self.layout.has_head if self.settings.correction is None
                               else self.settings.correction)
        self.tree_step: TreeStep | None = None  # the engine's step, set by runner.ProposerSwap
        self.head = None
        self.graphs: CorrectionGraphs | None = None
        # The adaptive budget: the proposer asks it which nodes to hand over, the step tells
        # it what each step cost and what was accepted.
        # ``width: "auto"`` (adaptive only): the step feeds it the scheduled counts through
        # the budget policy; the tree builder reads its width here.
        self.auto_width = (AutoWidth(self.settings.max_width, self.budget, self.tree_depths)
                           if self.settings.auto_width else None)
        self.budget_policy = (AdaptiveBudget(self.tree_depths, device,
                                             auto_width=self.auto_width)
                              if self.settings.adaptive else None)
        self.budget_report = BudgetReport() if self.settings.adaptive else None
        self.pending_context = PendingContext(
            vllm_config.scheduler_config.max_num_batched_tokens)

    def load_model(self, target_model) -> None:
        super().load_model(target_model)
        if self.use_correction:
            self.head = self.model.correction_head()
        self.graphs = self._correction_graphs()

    def _correction_graphs(self) -> CorrectionGraphs | None:
        """CUDA graphs of the per-depth head calls, every shape captured now (at load, not
        mid-serving), unless the engine runs eagerly. On a CPU there are no launches to
        save, and padding would only add rows."""
        if self.head is None or self.head.device.type != "cuda":
            return None
        if self.vllm_config.model_config.enforce_eager:
            return None
        max_requests = self.vllm_config.scheduler_config.max_num_seqs
        graphs = CorrectionGraphs(self.head, capture=True, max_bucket=bucket_size(max_requests))
        variants = {self.settings.tree, "chain"}  # chain: batches verified as chains
        widths = self.auto_width.widths if self.auto_width else [self.settings.max_width]
        for width in widths:
            capture_all_shapes(graphs, variants, max_requests, self.tree_depths,
                               self.budget, self.top_k, width)
        return graphs

    @property
    def tree_depths(self) -> int:
        """Depths a tree can use: the drafter's, capped at the budget."""
        return min(self.layout.num_depths, self.budget)

    @property
    def query_slots(self) -> int:
        """Mask slots queried after the root: the block's, cut to the depths a tree can use.

        With B below the drafter's depths the slots past depth B were computed and dropped.
        The block attends bidirectionally, so the cut moves the kept slots' hidden states a
        little: SmolLM2 pair at B = 6, tau 2.18 -> 2.25 on GSM8K, 2.14 -> 2.14 on MATH-500,
        drafter forward 10.1 -> 7.7 ms."""
        needed = self.tree_depths if self.layout.shift_label else self.tree_depths + 1
        return min(self.layout.block_size, needed) - 1

    @property
    def tree_width(self) -> int:
        """W of this step's pruned tree: the configured width, or the auto width's choice."""
        return self.auto_width.width if self.auto_width else self.settings.max_width

    @property
    def top_k(self) -> int:
        return min(self.settings.top_k, self.vllm_config.model_config.get_vocab_size())

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
        # A tree of B nodes reaches depth B at most (each node needs its ancestors), so
        # depths past B cannot change any variant's tree: skip their logits and candidates.
        depth_hidden = depth_hidden[:, : self.tree_depths]
        num_reqs, depths, hidden = depth_hidden.shape
        with StepProfile.phase("drafter_logits", self.device):
            base_logits, vocab_ids = self.model.draft_logits(
                depth_hidden.reshape(-1, hidden), min_columns=max(self.top_k, self.budget))
            base_logits = base_logits.view(num_reqs, depths, -1).float()
        runner = self.target_runner
        req_ids = runner.input_batch.req_ids[:num_reqs]
        # A batch vLLM verifies as a chain gets the drafter's best chain.
        chain = any(needs_chain_verification(getattr(runner.requests.get(r), "sampling_params",
                                                     None)) for r in req_ids)
        settings = self.settings
        variant = "chain" if chain else settings.tree
        width = self.tree_width
        with StepProfile.phase("tree_build", self.device):
            tree = build_tree(
                variant, base_logits, depth_hidden.float(),
                next_token_ids.to(torch.int64), self.head, budget=self.budget,
                top_k=self.top_k, width=width,
                depth_bonus=settings.effective_depth_bonus, graphs=self.graphs,
                vocab_ids=vocab_ids,
            )
            if variant != "chain" and self.budget_policy is None:
                tree = depth_first(tree)  # verified depth-first: see tree.depth_first
        if self.budget_policy is None:
            self.tree_step.hand_over(list(req_ids), tree, chains=variant == "chain")
            return tree.tokens
        tree = self._with_chain_confidence(tree, depth_hidden, next_token_ids)
        choice = self.budget_policy.choose(tree)
        self.budget_report.record(choice, self.budget_policy, width)
        self.tree_step.hand_over(list(req_ids), choice.tree, chains=variant == "chain")
        tokens = choice.tree.tokens.tolist()
        self.budget_policy.record_drafting(True, (time.perf_counter() - started) * 1e3,
                                           set_aside_ms=written_ms)
        return [row[:count] for row, count in zip(tokens, choice.counts)]

    def _with_chain_confidence(self, tree: DraftTree, depth_hidden: torch.Tensor,
                               root_tokens: torch.Tensor) -> DraftTree:
        """With a DSpark confidence head: the tree's acceptance estimate (its scores) moved
        to the head's chain survival (``tree.budget.with_confidence``)."""
        if not getattr(self.model, "has_confidence_head", False):
            return tree
        leaders, _ = depth_leaders(tree, depth_hidden.shape[1])
        previous = torch.cat([root_tokens.view(-1, 1).to(leaders.dtype), leaders[:, :-1]], 1)
        return with_confidence(tree, self.model.chain_confidence(depth_hidden, previous))

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
        """One drafter forward over [root, mask x (block-1)]: hidden state per depth [R, D, H]."""
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
        out = out[:num_tokens].view(-1, block, out.shape[-1])
        # Shift layout: slot j predicts position root+j+1 (16 depths for b16); non-shift
        # (z-lab): slot j >= 1 predicts its own position (15 depths).
        return out if self.layout.shift_label else out[:, 1:]

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
