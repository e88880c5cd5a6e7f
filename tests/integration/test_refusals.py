"""Setups a dartree engine cannot serve correctly are refused when vLLM builds the engine
config, before any weight loads, with the setting, its value and what is supported."""

from __future__ import annotations

import json
import os
import re
from types import SimpleNamespace

import pytest
import torch

from vllm_dartree.config import DARTreeConfig, DARTreeConfigError, carried_settings
from vllm_dartree.integration import refusals
from vllm_dartree.models.tiny import TargetSpec, _qwen3_config


def config_only_target(tmp_path, name: str, **changes) -> str:
    """A target checkpoint folder with only a config.json (nothing loads weights here)."""
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(_qwen3_config(TargetSpec()) | changes))
    return str(folder)


def engine_config(model: str, drafter, **engine):
    from vllm.engine.arg_utils import EngineArgs

    from vllm_dartree.plugin import register

    register()  # the gate, as vLLM's plugin loader installs it
    speculative = {"method": "dartree", "model": str(drafter),
                   **engine.pop("speculative", {})}
    engine.setdefault("dtype", "float32")
    return EngineArgs(model=model, skip_tokenizer_init=True, speculative_config=speculative,
                      **engine).create_engine_config()


def refused(match: str, model: str, drafter, **engine) -> str:
    with pytest.raises(DARTreeConfigError, match=match) as err:
        engine_config(model, drafter, **engine)
    assert "Supported setups" in str(err.value)
    return str(err.value)


def test_a_supported_setup_builds(tmp_path, tiny_domino):
    config = engine_config(config_only_target(tmp_path, "plain"), tiny_domino)
    assert carried_settings(config.speculative_config).tree == "pruned"
    assert config.use_v2_model_runner is False


def test_pipeline_parallel_is_refused(tmp_path, tiny_domino):
    refused(r"'pipeline_parallel_size' = 2 is not supported", config_only_target(
        tmp_path, "pp"), tiny_domino, pipeline_parallel_size=2,
        distributed_executor_backend="mp")


def test_m_rope_targets_pass_the_config_gate(tmp_path, tiny_domino):
    """M-RoPE targets run on V2 (tests/v2/test_v2_hybrid.py: a tiny Qwen3.5); V1 refuses
    them when it builds its runner (below)."""
    model = config_only_target(tmp_path, "mrope", rope_scaling={
        "rope_type": "default", "mrope_section": [4, 6, 6]})
    assert engine_config(model, tiny_domino).model_config.uses_mrope


@pytest.mark.parametrize(("changes", "what"), [
    ({"is_hybrid": True}, "is hybrid"), ({"has_inner_state": True}, "is hybrid"),
    ({"uses_mrope": True}, "uses M-RoPE")])
def test_the_v1_runner_refuses_targets_dartree_runs_on_v2_only(changes, what):
    from vllm_dartree.integration.v1.runner import refuse_v2_only_target

    plain = {"architectures": ["T"], "is_hybrid": False, "has_inner_state": False,
             "uses_mrope": False}
    refuse_v2_only_target(SimpleNamespace(**plain))  # attention-only, 1-D RoPE: runs on V1
    with pytest.raises(DARTreeConfigError, match=f"target T {what}.*V2 model runner only"):
        refuse_v2_only_target(SimpleNamespace(**plain | changes))


@pytest.mark.parametrize(("arch", "fields"), [
    ("JambaForCausalLM", {"model_type": "jamba", "attn_layer_period": 2,
                          "attn_layer_offset": 1, "expert_layer_period": 8,
                          "num_experts": 1, "mamba_d_state": 16}),
    ("MambaForCausalLM", {"model_type": "mamba", "state_size": 16, "expand": 2,
                          "conv_kernel": 4}),
])
def test_recurrent_and_hybrid_targets_are_refused(tmp_path, tiny_domino, arch, fields):
    model = config_only_target(tmp_path, arch, architectures=[arch], **fields)
    refused(r"recurrent or hybrid", model, tiny_domino)


@pytest.mark.parametrize("tree", ["chain", "pruned", "fixed", "ddtree"])
def test_every_tree_on_a_qwen3_next_target_passes_the_config_gate(tiny_hybrid_target,
                                                                 tiny_hybrid_domino, tree):
    """Qwen3-Next's GDN layers verify tree rows on CPU (integration/cpu_gdn.py)."""
    config = engine_config(str(tiny_hybrid_target), tiny_hybrid_domino, dtype="bfloat16",
                           speculative={"tree": tree, "num_speculative_tokens": 16})
    assert config.model_config.is_hybrid and carried_settings(config.speculative_config).tree == tree


@pytest.mark.parametrize("arch", ["Qwen3NextForCausalLM", "Qwen3_5ForConditionalGeneration",
                                  "Qwen3_5MoeForCausalLM"])
