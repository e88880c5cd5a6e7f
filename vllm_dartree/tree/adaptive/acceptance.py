"""The acceptance estimate: how likely each drafted node is to be accepted, and how far the
sum of those estimates is from the tokens verification delivers.

    p_u = min over u and its ancestors a of  min(1, c[d(a)] * exp(s_a))     (node_acceptance)
    c[d] = observed / predicted accepted nodes at depth d                   (DepthCalibration)
    g    = delivered / promised tokens beyond one per request               (DeliveryRatio)

``s`` is a node's path log-probability under the corrected drafter (``DraftTree.scores``;
with a DSpark confidence head moved by :func:`with_confidence`). The running minimum keeps
p non-increasing along every path.
"""

from __future__ import annotations

import torch

from vllm_dartree.tree.types import DraftTree, ancestor_mask


def node_acceptance(tree: DraftTree, depth_scale: torch.Tensor) -> torch.Tensor:
    """[R, B] calibrated probability that each node is on the accepted path (0 for padding).

    ``depth_scale`` [D + 1] is c[d] (index = depth). The running minimum over ancestors
    keeps p non-increasing along every path, whatever the per-depth scales do.
    """
    depths = tree.depths.clamp(max=depth_scale.shape[0] - 1)
    raw = (depth_scale[depths] * tree.scores.float().exp()).clamp(max=1.0)
    raw = torch.where(tree.valid, raw, torch.zeros_like(raw))
    ancestors = ancestor_mask(tree)[:, 1:, 1:]  # [R, i, j]: node j is i or above i
    spread = torch.where(ancestors, raw.unsqueeze(1), torch.ones_like(raw).unsqueeze(1))
    return spread.amin(dim=2) * tree.valid


def depth_leaders(tree: DraftTree, num_depths: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[R, D] token and path log-prob of each depth's most likely node (-inf: no node)."""
    depth = torch.arange(1, num_depths + 1, device=tree.depths.device)
    at_depth = (tree.depths.unsqueeze(2) == depth) & tree.valid.unsqueeze(2)  # [R, B, D]
    scores = torch.where(at_depth, tree.scores.float().unsqueeze(2),
                         torch.full_like(at_depth, float("-inf"), dtype=torch.float32))
    best, column = scores.max(dim=1)
    return tree.tokens.gather(1, column), best


def with_confidence(tree: DraftTree, survival: torch.Tensor) -> DraftTree:
    """The tree with its scores moved so that each depth's most likely node carries a
    confidence head's chain survival, its siblings and cousins keeping their ratio to it.

    ``survival`` [R, D] is the head's probability that the chain's node at depth d is
    accepted given depth d - 1 was (DSpark's per-slot confidence); the chain is taken as
    each depth's most likely node. Only the acceptance estimate changes: the nodes, their
    order within the tree and what is verified stay the drafter's.
    """
    num_depths = survival.shape[1]
    _, best = depth_leaders(tree, num_depths)
    log_survival = survival.float().clamp(min=1e-6, max=1.0).log().cumsum(dim=1)
    shift = torch.where(torch.isfinite(best), log_survival - best, torch.zeros_like(best))
    depth_index = (tree.depths.clamp(min=1, max=num_depths) - 1)
    moved = tree.scores.float() + shift.gather(1, depth_index)
    return DraftTree(tree.tokens, tree.parents, tree.depths, tree.num_nodes, tree.valid,
                     torch.where(tree.valid, moved, tree.scores.float()), tree.max_depth)


class DepthCalibration:
    """c[d] = observed / predicted accepted nodes at depth d (exponentially weighted).

    ``predicted[d]`` sums exp(path log-prob) of the verified nodes at depth d, ``observed[d]``
    counts the requests whose accepted path reached depth d. Both stay on the device (no
    host sync per step); c[d] starts at 1 (trust the drafter) and moves toward the observed
    ratio as evidence accumulates (``pseudo`` nodes of prior weight).
    """

    def __init__(self, max_depth: int, device: torch.device, decay: float = 0.99,
                 pseudo: float = 4.0) -> None:
        self.decay = decay
        self.pseudo = pseudo
        self.predicted = torch.zeros(max_depth + 1, device=device)
        self.observed = torch.zeros(max_depth + 1, device=device)

    def scale(self) -> torch.Tensor:
        """[D + 1] c[d] (index = depth; index 0 unused)."""
        weight = self.predicted + self.pseudo
        return (self.observed + self.pseudo) / weight

    def update(self, tree: DraftTree, num_accepted: torch.Tensor) -> None:
        """One verified step: ``tree`` as verified (valid = scheduled), ``num_accepted`` [R]
        the path lengths including the root."""
        size = self.predicted.shape[0]
        depths = tree.depths.clamp(max=size - 1)
        predicted = torch.zeros_like(self.predicted).scatter_add_(
            0, depths.flatten(), (tree.scores.float().exp() * tree.valid).flatten())
        reached = torch.arange(size, device=depths.device) <= (num_accepted - 1).unsqueeze(1)
        observed = reached.to(self.observed.dtype).sum(dim=0)
        observed[0] = 0
        self.predicted = self.decay * self.predicted + predicted
        self.observed = self.decay * self.observed + observed

    def error(self) -> float:
        """Mean |predicted * c - observed| / observed over depths with evidence, using the
        current scales on the accumulated sums: 0 when calibrated (host read)."""
        return self._relative_error(self.scale()[1:])

    def raw_error(self) -> float:
        """The same with c = 1: how far the drafter's own probabilities are off."""
        return self._relative_error(1.0)

    def _relative_error(self, scale: torch.Tensor | float) -> float:
        seen = self.observed[1:] > 0.5
        if not bool(seen.any()):
            return 0.0
        gap = (self.predicted[1:] * scale - self.observed[1:]).abs()
        return float((gap[seen] / self.observed[1:][seen]).mean())


class DeliveryRatio:
    """g = (delivered + pseudo) / (promised + pseudo), over the verified choices.

    ``promised`` sums, per verified choice, the acceptance of the nodes it chose (the tokens
    beyond one per request that E(n) promised); ``delivered`` the nodes verification
    accepted. Both forget ``decay`` per verified choice and stay on the device; ``pseudo``
    tokens of prior weight hold g at 1 until evidence accumulates. The per-depth calibration
    fits the drafter's raw probabilities, while E adds them up along prefix-closed
    selections, so the sum keeps an error of its own, which g takes out.
    """

    decay = 0.95
    pseudo = 2.0

    def __init__(self, device: torch.device) -> None:
        self.promised = torch.zeros((), device=device)
        self.delivered = torch.zeros((), device=device)
        self.pending: torch.Tensor | None = None  # the last choice's promise, until verified
        self.scale = 1.0  # g, host copy (read with each choice)

    def promise(self, promised: torch.Tensor) -> torch.Tensor:
        """A choice promised ``promised`` tokens beyond R (device); returns g (device)."""
        self.pending = promised
        return (self.delivered + self.pseudo) / (self.promised + self.pseudo)

    def deliver(self, accepted: torch.Tensor) -> None:
        """The last choice was verified: ``accepted`` nodes in all (device)."""
        if self.pending is not None:
            self.promised = self.decay * self.promised + self.pending
            self.delivered = self.decay * self.delivered + accepted
            self.pending = None
