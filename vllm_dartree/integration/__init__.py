"""Every vLLM touch-point of vllm-dartree lives in this package.

Nothing outside it imports vLLM internals. Each patch is a :class:`VllmPatch` subclass that
names the vLLM symbol it replaces and the vLLM versions it was written against. Here: the
patches and the gate, the tree attention backends, the drafter model, and each runner's
adapter (``v1/``, ``v2/``), which turns vLLM's objects into the plain arguments of the tree
step. The step itself, the same for every runner, lives in :mod:`vllm_dartree.step` and
imports no vLLM; what it needs of vLLM (the tensor-parallel group) the adapters give it as
callables (``tensor_parallel.py``).
"""
