"""When vllm-dartree changes vLLM, and the one list of what it changes.

:func:`declared_patches` is that list. Each entry declares the vLLM releases it applies
to, the model runner it serves and when it is applied (``patching.TouchPoint``); each
moment applies the entries that name it and cover the installed release
(:func:`apply_patches`). At plugin load (every vLLM process) that is the request gate
around ``EngineArgs.create_speculative_config``, which calls the original unchanged for any
config whose method is not "dartree", ``dartree`` as a choice of ``--spec-method`` (vLLM
loads plugins before building its CLI parser so that they can add choices) and, where vLLM
has the API, "dartree" as a registered speculative method. The rest is applied when
dartree is requested; engine processes spawned after that inherit ``VLLM_DARTREE_ACTIVE``
and activate at load.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from vllm_dartree import METHOD_NAME
from vllm_dartree.config import carried_layout, carry_settings
from vllm_dartree.integration.patching import (
    AppliedAt,
    ArchitectureOverride,
    BackendOverride,
    EnvironmentSetting,
    Runner,
    SpeculativeMethodRegistration,
    TouchPoint,
    VllmPatch,
    check_vllm_version,
    installed_release_in,
    installed_vllm_version,
)
from vllm_dartree.integration.touchpoints import (
    ALL_RELEASES,
    PRE_REGISTRY_RELEASES,
    REGISTRY_RELEASES,
    V1_RELEASES,
)

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


class SpeculativeConfigGate(VllmPatch):
    """Route a dartree request to :func:`build_dartree_speculative_config`."""

    target = "vllm.engine.arg_utils:EngineArgs"
    attribute = "create_speculative_config"
    releases = ALL_RELEASES
    runner = Runner.BOTH
    applied_at = AppliedAt.PLUGIN_LOAD
    log_level = logging.DEBUG  # installed in every vLLM process: stay quiet

    @classmethod
    def replacement(cls, original):
        @functools.wraps(original)
        def create_speculative_config(self, target_model_config, target_parallel_config):
            requested = requested_config(self)
            if requested is None:
                return original(self, target_model_config, target_parallel_config)
            return build_dartree_speculative_config(
                self, requested, original, target_model_config, target_parallel_config)

        return create_speculative_config


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


def install_gate() -> None:
    apply_patches(AppliedAt.PLUGIN_LOAD)


# ---- applied when dartree is requested --------------------------------------------------

class ActiveInEngineProcesses(EnvironmentSetting):
    """Engine processes spawned from here activate at plugin load."""

    variable = ACTIVE_ENV
    value = "1"
    releases = ALL_RELEASES
    runner = Runner.BOTH
    log_level = logging.DEBUG


class V2SpeculatorChoice(VllmPatch):
    """vLLM's V2 runner builds its speculator with ``init_speculator``, a hard-coded choice
    by method (no registry in 0.32/0.33); the runner module imports it by name. A dartree
    engine (carried as method "dflash") gets ``v2.speculator.DARTreeSpeculator``; any
    other engine vLLM's own choice."""

    target = "vllm.v1.worker.gpu.model_runner"
    attribute = "init_speculator"
    releases = PRE_REGISTRY_RELEASES  # 0.34+: MethodRegistration names the speculator
    runner = Runner.V2

    @classmethod
    def replacement(cls, original):
        @functools.wraps(original)
        def init_speculator(vllm_config, device, *args, **kwargs):
            from vllm_dartree.config import is_dartree_engine

            if not is_dartree_engine(vllm_config):
                return original(vllm_config, device, *args, **kwargs)
            from vllm_dartree.integration.v2.speculator import DARTreeSpeculator

            return DARTreeSpeculator(vllm_config, device)

        return init_speculator


