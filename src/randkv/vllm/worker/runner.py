"""What RandKV adds to every vLLM model runner, on every platform: rounds applied before the
forward pass, per-request records, statistics.

The parts that depend on vLLM's model runner (where block tables and attention inputs live)
are in `randkv.vllm.worker.runner_v1` and `randkv.vllm.worker.runner_v2`, the platform parts in
`randkv.vllm.worker.cpu` (CPU) and `randkv.vllm.worker.gpu` (GPU); `randkv.vllm.worker.runner_class`
assembles a runner class from them for the vLLM runner an engine built.

This module must never import `vllm.v1.worker.cpu_*` (directly or through another module):
vLLM's CPU worker package replaces torch's CUDA stream and event API process-wide when
imported, which would break a GPU worker. Nor does it import a model runner module: vLLM
0.34 has no V1 runner, 0.28 no V2 one.
"""

from __future__ import annotations

import dataclasses
import os
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from vllm.logger import init_logger
from vllm.utils.math_utils import cdiv

from randkv.kernels.compactor import KVLayout, PagedCompactor
from randkv.kernels.planner import RoundPlanner
from randkv.kernels.slotmap import SlotPositionMap
from randkv.spec.cadence import physical_lengths
from randkv.spec.config import RandKVConfig
from randkv.vllm.metrics import RandKVRecorder, Source
from randkv.vllm.refusals import refuse_shared_kv_layers
from randkv.vllm.sched.kv_groups import kv_group_layout
from randkv.vllm.sched.output import RandKVSchedulerOutput, RandKVStepPlan, RoundDirective
from randkv.vllm.worker.parallel import kv_head_shard
from randkv.vllm.worker.round_timer import RoundTimer
from randkv.vllm.worker.window_lengths import WindowLengths, give_absolute_lengths

logger = init_logger("vllm.randkv.worker")

TRACK_POSITIONS_ENV = "RANDKV_TRACK_POSITIONS"
_FINISHED_STATS_KEPT = 4096
_TRACKED_MAPS_KEPT = 256  # test/debug aid: finished requests' maps stay readable


@dataclasses.dataclass
class RequestRecord:
    """Worker-side observability of one request."""

    rounds: int = 0
    tokens_seen: int = 0
    physical_length: int = 0
    blocks_held: int = 0
    finished: bool = False


