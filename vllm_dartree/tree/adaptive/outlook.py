"""What the trees seen lately would deliver at another batch size: the tests behind the pause
policy's "batch shrank" and "no tree could pay" rules (:class:`TreeOutlook`).

    last tree pays at R:    (1 + G) / T(R, round(N * R))  >=  REQUIRED_GAIN / T(R, 0, no drafting)
    some tree could pay:    (1 + G_k) / T(R, k * R)  >=  1 / T(R, 0, no drafting)  for some k

G and N: the gain (tokens beyond the root, times g) and the nodes per request of the last
judged tree. G_k: what the best k * R' nodes of each of the last ``window`` judged steps
(R' requests each) promised per request, times g, averaged over the steps (a tree's curve
is flat beyond its last column). The average, not the most any step promised: an easy
stretch of text promises a token per node, which says little about the next trees. With
fewer requests each step's fixed cost weighs more, so a tree that did not pay may pay once
the batch shrinks, and one that paid may not once it grows.

Until the cost model has seen ``trusted_after`` steps that verified a tree, some tree could
always pay: a young fit can price a tree step absurdly, and only drafted probes correct it.
"""

from __future__ import annotations

from collections import deque

import numpy as np
import torch

from vllm_dartree.tree.adaptive.cost import StepCostModel
from vllm_dartree.tree.adaptive.pause import REQUIRED_GAIN


class TreeOutlook:
    def __init__(self, cost: StepCostModel, trusted_after: int, window: int = 64) -> None:
        self.cost = cost
        self.trusted_after = trusted_after
        self.recent_curves: deque[np.ndarray] = deque(maxlen=window)  # judged steps' G_k
        self.last_tree = (0.0, 0.0)  # G and N of the last judged tree

    def remember(self, gain: float, nodes: float, curve: np.ndarray) -> None:
        """A judged step: ``gain`` tokens beyond the root and ``nodes`` verified per
        request; ``curve`` [B] its G_k, k = 1 .. B."""
        self.last_tree = (gain, nodes)
        self.recent_curves.append(curve)

    def last_tree_pays(self, requests: int) -> bool:
        gain, nodes = self.last_tree
        tree_ms = float(self.cost.predict(requests, round(nodes * requests)))
        plain_ms = self.cost.plain_ms(requests)
        return plain_ms > 0 and (1 + gain) / tree_ms >= REQUIRED_GAIN / plain_ms

    def some_tree_could_pay(self, requests: int) -> bool:
        if self.cost.tree_steps < self.trusted_after or not self.recent_curves:
            return True
        size = max(len(curve) for curve in self.recent_curves)
        gains = torch.from_numpy(np.mean(  # beyond a tree's last column its curve is flat
            [np.pad(curve, (0, size - len(curve)), mode="edge") for curve in
             self.recent_curves], axis=0))
        per_request = torch.arange(1, size + 1, dtype=torch.float64)
        tree_ms = self.cost.predict(requests, per_request * requests)
        plain_ms = self.cost.plain_ms(requests)
        if plain_ms <= 0 or bool((tree_ms <= 0).any()):
            return True
        return bool(((1 + gains) / tree_ms >= 1 / plain_ms).any())