class DrafterBlockLookahead(VllmPatch):
    """V1: reserve KV slots for the drafter's whole query block (V2's query is cut to
    1 + query_slots <= B + 1 rows, inside what vLLM reserves for DFlash).

    vLLM reserves ``num_speculative_tokens + 1`` slots past the scheduled tokens for a
    DFlash drafter, which queries that many. Ours queries the checkpoint's block (16) for
    any budget B; with B < block - 1 the last queries would write K/V into block-table
    entries the request does not own (stale ids of a row's earlier request, i.e. another
    request's drafter cache). The scheduler and the warmup read this property.

    V1 only, by design: on V2 (the only runner of 0.34, where this would be the method
    config's ``num_lookahead_tokens``) the query never exceeds what vLLM reserves."""

    target = "vllm.config.vllm:VllmConfig"
    attribute = "num_lookahead_tokens"
    releases = V1_RELEASES
    runner = Runner.V1

    @classmethod
    def replacement(cls, original):
        def num_lookahead_tokens(self) -> int:
            reserved = original.fget(self)
            layout = carried_layout(getattr(self, "speculative_config", None))
            return reserved if layout is None else max(reserved, layout.block_size)

        return property(num_lookahead_tokens, doc=original.__doc__)


class DrafterArchitecture(ArchitectureOverride):
    """vLLM's ``DFlashDraftModel`` architecture (``qwen3_dflash.DFlashQwen3ForCausalLM``)
    builds our subclass, which is the stock model for checkpoints without a Domino head."""

    architecture = "DFlashDraftModel"
    model_path = "vllm_dartree.integration.drafter_model:DARTreeDraftModel"
    releases = ALL_RELEASES
    runner = Runner.BOTH


class DSparkDrafterArchitecture(ArchitectureOverride):
    """vLLM carries dartree as its method "dflash", whose EAGLEConfig renames a DSpark
    checkpoint's ``Qwen3DSparkModel`` to ``DFlashQwen3DSparkModel``, a name vLLM does not
    register: register it as our drafter (the DFlash backbone plus the Markov head)."""

    architecture = "DFlashQwen3DSparkModel"
    model_path = "vllm_dartree.integration.drafter_model:DARTreeDraftModel"
    releases = ALL_RELEASES
    runner = Runner.BOTH


class SpecForgeDominoArchitecture(ArchitectureOverride):
    """SpecForge writes a Domino drafter as ``DominoDraftModel``, a name vLLM does not
    register: vLLM resolves it when it reads the drafter's config, before method "dflash"
    renames it (below). Both build our drafter, which reads its Domino head."""

    architecture = "DominoDraftModel"
    model_path = "vllm_dartree.integration.drafter_model:DARTreeDraftModel"
    releases = ALL_RELEASES
    runner = Runner.BOTH


class SpecForgeDominoDrafterArchitecture(ArchitectureOverride):
    """... and ``DFlashDominoDraftModel``, the name method "dflash" gives it."""

    architecture = "DFlashDominoDraftModel"
    model_path = "vllm_dartree.integration.drafter_model:DARTreeDraftModel"
    releases = ALL_RELEASES
    runner = Runner.BOTH


class SpecForgeDSparkDrafterArchitecture(ArchitectureOverride):
    """SpecForge writes a DSpark drafter as ``DSparkDraftModel`` (vLLM's name for
    DeepSeek-V4's DSpark, which resolves and is left as it is); method "dflash" renames it
    ``DFlashDSparkDraftModel``, unregistered in vLLM: our drafter (the checkpoint reader
    accepts that name only with SpecForge's nested DSpark keys)."""

    architecture = "DFlashDSparkDraftModel"
    model_path = "vllm_dartree.integration.drafter_model:DARTreeDraftModel"
    releases = ALL_RELEASES
    runner = Runner.BOTH


class CpuTreeAttention(BackendOverride):
    """Tree attention in vLLM's CPU backend, for any engine that runs on it."""

    backend = "CPU_ATTN"
    class_path = "vllm_dartree.integration.cpu_attention.TreeCPUAttentionBackend"
    releases = ALL_RELEASES
    runner = Runner.BOTH


class TritonTreeAttention(BackendOverride):
    """Tree attention in vLLM's Triton backend, for any engine that runs on it (a GPU's,
    or any platform whose engine picks TRITON_ATTN): the backend the engine really uses
    decides, not the platform."""

    backend = "TRITON_ATTN"
    class_path = "vllm_dartree.integration.gpu_attention.TreeTritonAttentionBackend"
    releases = ALL_RELEASES
    runner = Runner.BOTH


