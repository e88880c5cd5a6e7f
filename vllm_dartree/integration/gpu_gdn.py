"""Tree rows through the Triton path of vLLM's Qwen Gated-DeltaNet layer (what a GPU runs).

``QwenGatedDeltaNetAttention._forward_core`` verifies a step's speculative rows with two
calls of its module's globals: ``causal_conv1d_update`` (the conv, window at
``num_accepted - 1``) and ``fused_sigmoid_gating_delta_rule_update`` (the recurrence, one
state slot per row). They run rows as a chain. On a tree step (a plan attached to the
layer's metadata), :class:`TreeRowsInTritonGdn` runs ``_forward_core`` with those two
globals swapped for :func:`tree_conv` and :func:`tree_recurrence`, which take over the
speculative call only (the one given ``num_accepted_tokens``): each row's conv along its
own path and its recurrence from its parent's state, both Triton kernels
(``kernels/gdn_tree.py``), states and conv inputs left in vLLM's slots as a chain leaves
them (``gdn_rows``). Prefill rows of the same batch run vLLM's code unchanged.

vLLM's fused CUDA chain kernel (``fused_gdn_decode_post_conv_mtp``: bf16, K = V = 128,
sm80+) verifies speculative rows without ``_forward_core``: :class:`NoFusedChainKernel`
keeps an engine that verifies trees off it.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import torch
import torch.nn.functional as F

from vllm_dartree.integration.gdn_rows import shift_conv_windows, tree_rows_of, verifies_trees
from vllm_dartree.integration.patching import ModuleGlobalSwap, Runner, VllmPatch, resolve
from vllm_dartree.integration.touchpoints import ALL_RELEASES
from vllm_dartree.kernels.gdn_tree import delta_rule_in_slots, tree_conv_outputs

GDN_MODULE = "vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn"
GDN_LAYER = f"{GDN_MODULE}:QwenGatedDeltaNetAttention"

logger = logging.getLogger("vllm.dartree")


class SpecConvGlobal(ModuleGlobalSwap):
    """The GDN module's ``causal_conv1d_update``, swapped while a tree step's layer runs."""

    target = GDN_MODULE
    attribute = "causal_conv1d_update"
    releases = ALL_RELEASES
    runner = Runner.V2  # hybrid (GDN) targets run on the V2 runner only


class SpecRecurrenceGlobal(ModuleGlobalSwap):
    """The GDN module's ``fused_sigmoid_gating_delta_rule_update``, likewise."""

    target = GDN_MODULE
    attribute = "fused_sigmoid_gating_delta_rule_update"
    releases = ALL_RELEASES
    runner = Runner.V2  # hybrid (GDN) targets run on the V2 runner only


def _metadata_of(layer: Any) -> Any:
    from vllm.forward_context import get_forward_context

    metadata = get_forward_context().attn_metadata
    return metadata.get(layer.prefix) if isinstance(metadata, dict) else None


class TreeRowsInTritonGdn(VllmPatch):
    """A tree step's speculative GDN rows along their own paths (module docstring)."""

    target = GDN_LAYER
    attribute = "_forward_core"
    releases = ALL_RELEASES
    runner = Runner.V2  # hybrid (GDN) targets run on the V2 runner only

    @classmethod
    def replacement(cls, original):
        @functools.wraps(original)
        def _forward_core(self, mixed_qkv, b, a, core_attn_out):
            metadata = _metadata_of(self)
            if metadata is None or not verifies_trees(metadata):
                return original(self, mixed_qkv, b, a, core_attn_out)
            module = resolve(GDN_MODULE)
            conv = functools.partial(tree_conv, self, metadata, module.causal_conv1d_update)
            recurrence = functools.partial(tree_recurrence, self, metadata,
                                           module.fused_sigmoid_gating_delta_rule_update)
            with SpecConvGlobal.swapped(conv), SpecRecurrenceGlobal.swapped(recurrence):
                return original(self, mixed_qkv, b, a, core_attn_out)

        return _forward_core


