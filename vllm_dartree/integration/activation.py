"""When vllm-dartree acts, and when it stays out of the way.

At plugin load only :class:`SpeculativeConfigGate` is installed: a pass-through around
``EngineArgs.create_speculative_config`` that calls the original unchanged for any config
whose method is not "dartree". Everything else is applied when dartree is requested.
Engine processes spawned after that inherit ``VLLM_DARTREE_ACTIVE`` and activate at load.
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Any

from vllm_dartree import METHOD_NAME
from vllm_dartree.integration.patching import VllmPatch, check_vllm_version, installed_vllm_version

SETTINGS_ATTR = "dartree"  # attribute of vLLM's SpeculativeConfig carrying DARTreeConfig

logger = logging.getLogger("vllm.dartree")

ACTIVE_ENV = "VLLM_DARTREE_ACTIVE"


def is_dartree_request(speculative_config: Any) -> bool:
    return isinstance(speculative_config, dict) and speculative_config.get("method") == METHOD_NAME


class SpeculativeConfigGate(VllmPatch):
    """Route ``method: "dartree"`` to :func:`build_dartree_speculative_config`."""

    target = "vllm.engine.arg_utils:EngineArgs"
    attribute = "create_speculative_config"
    log_level = logging.DEBUG  # installed in every vLLM process: stay quiet

    @classmethod
    def replacement(cls, original):
        @functools.wraps(original)
        def create_speculative_config(self, target_model_config, target_parallel_config):
            if not is_dartree_request(self.speculative_config):
                return original(self, target_model_config, target_parallel_config)
            return build_dartree_speculative_config(
                self, original, target_model_config, target_parallel_config
            )

        return create_speculative_config


def install_gate() -> None:
    if not SpeculativeConfigGate.is_applied():
        SpeculativeConfigGate.apply()


_activated = False


def activate() -> None:
    """Apply every patch dartree needs in this process (once)."""
    global _activated
    check_vllm_version()
    os.environ[ACTIVE_ENV] = "1"  # inherited by engine processes spawned from here
    if _activated:
        return
    _activated = True
    from vllm.platforms import current_platform

    from vllm_dartree.integration.compat import fix_expand_kernel_if_broken
    from vllm_dartree.integration.drafter_model import register_drafter_model
    from vllm_dartree.integration.runner import RUNNER_PATCHES

    fix_expand_kernel_if_broken()
    register_drafter_model()
    if current_platform.is_cpu():
        from vllm_dartree.integration.cpu_attention import register_tree_cpu_attention

        register_tree_cpu_attention()
    else:
        if current_platform.is_cuda():
            from vllm_dartree.integration.gpu_attention import register_tree_triton_attention

            register_tree_triton_attention()
        # The proposer and tree sampler hook the V1 runner; V2 is vLLM's GPU default.
        os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "0"
        logger.info("vllm-dartree: selecting vLLM's V1 model runner (VLLM_USE_V2_MODEL_RUNNER=0)")
    for patch in RUNNER_PATCHES:
        patch.apply()
    logger.info("vllm-dartree activated (vLLM %s)", installed_vllm_version())


def build_dartree_speculative_config(engine_args, original, target_model_config, parallel_config):
    """Validate the dartree request, activate the plugin, build vLLM's speculative config."""
    check_vllm_version()
    from vllm_dartree.config import parse_speculative_config

    config = parse_speculative_config(engine_args.speculative_config)
    refuse_unverifiable_platform(config)
    select_tree_attention_backend(config, engine_args)
    activate()
    requested = engine_args.speculative_config
    # vLLM carries dartree as its DFlash method (same drafter plumbing) with B draft slots;
    # the dartree settings ride along on the config object into every engine process.
    engine_args.speculative_config = {
        "method": "dflash",
        "model": config.model,
        "num_speculative_tokens": config.budget,
        **config.vllm_options,
    }
    try:
        speculative = original(engine_args, target_model_config, parallel_config)
    finally:
        engine_args.speculative_config = requested
    check_drafter(config, speculative.draft_model_config.hf_config, target_model_config,
                  parallel_config)
    object.__setattr__(speculative, SETTINGS_ATTR, config)
    logger.info("vllm-dartree: tree=%s B=%d W=%d K=%d beta=%g drafter=%s", config.tree,
                config.budget, config.width, config.top_k, config.effective_depth_bonus,
                config.model)
    return speculative


def refuse_unverifiable_platform(config) -> None:
    """Trees need an ancestor mask in the target's attention. This build has it for vLLM's
    CPU backend and for its Triton backend on CUDA; a chain needs no mask (causal attention
    is exact for it)."""
    from vllm.platforms import current_platform

    from vllm_dartree.config import DARTreeConfigError

    if config.tree != "chain" and not (current_platform.is_cpu() or current_platform.is_cuda()):
        raise DARTreeConfigError(
            f"speculative_config key 'tree' = {config.tree!r} needs tree attention, which this "
            f"build of vllm-dartree provides for vLLM's CPU backend and its Triton backend on "
            f"CUDA only (platform: {current_platform.device_name}); use tree 'chain' here, or "
            "one of those backends"
        )


def select_tree_attention_backend(config, engine_args) -> None:
    """On CUDA, trees are verified by the Triton backend: select it (or refuse another)."""
    from vllm.platforms import current_platform

    if config.tree != "chain" and current_platform.is_cuda():
        from vllm_dartree.integration.gpu_attention import select_triton_backend

        select_triton_backend(engine_args)


def check_drafter(config, draft_hf_config, target_model_config, parallel_config) -> None:
    """Drafter/target/settings mismatches, reported before any weight is loaded."""
    from vllm_dartree.config import DARTreeConfigError
    from vllm_dartree.integration.drafter_model import read_layout

    layout = read_layout(
        draft_hf_config,
        target_vocab=target_model_config.get_vocab_size(),
        target_hidden=target_model_config.get_hidden_size(),
        target_layers=target_model_config.get_num_layers(parallel_config),
    )
    if config.correction and not layout.has_head:
        raise DARTreeConfigError(
            f"speculative_config key 'correction' = True needs a drafter with a Domino head; "
            f"{config.model} is a DFlash checkpoint without one (set correction to false or "
            "use a Domino drafter)"
        )
    # The default K is capped at the vocabulary; a K the user chose must fit it.
    if "top_k" in config.model_fields_set and config.top_k > target_model_config.get_vocab_size():
        raise DARTreeConfigError(
            f"speculative_config key 'top_k' = {config.top_k} exceeds the vocabulary size "
            f"{target_model_config.get_vocab_size()}"
        )
