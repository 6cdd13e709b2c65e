"""RandKV's metrics: one table from which the Prometheus series, `LLM.randkv_stats()` and the
README's table all come.

Each metric is recorded once, through `RandKVRecorder.add`, which keeps the process's own
running totals (read by `randkv_stats()` over vLLM's RPC) and increments the Prometheus series
(served on vLLM's /metrics when every process writes to one prometheus_client multiprocess
directory, whose collector sums a counter over processes).

Across tensor-parallel ranks a metric is either counted `ONCE` (a per-request event every rank
sees, such as a round: only rank 0 writes its series, and `randkv_stats()` checks that every
rank agrees) or `SUMMED` (physical work each rank does on its own KV heads: every rank writes).
The scheduler exists once per engine, so its metrics are `ONCE` by construction.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any

LABELS = ("model_name", "engine")
PREFIX = "randkv:"


class Ranks(enum.Enum):
    ONCE = "once"
    SUMMED = "summed"


class Source(enum.Enum):
    SCHEDULER = "scheduler"  # the engine core's scheduler (and the server's front door)
    WORKER = "worker"  # every tensor-parallel worker


@dataclass(frozen=True)
class Metric:
    """One RandKV metric.

    name: the Prometheus series is `randkv:<name>_total` (counters) or `randkv:<name>`
        (gauges); `stats_group` / `stats_key` place it in `LLM.randkv_stats()`.
    """

    name: str
    kind: str  # "counter" or "gauge"
    source: Source
    ranks: Ranks
    help: str
    stats_group: str | None = None  # "counters", "seconds" or "scheduler"; None: not in stats
    stats_key: str | None = None  # defaults to name

    @property
    def series(self) -> str:
        return PREFIX + self.name + ("_total" if self.kind == "counter" else "")

    @property
    def key(self) -> str:
        return self.stats_key or self.name


_W, _S = Source.WORKER, Source.SCHEDULER
_ONCE, _SUM = Ranks.ONCE, Ranks.SUMMED

METRICS: tuple[Metric, ...] = (
    Metric("rounds", "counter", _W, _ONCE,
           "eviction rounds (one per request per round)", "counters"),
    Metric("tokens_evicted", "counter", _W, _ONCE,
           "tokens evicted per KV head (r per round)", "counters", "tokens_evicted_per_head"),
    Metric("kv_entries_evicted", "counter", _W, _SUM,
           "(layer, KV head, token) entries evicted, all ranks (a replicated head once)",
           "counters"),
    Metric("kv_bytes_moved", "counter", _W, _SUM,
           "bytes of keys and values written by compaction, all ranks", "counters",
           "bytes_moved"),
    Metric("planning_seconds", "counter", _W, _SUM,
           "worker seconds spent planning rounds, all ranks", "seconds", "planning"),
    Metric("compaction_seconds", "counter", _W, _SUM,
           "worker seconds spent moving KV, all ranks", "seconds", "compaction"),
    Metric("step_seconds", "counter", _W, _SUM,
           "worker seconds in execute_model, all ranks (the denominator of the share)",
           "seconds", "step"),
    Metric("blocks_freed", "counter", _S, _ONCE,
           "KV blocks returned to the pool by rounds", "scheduler"),
    Metric("kv_blocks_held", "gauge", _S, _ONCE,
           "KV blocks held by RandKV requests now (full-attention layers)"),
    Metric("kv_window_blocks_held", "gauge", _S, _ONCE,
           "KV blocks held now in vLLM's sliding-window groups (mixed models; else 0)"),
    Metric("kv_state_blocks_held", "gauge", _S, _ONCE,
           "blocks held now in vLLM's state groups (Mamba2 / Gated DeltaNet layers of hybrid "
           "models; else 0)"),
    Metric("rejected_prompts", "counter", _S, _ONCE,
           "requests refused because the prompt exceeds K", "scheduler"),
    Metric("long_prompts", "counter", _S, _ONCE,
           "requests served with a prompt longer than K (min_generated)", "scheduler"),
    Metric("preemptions", "counter", _S, _ONCE,
           "preemptions of RandKV requests (each replays its rounds)", "scheduler"),
    Metric("draft_steps_shortened", "counter", _S, _ONCE,
           "speculative steps whose drafts were cut so the step ends at a round", "scheduler"),
    Metric("draft_tokens_dropped", "counter", _S, _ONCE,
           "draft tokens dropped so a speculative step ends at a round", "scheduler"),
    Metric("round_waits", "counter", _S, _ONCE,
           "steps a request waited for its drafts' verification before a round (async)",
           "scheduler"),
)  # fmt: skip

BY_NAME = {metric.name: metric for metric in METRICS}


def markdown_table() -> str:
    """The README's table of series, generated from `METRICS` (a test keeps them equal)."""
    lines = ["| series | meaning |", "|---|---|"]
    lines += [f"| `{m.series}` | {m.help} |" for m in METRICS]
    return "\n".join(lines)


