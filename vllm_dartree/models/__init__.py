"""Real target models built offline (no hub): see :mod:`vllm_dartree.models.smollm2`."""
