"""The per-depth correction-head steps as fixed-shape calls, replayed from CUDA graphs.

Tree building calls the correction head (any :class:`~vllm_dartree.tree.heads.CorrectionHead`:
Domino's or DSpark's Markov head) once or twice per depth (score the K candidates of N
frontier nodes, advance the kept children's states) for R requests at a time. On a
GPU each call is a handful of small kernels whose launch latency outweighs their work, and a
CUDA graph replays them in one launch. Graphs need fixed shapes, so the request axis is
padded to a power-of-two bucket (1, 2, 4, ... requests, i.e. 1, 2, 4, ... x N rows; N, K and
the dtypes are part of the key) and one graph is captured per key on first use.

Padding rows hold zeros (token 0, zero states and weights), so they stay finite, and every
operation in the steps works request by request, so real rows never read them. With capture
off (CPU, or ``capture=False``) the same padded buffers and the same function run eagerly.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from vllm_dartree.tree.heads import CorrectionHead


def bucket_size(rows: int) -> int:
    """The smallest power of two >= rows (>= 1)."""
    return 1 << max(rows - 1, 0).bit_length()


class _FixedShapeStep:
    """``fn`` over static input buffers of one padded shape, captured or eager."""

    def __init__(self, fn: Callable[..., torch.Tensor], examples: list[torch.Tensor],
                 bucket: int, capture: bool, pool) -> None:
        self.fn = fn
        self.inputs = [x.new_zeros((bucket, *x.shape[1:])) for x in examples]
        self.graph: torch.cuda.CUDAGraph | None = None
        self.output: torch.Tensor | None = None
        if capture:
            self._capture(pool)

    def _capture(self, pool) -> None:
        # Warm up on a side stream first (lazy library handles must not be created during
        # capture), as torch.cuda.graphs recommends.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self.fn(*self.inputs)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        # thread_local: other engine threads may use CUDA while this thread captures.
        with torch.cuda.graph(self.graph, pool=pool, capture_error_mode="thread_local"):
            self.output = self.fn(*self.inputs)

    def __call__(self, inputs: list[torch.Tensor]) -> torch.Tensor:
        rows = inputs[0].shape[0]
        for static, x in zip(self.inputs, inputs):
            static[:rows].copy_(x)
            static[rows:].zero_()  # padding never depends on earlier calls
        if self.graph is None:
            return self.fn(*self.inputs)[:rows]
        self.graph.replay()
        return self.output[:rows].clone()  # the next replay overwrites the static output


class CorrectionGraphs:
    """Padded (and on CUDA, graph-replayed) stand-ins for the head's per-depth calls.

    ``logprobs`` and ``advance`` take and return what the head's ``corrected_logprobs`` and
    ``advance`` do; ``build_tree(..., graphs=...)`` uses them in place of the head.
    """

    def __init__(self, head: CorrectionHead, *, capture: bool = False,
                 max_bucket: int = 512) -> None:
        self.head = head
        self.capture = capture
        self.max_bucket = max_bucket
        self._steps: dict[tuple, _FixedShapeStep] = {}
        self._pool = None

    def logprobs(self, base: torch.Tensor, context: torch.Tensor, cand_weights: torch.Tensor,
                 h: torch.Tensor) -> torch.Tensor:
        """base [R, K], context [R, C], cand_weights [R, K, W], h [R, N, S] -> [R, N, K]
        (C may be 0: a Markov head's context is empty, a zero-size buffer here)."""
        return self._run("logprobs", self.head.corrected_logprobs,
                         [base, context, cand_weights, h])

    def advance(self, h: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """h [R, N, S], tokens [R, N] -> the states after consuming each token."""
        return self._run("advance", self.head.advance, [h, tokens])

    def num_captured(self) -> int:
        return sum(step.graph is not None for step in self._steps.values())

    def _run(self, name: str, fn: Callable[..., torch.Tensor],
             inputs: list[torch.Tensor]) -> torch.Tensor:
        bucket = bucket_size(inputs[0].shape[0])
        key = (name, bucket, *((tuple(x.shape[1:]), x.dtype, x.device) for x in inputs))
        step = self._steps.get(key)
        if step is None:
            step = _FixedShapeStep(fn, inputs, bucket, self._should_capture(inputs[0], bucket),
                                   self._graph_pool())
            self._steps[key] = step
        return step(inputs)

    def _should_capture(self, example: torch.Tensor, bucket: int) -> bool:
        return (self.capture and example.is_cuda and bucket <= self.max_bucket
                and not torch.cuda.is_current_stream_capturing())

    def _graph_pool(self):
        """One memory pool shared by every captured step: they run one at a time on one
        stream, and each static output is copied out right after its replay, so a later
        graph reusing that memory cannot corrupt a result."""
        if self._pool is None and self.capture and torch.cuda.is_available():
            self._pool = torch.cuda.graph_pool_handle()
        return self._pool
