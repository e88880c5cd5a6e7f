"""Tree verification: sample the target at every node, then walk the tree.

Sampling every node independently from the target and descending while the sampled token
is a drafted child is distribution-preserving because the tree is a deterministic function
of the drafter outputs: the emitted tokens are exactly what the target would sample.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vllm_dartree.tree.types import DraftTree


@dataclass
class AcceptResult:
    accepted_nodes: torch.Tensor  # [R, D+1] node indices along the path (root 0 first), -1 pad
    num_accepted: torch.Tensor  # [R] path length including the root (accepted drafts + 1)
    bonus_token: torch.Tensor  # [R] target choice at the last accepted node
    accepted_tokens: torch.Tensor  # [R, D+1] drafted path tokens then the bonus, -1 pad


@torch.no_grad()
def accept_tree(tree: DraftTree, target_choice: torch.Tensor) -> AcceptResult:
    """Walk from the root to the valid child whose token equals the target's choice.

    Siblings carry distinct tokens, so at most one child matches. One step per depth,
    vectorised over requests and nodes; no host sync.
    """
    num_requests, budget = tree.tokens.shape
    device = tree.tokens.device
    steps = tree.depth_limit
    current = torch.zeros(num_requests, dtype=torch.int64, device=device)
    active = torch.ones(num_requests, dtype=torch.bool, device=device)
    accepted_nodes = torch.full((num_requests, steps + 1), -1, dtype=torch.int64, device=device)
    accepted_nodes[:, 0] = 0
    for step in range(1, steps + 1):
        wanted = target_choice.gather(1, current.unsqueeze(1))  # [R, 1]
        match = tree.valid & (tree.parents == current.unsqueeze(1)) & (tree.tokens == wanted)
        active = active & match.any(dim=1)
        child = match.to(torch.uint8).argmax(dim=1) + 1
        current = torch.where(active, child, current)
        accepted_nodes[:, step] = torch.where(active, child, -1)
    num_accepted = (accepted_nodes >= 0).sum(dim=1)
    # Each accepted node's token is the target's choice at its parent, so the emitted
    # tokens are the target's choices along the path (the last one is the bonus).
    choices = target_choice.gather(1, accepted_nodes.clamp(min=0))
    accepted_tokens = torch.where(accepted_nodes >= 0, choices, -1)
    return AcceptResult(
        accepted_nodes=accepted_nodes,
        num_accepted=num_accepted,
        bonus_token=target_choice.gather(1, current.unsqueeze(1)).squeeze(1),
        accepted_tokens=accepted_tokens,
    )
