"""Triton kernels, each beside its torch twin: top-B selection, tree attention over a paged
KV cache, KV compaction. ``launch`` holds the one lazy Triton import and dispatch rule."""
