"""Hand-built verify plans for unit tests: a batch laid out as vLLM's V1 runner lays it out."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch

from vllm_dartree.step.verify_plan import Proposal, VerifyPlan, build_plan
from vllm_dartree.tree import DraftTree, stack_trees


def plan_of(trees: list[DraftTree], num_drafts: list[int], num_scheduled: list[int],
            budget: int | None = None) -> VerifyPlan:
    """The plan of a batch whose request b schedules ``num_scheduled[b]`` rows, the last
    ``num_drafts[b] + 1`` of them its root and drafts; ``trees`` are the drafted requests'
    trees, in batch order. Request ids are ``"r0"``, ``"r1"``, ..."""
    req_ids = [f"r{b}" for b in range(len(num_drafts))]
    drafted = [r for r, n in zip(req_ids, num_drafts) if n > 0]
    assert len(drafted) == len(trees), "one tree per request with drafts"
    tree = stack_trees(trees)
    proposal = Proposal(0, {r: i for i, r in enumerate(drafted)}, tree)
    plan = build_plan(1, req_ids, num_drafts, np.asarray(num_scheduled), proposal, {},
                      budget or tree.budget, torch.device("cpu"))
    assert plan is not None
    return plan


def layout_for_roots(root_rows: list[int], num_drafts: list[int]) -> list[int]:
    """``num_scheduled`` of a batch of drafted requests whose roots sit at ``root_rows``."""
    ends = [root + n + 1 for root, n in zip(root_rows, num_drafts)]
    return [end - start for start, end in zip([0, *ends[:-1]], ends)]


@contextmanager
def counting_branched_trees() -> Iterator[list[int]]:
    """While the block runs, append to the yielded list, for every tree step verified in
    this process, how many of its requests verified a tree that branches (some node not the
    child of the node before it: not a chain)."""
    from vllm_dartree.step.verifier import TreeVerifier

    counts: list[int] = []

    def record(paths) -> None:
        tree = paths.plan.tree
        columns = torch.arange(tree.budget, device=tree.parents.device)
        counts.append(int(((tree.parents != columns) & tree.valid).any(dim=1).sum()))

    with TreeVerifier.observing(record):
        yield counts
