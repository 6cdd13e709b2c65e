"""`randkv.vllm.LLM`: vLLM's offline engine with one extra option, `randkv=`."""

from __future__ import annotations

from typing import Any

import vllm

from randkv.config import RandKVConfig
from randkv.vllm.engine_args import randkv_engine_kwargs


class LLM(vllm.LLM):
    """`vllm.LLM` plus `randkv=RandKVConfig(...) | True | dict | None`.

    Every other keyword goes to `vllm.LLM` unchanged.
    """

    def __init__(self, model: str, *, randkv: Any = None, **kwargs: Any) -> None:
        self.randkv_config: RandKVConfig | None = RandKVConfig.coerce(randkv)
        super().__init__(model=model, **randkv_engine_kwargs(self.randkv_config, kwargs))

    def randkv_stats(self) -> dict[str, Any]:
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
        - `scheduler` and `requests` come from rank 0 (the scheduler's counters, and
          per-request records every rank keeps identically).
        - `ranks` is the number of workers, `per_rank` their own counters, seconds, and
          the global `layers` and `kv_heads` each holds.

        Per-request entries are keyed by vLLM's internal request id, which is the
        caller's id (RequestOutput.request_id) plus a random suffix.
        """
        if self.randkv_config is None:
            raise RuntimeError("RandKV is off for this LLM")
        per_rank = self.collective_rpc("randkv_stats")
        once = ("rounds", "tokens_evicted_per_head")
        counters: dict[str, float] = {}
        seconds: dict[str, float] = {}
        for rank in per_rank:
            for key, value in rank["counters"].items():
                if key not in once:
                    counters[key] = counters.get(key, 0) + value
            for key, value in rank["seconds"].items():
                seconds[key] = seconds.get(key, 0.0) + value
        first = per_rank[0]
        for key in once:
            values = {rank["counters"][key] for rank in per_rank}
            if len(values) != 1:
                raise RuntimeError(f"RandKV ranks disagree on {key}: {sorted(values)}")
            counters[key] = first["counters"][key]
        return {
            "counters": counters,
            "seconds": seconds,
            "scheduler": first["scheduler"],
            "requests": first["requests"],
            "ranks": len(per_rank),
            "per_rank": [
                {
                    "layers": rank.get("layers"),
                    "kv_heads": rank["kv_heads"],
                    "counters": rank["counters"],
                    "seconds": rank["seconds"],
                }
                for rank in per_rank
            ],
        }

    def randkv_request_stats(self, request_id: str) -> dict[str, Any]:
        """Stats of the request whose RequestOutput.request_id is `request_id`."""
        matches = {
            rid: rec
            for rid, rec in self.randkv_stats()["requests"].items()
            if rid.rsplit("-", 1)[0] == request_id
        }
        if len(matches) != 1:
            raise KeyError(f"no unique RandKV record for request {request_id!r}")
        return next(iter(matches.values()))

    def randkv_slot_positions(self, request_id: str) -> list[list[list[int]]]:
        """Slot -> absolute position per [global layer][global KV head] of a request.

        Each rank reports the (layer, head) pairs it holds; ranks holding a replica of the
        same KV head must agree. Needs RANDKV_TRACK_POSITIONS=1 in the engine's environment.
        """
        merged: dict[tuple[int, int], list[int]] = {}
        for rank in self.collective_rpc("randkv_slot_positions", args=(f"{request_id}-",)):
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
