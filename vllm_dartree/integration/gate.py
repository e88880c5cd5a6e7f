"""How a dartree request is recognised and named, in every vLLM process: whether engine args
ask for dartree (:func:`requested_config`, read by ``activation.SpeculativeConfigGate``),
``--spec-method dartree`` in vLLM's CLI and, on 0.34+, the registered method (both applied
at plugin load); ``ActiveInEngineProcesses`` (applied when dartree is requested) makes
engine processes spawned afterwards activate at load.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from vllm_dartree import METHOD_NAME
from vllm_dartree.integration.patching import (
    AppliedAt,
    EnvironmentSetting,
    Runner,
    SpeculativeMethodRegistration,
    VllmPatch,
)
from vllm_dartree.integration.touchpoints import ALL_RELEASES, REGISTRY_RELEASES

ACTIVE_ENV = "VLLM_DARTREE_ACTIVE"
SHORTCUT_FLAGS = (("--spec-method", "method", "spec_method"),
                  ("--spec-model", "model", "spec_model"),
                  ("--spec-tokens", "num_speculative_tokens", "spec_tokens"))

logger = logging.getLogger("vllm.dartree")


def requested_config(engine_args: Any) -> dict | None:
    """The dartree speculative config these engine args ask for, with vLLM's CLI shortcut
    flags merged in as vLLM merges them; None when they ask for something else."""
    config = engine_args.speculative_config
    flags = {key: getattr(engine_args, attr, None) for _, key, attr in SHORTCUT_FLAGS}
    method = flags["method"] or (config.get("method") if isinstance(config, dict) else None)
    if method != METHOD_NAME:
        return None
    merged = dict(config or {})
    # vLLM 0.34's form for a custom method's own options: the same keys, nested.
    for key, value in (merged.pop("speculator_options", None) or {}).items():
        if key in merged:
            raise ValueError(f"speculative_config key '{key}' is given both at the top level "
                             "and in 'speculator_options'; give it once")
        merged[key] = value
    for flag, key, _ in SHORTCUT_FLAGS:
        if flags[key] is None:
            continue
        if key in merged:
            raise ValueError(f"{flag} and --speculative-config['{key}'] are mutually exclusive")
        merged[key] = flags[key]
    return merged


class SpecMethodChoice(VllmPatch):
    """Accept ``--spec-method dartree`` in vLLM's CLI (the choices come from vLLM's
    ``SpeculativeConfig.method`` Literal, which a plugin cannot extend)."""

    target = "vllm.engine.arg_utils:EngineArgs"
    attribute = "add_cli_args"
    releases = ALL_RELEASES
    runner = Runner.BOTH
    applied_at = AppliedAt.PLUGIN_LOAD
    log_level = logging.DEBUG

    @classmethod
    def replacement(cls, original):
        add_cli_args = original.__func__ if isinstance(original, staticmethod) else original

        @functools.wraps(add_cli_args)
        def with_dartree_choice(parser):
            parser = add_cli_args(parser)
            for action in parser._actions:
                if ("--spec-method" in action.option_strings and action.choices is not None
                        and METHOD_NAME not in action.choices):
                    action.choices = [*action.choices, METHOD_NAME]
            return parser

        return staticmethod(with_dartree_choice)


class MethodRegistration(SpeculativeMethodRegistration):
    """vLLM 0.34+: "dartree" is a registered speculative method (vLLM's custom-speculator
    API), whose config (``v2.registry.DARTreeSpeculatorConfig``) names the speculator."""

    method = METHOD_NAME
    config_path = "vllm_dartree.integration.v2.registry.DARTreeSpeculatorConfig"
    releases = REGISTRY_RELEASES
    runner = Runner.V2  # 0.34 has only the V2 runner
    applied_at = AppliedAt.PLUGIN_LOAD


class ActiveInEngineProcesses(EnvironmentSetting):
    """Engine processes spawned from here activate at plugin load."""

    variable = ACTIVE_ENV
    value = "1"
    releases = ALL_RELEASES
    runner = Runner.BOTH
    log_level = logging.DEBUG
