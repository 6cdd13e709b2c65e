"""RandKV's Prometheus series, served on vLLM's own /metrics endpoint.

The scheduler (once per engine) counts rounds, evicted tokens and freed blocks and sets the
blocks-held gauge; every worker (once per tensor-parallel rank) counts the KV entries it
evicted and the seconds it spent planning and compacting. Under `randkv serve` all
processes write to prometheus_client's multiprocess directory, whose collector sums a
counter over processes, so TP ranks add up with nothing counted twice.

Series (all labelled model_name and engine, like vLLM's own):

| series | meaning |
|---|---|
| `randkv:rounds_total` | eviction rounds fired (one per request per round) |
| `randkv:tokens_evicted_total` | tokens evicted per KV head (r per round) |
| `randkv:kv_entries_evicted_total` | (layer, KV head, token) entries evicted, all ranks |
| `randkv:blocks_freed_total` | KV blocks returned to the pool by rounds |
| `randkv:kv_blocks_held` | KV blocks held by RandKV requests now |
| `randkv:rejected_prompts_total` | requests refused because the prompt exceeds K |
| `randkv:preemptions_total` | preemptions of RandKV requests (each replays its rounds) |
| `randkv:planning_seconds_total` | worker seconds spent planning rounds, all ranks |
| `randkv:compaction_seconds_total` | worker seconds spent moving KV, all ranks |
| `randkv:step_seconds_total` | worker seconds in execute_model, all ranks (for the share) |
"""

from __future__ import annotations

from functools import cache
from typing import Any

from prometheus_client import Counter, Gauge

LABELS = ("model_name", "engine")

_COUNTERS = {
    "rounds": "RandKV eviction rounds fired (one per request per round).",
    "tokens_evicted": "Tokens evicted per KV head (r per round).",
    "kv_entries_evicted": "KV entries (layer, KV head, token) evicted, summed over ranks.",
    "blocks_freed": "KV cache blocks returned to the pool by RandKV rounds.",
    "rejected_prompts": "Requests refused because the prompt exceeds the RandKV budget K.",
    "preemptions": "Preemptions of RandKV requests (each replays its rounds on resume).",
    "planning_seconds": "Worker seconds spent planning RandKV rounds, summed over ranks.",
    "compaction_seconds": "Worker seconds spent compacting KV, summed over ranks.",
    "step_seconds": "Worker seconds spent in execute_model, summed over ranks.",
}


@cache
def _collectors() -> dict[str, Any]:
    """Created once per process: prometheus_client refuses duplicate names."""
    out: dict[str, Any] = {
        name: Counter(f"randkv:{name}", doc, LABELS) for name, doc in _COUNTERS.items()
    }
    out["kv_blocks_held"] = Gauge(
        "randkv:kv_blocks_held",
        "KV cache blocks held by RandKV requests.",
        LABELS,
        multiprocess_mode="livesum",
    )
    return out


def engine_labels(vllm_config: Any) -> tuple[str, str]:
    model = vllm_config.model_config
    name = model.served_model_name
    if isinstance(name, list | tuple):
        name = name[0]
    engine = getattr(vllm_config.parallel_config, "data_parallel_index", 0) or 0
    return str(name or model.model), str(engine)


class RandKVMetrics:
    """The series of one engine, bound to its labels."""

    def __init__(self, vllm_config: Any) -> None:
        labels = engine_labels(vllm_config)
        self._series = {name: c.labels(*labels) for name, c in _collectors().items()}

    def add(self, name: str, amount: float) -> None:
        if amount:
            self._series[name].inc(amount)

    def set_blocks_held(self, blocks: int) -> None:
        self._series["kv_blocks_held"].set(blocks)
