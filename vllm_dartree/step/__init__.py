"""One DARTree tree step, for any model runner: plan, verify, accept and compact, the
drafter's context, the trees and their hand-over (:mod:`~vllm_dartree.step.tree_step`).

Imports no vLLM: each runner's adapter (``integration/v1/``, ``integration/v2/``) turns
vLLM's objects into the plain arguments used here, and injects what needs vLLM (the
tensor-parallel group) as callables.
"""
