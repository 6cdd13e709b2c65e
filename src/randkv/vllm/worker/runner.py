"""What RandKV adds to every vLLM model runner, on every platform: its state object
(`randkv.vllm.worker.state`), built at start-up, and rounds applied before the forward pass.

The parts that depend on vLLM's model runner (where block tables and attention inputs live)
are in `randkv.vllm.worker.runner_v1` and `randkv.vllm.worker.runner_v2`, the platform parts
in `randkv.vllm.worker.cpu` and `randkv.vllm.worker.gpu`; `randkv.vllm.worker.runner_class`
assembles a runner class from them for the vLLM runner an engine built.

This module must never import `vllm.v1.worker.cpu_*` (directly or through another module):
vLLM's CPU worker package replaces torch's CUDA stream and event API process-wide when
imported, which would break a GPU worker. Nor does it import a model runner module: vLLM
0.34 has no V1 runner, 0.28 no V2 one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from vllm.logger import init_logger

from randkv.kernels.compactor import KVLayout, PagedCompactor
from randkv.spec.config import RandKVConfig
from randkv.vllm.metrics import RandKVRecorder, Source
from randkv.vllm.refusals import refuse_shared_kv_layers
from randkv.vllm.sched.kv_groups import kv_group_layout
from randkv.vllm.sched.output import RoundDirective
from randkv.vllm.worker.parallel import global_layer_index, kv_cache_layer_indices, kv_head_shard
from randkv.vllm.worker.records import RequestRecords
from randkv.vllm.worker.rounds import Compactor, RoundApplier
from randkv.vllm.worker.state import RandKVWorkerState
from randkv.vllm.worker.window_lengths import give_absolute_lengths

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig

logger = init_logger("vllm.randkv.worker")


class RandKVRunnerMixin:
    """Added to vLLM's model runner at start-up (see `RandKVWorkerMixin.init_device`).

    A runner mixin (`runner_v1.V1RunnerMixin`, `runner_v2.V2RunnerMixin`) supplies the
    hooks below that read or change vLLM's runner state; attention inputs (physical slots and
    lengths) are the runner mixin's own business.
    """

    #: RandKV's state in this worker, set by `randkv_setup`.
    randkv: RandKVWorkerState
    # vLLM's runner attributes RandKV reads (declared for the type checker).
    vllm_config: VllmConfig
    kv_cache_config: KVCacheConfig
    attn_groups: list[list[Any]]
    model_config: Any
    cache_config: Any
    compilation_config: Any

    # ------------------------------------------------------------------ runner hooks

    def randkv_shared_kv_layers(self) -> dict[str, str]:
        """Layer -> the layer whose KV cache it reads, for vLLM's cross-layer KV sharing."""
        raise NotImplementedError

    def randkv_forget_tail_blocks(self, directives: dict[str, RoundDirective]) -> None:
        """Drop the blocks past each directive's `keep_blocks` from the runner's block
        tables (the scheduler freed them), before this step appends new blocks."""
        raise NotImplementedError

    def randkv_layer_caches(self, group: int) -> tuple[list[int], list[torch.Tensor]]:
        """(global layer index, KV cache) of each attention layer of KV cache group `group`
        (the one RandKV bounds) this worker holds, in layer order: draws are keyed by global
        layer. A drafter's layers in the group are among them (speculative decoding). Each
        layer's own cache: V2's `kv_caches` follow the allocation order of the cache tensors,
        and V1's list holds a draft model's layer beside the target layer of its index."""
        names = list(self.kv_cache_config.kv_cache_groups[group].layer_names)
        target_layers = self.model_config.get_total_num_hidden_layers()
        context = self.compilation_config.static_forward_context
        by_index = {global_layer_index(name, target_layers): name for name in names}
        ordered = kv_cache_layer_indices(names, target_layers)
        return ordered, [_with_head_axis(context[by_index[i]].kv_cache) for i in ordered]

    def randkv_attention_backend_name(self) -> str:
        """The name of vLLM's attention backend for the full-attention KV cache group."""
        groups = self.attn_groups
        group = kv_group_layout(self.kv_cache_config).randkv
        return (
            groups[group][0].backend.__name__
            if len(groups) > group and groups[group]
            else "unknown"
        )

    def randkv_make_compactor(self, layout: KVLayout, block_size: int) -> Compactor:
        """The compactor for this platform (the GPU runner overrides it)."""
        return PagedCompactor(layout, block_size)

    # ------------------------------------------------------------------ start-up

    def randkv_setup(self, config: RandKVConfig, layout: KVLayout) -> None:
        from vllm.distributed import (
            get_tensor_model_parallel_rank,
            get_tensor_model_parallel_world_size,
        )
        from vllm.utils.platform_utils import is_pin_memory_available

        from randkv.kernels.hostsync import set_pin_memory

        refuse_shared_kv_layers(self.randkv_shared_kv_layers())
        set_pin_memory(is_pin_memory_available())  # vLLM may have turned pinning off
        groups = kv_group_layout(self.kv_cache_config)
        # Draws are keyed by global layer and global KV head, so each TP rank (and each
        # pipeline stage) plans a slice of the single-device plan.
        layers, caches = self.randkv_layer_caches(groups.randkv)
        head_axis = 3 if layout is KVLayout.KV_BLOCK_SLOT_HEAD else 1
        tp_rank = get_tensor_model_parallel_rank()
        # MLA: one latent row per token, shared by every head and replicated on every rank:
        # the spec's draws with one head per layer (docs/spec.md, "MLA").
        total_heads = 1 if self.model_config.use_mla else self.model_config.get_total_num_kv_heads()
        shard = kv_head_shard(
            tp_rank,
            get_tensor_model_parallel_world_size(),
            total_heads,
            caches[0].shape[head_axis],
        )
        # Per-request events (rounds) are published by rank 0 only; work by every rank.
        metrics = RandKVRecorder(self.vllm_config, Source.WORKER, publishes_once=tp_rank == 0)
        block_size = self.cache_config.block_size
        compactor = self.randkv_make_compactor(layout, block_size)
        rounds = RoundApplier(config, caches, layers, shard, compactor, metrics)
        records = RequestRecords(config, len(caches), shard.num_heads)
        self.randkv = RandKVWorkerState(config, groups, rounds, records, metrics, block_size)
        # A mixed model's window layers and a hybrid model's state layers read absolute
        # lengths (their own attention inputs): both runners build every group's metadata
        # from one set of lengths.
        for group in groups.absolute:
            for attn_group in self.attn_groups[group]:
                for builder in attn_group.metadata_builders:
                    give_absolute_lengths(builder, self.randkv.window_lengths)
        logger.info(
            "RandKV worker: layers %d..%d, KV heads %d..%d (%d replicas), layout %s, "
            "compactor %s, position tracking %s",
            layers[0],
            layers[-1],
            shard.first_head,
            shard.heads[-1],
            shard.replicas,
            layout.value,
            type(compactor).__name__,
            "on" if records.tracking else "off",
        )

    # ------------------------------------------------------------------ before a step

    def randkv_before_step(self, scheduler_output: SchedulerOutput) -> None:
        state = self.randkv
        plan = state.begin_step(scheduler_output)
        if plan is None:
            return
        state.records.roll_back_rejected(scheduler_output)
        if plan.directives:
            round_plan = state.rounds.apply(plan.directives)
            self.randkv_forget_tail_blocks(plan.directives)
            state.records.after_rounds(plan.directives, round_plan)
            rounds = state.metrics.totals["rounds"]
            if rounds % 1000 < len(plan.directives):
                logger.info("RandKV: %d rounds", rounds)
        state.records.observe(scheduler_output, state.budgets, state.block_size)

    # ------------------------------------------------------------------ observability

    def randkv_stats(self) -> dict[str, Any]:
        """This worker's `RankStats`, as the plain dict that crosses vLLM's RPC."""
        return self.randkv.stats().to_wire()

    def randkv_slot_positions(self, req_ids: list[str]) -> dict[str, Any]:
        """Slot -> position maps of the tracked requests among `req_ids`."""
        rounds = self.randkv.rounds
        return self.randkv.records.slot_positions(req_ids, rounds.layers, rounds.kv_heads)


def _with_head_axis(cache: torch.Tensor) -> torch.Tensor:
    """A layer's KV cache with a KV-head axis: MLA's latent cache, (blocks, block_size,
    latent + RoPE), is a one-head `BLOCK_HEAD_SLOT` cache (a view: compaction writes
    through). The RoPE part moves with its row: it was rotated at its original position,
    as GQA keys are."""
    return cache.unsqueeze(1) if cache.dim() == 3 else cache