class RandKVRunnerMixin:
    """Added to vLLM's model runner at start-up (see `RandKVWorkerMixin.init_device`).

    A runner mixin (`runner_v1.V1RunnerMixin`, `runner_v2.V2RunnerMixin`) supplies the
    hooks below that read or change vLLM's runner state; attention inputs (physical slots and
    lengths) are the runner mixin's own business.
    """

    # ------------------------------------------------------------------ runner hooks

    def randkv_shared_kv_layers(self) -> dict[str, str]:
        """Layer -> the layer whose KV cache it reads, for vLLM's cross-layer KV sharing."""
        raise NotImplementedError

    def randkv_forget_tail_blocks(self, directives: dict[str, RoundDirective]) -> None:
        """Drop the blocks past each directive's `keep_blocks` from the runner's block
        tables (the scheduler freed them), before this step appends new blocks."""
        raise NotImplementedError

    def randkv_layer_caches(self) -> tuple[list[int], list[torch.Tensor]]:
        """(global layer index, KV cache) of each attention layer this worker holds, in
        layer order (RandKV keys draws by global layer)."""
        raise NotImplementedError

    def randkv_attention_backend_name(self) -> str:
        """The name of vLLM's attention backend for the full-attention KV cache group."""
        groups = self.attn_groups
        group = kv_group_layout(self.kv_cache_config).randkv
        return (
            groups[group][0].backend.__name__
            if len(groups) > group and groups[group]
            else "unknown"
        )

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
        # The KV cache group RandKV bounds (a mixed model's window groups stay vLLM's).
        self.randkv_groups = kv_group_layout(self.kv_cache_config)
        # A mixed model's window layers read absolute lengths (their own attention inputs):
        # both runners build every group's metadata from one set of lengths.
        self.randkv_window_lengths = WindowLengths()
        for group in self.randkv_groups.windows:
            for attn_group in self.attn_groups[group]:
                for builder in attn_group.metadata_builders:
                    give_absolute_lengths(builder, self.randkv_window_lengths)
        # Draws are keyed by global layer and global KV head, so each TP rank (and each
        # pipeline stage) plans a slice of the single-device plan.
        layers, caches = self.randkv_layer_caches()
        self.randkv_caches = caches
        local_heads = (
            caches[0].shape[3] if layout is KVLayout.KV_BLOCK_SLOT_HEAD else caches[0].shape[1]
        )
        tp_rank = get_tensor_model_parallel_rank()
        shard = kv_head_shard(
            tp_rank,
            get_tensor_model_parallel_world_size(),
            self.model_config.get_total_num_kv_heads(),
            local_heads,
        )
        device = caches[0].device
        self.randkv = config
        self.randkv_shard = shard
        self.randkv_planner = RoundPlanner(config, layers, shard.heads, device=device)
        self.randkv_compactor = self.randkv_make_compactor(layout, self.cache_config.block_size)
        self.randkv_track = os.environ.get(TRACK_POSITIONS_ENV, "0") == "1"
        self.randkv_slot_maps: OrderedDict[str, SlotPositionMap] = OrderedDict()
        self.randkv_records: OrderedDict[str, RequestRecord] = OrderedDict()
        self.randkv_scheduler_counters: dict[str, float] = {}
        # Per-request events (rounds) are published by rank 0 only; work by every rank.
        self.randkv_metrics = RandKVRecorder(
            self.vllm_config, Source.WORKER, publishes_once=tp_rank == 0
        )
        self.randkv_timer = RoundTimer(device)
        logger.info(
            "RandKV worker: layers %d..%d, KV heads %d..%d (%d replicas), layout %s, "
            "compactor %s, position tracking %s",
            layers[0],
            layers[-1],
            shard.first_head,
            shard.heads[-1],
            shard.replicas,
            layout.value,
            type(self.randkv_compactor).__name__,
            "on" if self.randkv_track else "off",
        )

    def randkv_make_compactor(self, layout: KVLayout, block_size: int) -> Any:
        """The compactor for this platform (the GPU runner overrides it)."""
        return PagedCompactor(layout, block_size)

    # ------------------------------------------------------------------ before a step

    #: True while vLLM warms up or compiles through real steps it builds itself (plain
    #: SchedulerOutputs of a few short requests, which never reach a round).
    randkv_warming_up: bool = False

    def randkv_before_step(self, scheduler_output: Any) -> None:
        if not isinstance(scheduler_output, RandKVSchedulerOutput):
            if scheduler_output.total_num_scheduled_tokens and not self.randkv_warming_up:
                # Skipping a round on one rank would silently desynchronize its KV heads.
                raise RuntimeError(
                    "RandKV: this step's plan (RandKVSchedulerOutput) did not reach the "
                    "worker; the engine must run randkv.vllm.sched.scheduler.RandKVScheduler"
                )
            return
        plan = scheduler_output.randkv
        self.randkv_scheduler_counters = plan.scheduler_counters
        self.randkv_step_budgets = plan.budgets
        self._randkv_harvest_timings()
        for req_id in scheduler_output.finished_req_ids:
            record = self.randkv_records.get(req_id)
            if record is not None:
                record.finished = True
        if plan.directives:
            self._randkv_apply_rounds(plan)
        self._randkv_observe(scheduler_output)

    #: This step's requests whose K is not the server's (RandKVStepPlan.budgets).
    randkv_step_budgets: dict[str, int] = {}  # noqa: RUF012 - replaced, never mutated

    def randkv_budget(self, req_id: str) -> int:
        """The K of a request scheduled this step."""
        return self.randkv_step_budgets.get(req_id, self.randkv.budget)

    def randkv_row_budgets(self, req_ids: Sequence[str]) -> np.ndarray | None:
        """The K of each of these requests (int64, host), or None when all have the
        server's K (the common case: one K for the whole batch)."""
        if not self.randkv_step_budgets:
            return None
        return np.array([self.randkv_budget(r) for r in req_ids], dtype=np.int64)

    def _randkv_harvest_timings(self) -> None:
        for name, seconds in self.randkv_timer.harvest().items():
            self.randkv_metrics.add(name, seconds)

    def _randkv_apply_rounds(self, plan: RandKVStepPlan) -> None:
        req_ids = list(plan.directives)
        directives = [plan.directives[r] for r in req_ids]
        block_lists = [d.block_ids for d in directives]
        width = max(len(b) for b in block_lists)
        # Host data: the compactor copies it to the device without a sync.
        block_tables = torch.zeros((len(req_ids), width), dtype=torch.int64)
        for row, blocks in enumerate(block_lists):
            block_tables[row, : len(blocks)] = torch.tensor(blocks, dtype=torch.int64)
        start = self.randkv_timer.mark()
        round_plan = self.randkv_planner.plan(
            [d.prompt_length for d in directives],
            [d.request_key for d in directives],  # Python ints: the planner's fast path
            [d.round_index for d in directives],
            [d.budget for d in directives],
        )
        planned = self.randkv_timer.mark()
        self.randkv_compactor.apply(round_plan, self.randkv_caches, block_tables)
        done = self.randkv_timer.mark()
        self.randkv_timer.record("planning_seconds", start, planned)
        self.randkv_timer.record("compaction_seconds", planned, done)
        # A KV head replicated on several ranks (fewer KV heads than ranks) counts on one.
        entries = round_plan.evicted.numel() if self.randkv_shard.counts_evictions else 0
        self.randkv_metrics.add("rounds", len(req_ids))
        self.randkv_metrics.add("tokens_evicted", len(req_ids) * self.randkv.buffer_size)
        self.randkv_metrics.add("kv_entries_evicted", entries)
        self.randkv_metrics.add(
            "kv_bytes_moved", self.randkv_compactor.moved_bytes(round_plan, self.randkv_caches)
        )
        self.randkv_forget_tail_blocks(plan.directives)
        for row, (req_id, directive) in enumerate(zip(req_ids, directives, strict=True)):
            slot_map = self.randkv_slot_maps.get(req_id)
            if slot_map is not None:  # debug aid: reads the plan back to the host
                slot_map.apply_round(round_plan.evicted[row], round_plan.row_sources(row))
            self._randkv_record(req_id).rounds = directive.round_index + 1
            logger.debug("RandKV round %d for %s", directive.round_index, req_id)
        rounds = self.randkv_metrics.totals["rounds"]
        if rounds % 1000 < len(req_ids):
            logger.info("RandKV: %d rounds", rounds)

    def _randkv_record(self, req_id: str) -> RequestRecord:
        record = self.randkv_records.get(req_id)
        if record is None:
            record = self.randkv_records[req_id] = RequestRecord()
            while len(self.randkv_records) > _FINISHED_STATS_KEPT:
                self.randkv_records.popitem(last=False)
        return record

    def _randkv_observe(self, scheduler_output: Any) -> None:
        """Per-request lengths (host ints only), and (when tracking) slot -> position maps."""
        starts = {r.req_id: r.num_computed_tokens for r in scheduler_output.scheduled_new_reqs}
        cached = scheduler_output.scheduled_cached_reqs
        starts.update(zip(cached.req_ids, cached.num_computed_tokens, strict=True))
        for req_id, count in scheduler_output.num_scheduled_tokens.items():
            start = starts.get(req_id)
            if start is None:
                continue
            end = start + count
            record = self._randkv_record(req_id)
            if start == 0 and record.tokens_seen > 0:
                record.rounds = 0  # resumed after preemption: replays from the prompt
            record.tokens_seen = end
            record.physical_length = physical_lengths(self.randkv, end, self.randkv_budget(req_id))
            record.blocks_held = cdiv(record.physical_length, self.cache_config.block_size)
            if self.randkv_track:
                self._randkv_track(req_id, start, count)

    def _randkv_track(self, req_id: str, start: int, count: int) -> None:
        slot_map = self.randkv_slot_maps.get(req_id)
        if slot_map is None or slot_map.tokens_seen != start:
            config = self.randkv.with_budget(self.randkv_budget(req_id))
            slot_map = SlotPositionMap(
                config, len(self.randkv_caches), len(self.randkv_planner.kv_heads)
            )
            slot_map.append(start)  # prefix-cache hits arrive already computed
            self.randkv_slot_maps[req_id] = slot_map
            while len(self.randkv_slot_maps) > _TRACKED_MAPS_KEPT:
                self.randkv_slot_maps.popitem(last=False)
        slot_map.append(count)

    # ------------------------------------------------------------------ observability

    def randkv_stats(self) -> dict[str, Any]:
        self.randkv_timer.wait()
        self._randkv_harvest_timings()
        return {
            "counters": self.randkv_metrics.stats("counters"),
            "seconds": self.randkv_metrics.stats("seconds"),
            "scheduler": dict(self.randkv_scheduler_counters),
            "requests": {k: dataclasses.asdict(v) for k, v in self.randkv_records.items()},
            "kv_heads": list(self.randkv_planner.kv_heads),
            "layers": list(self.randkv_planner.layers),
            "counts_evictions": self.randkv_shard.counts_evictions,
        }

    def randkv_slot_positions(self, req_ids: list[str]) -> dict[str, Any]:
        """Slot -> position maps of the tracked requests among `req_ids`."""
        return {
            req_id: {
                "kv_heads": list(self.randkv_planner.kv_heads),
                "layers": list(self.randkv_planner.layers),
                "positions": [
                    [
                        list(slot_map.slot_positions(layer, h))
                        for h in range(slot_map.positions.shape[1])
                    ]
                    for layer in range(slot_map.positions.shape[0])
                ],
            }
            for req_id, slot_map in self.randkv_slot_maps.items()
            if req_id in req_ids
        }
