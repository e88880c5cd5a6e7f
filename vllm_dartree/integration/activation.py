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
from vllm_dartree.integration.patching import VllmPatch, check_vllm_version

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


def activate() -> None:
    """Apply every patch dartree needs in this process (idempotent)."""
    check_vllm_version()
    os.environ[ACTIVE_ENV] = "1"  # inherited by engine processes spawned from here
    from vllm_dartree.integration.compat import fix_expand_kernel_if_broken

    fix_expand_kernel_if_broken()


def build_dartree_speculative_config(engine_args, original, target_model_config, parallel_config):
    """Validate the dartree request, activate the plugin, build vLLM's speculative config."""
    check_vllm_version()
    from vllm_dartree.config import parse_speculative_config

    config = parse_speculative_config(engine_args.speculative_config)
    activate()
    raise NotImplementedError(
        f"speculative method 'dartree' ({config.tree}, B={config.budget}) is validated but its "
        "engine integration is not available in this build yet"
    )