def test_trees_on_gdn_targets_are_accepted_on_cuda(monkeypatch, arch):
    """On a GPU (any checked release) the Triton GDN layer verifies tree rows
    (integration/gpu_gdn.py); other recurrent layers still verify chains only."""
    from vllm.platforms import current_platform

    from vllm_dartree.integration import compat

    monkeypatch.setattr(current_platform, "is_cpu", lambda: False)
    monkeypatch.setattr(compat.CpuGdnConvWindowFix, "applies_here", classmethod(lambda c: False))
    monkeypatch.setattr(compat.CpuGdnConvWindowFix, "is_applied", classmethod(lambda c: False))
    assert refusals.tree_rows_in_recurrent_layers(SimpleNamespace(architectures=[arch]))
    assert not refusals.tree_rows_in_recurrent_layers(
        SimpleNamespace(architectures=["JambaForCausalLM"]))
    # On a CPU the CPU ops verify tree rows only where the plugin replaces them (0.32).
    monkeypatch.setattr(current_platform, "is_cpu", lambda: True)
    assert not refusals.tree_rows_in_recurrent_layers(SimpleNamespace(architectures=[arch]))


def test_trees_on_other_hybrid_targets_name_the_supported_ones(tmp_path, tiny_domino):
    model = config_only_target(tmp_path, "jamba", architectures=["JambaForCausalLM"],
                               model_type="jamba", attn_layer_period=2, attn_layer_offset=1,
                               expert_layer_period=8, num_experts=1, mamba_d_state=16)
    message = refused(r"'tree' = 'fixed' would feed a tree's rows", model, tiny_domino,
                      speculative={"tree": "fixed"})
    assert "Qwen3NextForCausalLM" in message


def test_cross_layer_kv_sharing_is_refused():
    problems = setup_problems(text=SimpleNamespace(num_kv_shared_layers=4))
    assert any("num_kv_shared_layers = 4" in p for p in problems)


def test_sliding_window_targets_are_refused(tmp_path, tiny_domino):
    model = config_only_target(tmp_path, "swa", sliding_window=64, use_sliding_window=True,
                               max_window_layers=0)
    refused(r"sliding window = 64", model, tiny_domino)
    # vLLM's own switch turns the window off: then the target is a full-attention one.
    engine_config(model, tiny_domino, disable_sliding_window=True)


def test_an_fp8_kv_cache_is_refused(tmp_path, tiny_domino):
    refused(r"'kv_cache_dtype' = 'fp8' resolves to 'fp8'",
            config_only_target(tmp_path, "fp8"), tiny_domino, kv_cache_dtype="fp8")


def test_a_kv_dtype_the_checkpoint_turns_into_fp8_is_refused():
    """'auto' resolves as vLLM resolves it: a ModelOpt checkpoint's KV scheme makes it fp8."""
    quantized = SimpleNamespace(quantization_config={
        "quant_method": "modelopt", "quantization": {"kv_cache_quant_algo": "FP8"}})
    problems = setup_problems(hf_config=quantized)
    assert any("'kv_cache_dtype' = 'auto' resolves to 'fp8_e4m3'" in p for p in problems)


def test_head_sizes_the_triton_kernel_cannot_take_are_refused_on_cuda():
    assert any("head size 96" in p for p in setup_problems(head=96, on_cuda=True))
    assert not setup_problems(head=96, on_cuda=False)  # the CPU path takes any head size
    assert not setup_problems(head=128, on_cuda=True)
    assert not setup_problems(head=96, on_cuda=True, tree="chain")  # no tree kernel


def test_disable_padded_drafter_batch_is_refused(tmp_path, tiny_domino):
    refused(r"'disable_padded_drafter_batch' = True is not supported",
            config_only_target(tmp_path, "nopad"), tiny_domino,
            speculative={"disable_padded_drafter_batch": True})


def test_the_adaptive_verification_schedules_synchronously(tmp_path, tiny_domino):
    model = config_only_target(tmp_path, "adaptive")
    adaptive = {"budget_policy": "adaptive"}
    refused(r"'async_scheduling' = True cannot run .*'budget_policy' = 'adaptive'", model,
            tiny_domino, speculative=adaptive, async_scheduling=True)
    config = engine_config(model, tiny_domino, speculative=adaptive)
    assert config.scheduler_config.async_scheduling is False
    assert carried_settings(config.speculative_config).adaptive


def test_watermarking_is_refused(tmp_path, tiny_domino):
    model = config_only_target(tmp_path, "v2")
    refused(r"'watermark_config' is set: watermarking biases each draft position", model,
            tiny_domino, watermark_config={"algorithm": "gumbel"})


