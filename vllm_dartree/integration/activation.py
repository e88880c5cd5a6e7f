"""When vllm-dartree changes vLLM, and the one list of what it changes.

:func:`declared_patches` is that list. Each entry declares the vLLM releases it applies
to, the model runner it serves and when it is applied (``patching.TouchPoint``); each
moment applies the entries that name it and cover the installed release
(:func:`apply_patches`). At plugin load (every vLLM process) that is the request gate,
:class:`SpeculativeConfigGate`: a config that asks for dartree (``gate.requested_config``)
is built by :func:`build_dartree_speculative_config`, every other goes to vLLM's code
unchanged; and ``gate.py``'s ``--spec-method dartree`` and, where vLLM has the API, the
registered method. The build activates the rest of the list in this process; engine
processes spawned after that inherit ``VLLM_DARTREE_ACTIVE`` and activate at load. The
gate and the build live here because the build applies this list (a module of their own
would import this one and be imported by it); its steps are in ``refusals.py`` and
``speculative_config.py``. Patches live beside their subjects (``v1/``, ``v2/``,
``sampling.py``, ``lora.py``, ...); the ones declared here have no other home: the drafter
architectures, the tree attention backends and 0.32/0.33's V2 speculator choice.
"""

from __future__ import annotations

import functools
import logging

from vllm_dartree import METHOD_NAME
from vllm_dartree.config import carry_settings
from vllm_dartree.integration.gate import (
    SHORTCUT_FLAGS,
    ActiveInEngineProcesses,
    MethodRegistration,
    SpecMethodChoice,
    requested_config,
)
from vllm_dartree.integration.patching import (
    AppliedAt,
    ArchitectureOverride,
    BackendOverride,
    Runner,
    TouchPoint,
    VllmPatch,
    check_vllm_version,
    installed_release_in,
    installed_vllm_version,
)
from vllm_dartree.integration.refusals import check_drafter, refuse_unverifiable_platform
from vllm_dartree.integration.speculative_config import (
    adopt_speculators_checkpoint,
    expose_target_layers,
    schedule_synchronously_if_adaptive,
    select_tree_attention_backend,
)
from vllm_dartree.integration.touchpoints import ALL_RELEASES, PRE_REGISTRY_RELEASES

logger = logging.getLogger("vllm.dartree")


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



def install_gate() -> None:
    apply_patches(AppliedAt.PLUGIN_LOAD)


# ---- applied when dartree is requested --------------------------------------------------

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
    from vllm_dartree.integration.v1.runner import (
        RUNNER_PATCHES,
        DFlashProposerGlobal,
        DrafterBlockLookahead,
    )
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
