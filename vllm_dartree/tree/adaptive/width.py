"""The pruned tree's width with the load (``width: "auto"``)."""

from __future__ import annotations

from collections import deque


class AutoWidth:
    """The pruned tree's width W for the next drafted step (``width: "auto"``):

        W_next = the smallest width in ``widths`` that is >= max n_r over the requests of
                 the last ``window`` steps that verified a node
        widths = {ceil(B / D)} + {powers of two between} + {W_max}

    n_r: the nodes scheduled for request r in a step; B nodes per tree, D depths, W_max the
    widest allowed. A selection of n nodes holds at most n nodes of any one depth, and
    within a depth the policy ranks nodes by path score, as the pruned tree's per-depth
    top-W does; so a width of at least n keeps (up to the calibration's per-depth caps)
    every node the policy would pick, while the correction head scores W * K candidates per
    request and depth.

    The window keeps the width up while some recent step used it (one step's count says
    little about the next one's: at low load a confident step is often followed by a
    doubtful one), so the tree narrows only when the load has kept every request to a few
    nodes. Steps that verified nothing (not drafted, or no node paid) say nothing about the
    width a tree needs and leave it as it was, so the first tree after a pause is as wide
    as the trees before it (a narrower one would understate what trees deliver when the
    policy decides whether to resume drafting). ``ceil(B / D)`` keeps W * D >= B, so a
    tree still holds B nodes and a request can be given more. Rounding up to a power of
    two leaves a handful of widths, so a GPU captures the head's graphs for each at
    start-up.
    """

    def __init__(self, max_width: int, budget: int, num_depths: int, window: int = 16
                 ) -> None:
        narrowest = min(max_width, -(-budget // num_depths))
        powers = [2**i for i in range(max_width.bit_length()) if narrowest < 2**i < max_width]
        self.widths = [narrowest, *powers, max_width] if narrowest < max_width else [max_width]
        self.width = max_width  # until a choice has been seen
        self._recent: deque[int] = deque(maxlen=window)  # each step's largest count

    def update(self, counts: list[int]) -> int:
        """The width for the next drafted step, after a step scheduled ``counts`` [R]."""
        largest = max(counts, default=0)
        if largest == 0:
            return self.width
        self._recent.append(largest)
        most = max(self._recent)
        self.width = next((w for w in self.widths if w >= most), self.widths[-1])
        return self.width