@functools.cache
def declared_patches() -> tuple[type[TouchPoint], ...]:
    """Every change vllm-dartree makes to vLLM (and, for vLLM's CLI, to the process), in the
    order each moment applies them. Which apply where is each entry's own declaration
    (``releases``, ``runner``, ``applied_at``). Collected on first use, not at import: the
    patch modules pull in the tree step, which nothing needs before this is read."""
    from vllm_dartree.integration.compat import (
        CPU_DEFECT_FIXES,
        LAUNCH_PATCHES,
        CpuGdnConvWindowFix,
        KernelRebindVarsFix,
    )
    from vllm_dartree.integration.draft_handoff import ENGINE_CORE_PATCHES
    from vllm_dartree.integration.gpu_gdn import TRITON_GDN_PATCHES
    from vllm_dartree.integration.lora import V2_LORA_PATCHES
    from vllm_dartree.integration.sampling import SpecDecodeSamplingCheck
    from vllm_dartree.integration.v1.draft_handoff import DraftsWithOutput
    from vllm_dartree.integration.v1.runner import RUNNER_PATCHES, DFlashProposerGlobal
    from vllm_dartree.integration.v1.sampling import (
        BuiltinLogitsProcessors,
        ChainRowsLogitBiasAndMinP,
    )
    from vllm_dartree.integration.v2.draft_counts import DRAFT_COUNT_PATCHES
    from vllm_dartree.integration.v2.draft_handoff import DraftsWithAsyncOutput
    from vllm_dartree.integration.v2.penalties import PenaltiesOnTreePaths

    return (
        # every vLLM process: the gate
        SpeculativeConfigGate, SpecMethodChoice, MethodRegistration,
        # dartree requested: the tree core (drafter architectures, tree attention backends,
        # tree rows in GDN layers, the engine core's half of the drafts' hand-over) ...
        ActiveInEngineProcesses, DrafterArchitecture, DSparkDrafterArchitecture,
        SpecForgeDominoArchitecture, SpecForgeDominoDrafterArchitecture,
        SpecForgeDSparkDrafterArchitecture,
        CpuTreeAttention, TritonTreeAttention, CpuGdnConvWindowFix, *TRITON_GDN_PATCHES,
        *ENGINE_CORE_PATCHES, SpecDecodeSamplingCheck,
        # ... the V2 runner's (its speculator choice, adaptive verification's draft counts to
        # the scheduler, drafts with the sampled tokens, the lm_head LoRA ids per logits row,
        # penalties along tree paths) ...
        V2SpeculatorChoice, *DRAFT_COUNT_PATCHES, DraftsWithAsyncOutput, *V2_LORA_PATCHES,
        PenaltiesOnTreePaths,
        # ... and the V1 runner's
        DrafterBlockLookahead, *CPU_DEFECT_FIXES, DFlashProposerGlobal, *RUNNER_PATCHES,
        DraftsWithOutput, BuiltinLogitsProcessors, ChainRowsLogitBiasAndMinP,
        # the console script, before vLLM's CLI; the test and benchmark harness
        *LAUNCH_PATCHES, KernelRebindVarsFix,
    )


def patches_at(moment: AppliedAt) -> list[type[TouchPoint]]:
    """The declared patches of ``moment`` whose releases include the installed vLLM (each
    may still find this process does not need it: ``needed_here``)."""
    return [patch for patch in declared_patches()
            if patch.applied_at is moment and installed_release_in(patch.releases)]


def apply_patches(moment: AppliedAt) -> None:
    for patch in patches_at(moment):
        if not patch.is_applied() and patch.needed_here():
            patch.apply()


_activated = False


def activate() -> None:
    """Apply every patch dartree needs in this process (once)."""
    global _activated
    check_vllm_version()
    if _activated:
        return
    _activated = True
    apply_patches(AppliedAt.DARTREE_REQUESTED)
    logger.info("vllm-dartree activated (vLLM %s)", installed_vllm_version())


