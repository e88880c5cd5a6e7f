"""Helpers for the test suite only. Nothing outside ``vllm_dartree/testing/`` and ``tests/``
imports this package (``tests/integration/test_layering.py`` checks it)."""
