"""Benchmark harness: ``vllm-dartree bench`` (:func:`vllm_dartree.bench.run.main`) and
``vllm-dartree viz`` (:func:`vllm_dartree.bench.viz_cli.main`).

Modules: ``datasets`` (offline prompt sources, reference formats and counts), ``prompts``
(chat template, thinking off), ``methods`` (the six speculative configs), ``generate`` (timed
in-process engine loop), ``recorder`` (per-round tree records from the proposer), ``metrics``
(tau, TPOT, speedup, Pr(L >= t)), ``report`` (table.md), ``plots`` (figures), ``viz`` (tree
drawings), ``serving`` (OpenAI-server concurrency), ``run`` (orchestration and CLI).
"""