def build_dartree_speculative_config(engine_args, requested: dict, original,
                                     target_model_config, parallel_config):
    """Validate the dartree request, refuse what cannot run, activate, build vLLM's config."""
    check_vllm_version()
    from vllm.platforms import current_platform

    from vllm_dartree.config import parse_speculative_config
    from vllm_dartree.integration.refusals import refuse_unsupported_setup

    config = parse_speculative_config(requested, on_cpu=current_platform.is_cpu())
    refuse_unverifiable_platform(config)
    refuse_unsupported_setup(config, engine_args, target_model_config, parallel_config,
                             on_cuda=current_platform.is_cuda())
    select_tree_attention_backend(config, engine_args)
    schedule_synchronously_if_adaptive(config, engine_args)
    activate()
    saved = {attr: getattr(engine_args, attr, None) for _, _, attr in SHORTCUT_FLAGS}
    saved_config = engine_args.speculative_config
    # vLLM carries dartree as its DFlash method (same drafter plumbing) with B draft slots:
    # on 0.34+ through the registered method "dartree" (a DFlash-based config naming our
    # speculator), before that as "dflash" itself. The dartree settings ride along on the
    # config object into every engine process (config.carry_settings says why there).
    engine_args.speculative_config = {
        "method": METHOD_NAME if MethodRegistration.applies_here() else "dflash",
        "model": config.model,
        "num_speculative_tokens": config.num_speculative_tokens,
        **config.vllm_options,
    }
    for attr in saved:  # merged into the request above
        setattr(engine_args, attr, None)
    try:
        speculative = original(engine_args, target_model_config, parallel_config)
    finally:
        engine_args.speculative_config = saved_config
        for attr, value in saved.items():
            setattr(engine_args, attr, value)
    adopt_speculators_checkpoint(speculative, config)
    layout = check_drafter(config, speculative.draft_model_config.hf_config,
                           target_model_config, parallel_config)
    expose_target_layers(speculative.draft_model_config.hf_config, layout)
    carry_settings(speculative, config, layout)
    logger.info("vllm-dartree: tree=%s B=%d W=%s K=%d beta=%g budget_policy=%s drafter=%s",
                config.tree, config.num_speculative_tokens, config.width, config.top_k,
                config.effective_depth_bonus, config.budget_policy, config.model)
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


def check_drafter(config, draft_hf_config, target_model_config, parallel_config):
    """Drafter/target/settings mismatches, reported before any weight is loaded; returns
    the drafter's layout."""
    from vllm_dartree.config import DARTreeConfigError
    from vllm_dartree.integration.drafter_model import read_layout

    layout = read_layout(
        draft_hf_config,
        target_vocab=target_model_config.get_vocab_size(),
        target_hidden=target_model_config.get_hidden_size(),
        target_layers=target_model_config.get_num_layers(parallel_config),
    )
    if config.correction and not (layout.has_head or layout.has_lattice):
        raise DARTreeConfigError(
            f"speculative_config key 'correction' = True needs a drafter with a correction "
            f"head (Domino or DSpark) or its own lattice (DFlash2, LiLiCorr); {config.model} is "
            "a DFlash checkpoint without one (set correction to false or use such a drafter)"
        )
    if layout.has_lattice and config.user_set("top_k") and config.top_k != layout.lattice_top_k:
        raise DARTreeConfigError(
            f"speculative_config key 'top_k' = {config.top_k} does not apply to {config.model}: "
            f"a {layout.lattice} drafter scores its own {layout.lattice_top_k} candidates per "
            f"depth (leave top_k unset, or set it to {layout.lattice_top_k})"
        )
    # The default K is capped at the vocabulary; a K the user chose must fit it.
    if config.user_set("top_k") and config.top_k > target_model_config.get_vocab_size():
        raise DARTreeConfigError(
            f"speculative_config key 'top_k' = {config.top_k} exceeds the vocabulary size "
            f"{target_model_config.get_vocab_size()}"
        )
    return layout
