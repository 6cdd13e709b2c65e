"""Every vLLM internal RandKV relies on beyond what its own classes override, as data.

`randkv.vllm.release.drift` checks these against a vLLM release, together with what it finds by
itself: every `vllm` import in RandKV's source (an import inside `try: ... except
ImportError` counts when one of its alternatives resolves), and every method RandKV's
subclasses of vLLM classes override (it must still exist, and RandKV's signature must accept
every parameter vLLM's has). This table holds the rest: attributes RandKV reads on vLLM's
objects, calls it makes with keywords, dataclass fields, and attributes vLLM sets elsewhere.

A row's `runner` / `platform` limit it to releases where RandKV uses that model runner or
runs on that platform (`randkv.vllm.release.versions`). A row may list alternatives
(`either`): it holds when one of them does (the places where releases differ, read by
`randkv.vllm.release.compat`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Touch:
    """One vLLM internal RandKV relies on.

    kind:
    - "attributes": `target` is a class; instances have `names` (class attributes,
      dataclass fields, annotations, or `self.<name> = ...` in the class's or a base's
      source).
    - "call": `target` is a callable RandKV calls with `positional` arguments (after self)
      and the keyword arguments `names`.
    - "fields": `target` is a dataclass with the fields `names`.
    - "parameters": `target` is a callable with parameters named `names` (RandKV reads
      them from a call it intercepts).
    - "assigns": `target` is a module whose source assigns `<something>.<name>` for each of
      `names` (an attribute vLLM sets on an object of another class).
    """

    kind: str
    target: str
    names: tuple[str, ...] = ()
    positional: int = 0
    runner: str | None = None
    platform: str | None = None
    why: str = ""
    either: tuple[Touch, ...] = ()


def attrs(
    target: str,
    *names: str,
    runner: str | None = None,
    platform: str | None = None,
    why: str = "",
) -> Touch:
    return Touch("attributes", target, names, runner=runner, platform=platform, why=why)


def call(
    target: str,
    *keywords: str,
    positional: int = 0,
    runner: str | None = None,
    platform: str | None = None,
) -> Touch:
    return Touch("call", target, keywords, positional, runner=runner, platform=platform)


def either(
    why: str, *options: Touch, runner: str | None = None, platform: str | None = None
) -> Touch:
    return Touch("either", "", (), why=why, either=options, runner=runner, platform=platform)


SCHED = "vllm.v1.core.sched.scheduler:Scheduler"
MANAGER = "vllm.v1.core.kv_cache_manager:KVCacheManager"
COORDINATOR = "vllm.v1.core.kv_cache_coordinator:KVCacheCoordinator"
WINDOW_MANAGER = "vllm.v1.core.single_type_kv_cache_manager:SlidingWindowManager"
STATE_MANAGER = "vllm.v1.core.single_type_kv_cache_manager:MambaManager"
V1_RUNNER = "vllm.v1.worker.gpu_model_runner:GPUModelRunner"
V1_INPUT_BATCH = "vllm.v1.worker.gpu_input_batch:InputBatch"
V1_BLOCK_TABLE = "vllm.v1.worker.block_table:BlockTable"
V2_RUNNER = "vllm.v1.worker.gpu.model_runner:GPUModelRunner"
V1_PROPOSER = "vllm.v1.spec_decode.llm_base_proposer:SpecDecodeBaseProposer"

TOUCHPOINTS: tuple[Touch, ...] = (
    # ------------------------------------------------------------------ scheduler side
    attrs(
        SCHED,
        "vllm_config",
        "kv_cache_config",
        "kv_cache_manager",
        "running",
        "waiting",
        "requests",
        "need_mamba_block_aligned_split",
        why="RandKVScheduler reads them; the split hook is enabled through the flag",
    ),
    either(
        "the timeline's count of waiting requests (randkv.vllm.release.compat.queues)",
        attrs(SCHED, "get_request_counts"),
        attrs(SCHED, "skipped_waiting"),
    ),
    call(f"{SCHED}.finish_requests", positional=2),
    attrs(MANAGER, "coordinator", "block_pool", "watermark_blocks", "enable_caching"),
    call(f"{MANAGER}.create_kv_cache_blocks", positional=1),
    attrs(COORDINATOR, "single_type_managers"),
    call(
        f"{COORDINATOR}.allocate_new_computed_blocks",
        "request_id",
        "new_computed_blocks",
        "num_local_computed_tokens",
        "num_external_computed_tokens",
    ),
    call(f"{COORDINATOR}.allocate_new_blocks", positional=4),
    call(f"{COORDINATOR}.cache_blocks", positional=2),
    attrs(
        "vllm.v1.core.single_type_kv_cache_manager:SingleTypeKVCacheManager",
        "req_to_blocks",
        "block_size",
    ),
    # A mixed model's window groups, driven one manager at a time (RandKVCacheManager).
    call(f"{WINDOW_MANAGER}.get_num_blocks_to_allocate", "apply_admission_cap", positional=6),
    call(f"{WINDOW_MANAGER}.allocate_new_blocks", positional=3),
    call(f"{WINDOW_MANAGER}.remove_skipped_blocks", positional=3),
    # A hybrid model's state groups, the same way (vLLM's "align" mode places its prefill
    # checkpoints by `prefill_end`, passed where the release has it).
    either(
        "the state manager's count of new blocks (prefill_end: vLLM >= 0.32)",
        call(
            f"{STATE_MANAGER}.get_num_blocks_to_allocate",
            "apply_admission_cap",
            "prefill_end",
            positional=6,
        ),
        call(f"{STATE_MANAGER}.get_num_blocks_to_allocate", "apply_admission_cap", positional=6),
    ),  # fmt: skip
    call(f"{STATE_MANAGER}.allocate_new_blocks", positional=3),
    call(f"{STATE_MANAGER}.remove_skipped_blocks", positional=3),
    call(f"{SCHED}._mamba_block_aligned_split", positional=4),
    attrs("vllm.v1.kv_cache_interface:MambaSpec", "block_size"),
    attrs(MANAGER, "max_model_len"),
    attrs(
        "vllm.v1.core.block_pool:BlockPool",
        "get_num_free_blocks",
        "free_blocks",
        "num_gpu_blocks",
        "null_block",
    ),
    attrs("vllm.v1.core.kv_cache_utils:KVCacheBlock", "block_id", "ref_cnt"),
    attrs("vllm.v1.core.kv_cache_manager:KVCacheBlocks", "blocks"),
    attrs(
        "vllm.v1.request:Request",
        "request_id",
        "num_computed_tokens",
        "num_prompt_tokens",
        "prompt_token_ids",
        "sampling_params",
        "num_tokens",
        "status",
        "client_index",
        "get_finished_reason",
        "num_in_flight_tokens",
    ),
    attrs("vllm.v1.request:RequestStatus", "WAITING", "PREEMPTED", "FINISHED_ERROR"),
    call(
        "vllm.v1.engine:EngineCoreOutput",
        "request_id",
        "new_token_ids",
        "finish_reason",
        "stop_reason",
    ),
    call("vllm.v1.engine:EngineCoreOutputs", "outputs"),
    Touch(
        "fields",
        "vllm.v1.core.sched.output:SchedulerOutput",
        (
            "scheduled_new_reqs",
            "scheduled_cached_reqs",
            "num_scheduled_tokens",
            "total_num_scheduled_tokens",
            "finished_req_ids",
            "preempted_req_ids",
        ),
        why="RandKVSchedulerOutput copies every field; the worker reads these",
    ),
    Touch("fields", "vllm.v1.core.sched.output:NewRequestData", ("req_id", "num_computed_tokens")),
    Touch(
        "fields", "vllm.v1.core.sched.output:CachedRequestData", ("req_ids", "num_computed_tokens")
    ),
    # ------------------------------------------------------------------ configuration
    attrs(
        "vllm.config:VllmConfig",
        "model_config",
        "cache_config",
        "parallel_config",
        "scheduler_config",
        "compilation_config",
        "speculative_config",
        "kv_transfer_config",
        "additional_config",
    ),
    attrs(
        "vllm.config:ModelConfig",
        "max_model_len",
        "use_mla",
        "is_hybrid",
        "is_attention_free",
        "uses_alibi",
        "is_encoder_decoder",
        "uses_mrope",
        "get_total_num_kv_heads",
        "get_num_layers",
        "get_num_kv_heads",
    ),
    attrs(
        "vllm.config:ParallelConfig",
        "pipeline_parallel_size",
        "data_parallel_size",
        "decode_context_parallel_size",
        "prefill_context_parallel_size",
        "distributed_executor_backend",
    ),
    attrs("vllm.config:SchedulerConfig", "async_scheduling", "max_num_seqs"),
    attrs("vllm.config:CacheConfig", "cache_dtype", "block_size"),
    attrs("vllm.config:CompilationConfig", "static_forward_context"),
    attrs(
        "vllm.engine.arg_utils:EngineArgs",
        "scheduler_cls",
        "worker_cls",
        "async_scheduling",
        "additional_config",
        "speculative_config",
        "kv_transfer_config",
        "pipeline_parallel_size",
        "kv_cache_dtype",
        "create_engine_config",
    ),
    attrs(
        "vllm.v1.kv_cache_interface:FullAttentionSpec",
        "block_size",
        "page_size_bytes",
        "sliding_window",
        "attention_chunk_size",
    ),
    attrs("vllm.v1.kv_cache_interface:KVCacheConfig", "kv_cache_groups"),
    attrs("vllm.v1.kv_cache_interface:KVCacheGroupSpec", "layer_names", "kv_cache_spec"),
    # ------------------------------------------------------------------ workers
    attrs(
        "vllm.v1.worker.gpu_worker:Worker",
        "vllm_config",
        "model_runner",
        "cache_config",
        "model_config",
        "parallel_config",
        "scheduler_config",
    ),
    call(
        "vllm.v1.attention.backends.cpu_attn:CPUAttentionBackend.get_supported_kernel_block_sizes",
        platform="cpu",
    ),
    either(
        "the CPU attention kernels' ISA (randkv.vllm.release.compat.cpu_attention)",
        Touch("assigns", "vllm.v1.attention.backends.cpu_attn", ("isa",)),
        attrs("vllm.v1.attention.backends.cpu_attn:CPUAttentionBackendImpl", "isa"),
        platform="cpu",
    ),
    # ------------------------------------------------------------------ the V1 model runner
    attrs(
        V1_RUNNER,
        "kv_caches",
        "kv_cache_config",
        "model_config",
        "cache_config",
        "vllm_config",
        "input_batch",
        "requests",
        "num_computed_tokens",
        "req_indices",
        "positions",
        "query_start_loc",
        "seq_lens",
        "optimistic_seq_lens_cpu",
        "attn_groups",
        "shared_kv_cache_layers",
        runner="v1",
    ),
    attrs(
        V1_INPUT_BATCH,
        "num_reqs",
        "num_computed_tokens_cpu",
        "block_table",
        "req_id_to_index",
        "req_ids",
        runner="v1",
    ),
    attrs(V1_BLOCK_TABLE, "num_blocks_per_row", "slot_mapping", runner="v1"),
    call(
        "vllm.v1.worker.block_table:MultiGroupBlockTable.compute_slot_mapping",
        positional=3,
        runner="v1",
    ),  # fmt: skip
    attrs("vllm.v1.worker.gpu_input_batch:CachedRequestState", "block_ids", runner="v1"),
    # A mixed model's window groups get absolute lengths back (randkv.vllm.worker.window_lengths),
    # on either runner.
    attrs("vllm.v1.worker.utils:AttentionGroup", "metadata_builders"),
    Touch(
        "parameters",
        "vllm.v1.attention.backend:AttentionMetadataBuilder.build",
        ("common_prefix_len", "common_attn_metadata"),
    ),
    Touch(
        "fields",
        "vllm.v1.attention.backend:CommonAttentionMetadata",
        ("seq_lens", "max_seq_len"),
    ),
    # ------------------------------------------------------------------ the V2 model runner
    attrs(
        V2_RUNNER,
        "kv_cache_config",
        "compilation_config",
        "model_config",
        "cache_config",
        "vllm_config",
        "req_states",
        "block_tables",
        "input_buffers",
        "attn_groups",
        "prepare_attn",
        "sample",
        runner="v2",
    ),
    attrs(
        "vllm.v1.worker.gpu.states:RequestState",
        "req_id_to_index",
        "num_computed_tokens",
        runner="v2",
    ),  # fmt: skip
    attrs("vllm.v1.worker.gpu.block_table:BlockTables", "num_blocks", "slot_mappings", runner="v2"),
    # A mixed model's window groups: their slots from absolute positions, into RandKV's buffer.
    call(
        "vllm.v1.worker.gpu.block_table:BlockTables.compute_slot_mappings",
        "num_tokens_padded",
        "out",
        positional=3,
        runner="v2",
    ),
    attrs("vllm.v1.worker.gpu.buffer_utils:UvaBackedTensor", "np", runner="v2"),
    # A hybrid model's "align" state indices come from absolute lengths on GPUs
    # (`runner_v2._randkv_absolute_state_indices` wraps the V2 runner's
    # `model_state._mamba_ctx.compute_aligned_state_indices(seq_lens, num_reqs)`, vLLM 0.32
    # and 0.34). It looks them up at start-up and leaves a release without them alone, so
    # they are no rows here: importing their modules for the check disturbs vLLM 0.28.
    attrs("vllm.v1.worker.gpu.buffer_utils:StagedWriteTensor", "gpu", runner="v2"),
    attrs("vllm.v1.worker.gpu.input_batch:InputBuffers", "positions", "seq_lens", runner="v2"),
    Touch(
        "fields",
        "vllm.v1.worker.gpu.input_batch:InputBatch",
        (
            "num_reqs",
            "num_reqs_after_padding",
            "num_tokens_after_padding",
            "idx_mapping",
            "query_start_loc",
            "positions",
            "seq_lens",
            "seq_lens_cpu_upper_bound",
            "num_computed_tokens_np",
        ),
        runner="v2",
    ),
    call("vllm.v1.worker.gpu.input_batch:prepare_pos_seq_lens", positional=5, runner="v2"),
    call("vllm.v1.worker.gpu.attn_utils:get_shared_kv_cache_layers", positional=1, runner="v2"),
    Touch(
        "assigns",
        "vllm.model_executor.layers.attention_layer_base",
        ("kv_cache",),
        runner="v2",
        why="V2 keeps each layer's cache on the layer; its kv_caches list is not layer-ordered",
    ),
    attrs("vllm.v1.attention.backend:AttentionBackend", "get_supported_kernel_block_sizes"),
    # ------------------------------------------------------------------ the server's front door
    Touch(
        "parameters",
        "vllm.v1.engine.async_llm:AsyncLLM.generate",
        ("prompt", "sampling_params", "request_id"),
        why="every generating route's call into the engine (randkv.vllm.entrypoints.front_door)",
    ),
    Touch(
        "parameters",
        "vllm.entrypoints.generate.beam_search.online:BeamSearchOnlineMixin.beam_search",
        ("prompt", "request_id", "params"),
    ),
    Touch(
        "parameters",
        "vllm.entrypoints.openai.responses.serving:"
        "OpenAIServingResponses._generate_with_builtin_tools",
        ("request_id", "engine_input", "sampling_params"),
    ),
    attrs("vllm.v1.engine.async_llm:AsyncLLM", "vllm_config", "model_config"),
    either(
        "where the API server app gets its middleware (randkv.vllm.release.compat.entrypoints)",
        attrs("vllm.entrypoints.launchers.app", "init_entrypoints_middleware"),
        attrs("vllm.entrypoints.openai.api_server", "build_app"),
    ),
    # ------------------------------------------------------------------ speculative decoding
    attrs(SCHED, "num_spec_tokens", "num_lookahead_tokens"),
    attrs("vllm.v1.request:Request", "spec_token_ids", "num_output_placeholders", "max_tokens"),
    attrs("vllm.config:VllmConfig", "num_lookahead_tokens"),
    attrs("vllm.config:SpeculativeConfig", "method", "num_speculative_tokens"),
    attrs("vllm.config:ModelConfig", "get_total_num_hidden_layers"),
    Touch(
        "fields",
        "vllm.v1.core.sched.output:SchedulerOutput",
        ("scheduled_spec_decode_tokens",),
        why="the speculative tests read which drafts a step verified",
    ),
    # V1 drafters that write KV (randkv.vllm.worker.drafters_v1): draft steps and a draft
    # model's first pass, recomputed at physical slots.
    Touch(
        "parameters",
        f"{V1_PROPOSER}._update_positions_dependent_metadata",
        ("positions", "common_attn_metadata", "batch_size", "input_batch_size", "block_size"),
        runner="v1",
    ),
    Touch(
        "parameters",
        f"{V1_PROPOSER}.set_inputs_first_pass",
        (
            "target_token_ids",
            "next_token_ids",
            "target_positions",
            "target_hidden_states",
            "token_indices_to_sample",
            "cad",
            "num_rejected_tokens_gpu",
        ),
        runner="v1",
    ),  # fmt: skip
    attrs(
        V1_PROPOSER,
        "_slot_mapping_buffer",
        "positions",
        "is_rejected_token_mask",
        "needs_extra_input_slots",
        "net_num_new_slots_per_request",
        "block_size",
        "max_model_len",
        runner="v1",
    ),
    attrs(V1_RUNNER, "drafter", runner="v1"),
    call(
        "vllm.v1.spec_decode.utils:compute_new_slot_mapping",
        "cad",
        "new_positions",
        "is_rejected_token_mask",
        "block_size",
        "num_new_tokens",
        "max_model_len",
        runner="v1",
    ),  # fmt: skip
    attrs("vllm.v1.spec_decode.utils", "PADDING_SLOT_ID", runner="v1"),
    Touch(
        "fields",
        "vllm.v1.attention.backend:CommonAttentionMetadata",
        ("slot_mapping", "block_table_tensor"),
        runner="v1",
    ),
    # The V2 speculator: physical lengths and slot tables during its propose.
    attrs(V2_RUNNER, "speculator", runner="v2"),
    attrs(
        "vllm.v1.worker.gpu.spec_decode.speculator:DraftModelSpeculator",
        "block_tables",
        "propose",
        runner="v2",
    ),
    # ------------------------------------------------------------------ offline LLM
    attrs("vllm:LLM", "llm_engine", "collective_rpc"),
    # LLM.randkv_stats reads the scheduler's counters through vLLM's engine-core utility
    # channel (the scheduler adds the method to EngineCore; the client calls it by name).
    attrs("vllm.v1.engine.core:EngineCore", "scheduler"),
    call("vllm.v1.engine.core_client:SyncMPClient.call_utility", positional=1),
    attrs("vllm.v1.engine.core_client:InprocClient", "engine_core"),
    attrs("vllm.v1.engine.llm_engine:LLMEngine", "add_request", "output_processor"),
    attrs("vllm.v1.engine.output_processor:OutputProcessor", "request_states"),
)
