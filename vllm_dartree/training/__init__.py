"""Training DFlash + Domino drafters on a target's own outputs (pure torch, CPU or GPU).

- :mod:`~vllm_dartree.training.model`: the drafter, with the forward vLLM runs at inference;
- :mod:`~vllm_dartree.training.data`: target continuations, target features, anchors;
- :mod:`~vllm_dartree.training.train`: the training loop, checkpoints, export;
- :mod:`~vllm_dartree.training.cli`: ``main(argv)`` (``vllm-dartree train-drafter``).
"""
