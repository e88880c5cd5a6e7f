"""Draft-tree construction: chain, DDTree, and DARTree (fixed / pruned / sequential).

Every builder takes per-depth drafter outputs for R requests (``base_logits [R, D, V]``,
``draft_hidden [R, D, H]``) and the root tokens, and returns a ``DraftTree`` padded to the
budget B. Depth d (1-based) uses row d-1 of both. ``chain``, ``ddtree``, ``fixed`` and
``pruned`` are batched with static shapes (Python loops run over depths or budget steps only,
no host syncs); ``sequential`` is the slow per-node reference of the DARTree ablation.

The correction head (Domino's GRU head or DSpark's Markov head) is used only through the
:class:`~vllm_dartree.tree.heads.CorrectionHead` protocol. A drafter that scores its own
candidate lattice (DFlash2, LiLiCorr) gives a :class:`~vllm_dartree.tree.lattice.Lattice`
instead: its candidates and per-parent rows replace the top-K and the head.

Tie-breaking is deterministic everywhere: among equal scores the lower index wins (the
ancestor first, then the lower candidate rank / insertion order).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

import torch

from vllm_dartree.kernels.topb import select_top_b
from vllm_dartree.tree.graphs import CorrectionGraphs, bucket_size
from vllm_dartree.tree.heads import CorrectionHead
from vllm_dartree.tree.lattice import Lattice, row_logprobs
from vllm_dartree.tree.types import DraftTree, padded_tree

VARIANTS = ("chain", "ddtree", "fixed", "pruned", "sequential")
# Rows up to this length are fully (stably) sorted; longer rows use two topk passes.
SMALL_SORT = 4096


@torch.no_grad()  # trees are data: never build autograd graphs through the head weights
def build_tree(
    variant: str,
    base_logits: torch.Tensor | None,
    draft_hidden: torch.Tensor | None,
    root_tokens: torch.Tensor,
    head: CorrectionHead | None,
    *,
    budget: int = 64,
    top_k: int = 64,
    width: int = 12,
    depth_bonus: float = -0.2,
    graphs: CorrectionGraphs | None = None,
    vocab_ids: torch.Tensor | None = None,
    lattice: Lattice | None = None,
) -> DraftTree:
    """Build the draft trees of R requests with one of ``VARIANTS``.

    ``vocab_ids`` [V'] (ascending) is the token id of each column of ``base_logits`` when
    the drafter's head covers only part of the vocabulary (the tree is the same as over
    the full vocabulary with -inf elsewhere); None: column j is token j.

    - ``chain``: greedy chain of min(D, budget) nodes (head: corrected argmax over the top-K
      candidates, the head's state advanced along the chain = Domino's or DSpark's own
      chain; no head: argmax of base logits).
    - ``ddtree``: best-first over factorised full-vocabulary marginals, min(budget, V) ranks
      per depth as in the reference (``head``, ``draft_hidden``, ``top_k`` unused).
    - ``fixed``: DARTree with per-depth quota ceil(remaining budget / remaining depths)
      (``depth_bonus`` is unused: the quotas already sum to the budget).
    - ``pruned``: DARTree supertree of ``width`` nodes per depth, then the global top-budget
      by path score + depth_bonus * depth (``depth_bonus`` <= 0 keeps it prefix-closed).
    - ``sequential``: exact per-node best-first reference (slow, loops in Python).

    ``graphs`` (wrapping ``head``) runs the per-depth head calls of ``chain``, ``fixed`` and
    ``pruned`` as padded fixed-shape steps (CUDA graphs on a GPU); ``sequential`` ignores it.

    ``lattice`` (the drafter's own, ``head`` None): ``chain``, ``fixed``, ``pruned`` and
    ``sequential`` grow over its candidates, each node's children scored by its own row
    (``top_k`` is the lattice's K); they read no ``base_logits`` (None allowed), ``ddtree``
    reads only those.
    """
    if lattice is not None:
        _validate_lattice(variant, lattice, base_logits, head)
        top_k = lattice.top_k
    elif base_logits is None:
        raise ValueError("base_logits is required; only a tree over a lattice reads none")
    # [R, D, V], or over a lattice without base logits [R, D, K]: the columns it picks from
    shape = tuple((lattice.ids if base_logits is None else base_logits).shape)
    _validate(variant, shape, draft_hidden, root_tokens, head, budget, top_k, width,
              depth_bonus)
    if vocab_ids is not None and tuple(vocab_ids.shape) != (shape[-1],):
        raise ValueError(f"vocab_ids must be [V'] = [{shape[-1]}] (one token id "
                         f"per logit column), got {list(vocab_ids.shape)}")
    if graphs is not None and graphs.head is not head:
        raise ValueError("graphs must wrap the head passed to build_tree")
    if variant == "ddtree":
        return build_ddtree(base_logits, root_tokens, budget=budget, vocab_ids=vocab_ids)
    if variant == "chain" and head is None and lattice is None:
        return build_argmax_chain(base_logits, root_tokens, budget=budget, vocab_ids=vocab_ids)
    candidates = (lattice_candidates(lattice) if lattice is not None else
                  prepare_candidates(base_logits, draft_hidden, head, top_k, vocab_ids))
    depths = shape[1]
    if variant == "sequential":
        return build_sequential(candidates, head, root_tokens, budget=budget,
                                depth_bonus=depth_bonus)
    quotas = depth_quotas(variant, depths, budget, top_k, width)
    supertree = grow_supertree(candidates, head, root_tokens, quotas, graphs)
    if variant == "pruned":
        return prune_supertree(supertree, root_tokens, budget, depth_bonus, depths)
    return supertree_to_tree(supertree, root_tokens, budget, depths)


def depth_quotas(variant: str, num_depths: int, budget: int, top_k: int, width: int
                 ) -> list[int]:
    """Nodes kept per depth by the supertree of ``chain`` (with a head), ``fixed``, ``pruned``."""
    if variant == "chain":
        return capacity_limited([1] * min(num_depths, budget), top_k)
    if variant == "fixed":
        return fixed_quotas(budget, num_depths, top_k)
    if variant == "pruned":
        return capacity_limited([width] * num_depths, top_k)
    raise ValueError(f"variant {variant!r} grows no supertree")


def capture_all_shapes(graphs: CorrectionGraphs, variants: set[str], max_requests: int,
                       num_depths: int, budget: int, top_k: int, width: int) -> None:
    """Make every per-depth head call the builders can issue for 1..``max_requests``
    requests once now, so that ``graphs`` holds (on CUDA: has captured) every shape before
    serving starts instead of capturing mid-serving. Runs the real code path on zeros."""
    head = graphs.head
    device = head.device
    requests = 1
    while True:
        for variant in sorted(variants & {"chain", "fixed", "pruned"}):
            logits = torch.zeros(requests, num_depths, top_k, device=device)
            hidden = torch.zeros(requests, num_depths, head.hidden_size or 1, device=device)
            roots = torch.zeros(requests, dtype=torch.int64, device=device)
            candidates = prepare_candidates(logits, hidden, head, top_k)
            grow_supertree(candidates, head, roots,
                           depth_quotas(variant, num_depths, budget, top_k, width), graphs)
        if requests >= max_requests:
            return
        requests = min(2 * requests, bucket_size(max_requests))


# --------------------------------------------------------------------------- validation
def _validate(variant, shape, draft_hidden, root_tokens, head, budget, top_k, width,
              depth_bonus) -> None:
    if variant not in VARIANTS:
        raise ValueError(f"variant={variant!r} is unknown; allowed: {', '.join(VARIANTS)}")
    if len(shape) != 3:
        raise ValueError(f"base_logits must be [R, D, V], got shape {list(shape)}")
    num_requests, num_depths, vocab = shape
    if num_depths < 1 or vocab < 1:
        raise ValueError(f"base_logits must have D >= 1 depths and V >= 1 tokens, got shape "
                         f"{list(shape)}")
    if root_tokens.shape != (num_requests,):
        raise ValueError(f"root_tokens must be [R] = [{num_requests}], got "
                         f"{list(root_tokens.shape)}")
    if budget < 1:
        raise ValueError(f"budget={budget} is invalid; it must be >= 1")
    uses_candidates = variant in ("fixed", "pruned", "sequential") or (
        variant == "chain" and head is not None)
    if top_k < 1 or (uses_candidates and top_k > vocab):
        raise ValueError(f"top_k={top_k} is invalid; it must be in 1..V={vocab}")
    if width < 1:
        raise ValueError(f"width={width} is invalid; it must be >= 1")
    if variant == "pruned" and depth_bonus > 0:
        raise ValueError(f"depth_bonus={depth_bonus} is invalid for variant 'pruned'; it must "
                         "be <= 0 so the pruned tree stays prefix-closed")
    if head is not None and variant != "ddtree":
        if draft_hidden is None:
            raise ValueError("draft_hidden is required when a correction head is given")
        # A head that reads no hidden state (Markov) accepts any H.
        width = draft_hidden.shape[-1] if head.hidden_size is None else head.hidden_size
        expected = (*shape[:2], width)
        if tuple(draft_hidden.shape) != expected:
            raise ValueError(f"draft_hidden must be [R, D, H] = {list(expected)}, got "
                             f"{list(draft_hidden.shape)}")


def _validate_lattice(variant: str, lattice: Lattice, base_logits: torch.Tensor | None,
                      head: CorrectionHead | None) -> None:
    if head is not None:
        raise ValueError("a lattice replaces the correction head: give one of them, not both")
    if base_logits is None:
        if variant == "ddtree":
            raise ValueError("variant 'ddtree' reads base_logits, not the lattice")
        return
    if lattice.ids.shape[:2] != base_logits.shape[:2]:
        raise ValueError(f"lattice ids [R, D, K] = {list(lattice.ids.shape)} must have the "
                         f"base logits' R and D {list(base_logits.shape[:2])}")


# ------------------------------------------------------------------------- selection
def stable_topk(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Values and indices of the k largest entries of the last dim, sorted descending.

    Ties go to the lower index, including at the k-th place (torch.topk leaves both the
    order among equal values and which tied entries make the cut unspecified). Large rows
    avoid a full sort: one topk gives the k-th largest value t; the entries above t are the
    head of that topk, and a second topk over "-index where x == t" picks the lowest-index
    tied entries to fill the remaining places.
    """
    n = x.shape[-1]
    if n <= SMALL_SORT or k == n or n > 2**24:
        values, indices = torch.sort(x, dim=-1, descending=True, stable=True)
        return values[..., :k], indices[..., :k]
    top_values, top_indices = torch.topk(x, k, dim=-1)
    threshold = top_values[..., -1:]
    num_above = (top_values > threshold).sum(dim=-1, keepdim=True)
    # float32 holds every index < 2^24 exactly; lower index -> larger key
    negative_index = -torch.arange(n, device=x.device, dtype=torch.float32)
    tie_key = torch.where(x == threshold, negative_index, float("-inf"))
    tied = torch.topk(tie_key, k, dim=-1).indices  # lowest-index tied entries first
    place = torch.arange(k, device=x.device)
    from_ties = tied.gather(-1, (place - num_above).clamp(min=0))
    indices = torch.where(place < num_above, top_indices, from_ties)
    # order: value descending, then index ascending (stable sort on index-sorted input)
    indices = torch.sort(indices, dim=-1).values
    values, order = torch.sort(x.gather(-1, indices), dim=-1, descending=True, stable=True)
    return values, indices.gather(-1, order)


# ------------------------------------------------------------------------ candidates
@dataclass
class Candidates:
    """Per-depth candidate pool shared by every parent of that depth."""

    ids: torch.Tensor  # [R, D, K] base top-K token ids, best first
    base: torch.Tensor  # [R, D, K] their base logits
    context: torch.Tensor | None  # [R, D, C] head.depth_context (None without a head)
    weights: torch.Tensor | None  # [R, D, K, W] the head's output rows of the candidates
    # [R, D, K, K] a lattice's scores: row i scores the depth's candidates after the
    # previous depth's candidate i (None: no lattice)
    transitions: torch.Tensor | None = None


def prepare_candidates(
    base_logits: torch.Tensor,
    draft_hidden: torch.Tensor | None,
    head: CorrectionHead | None,
    top_k: int,
    vocab_ids: torch.Tensor | None = None,
) -> Candidates:
    """Top-K of every depth, the head's per-depth context for all depths at once (Domino:
    W_z.z in one matmul) and the candidates' output rows gathered once."""
    base, ids = stable_topk(base_logits.float(), top_k)
    ids = _token_ids(ids, vocab_ids)
    if head is None:
        return Candidates(ids, base, None, None)
    return Candidates(ids, base, head.depth_context(draft_hidden), head.candidate_weights(ids))


def lattice_candidates(lattice: Lattice) -> Candidates:
    """A lattice's candidates; ``base`` holds each depth's row 0 (unused: every parent is
    scored by its own row)."""
    return Candidates(lattice.ids, lattice.transitions[:, :, 0].float(), None, None,
                      lattice.transitions)


def candidate_logprobs(
    candidates: Candidates, depth: int, head: CorrectionHead | None, states: torch.Tensor | None,
    graphs: CorrectionGraphs | None = None, parent_slots: torch.Tensor | None = None,
) -> torch.Tensor:
    """Log-probs of the K candidates of ``depth`` for each parent, normalised over the K.

    Returns [R, N, K] for N parents with states [R, N, G] (or, over a lattice, with
    candidate slots [R, N] at the depth before: the root's is 0), or [R, 1, K] (shared by
    all parents) when the depth is uncorrected.
    """
    if candidates.transitions is not None:
        return row_logprobs(candidates.transitions[:, depth - 1], parent_slots)
    base = candidates.base[:, depth - 1]
    if head is not None and head.corrects_depth(depth):
        corrected = head.corrected_logprobs if graphs is None else graphs.logprobs
        return corrected(base, candidates.context[:, depth - 1],
                         candidates.weights[:, depth - 1], states)
    return torch.log_softmax(base.unsqueeze(1), dim=-1)


def _token_ids(columns: torch.Tensor, vocab_ids: torch.Tensor | None) -> torch.Tensor:
    """Token ids of logit columns (``build_tree``'s ``vocab_ids``)."""
    return columns if vocab_ids is None else vocab_ids[columns]


def needs_states(head: CorrectionHead | None, num_depths: int) -> bool:
    """Head states matter only if some depth gets the correction."""
    return head is not None and head.corrects_depth(num_depths)


# ------------------------------------------------------------------------- supertree
@dataclass
class Supertree:
    """Nodes grown depth by depth (BFS order, best first within a depth)."""

    tokens: torch.Tensor  # [R, S]
    parents: torch.Tensor  # [R, S] node index (root 0, column j is node j+1)
    depths: torch.Tensor  # [R, S]
    scores: torch.Tensor  # [R, S] path log-prob


def capacity_limited(quotas: list[int], top_k: int) -> list[int]:
    """Clip each depth's quota to what its frontier can produce (frontier size x K)."""
    clipped, frontier = [], 1
    for quota in quotas:
        frontier = min(quota, frontier * top_k)
        clipped.append(frontier)
    return clipped


def fixed_quotas(budget: int, num_depths: int, top_k: int) -> list[int]:
    """ceil(remaining budget / remaining depths) per depth, clipped by frontier capacity."""
    quotas, remaining, frontier = [], budget, 1
    for depth in range(num_depths):
        quota = min(math.ceil(remaining / (num_depths - depth)), frontier * top_k)
        quotas.append(quota)
        remaining -= quota
        frontier = quota
    return quotas


def grow_supertree(
    candidates: Candidates,
    head: CorrectionHead | None,
    root_tokens: torch.Tensor,
    quotas: list[int],
    graphs: CorrectionGraphs | None = None,
) -> Supertree:
    """Per depth, keep the global top-``quota`` (parent, candidate) pairs over the frontier.

    Child path score = parent path score + candidate log-prob (normalised over the K
    candidates, with the parent's head state when the depth is corrected). The kept children
    become the next frontier and their states advance with their tokens.
    """
    num_requests, num_depths, top_k = candidates.ids.shape
    device = candidates.ids.device
    with_states = needs_states(head, num_depths)
    states = head.root_state(root_tokens).unsqueeze(1) if with_states else None
    frontier_scores = torch.zeros(num_requests, 1, device=device)
    frontier_nodes = torch.zeros(num_requests, 1, dtype=torch.int64, device=device)
    frontier_slots = torch.zeros_like(frontier_nodes)  # lattice rows: the root reads row 0
    tokens, parents, depths, scores = [], [], [], []
    next_node = 1
    for depth, quota in enumerate(quotas, start=1):
        if quota == 0:
            break
        logprobs = candidate_logprobs(candidates, depth, head, states, graphs, frontier_slots)
        pair_scores = (frontier_scores.unsqueeze(-1) + logprobs).flatten(1)
        child_scores, pair = stable_topk(pair_scores, quota)
        parent_slot, cand_slot = pair // top_k, pair % top_k
        child_tokens = candidates.ids[:, depth - 1].gather(1, cand_slot)
        tokens.append(child_tokens)
        parents.append(frontier_nodes.gather(1, parent_slot))
        depths.append(torch.full_like(child_tokens, depth))
        scores.append(child_scores)
        if with_states and depth < num_depths:
            state_index = parent_slot.unsqueeze(-1).expand(-1, -1, states.shape[-1])
            stepper = head if graphs is None else graphs
            states = stepper.advance(states.gather(1, state_index), child_tokens)
        frontier_scores, frontier_slots = child_scores, cand_slot
        frontier_nodes = torch.arange(next_node, next_node + quota, device=device)
        frontier_nodes = frontier_nodes.expand(num_requests, quota)
        next_node += quota
    return Supertree(*(torch.cat(parts, dim=1) for parts in (tokens, parents, depths, scores)))


def supertree_to_tree(
    supertree: Supertree, root_tokens: torch.Tensor, budget: int, max_depth: int
) -> DraftTree:
    """Use the whole supertree (its size is <= budget) as the draft tree."""
    valid = torch.ones_like(supertree.tokens, dtype=torch.bool)
    return padded_tree(supertree.tokens, supertree.parents, supertree.depths, valid,
                       supertree.scores, root_tokens, budget, max_depth)


def node_priority(scores: torch.Tensor, depths: torch.Tensor, depth_bonus: float) -> torch.Tensor:
    """path score + depth_bonus * depth, in the scores' dtype (shared by all builders)."""
    return scores + depth_bonus * depths.to(scores.dtype)


def prune_supertree(
    supertree: Supertree,
    root_tokens: torch.Tensor,
    budget: int,
    depth_bonus: float,
    max_depth: int,
) -> DraftTree:
    """Keep the top-``budget`` nodes by path score + depth_bonus * depth, remap parents.

    With depth_bonus <= 0 and log-probs <= 0 a child never outranks its parent (and wins no
    tie against it: the parent has the lower index), so the kept set is prefix-closed.
    """
    size = supertree.tokens.shape[1]
    if size <= budget:
        return supertree_to_tree(supertree, root_tokens, budget, max_depth)
    priority = node_priority(supertree.scores, supertree.depths, depth_bonus)
    kept = select_top_b(priority, budget)  # [R, B] ascending, so still topological
    # old node index (0 = root, j+1 = column j) -> new node index
    new_index = torch.zeros(kept.shape[0], 1 + size, dtype=torch.int64, device=kept.device)
    new_positions = torch.arange(1, budget + 1, device=kept.device).expand_as(kept)
    new_index.scatter_(1, kept + 1, new_positions)
    parents = new_index.gather(1, supertree.parents.gather(1, kept))
    valid = torch.ones_like(kept, dtype=torch.bool)
    return padded_tree(supertree.tokens.gather(1, kept), parents,
                       supertree.depths.gather(1, kept), valid, supertree.scores.gather(1, kept),
                       root_tokens, budget, max_depth)


# -------------------------------------------------------------------------------- chain
def build_argmax_chain(
    base_logits: torch.Tensor, root_tokens: torch.Tensor, *, budget: int,
    vocab_ids: torch.Tensor | None = None,
) -> DraftTree:
    """DFlash chain: argmax of the base logits at every depth (scores: full-vocab log-probs)."""
    num_requests, num_depths, _ = base_logits.shape
    length = min(num_depths, budget)
    logprobs = torch.log_softmax(base_logits[:, :length].float(), dim=-1)
    step_logprob, columns = logprobs.max(dim=-1)
    tokens = _token_ids(columns, vocab_ids)
    positions = torch.arange(length, device=base_logits.device).expand(num_requests, length)
    valid = torch.ones_like(tokens, dtype=torch.bool)
    return padded_tree(tokens, positions.clone(), positions + 1, valid,
                       step_logprob.cumsum(dim=1), root_tokens, budget, num_depths)


# ------------------------------------------------------------------------------- DDTree
def build_ddtree(base_logits: torch.Tensor, root_tokens: torch.Tensor, *, budget: int,
                 vocab_ids: torch.Tensor | None = None) -> DraftTree:
    """DDTree: best-first over rank tuples of factorised full-vocabulary marginals.

    A fixed frontier of 1 + 2*budget slots replaces the heap: pop t takes the live slot with
    the highest priority (lowest slot among ties = earliest pushed, like a heap with an
    insertion counter) and pushes the popped node's next sibling into slot 1+2t and its
    first child into slot 2+2t. Priority = parent priority + log-prob of the rank.
    """
    num_requests, num_depths, vocab = base_logits.shape
    device = base_logits.device
    ranks = min(budget, vocab)
    logprobs = torch.log_softmax(base_logits.float(), dim=-1)
    rank_logprobs, rank_columns = stable_topk(logprobs, ranks)  # [R, D, ranks]
    rank_tokens = _token_ids(rank_columns, vocab_ids)
    rank_logprobs, rank_tokens = rank_logprobs.flatten(1), rank_tokens.flatten(1)

    slots = 1 + 2 * budget
    live = torch.zeros(num_requests, slots, dtype=torch.bool, device=device)
    priority = torch.full((num_requests, slots), float("-inf"), device=device)
    parent_priority = torch.zeros(num_requests, slots, device=device)
    depth = torch.ones(num_requests, slots, dtype=torch.int64, device=device)
    rank = torch.zeros_like(depth)
    parent = torch.zeros_like(depth)
    live[:, 0] = True
    priority[:, 0] = rank_logprobs[:, 0]

    def rank_logprob(at_depth: torch.Tensor, at_rank: torch.Tensor) -> torch.Tensor:
        flat = (at_depth.clamp(max=num_depths) - 1) * ranks + at_rank.clamp(max=ranks - 1)
        return rank_logprobs.gather(1, flat.unsqueeze(1)).squeeze(1)

    node_tokens, node_parents, node_depths, node_scores, node_valid = [], [], [], [], []
    for step in range(budget):
        key = torch.where(live, priority, float("-inf"))
        best = key.amax(dim=1, keepdim=True)
        slot = (live & (key == best)).to(torch.uint8).argmax(dim=1, keepdim=True)
        popped = live.any(dim=1)
        live.scatter_(1, slot, False)
        pop_depth = depth.gather(1, slot).squeeze(1)
        pop_rank = rank.gather(1, slot).squeeze(1)
        pop_priority = priority.gather(1, slot).squeeze(1)
        pop_parent_priority = parent_priority.gather(1, slot).squeeze(1)
        flat = (pop_depth - 1) * ranks + pop_rank
        node_tokens.append(rank_tokens.gather(1, flat.unsqueeze(1)).squeeze(1))
        node_parents.append(parent.gather(1, slot).squeeze(1))
        node_depths.append(pop_depth)
        node_scores.append(pop_priority)
        node_valid.append(popped)
        # next sibling: same parent and depth, next rank
        sibling, child = 1 + 2 * step, 2 + 2 * step
        live[:, sibling] = popped & (pop_rank + 1 < ranks)
        depth[:, sibling] = pop_depth
        rank[:, sibling] = pop_rank + 1
        parent[:, sibling] = node_parents[-1]
        parent_priority[:, sibling] = pop_parent_priority
        priority[:, sibling] = pop_parent_priority + rank_logprob(pop_depth, pop_rank + 1)
        # first child: rank 0 one depth deeper, parent = the popped node (index step + 1)
        live[:, child] = popped & (pop_depth < num_depths)
        depth[:, child] = pop_depth + 1
        rank[:, child] = 0
        parent[:, child] = step + 1
        parent_priority[:, child] = pop_priority
        priority[:, child] = pop_priority + rank_logprob(pop_depth + 1, torch.zeros_like(pop_rank))
    stacked = [torch.stack(parts, dim=1) for parts in
               (node_tokens, node_parents, node_depths, node_valid, node_scores)]
    return padded_tree(*stacked, root_tokens, budget, num_depths)


# --------------------------------------------------------------------------- sequential
def build_sequential(
    candidates: Candidates,
    head: CorrectionHead | None,
    root_tokens: torch.Tensor,
    *,
    budget: int,
    depth_bonus: float,
) -> DraftTree:
    """Exact best-first DARTree: every popped node scores its own children with its own head
    state; priority = path score + depth_bonus * depth. Slow by design (Python loops)."""
    trees = [
        _sequential_one(candidates, head, root_tokens, request, budget, depth_bonus)
        for request in range(root_tokens.shape[0])
    ]
    stacked = [torch.stack(parts) for parts in zip(*trees)]
    num_depths = candidates.ids.shape[1]
    return padded_tree(*stacked, root_tokens, budget, num_depths)


def _sequential_one(candidates, head, root_tokens, request, budget, depth_bonus):
    num_depths = candidates.ids.shape[1]
    with_states = needs_states(head, num_depths)
    def one_request(part: torch.Tensor | None) -> torch.Tensor | None:
        return None if part is None else part[request : request + 1]

    one = Candidates(*(one_request(part) for part in (
        candidates.ids, candidates.base, candidates.context, candidates.weights,
        candidates.transitions)))
    heap: list[tuple] = []
    counter = 0

    def expand(node: int, depth: int, score: torch.Tensor, state, slot: int) -> None:
        nonlocal counter
        child_depth = depth + 1
        slots = torch.tensor([[slot]], device=one.ids.device)
        logprobs = candidate_logprobs(one, child_depth, head, state, None, slots)[0, 0]  # [K]
        child_scores = score + logprobs  # float32, like the batched builders
        priorities = node_priority(child_scores, torch.full_like(logprobs, child_depth),
                                   depth_bonus)
        for slot, (prio, child_score) in enumerate(zip(priorities.tolist(),
                                                       child_scores.tolist())):
            heapq.heappush(heap, (-prio, counter, node, child_depth, slot, child_score, state))
            counter += 1

    root_state = head.root_state(root_tokens[request : request + 1]).unsqueeze(1) \
        if with_states else None
    expand(0, 0, torch.zeros((), dtype=candidates.base.dtype), root_state, 0)
    tokens, parents, depths, scores = [], [], [], []
    while len(tokens) < budget and heap:
        _, _, parent, depth, slot, score, parent_state = heapq.heappop(heap)
        token = candidates.ids[request, depth - 1, slot]
        tokens.append(token)
        parents.append(parent)
        depths.append(depth)
        scores.append(score)
        if depth < num_depths:
            state = head.advance(parent_state, token.view(1, 1)) if with_states else None
            expand(len(tokens), depth, torch.tensor(score, dtype=candidates.base.dtype), state,
                   slot)
    count = len(tokens)
    valid = torch.zeros(budget, dtype=torch.bool)
    valid[:count] = True
    pad = budget - count
    device = candidates.ids.device
    return (
        torch.tensor([int(t) for t in tokens] + [0] * pad, dtype=torch.int64, device=device),
        torch.tensor(parents + [0] * pad, dtype=torch.int64, device=device),
        torch.tensor(depths + [1] * pad, dtype=torch.int64, device=device),
        valid.to(device),
        torch.tensor(scores + [0.0] * pad, dtype=torch.float32, device=device),
    )
