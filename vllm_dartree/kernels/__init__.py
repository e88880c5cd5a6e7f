"""The fast paths of ``vllm_dartree.tree`` functions, each beside the name of its torch twin:
Triton kernels (top-B selection, tree attention over a paged KV cache, KV compaction, the
Gated-DeltaNet tree rows) and the C++ kernels over vLLM's CPU KV pages (``cpu_kv_pages``).
``launch`` holds the one lazy Triton import and dispatch rule. This folder sits beside
``tree/``, not below it: ``tree/build.py`` calls the top-B kernel, and the kernels' twins
live in ``tree/``.
"""
