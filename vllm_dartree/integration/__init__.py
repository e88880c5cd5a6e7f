"""Every vLLM touch-point of vllm-dartree lives in this package.

Nothing outside it imports vLLM internals. Each change to vLLM is a declared patch
(``patching.py``: six kinds) that names what it changes and declares the vLLM releases and
the model runner it applies to; ``activation.declared_patches()`` lists them all. Here: the
patches and the gate, the tree attention backends, the drafter model, and each runner's
adapter (``v1/``, ``v2/``), which turns vLLM's objects into the plain arguments of the tree
step. The step itself, the same for every runner, lives in :mod:`vllm_dartree.step` and
imports no vLLM; what it needs of vLLM (the tensor-parallel group) the adapters give it as
callables (``tensor_parallel.py``).
"""