@cache
def _collectors() -> dict[str, Any]:
    """Created once per process: prometheus_client refuses duplicate names."""
    from prometheus_client import Counter, Gauge

    out: dict[str, Any] = {}
    for metric in METRICS:
        if metric.kind == "counter":
            # prometheus_client appends `_total` to a counter's name itself.
            out[metric.name] = Counter(PREFIX + metric.name, metric.help, LABELS)
        else:
            out[metric.name] = Gauge(
                metric.series, metric.help, LABELS, multiprocess_mode="livesum"
            )
    return out


def engine_labels(vllm_config: Any) -> tuple[str, str]:
    model = vllm_config.model_config
    name = model.served_model_name
    if isinstance(name, list | tuple):
        name = name[0]
    engine = getattr(vllm_config.parallel_config, "data_parallel_index", 0) or 0
    return str(name or model.model), str(engine)


class RandKVRecorder:
    """One process's RandKV metrics: running totals plus its Prometheus series.

    publishes_once: whether this process writes the series of `ONCE` metrics (the scheduler,
    and tensor-parallel rank 0 among the workers), so they are counted once engine-wide.
    """

    def __init__(self, vllm_config: Any, source: Source, *, publishes_once: bool) -> None:
        labels = engine_labels(vllm_config)
        self.source = source
        self.totals: dict[str, float] = {
            m.name: 0 for m in METRICS if m.source is source and m.kind == "counter"
        }
        self._series = {
            m.name: _collectors()[m.name].labels(*labels)
            for m in METRICS
            if m.source is source and (publishes_once or m.ranks is Ranks.SUMMED)
        }

    def add(self, name: str, amount: float) -> None:
        self.totals[name] += amount
        series = self._series.get(name)
        if series is not None and amount:
            series.inc(amount)

    def set(self, name: str, value: float) -> None:
        """Set a gauge (not kept in the totals: it is a level, not an event count)."""
        series = self._series.get(name)
        if series is not None:
            series.set(value)

    def stats(self, group: str) -> dict[str, float]:
        """This process's totals of one `randkv_stats()` group, under their stats keys."""
        return {
            m.key: self.totals[m.name]
            for m in METRICS
            if m.source is self.source and m.stats_group == group
        }


def merge_ranks(per_rank: Iterable[RankStats], group: str) -> dict[str, float]:
    """Merge the workers' `group` totals: `SUMMED` metrics add up, `ONCE` metrics must agree."""
    ranks = list(per_rank)
    merged: dict[str, float] = {}
    for metric in METRICS:
        if metric.source is not Source.WORKER or metric.stats_group != group:
            continue
        values = [getattr(rank, group)[metric.key] for rank in ranks]
        if metric.ranks is Ranks.SUMMED:
            merged[metric.key] = sum(values)
        elif len(set(values)) != 1:
            raise RuntimeError(f"RandKV ranks disagree on {metric.key}: {sorted(set(values))}")
        else:
            merged[metric.key] = values[0]
    return merged


# --------------------------------------------------------------------------- randkv_stats()


@dataclass
class RequestRecord:
    """What a worker knows of one request: rounds applied, tokens seen, the physical length
    and blocks that leaves it, and whether it has finished."""

    rounds: int = 0
    tokens_seen: int = 0
    physical_length: int = 0
    blocks_held: int = 0
    finished: bool = False


@dataclass(frozen=True)
class RankStats:
    """One worker's statistics. Crosses vLLM's RPC as a plain dict (`to_wire`, `from_wire`):
    vLLM encodes RPC results with msgpack, which turns dataclasses into dicts anyway.

    layers, kv_heads: the global layer indices and KV heads this rank holds.
    counts_evictions: whether this rank counts its KV heads' evictions (a head replicated on
    several tensor-parallel ranks counts on one)."""

    counters: dict[str, float]
    seconds: dict[str, float]
    layers: list[int]
    kv_heads: list[int]
    counts_evictions: bool
    requests: dict[str, RequestRecord] = field(default_factory=dict)

    def to_wire(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any] | RankStats) -> RankStats:
        if isinstance(wire, RankStats):
            return wire
        values = dict(wire)
        values["requests"] = {k: RequestRecord(**v) for k, v in values["requests"].items()}
        return cls(**values)


@dataclass(frozen=True)
class RandKVStats:
    """`LLM.randkv_stats()`: engine-wide and per-request RandKV statistics (see there).

    counters, seconds: the workers' metrics merged over ranks (`merge_ranks`).
    scheduler: the scheduler's counters (rejected prompts, long prompts, preemptions,
        blocks freed), read from the scheduler itself.
    requests: per-request records by the engine's request id (rank 0's; every rank keeps
        the same).
    per_rank: each worker's own statistics (without the per-request records)."""

    counters: dict[str, float]
    seconds: dict[str, float]
    scheduler: dict[str, float]
    requests: dict[str, RequestRecord]
    per_rank: list[RankStats]

    @property
    def ranks(self) -> int:
        """The number of workers."""
        return len(self.per_rank)
