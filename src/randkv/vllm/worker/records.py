"""Per-request records a worker keeps: rounds, lengths and blocks (`randkv_stats()`), and,
with RANDKV_TRACK_POSITIONS=1, each request's slot -> position map (tests and debugging)."""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from randkv.kernels.slotmap import SlotPositionMap
from randkv.spec.cadence import physical_lengths
from randkv.spec.config import RandKVConfig
from randkv.spec.rounds import RoundPlan
from randkv.vllm.metrics import RequestRecord
from randkv.vllm.sched.allocation import blocks_for
from randkv.vllm.sched.output import RoundDirective
from randkv.vllm.worker.lengths import StepBudgets

if TYPE_CHECKING:
    from vllm.v1.core.sched.output import SchedulerOutput

TRACK_POSITIONS_ENV = "RANDKV_TRACK_POSITIONS"
_FINISHED_STATS_KEPT = 4096
_TRACKED_MAPS_KEPT = 256  # test/debug aid: finished requests' maps stay readable


class RequestRecords:
    """The records of the requests a worker has seen (the newest 4096 kept), and the slot
    maps of the newest 256 when tracking is on."""

    def __init__(self, config: RandKVConfig, num_layers: int, num_kv_heads: int) -> None:
        self.config = config
        self.num_layers = num_layers
        self.num_kv_heads = num_kv_heads
        self.tracking = os.environ.get(TRACK_POSITIONS_ENV, "0") == "1"
        self.records: OrderedDict[str, RequestRecord] = OrderedDict()
        self.slot_maps: OrderedDict[str, SlotPositionMap] = OrderedDict()

    def record(self, req_id: str) -> RequestRecord:
        record = self.records.get(req_id)
        if record is None:
            record = self.records[req_id] = RequestRecord()
            while len(self.records) > _FINISHED_STATS_KEPT:
                self.records.popitem(last=False)
        return record

    def finish(self, req_ids: Iterable[str]) -> None:
        for req_id in req_ids:
            record = self.records.get(req_id)
            if record is not None:
                record.finished = True

    def after_rounds(self, directives: Mapping[str, RoundDirective], plan: RoundPlan) -> None:
        """The rounds of this step were applied (`plan`'s rows in `directives`' order)."""
        for row, (req_id, directive) in enumerate(directives.items()):
            slot_map = self.slot_maps.get(req_id)
            if slot_map is not None:  # debug aid: reads the plan back to the host
                slot_map.apply_round(plan.evicted[row], plan.row_sources(row))
            self.record(req_id).rounds = directive.round_index + 1

    def roll_back_rejected(self, scheduler_output: SchedulerOutput) -> None:
        """Before this step's rounds: a tracked request that starts before the tokens its
        map holds, but not before its last round, had drafts rejected (speculative
        decoding; under async scheduling, in the step before); its map drops them. A start
        before the last round is a replay after preemption (a start is at most the prompt
        then), for which `observe` starts a new map."""
        if not self.tracking:
            return
        for req_id, start in _starts(scheduler_output).items():
            slot_map = self.slot_maps.get(req_id)
            if slot_map is not None and 0 < start < slot_map.tokens_seen:
                slot_map.roll_back(start)  # False (a replay): `observe` starts over

    def observe(
        self, scheduler_output: SchedulerOutput, budgets: StepBudgets, block_size: int
    ) -> None:
        """This step's per-request lengths (host ints only; a speculative step's drafts
        count until the next step says how many were accepted), and (when tracking) slot
        maps."""
        starts = _starts(scheduler_output)
        for req_id, count in scheduler_output.num_scheduled_tokens.items():
            start = starts.get(req_id)
            if start is None:
                continue
            end = start + count
            record = self.record(req_id)
            if start == 0 and record.tokens_seen > 0:
                record.rounds = 0  # resumed after preemption: replays from the prompt
            record.tokens_seen = end
            record.physical_length = physical_lengths(self.config, end, budgets.of(req_id))
            record.blocks_held = blocks_for(record.physical_length, block_size)
            if self.tracking:
                self._track(req_id, start, count, budgets.of(req_id))

    def _track(self, req_id: str, start: int, count: int, budget: int) -> None:
        slot_map = self.slot_maps.get(req_id)
        if slot_map is None or slot_map.tokens_seen != start:
            config = self.config.with_budget(budget)
            slot_map = SlotPositionMap(config, self.num_layers, self.num_kv_heads)
            slot_map.append(start)  # prefix-cache hits arrive already computed
            self.slot_maps[req_id] = slot_map
            while len(self.slot_maps) > _TRACKED_MAPS_KEPT:
                self.slot_maps.popitem(last=False)
        slot_map.append(count)

    def slot_positions(
        self, req_ids: Iterable[str], layers: list[int], kv_heads: list[int]
    ) -> dict[str, Any]:
        """Slot -> position maps of the tracked requests among `req_ids` (plain lists: they
        cross vLLM's RPC)."""
        wanted = set(req_ids)
        return {
            req_id: {
                "kv_heads": kv_heads,
                "layers": layers,
                "positions": [
                    [
                        list(slot_map.slot_positions(layer, h))
                        for h in range(slot_map.positions.shape[1])
                    ]
                    for layer in range(slot_map.positions.shape[0])
                ],
            }
            for req_id, slot_map in self.slot_maps.items()
            if req_id in wanted
        }


def _starts(scheduler_output: SchedulerOutput) -> dict[str, int]:
    """Each scheduled request's tokens computed before this step."""
    starts = {r.req_id: r.num_computed_tokens for r in scheduler_output.scheduled_new_reqs}
    cached = scheduler_output.scheduled_cached_reqs
    starts.update(zip(cached.req_ids, cached.num_computed_tokens, strict=True))
    return starts
