"""Engines and servers our own entry points run (tests, demo, benchmarks, training data):
in-process ``LLM`` engines with a small KV cache, and ``vllm-dartree serve`` on 127.0.0.1."""