def tree_conv(layer: Any, metadata: Any, stock, x: torch.Tensor, conv_state: torch.Tensor,
              weight: torch.Tensor, bias: torch.Tensor | None = None, activation=None,
              *args: Any, num_accepted_tokens: torch.Tensor | None = None, **kwargs: Any
              ) -> torch.Tensor:
    """``causal_conv1d_update`` for the speculative rows of a tree step; any other call (no
    ``num_accepted_tokens``) goes to vLLM's."""
    if num_accepted_tokens is None:
        return stock(x, conv_state, weight, bias, activation, *args,
                     num_accepted_tokens=num_accepted_tokens, **kwargs)
    rows = tree_rows_of(metadata, x.shape[0], weight.shape[-1])
    silu = activation in (True, "silu", "swish")
    out = tree_conv_outputs(x, conv_state, rows.window_slot, rows.window_start,
                            rows.row_request, rows.sources, weight, bias,
                            "silu" if silu else None)
    shift_conv_windows(conv_state, rows, x)
    return out


def _l2_normalised(x: torch.Tensor) -> torch.Tensor:
    """x / sqrt(sum(x^2) + 1e-6) in fp32, as vLLM's Triton GDN kernels normalise q and k (its
    decode and chain kernels alike): the eps shows where |x|^2 is small."""
    x = x.float()
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + 1e-6)


def tree_recurrence(layer: Any, metadata: Any, stock, *args: Any, **kwargs: Any
                    ) -> tuple[torch.Tensor, None]:
    """``fused_sigmoid_gating_delta_rule_update`` for the speculative rows of a tree step:
    gates and normalisation as vLLM's kernel computes them (``g = -exp(A_log) *
    softplus(a + dt_bias)``, ``beta = sigmoid(b)``, q and k over sqrt(|x|^2 + 1e-6), q
    scaled by ``K ** -0.5``, key heads shared by consecutive value heads), then every row from its
    parent's state in its own slot. Any other call goes to vLLM's."""
    if kwargs.get("num_accepted_tokens") is None:
        return stock(*args, **kwargs)
    q, k, v = kwargs["q"][0], kwargs["k"][0], kwargs["v"][0]  # [N, heads, dim]
    rows = tree_rows_of(metadata, q.shape[0], layer.conv_kernel_size)
    value_heads = v.shape[1]
    q = _l2_normalised(q) * (kwargs.get("scale") or q.shape[-1] ** -0.5)
    k = _l2_normalised(k)
    q = q.repeat_interleave(value_heads // q.shape[1], dim=1)
    k = k.repeat_interleave(value_heads // k.shape[1], dim=1)
    g = -kwargs["A_log"].float().exp() * F.softplus(kwargs["a"].float()
                                                   + kwargs["dt_bias"].float())
    beta = kwargs["b"].float().sigmoid()
    out = delta_rule_in_slots(q, k, v, g, beta, kwargs["initial_state"], rows.row_slot,
                              rows.parent_slot, rows.request_starts)
    return out.unsqueeze(0), None


class NoFusedChainKernel(VllmPatch):
    """A GDN layer of an engine that verifies trees never takes vLLM's fused CUDA chain
    kernel for speculative rows (it bypasses ``_forward_core``); other engines keep it."""

    target = GDN_LAYER
    attribute = "__init__"
    releases = ALL_RELEASES
    runner = Runner.V2  # hybrid (GDN) targets run on the V2 runner only

    @classmethod
    def replacement(cls, original):
        @functools.wraps(original)
        def __init__(self, config, vllm_config, *args, **kwargs):
            original(self, config, vllm_config, *args, **kwargs)
            from vllm_dartree.config import carried_settings

            settings = carried_settings(vllm_config.speculative_config)
            if (settings is not None and settings.tree != "chain"
                    and self.enable_fused_gdn_spec_decode):
                self.enable_fused_gdn_spec_decode = False
                logger.info("vllm-dartree: %s verifies tree rows with the Triton GDN path "
                            "(fused chain kernel off)", self.prefix)

        return __init__


TRITON_GDN_PATCHES = (SpecConvGlobal, SpecRecurrenceGlobal, TreeRowsInTritonGdn,
                      NoFusedChainKernel)
