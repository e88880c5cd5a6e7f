"""Per-round records of tree steps, observed through the verifier's hook.

While the recorder is entered, :meth:`TreeVerifier.observing
<vllm_dartree.step.verifier.TreeVerifier.observing>` hands it every accepted tree
step (read, never changed). Each verify round of a request yields ``accept`` (path length
including the root = accepted drafts + 1, i.e. tokens committed with the bonus), ``nodes``
and ``depth_counts`` (number of tree nodes at depth 1, 2, ...), plus the whole tree for the
first ``keep_limit`` rounds of requests listed in ``keep_requests``.
Only in-process engines (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) verify in this process.
"""

from __future__ import annotations

import math
from collections import defaultdict
from contextlib import ExitStack
from typing import Any


def external_id(internal: str) -> str:
    """vLLM appends ``-<random>`` to request ids; ours contain no '-'."""
    return internal.split("-", 1)[0]


class RoundRecorder:
    """Collects tree-verify rounds per request id; ``step`` is set by the engine loop."""

    def __init__(self, keep_limit: int = 0) -> None:
        self.keep_limit = keep_limit
        self.keep_requests: set[str] = set()
        self.rounds: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self.step = 0
        self._hook = ExitStack()

    def __enter__(self) -> RoundRecorder:
        from vllm_dartree.step.verifier import TreeVerifier

        self._hook.enter_context(TreeVerifier.observing(self.observe))
        return self

    def __exit__(self, *exc: object) -> None:
        self._hook.close()

    def pop(self, request_id: str) -> list[dict[str, Any]]:
        self.keep_requests.discard(request_id)
        return self.rounds.pop(request_id, [])

    def keep_tree(self, request_id: str) -> bool:
        return (request_id in self.keep_requests
                and len(self.rounds[request_id]) < self.keep_limit)

    def observe(self, accepted: Any) -> None:
        plan = accepted.plan
        tree = plan.tree
        for row, req_id in enumerate(plan.req_ids):
            request = external_id(req_id)
            record = round_record(tree, accepted, row, self.step)
            if self.keep_tree(request):
                record["tree"] = tree_record(tree, accepted, row)
            self.rounds[request].append(record)


def round_record(tree: Any, accepted: Any, row: int, step: int) -> dict[str, Any]:
    valid = tree.valid[row]
    depths = tree.depths[row][valid].tolist()
    counts = [0] * (max(depths) if depths else 0)
    for depth in depths:
        counts[depth - 1] += 1
    return {"step": step, "accept": int(accepted.num_accepted[row]), "nodes": len(depths),
            "depth_counts": counts}


def tree_record(tree: Any, accepted: Any, row: int) -> dict[str, Any]:
    """Node arrays up to the last valid node (node j+1 is column j; parent 0 is the root)."""
    valid = tree.valid[row].tolist()
    size = max((j + 1 for j, v in enumerate(valid) if v), default=0)
    scores = [None if not math.isfinite(s) else round(s, 4)
              for s in tree.scores[row, :size].tolist()]
    path = [n for n in accepted.accepted_nodes[row].tolist() if n >= 0]
    return {"tokens": tree.tokens[row, :size].tolist(), "parents": tree.parents[row, :size].tolist(),
            "depths": tree.depths[row, :size].tolist(), "valid": valid[:size], "scores": scores,
            "accepted": path}
