"""`randkv.vllm.LLM`: vLLM's offline engine with one extra option, `randkv=`."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import vllm

from randkv.spec.config import RandKVConfig
from randkv.vllm.entrypoints.engine_ids import EngineRequestIds
from randkv.vllm.metrics import RandKVStats, RankStats, RequestRecord, merge_ranks
from randkv.vllm.options import ADDITIONAL_CONFIG_KEY
from randkv.vllm.plugin import register
from randkv.vllm.sched.scheduler import COUNTERS_UTILITY


class LLM(vllm.LLM):
    """`vllm.LLM` plus `randkv=RandKVConfig(...) | True | dict | None`.

    Every other keyword goes to `vllm.LLM` unchanged.
    """

    def __init__(self, model: str, *, randkv: Any = None, **kwargs: Any) -> None:
        self.randkv_config: RandKVConfig | None = RandKVConfig.coerce(randkv)
        if self.randkv_config is not None:
            # The plugin's path (stock `vllm.LLM(additional_config={"randkv": ...})`): it
            # fills in RandKV's scheduler and worker when vLLM builds its configuration, and
            # takes the config parsed here as it is.
            register()
            kwargs["additional_config"] = {
                **(kwargs.get("additional_config") or {}),
                ADDITIONAL_CONFIG_KEY: self.randkv_config,
            }
        super().__init__(model=model, **kwargs)
        self._randkv_ids = EngineRequestIds()
        self._randkv_ids.follow(self.llm_engine)

    def randkv_stats(self) -> RandKVStats:
        """Engine-wide and per-request RandKV statistics, aggregated over worker ranks.

        Every rank applies every round to the KV heads and layers it holds, so:

        - `counters["rounds"]` (rounds fired, one per request per round) and
          `counters["tokens_evicted_per_head"]` (r per round) are per-request events,
          counted once; every rank must report the same value (RuntimeError otherwise:
          a rank missed a round).
        - `counters["kv_entries_evicted"]`: (layer, global KV head, token) entries evicted,
          summed over ranks; a KV head that vLLM replicates on several ranks (fewer KV heads
          than tensor-parallel ranks) is counted on one of them. It equals
          rounds x r x layers x the model's KV heads, whatever the parallel layout.
        - `counters["bytes_moved"]` and `seconds`: physical work summed over ranks
          (replicas included), so seconds are worker-seconds, not wall time.
        - `scheduler`: the scheduler's counters, read from the scheduler itself (vLLM's
          engine-core utility channel). `requests`: per-request records, which every rank
          keeps identically (rank 0's). A request this LLM no longer tracks (returned or
          aborted) is `finished`, although the workers hear of it only with the next step.
        - `ranks` is the number of workers, `per_rank` their own counters, seconds, and
          the global `layers` and `kv_heads` each holds.

        Per-request entries are keyed by vLLM's internal request id (the engine's id,
        which vLLM derives from the caller's); `randkv_request_stats` looks one up by the
        caller's id.
        """
        if self.randkv_config is None:
            raise RuntimeError("RandKV is off for this LLM")
        per_rank = [RankStats.from_wire(rank) for rank in self.collective_rpc("randkv_stats")]
        # Read after the workers answered: a request the front end no longer tracks has ended.
        live = self.llm_engine.output_processor.request_states
        requests = {
            req_id: replace(record, finished=record.finished or req_id not in live)
            for req_id, record in per_rank[0].requests.items()
        }
        return RandKVStats(
            counters=merge_ranks(per_rank, "counters"),
            seconds=merge_ranks(per_rank, "seconds"),
            scheduler=self._randkv_scheduler_counters(),
            requests=requests,
            per_rank=[replace(rank, requests={}) for rank in per_rank],
        )

    def _randkv_scheduler_counters(self) -> dict[str, float]:
        """The engine core's scheduler counters, through vLLM's utility channel (in this
        process when the engine core runs here)."""
        client = self.llm_engine.engine_core
        call_utility = getattr(client, "call_utility", None)
        if call_utility is not None:  # the engine core runs in its own process
            return dict(call_utility(COUNTERS_UTILITY))
        in_process = getattr(client, "engine_core")  # noqa: B009 - InprocClient's EngineCore
        return dict(getattr(in_process, COUNTERS_UTILITY)())

    def randkv_request_stats(self, request_id: str, sample: int | None = None) -> RequestRecord:
        """Stats of the request whose RequestOutput.request_id is `request_id` (and, for
        n > 1, of its `sample`-th sample)."""
        internal = self._randkv_ids.engine_id(request_id, sample)
        record = self.randkv_stats().requests.get(internal)
        if record is None:
            hint = "" if sample is not None else " (a request with n > 1: pass sample=i)"
            raise KeyError(f"no RandKV record for request {request_id!r}{hint}")
        return record

    def randkv_slot_positions(
        self, request_id: str, sample: int | None = None
    ) -> list[list[list[int]]]:
        """Slot -> absolute position per [global layer][global KV head] of a request.

        Each rank reports the (layer, head) pairs it holds; ranks holding a replica of the
        same KV head must agree. Needs RANDKV_TRACK_POSITIONS=1 in the engine's environment.
        """
        merged: dict[tuple[int, int], list[int]] = {}
        internal = self._randkv_ids.engine_id(request_id, sample)
        for rank in self.collective_rpc("randkv_slot_positions", args=([internal],)):
            for entry in rank.values():
                layers = entry.get("layers") or range(len(entry["positions"]))
                for layer, per_head in zip(layers, entry["positions"], strict=True):
                    for head, positions in zip(entry["kv_heads"], per_head, strict=True):
                        known = merged.setdefault((layer, head), positions)
                        if known != positions:
                            raise RuntimeError(
                                f"RandKV replicas of layer {layer}, KV head {head} disagree"
                            )
        if not merged:
            raise KeyError(f"no tracked positions for request {request_id!r}")
        layers = sorted({layer for layer, _ in merged})
        heads = sorted({head for _, head in merged})
        return [[merged[layer, head] for head in heads] for layer in layers]
