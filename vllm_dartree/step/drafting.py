"""The runner-independent half of a dartree drafter: settings, correction head, each
step's trees from the drafter's per-depth hidden states, and the context held while the
adaptive verification pauses drafting.

vLLM's V1 proposer (``integration/v1/proposer.py``) and its V2 speculator
(``integration/v2/speculator.py``) both run vLLM's own DFlash plumbing for the drafter's one
forward (context K/V, the [root, mask x slots] query) and then call
:meth:`TreeDrafting.finish_proposal` on the query's hidden states (or
:meth:`TreeDrafting.record_pause` on a step that did not draft). Which rows those are, and
how the tokens reach the next step, is each runner's glue; what a tree is, how it is built,
chosen and handed to the step lives here once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from itertools import accumulate

import torch

from vllm_dartree.checkpoint import DrafterLayout
from vllm_dartree.config import DARTreeConfig, carried_layout, carried_settings
from vllm_dartree.step.policy_report import PolicyReport
from vllm_dartree.step.profile import StepProfile
from vllm_dartree.step.tree_step import TreeStep
from vllm_dartree.tree import (
    DraftTree,
    build_tree,
    depth_first,
    select_requests,
    where_requests,
)
from vllm_dartree.tree.adaptive import (
    AdaptiveVerification,
    AutoWidth,
    VerifyChoice,
    depth_leaders,
    with_confidence,
)
from vllm_dartree.tree.build import capture_all_shapes
from vllm_dartree.tree.graphs import CorrectionGraphs, bucket_size
from vllm_dartree.tree.lattice import Lattice


class PendingContext:
    """Context the drafter's cache is owed: the target states, positions and cache slots of
    the tokens committed by steps that did not draft, in step order.

    Writing them late is exact. Only a drafted step's query reads the drafter's cache, and
    every drafted step first writes whatever is pending; each write goes to the same slot,
    in the same order, as it would have at its own step, so any slot a query reads holds
    the same K/V (a slot freed and handed to another request is overwritten by the newer
    write, as before). What it saves: per paused step the combining projection of the
    target's layers and the K/V projections of every drafter layer, each a weight read for
    a few rows, paid instead once per pause as a batched matmul. ``limit`` (vLLM's
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


class TreeDrafting:
    """Mixed into vLLM's DFlash drafter classes (which provide ``vllm_config``, ``device``
    and, once loaded, the drafter ``model``).

    ``same_on_every_rank(decision)`` (given by the runner's adapter:
    ``integration.tensor_parallel.same_on_every_rank``) returns rank 0's ``decision`` on
    every rank of the tensor-parallel group. ``tree_step`` is the engine's
    :class:`~vllm_dartree.step.tree_step.TreeStep` (set by the adapter), which gets the
    trees. Each runner keeps its own query forward and its own output format; the end of a
    proposal is here once: :meth:`finish_proposal` (a drafted step) and
    :meth:`record_pause` (a step that did not draft)."""

    vllm_config: object
    device: torch.device
    model: torch.nn.Module

    def init_tree_drafting(self, vllm_config, device,
                           same_on_every_rank: Callable[[bool], bool]) -> None:
        self.same_on_every_rank = same_on_every_rank
        self.tree_step: TreeStep | None = None  # the engine's step, set by the adapter
        self.settings: DARTreeConfig = carried_settings(vllm_config.speculative_config)
        # Read and checked at config time (refusals.check_drafter).
        self.layout: DrafterLayout = carried_layout(vllm_config.speculative_config)
        corrects = self.layout.has_head or self.layout.has_lattice
        self.use_correction = (corrects if self.settings.correction is None
                               else self.settings.correction)
        # A lattice drafter's correction is its own lattice, scored each step.
        self.use_lattice = self.use_correction and self.layout.has_lattice
        # K candidates per depth: a lattice's own (vLLM's lattice speculators set the same
        # attribute to it), else the setting capped at the vocabulary.
        self.top_k = (self.layout.lattice_top_k if self.layout.has_lattice else
                      min(self.settings.top_k, vllm_config.model_config.get_vocab_size()))
        self.head = None
        self.graphs: CorrectionGraphs | None = None
        # Adaptive verification: the drafter asks it which nodes to hand over, the step tells
        # it what each step cost and what was accepted. ``width: "auto"`` (adaptive only):
        # the step feeds it the scheduled counts through the policy; the builder reads it.
        self.auto_width = (AutoWidth(self.settings.max_width, self.budget, self.tree_depths)
                           if self.settings.auto_width else None)
        self.policy = (AdaptiveVerification(self.tree_depths, device,
                                             auto_width=self.auto_width)
                              if self.settings.adaptive else None)
        self.policy_report = PolicyReport() if self.settings.adaptive else None
        # Context K/V owed to the drafter's cache by steps that did not draft.
        self.pending_context = PendingContext(
            vllm_config.scheduler_config.max_num_batched_tokens)

    def load_tree_head(self) -> None:
        """After the drafter model is loaded: its correction head and the head's graphs."""
        if self.use_correction and not self.use_lattice:
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
    def budget(self) -> int:
        """B, as the user set it (``DARTreeConfig.num_speculative_tokens``)."""
        return self.settings.num_speculative_tokens

    @property
    def tree_depths(self) -> int:
        """Depths a tree can use: the drafter's, capped at the budget."""
        return min(self.layout.num_depths, self.budget)

    @property
    def query_slots(self) -> int:
        """Mask slots queried after the root: the block's, cut to the depths a tree can use.

        With B below the drafter's depths the slots past depth B were computed and dropped.
        The block attends bidirectionally, so the cut moves the kept slots' hidden states a
        little (what it did to tau and to the drafter's forward on the SmolLM2 pair:
        benchmarks/results/cpu-speed.md)."""
        needed = self.tree_depths if self.layout.shift_label else self.tree_depths + 1
        return min(self.layout.block_size, needed) - 1

    @property
    def tree_width(self) -> int:
        """W of this step's pruned tree: the configured width, or the auto width's choice."""
        return self.auto_width.width if self.auto_width else self.settings.max_width


    def depth_hidden_of(self, query_out: torch.Tensor) -> torch.Tensor:
        """The drafter's query outputs [R, 1 + query_slots, H] -> one hidden state per tree
        depth [R, D, H]. Shift layout: slot j predicts position root+j+1 (16 depths for b16);
        non-shift (z-lab): slot j >= 1 predicts its own position (15 depths). A tree of B
        nodes reaches depth B at most, so depths past B cannot change any variant's tree."""
        depths = query_out if self.layout.shift_label else query_out[:, 1:]
        return depths[:, : self.tree_depths]

    def build_trees(self, depth_hidden: torch.Tensor, root_tokens: torch.Tensor,
                    chain: bool) -> DraftTree:
        """One tree per request from the drafter's per-depth hidden states [R, D, H] and the
        roots [R] (``chain``: the drafter's best chain, for a batch verified as chains).
        With ``budget_policy`` fixed the tree comes depth-first (see ``tree.depth_first``)."""
        num_reqs, depths, hidden = depth_hidden.shape
        variant = "chain" if chain else self.settings.tree
        base_logits = vocab_ids = lattice = None
        with StepProfile.phase("drafter_logits", self.device):
            if self.use_lattice and variant != "ddtree":  # no logits over the vocabulary
                lattice = self.depth_lattice(depth_hidden, root_tokens)
            else:
                base_logits, vocab_ids = self.depth_logits(
                    depth_hidden.reshape(-1, hidden), min_columns=max(self.top_k, self.budget))
                base_logits = base_logits.view(num_reqs, depths, -1).float()
        with StepProfile.phase("tree_build", self.device):
            tree = build_tree(
                variant, base_logits, depth_hidden.float(), root_tokens.to(torch.int64),
                self.head, budget=self.budget, top_k=self.top_k, width=self.tree_width,
                depth_bonus=self.settings.effective_depth_bonus, graphs=self.graphs,
                vocab_ids=vocab_ids, lattice=lattice,
            )
            if variant != "chain" and self.policy is None:
                tree = depth_first(tree)  # verified depth-first: see tree.depth_first
        return tree

    def depth_logits(self, hidden: torch.Tensor, min_columns: int = 1
                     ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The drafter's logits of hidden states [N, H] (see the drafter model's)."""
        return self.model.draft_logits(hidden, min_columns=min_columns)

    def depth_lattice(self, depth_hidden: torch.Tensor, roots: torch.Tensor) -> Lattice:
        """The drafter's candidate lattice of the depths [R, D, H] (lattice drafters only:
        ``integration/v2/lattice.py``)."""
        raise NotImplementedError(f"{type(self).__name__} drafts no lattice")

    def drafts_this_step(self, num_requests: int) -> bool:
        """Adaptive verification's call (always True without it); every tensor-parallel rank
        takes rank 0's, since the drafter's forward and logits run collectives."""
        policy = self.policy
        if policy is None:
            return True
        drafting = self.same_on_every_rank(policy.should_draft(num_requests))
        if not drafting:
            self.policy_report.record_no_drafting()
        return drafting

    def choose_nodes(self, tree: DraftTree, depth_hidden: torch.Tensor,
                     root_tokens: torch.Tensor) -> VerifyChoice:
        """Adaptive verification's nodes to verify: a subtree per request, in priority order,
        and how many of each (the scheduler's draft counts)."""
        tree = self.with_chain_confidence(tree, depth_hidden, root_tokens)
        choice = self.policy.choose(tree)
        self.policy_report.record(choice, self.policy, self.tree_width)
        return choice

    def finish_proposal(self, depth_hidden: torch.Tensor, roots: torch.Tensor,
                        req_ids: list[str], chain_rows: list[bool], started: float,
                        written_ms: float) -> tuple[DraftTree, list[int] | None]:
        """The end of a drafted step: one tree per request ``req_ids[r]`` from the drafter's
        per-depth hidden states [R, D, H] and the roots [R] (``chain_rows[r]``: the request
        verifies as a chain, so it gets the drafter's best chain), handed to the engine's
        step for the next step's verification. With adaptive verification the trees are the
        nodes it chose (priority order), and the proposal's wall time since ``started``
        (``time.perf_counter()``; ``written_ms`` of it wrote held context) is recorded.
        Returns (the trees handed over, each request's node count to schedule; None without
        adaptive verification)."""
        all_chains = all(chain_rows)
        tree = self.build_trees(depth_hidden, roots, all_chains)
        counts = None
        if self.policy is not None:
            choice = self.choose_nodes(tree, depth_hidden, roots)
            tree, counts = choice.tree, choice.counts
        if any(chain_rows) and not all_chains:
            tree, counts = self._with_chains(tree, counts, depth_hidden, roots, chain_rows)
        self.tree_step.hand_over(list(req_ids), tree,
                                 chains=all_chains or self.settings.tree == "chain")
        if self.policy is not None:
            self._record_drafting(True, started, written_ms)
        return tree, counts

    def _with_chains(self, tree: DraftTree, counts: list[int] | None,
                     depth_hidden: torch.Tensor, roots: torch.Tensor, chain_rows: list[bool]
                     ) -> tuple[DraftTree, list[int] | None]:
        """``tree`` with the drafter's best chain for every request of ``chain_rows`` (the
        verify plan lays such a request's rows out as a chain: ``verify_plan.build_plan``),
        built from those requests' rows alone (their drafter logits only)."""
        device = tree.tokens.device
        rows = torch.tensor([r for r, chain in enumerate(chain_rows) if chain], device=device)
        chains = self.build_trees(depth_hidden[rows], roots[rows], chain=True)
        # Request r takes chain row (number of chain requests up to r) - 1; the rows of tree
        # requests (any chain, the first) are not taken.
        source = torch.tensor(list(accumulate(chain_rows)), device=device).sub_(1).clamp_(min=0)
        mask = torch.tensor(chain_rows, device=device)
        tree = where_requests(mask, select_requests(chains, source), tree)
        if counts is not None:
            counts = [self.tree_depths if chain else count
                      for chain, count in zip(chain_rows, counts)]
        return tree, counts

    def record_pause(self, started: float, written_ms: float) -> None:
        """The end of a step that did not draft (adaptive verification's pause: the next step
        verifies nothing): its wall time since ``started``, ``written_ms`` of it writing
        held context, told to the policy."""
        self._record_drafting(False, started, written_ms)

    def _record_drafting(self, drafted: bool, started: float, written_ms: float) -> None:
        self.policy.record_drafting(drafted, (time.perf_counter() - started) * 1e3,
                                           set_aside_ms=written_ms)

    def _write_pending_context(self) -> float:
        """Write every held context into the drafter's cache (one K/V pass over all of it,
        after :meth:`_combine_held`); returns the ms it took."""
        held = self.pending_context.take()
        if held is None:
            return 0.0
        started = time.perf_counter()
        states, positions, slots = held
        with StepProfile.phase("drafter_forward", self.device):
            self.model.precompute_and_store_context_kv(self._combine_held(states), positions,
                                                       slots)
        return (time.perf_counter() - started) * 1e3

    def _combine_held(self, states: torch.Tensor) -> torch.Tensor:
        """The drafter's context states of held target states: as held (V2 holds them
        combined); V1 holds the target's states uncombined and combines them here."""
        return states

    def with_chain_confidence(self, tree: DraftTree, depth_hidden: torch.Tensor,
                              root_tokens: torch.Tensor) -> DraftTree:
        """With a DSpark confidence head: the tree's acceptance estimate (its scores) moved
        to the head's chain survival (``tree.adaptive.with_confidence``)."""
        if not getattr(self.model, "has_confidence_head", False):
            return tree
        leaders, _ = depth_leaders(tree, depth_hidden.shape[1])
        previous = torch.cat([root_tokens.view(-1, 1).to(leaders.dtype), leaders[:, :-1]], 1)
        return with_confidence(tree, self.model.chain_confidence(depth_hidden, previous))
