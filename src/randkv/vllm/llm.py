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
        """Engine-wide and per-request RandKV statistics, summed over tensor-parallel ranks.

        Per-request entries are keyed by vLLM's internal request id, which is the
        caller's id (RequestOutput.request_id) plus a random suffix.
        """
        if self.randkv_config is None:
            raise RuntimeError("RandKV is off for this LLM")
        per_rank = self.collective_rpc("randkv_stats")
        counters: dict[str, float] = {}
        seconds: dict[str, float] = {}
        for rank in per_rank:
            for key, value in rank["counters"].items():
                counters[key] = counters.get(key, 0) + value
            for key, value in rank["seconds"].items():
                seconds[key] = seconds.get(key, 0.0) + value
        # Rounds and evictions happen once per request, on every rank: report one rank's.
        first = per_rank[0]
        counters["rounds"] = first["counters"]["rounds"]
        counters["tokens_evicted_per_head"] = first["counters"]["tokens_evicted_per_head"]
        return {
            "counters": counters,
            "seconds": seconds,
            "scheduler": first["scheduler"],
            "requests": first["requests"],
            "ranks": len(per_rank),
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
        """Slot -> absolute position per [layer][global KV head] of a live request.

        Needs RANDKV_TRACK_POSITIONS=1 in the engine's environment.
        """
        merged: dict[int, list[list[int]]] = {}
        for rank in self.collective_rpc("randkv_slot_positions", args=(f"{request_id}-",)):
            for entry in rank.values():
                for h, head in enumerate(entry["kv_heads"]):
                    merged[head] = [layer[h] for layer in entry["positions"]]
        if not merged:
            raise KeyError(f"no tracked positions for request {request_id!r}")
        heads = sorted(merged)
        layers = len(merged[heads[0]])
        return [[merged[h][layer] for h in heads] for layer in range(layers)]
