"""Every vLLM touch-point of vllm-dartree lives in this package.

Nothing outside it imports vLLM internals. Each patch is a :class:`VllmPatch` subclass that
names the vLLM symbol it replaces and the vLLM versions it was written against.
"""