def test_a_dartree_engine_keeps_vllms_runner_choice(tmp_path, tiny_domino):
    """No runner is forced: vLLM's V1/V2 choice stands for dartree engines (here V1: no
    Triton CPU backend; tests/v2 runs dartree engines where vLLM is told to pick V2)."""
    from vllm.config.vllm import VllmConfig

    from vllm_dartree.integration.activation import declared_patches

    config = engine_config(config_only_target(tmp_path, "scope"), tiny_domino)
    assert not any(getattr(t, "target", None) == "vllm.config.vllm:VllmConfig"
                   and getattr(t, "attribute", None) == "use_v2_model_runner"
                   for t in declared_patches())
    assert getattr(VllmConfig.use_v2_model_runner.fget, "__dartree_patch__", None) is None
    assert config.use_v2_model_runner is False


def test_layers_with_sinks_or_windows_are_refused_in_dartree_engines_only(monkeypatch):
    from vllm.config import vllm as vllm_config

    layer = SimpleNamespace(sinks=torch.zeros(4), sliding_window=-1, alibi_slopes=None,
                            logits_soft_cap=0, kv_sharing_target_layer_name=None)
    monkeypatch.setattr(vllm_config, "_current_vllm_config", SimpleNamespace(
        speculative_config=SimpleNamespace(dartree=object())))
    with pytest.raises(DARTreeConfigError, match="attention sinks"):
        refusals.refuse_layer(layer, "CPU")
    monkeypatch.setattr(vllm_config, "_current_vllm_config", SimpleNamespace(
        speculative_config=None))
    refusals.refuse_layer(layer, "CPU")  # another engine: not ours to refuse


def setup_problems(text=None, hf_config=None, head=64, on_cuda=False, tree="pruned",
                   parallel=None):
    """setup_problems() for a plain model config with one thing changed."""
    model_config = SimpleNamespace(
        hf_text_config=text or SimpleNamespace(), hf_config=hf_config or SimpleNamespace(),
        architectures=["Qwen3ForCausalLM"], uses_mrope=False, is_hybrid=False,
        has_inner_state=False, is_attention_free=False, use_mla=False,
        is_encoder_decoder=False, uses_alibi=False, get_sliding_window=lambda: None,
        disable_sliding_window=False,
        get_head_size=lambda: head)
    config = DARTreeConfig(model="drafter", tree=tree)
    return refusals.setup_problems(config, SimpleNamespace(kv_cache_dtype="auto"),
                                   model_config,
                                   parallel or SimpleNamespace(pipeline_parallel_size=1),
                                   on_cuda)


@pytest.fixture(autouse=True)
def _no_v2_env(monkeypatch):
    if os.environ.get("VLLM_USE_V2_MODEL_RUNNER"):
        monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER")


@pytest.mark.parametrize(("key", "value"), [
    ("rejection_sample_method", "block"), ("draft_sample_method", "probabilistic"),
    ("enable_adaptive_verification", True), ("synthetic_acceptance_rates", [0.5])])
def test_v2_verification_settings_trees_cannot_honour_are_refused(tmp_path, tiny_domino, key,
                                                                   value):
    """vLLM's own verification options (lossy or chain-only rejection, probabilistic drafts,
    its adaptive verification) are not dartree keys: refused by name and value."""
    message = (f"key '{key}' (value {value!r}) is not supported with method 'dartree'; "
               "allowed keys: budget_policy")
    with pytest.raises(DARTreeConfigError, match=re.escape(message)):
        engine_config(config_only_target(tmp_path, key), tiny_domino,
                      speculative={key: value})


@pytest.mark.parametrize("key", ["prefill_context_parallel_size",
                                 "decode_context_parallel_size"])
def test_context_parallelism_is_refused(key):
    problems = setup_problems(parallel=SimpleNamespace(pipeline_parallel_size=1, **{key: 2}))
    assert any(f"engine key '{key}' = 2 is not supported with dartree" in p for p in problems)


@pytest.mark.e2e
def test_a_hybrid_target_on_the_v1_runner_is_refused_before_weights_load(tiny_hybrid_target,
                                                                         tiny_hybrid_domino):
    """Chains on hybrid targets need V2's hybrid model state; V1 refuses them at runner
    construction (vLLM picks the runner after the config gate)."""
    from vllm_dartree.harness.engine import build_llm
    from vllm_dartree.integration.compat import release_engine

    with pytest.raises(DARTreeConfigError, match="runs it on vLLM's V2 model runner only"):
        build_llm(model=str(tiny_hybrid_target), dtype="bfloat16", speculative_config={
            "method": "dartree", "model": str(tiny_hybrid_domino), "tree": "chain",
            "num_speculative_tokens": 7})
    release_engine(None)  # the half-built engine's distributed state
