"""vLLM's V2 model runner (``vllm.v1.worker.gpu``): the glue between its hooks and the tree
step (``step.tree_step.TreeStep``, ``step.drafting.TreeDrafting``,
``step.verifier.TreeVerifier``) and the tree attention backends. Imports vLLM's V2 modules
only; nothing here touches the V1 runner.

- ``speculator.DARTreeSpeculator``: the drafter (a ``DFlashSpeculator``), the trees.
- ``model_state.DARTreeModelState``: plan, depth positions, the plan's hand-over to the
  attention backends, KV of the target layers; installed through the target model's
  ``get_model_state_cls`` (read by ``model_states.resolve_model_state_cls``).
- ``sampler.TreeRejectionSampler``: acceptance, returned by the model state's
  ``custom_sampler``.
- ``draft_counts``: adaptive verification's per-request draft counts to vLLM's scheduler
  (two declared patches of ``DraftTokensHandler``).
- ``draft_handoff``: the drafts ride back with the sampled tokens (no RPC per step; the
  engine core's half is ``integration/draft_handoff.py``).
- ``registry.DARTreeSpeculatorConfig``: "dartree" as a registered method (vLLM 0.34+).
"""
