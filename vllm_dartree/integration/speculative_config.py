"""The steps of making a dartree request into vLLM's speculative config
(``activation.build_dartree_speculative_config``) that adjust vLLM's objects: the engine's
scheduling and attention backend, a speculators checkpoint's own keys, the target layers a
DSpark drafter names.
"""

from __future__ import annotations

import logging

logger = logging.getLogger("vllm.dartree")


def schedule_synchronously_if_adaptive(config, engine_args) -> None:
    """Adaptive verification hands vLLM a draft count per request, which only its synchronous
    scheduler takes (the asynchronous one schedules a fixed count of placeholder drafts).
    An engine that left the choice to vLLM gets synchronous scheduling (an explicit
    ``async_scheduling=True`` was refused before this)."""
    if config.adaptive and getattr(engine_args, "async_scheduling", None) is None:
        engine_args.async_scheduling = False
        logger.info("vllm-dartree: budget_policy 'adaptive' schedules synchronously "
                    "(async_scheduling=False)")


def select_tree_attention_backend(config, engine_args) -> None:
    """On CUDA, trees are verified by the Triton backend: select it (or refuse another)."""
    from vllm.platforms import current_platform

    if config.tree != "chain" and current_platform.is_cuda():
        from vllm_dartree.integration.gpu_attention import select_triton_backend

        select_triton_backend(engine_args)


def adopt_speculators_checkpoint(speculative, config) -> None:
    """A speculators checkpoint reaches vLLM as its own ``config.json``, which vLLM converts
    (``SpeculatorsConfig``, model_type "speculators") without ``block_size``, with DFlash
    marked causal unless trained with ``sliding_window_non_causal``, and a DSpark drafter
    named ``Qwen3DSparkModel``, which builds vLLM's DSpark model rather than ours (vLLM
    does not wrap a speculators config in its EAGLEConfig, whose "DFlash" prefix routes the
    other DSpark checkpoints to us). Read the checkpoint's own file instead
    (``checkpoint.speculators_drafter_keys``: refused there, before any weight loads, with
    the field and the training flag to change), set what it states on vLLM's config and
    re-resolve the drafter's class."""
    draft = speculative.draft_model_config
    if getattr(draft.hf_config, "model_type", None) != "speculators":
        return
    from transformers import PretrainedConfig

    raw, _ = PretrainedConfig.get_config_dict(config.model,
                                              revision=config.vllm_options.get("revision"))
    set_speculators_keys(draft.hf_config, raw)
    speculative.update_arch_()


def set_speculators_keys(draft_hf_config, raw: dict) -> None:
    """Set on vLLM's converted config what the speculators ``config.json`` ``raw`` states
    (``checkpoint.speculators_drafter_keys``), a DSpark drafter under the name method
    "dflash" gives DSpark checkpoints (``DSparkDrafterArchitecture``: ours)."""
    from vllm_dartree.checkpoint import DSPARK_ARCHITECTURE, speculators_drafter_keys

    keys = speculators_drafter_keys(raw)
    if keys["architectures"] == [DSPARK_ARCHITECTURE]:
        keys["architectures"] = ["DFlash" + DSPARK_ARCHITECTURE]
    for key, value in keys.items():
        setattr(draft_hf_config, key, value)


def expose_target_layers(draft_hf_config, layout) -> None:
    """A DSpark config keeps target_layer_ids and mask_token_id at the top level, where
    vLLM's V2 runner looks; the V1 runner a dartree engine runs on reads the drafter's
    target layers only from dflash_config (``GPUModelRunner._get_eagle3_aux_layers_from_
    config``) and would otherwise capture its default layers. Put them there too."""
    dflash = dict(getattr(draft_hf_config, "dflash_config", None) or {})
    dflash.setdefault("target_layer_ids", list(layout.target_layer_ids))
    dflash.setdefault("mask_token_id", layout.mask_token_id)
    draft_hf_config.dflash_config = dflash
