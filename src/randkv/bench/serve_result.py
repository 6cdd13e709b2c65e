"""The result of `randkv bench serve`, typed: what `result.json` holds, as frozen dataclasses.

`randkv.bench.records` writes them as JSON (`to_json`), reads them back with type checks
(`from_json`) and derives the JSON Schema from them (`randkv.bench.serve_schema.SCHEMA`).

Bump SCHEMA_VERSION (and the `schema_version` literal of `ServeResult`) on any change a
reader would notice (renamed or removed field, changed meaning or unit); adding a field with
a default (older files lack it) does not need a bump.

Version 2 (`--repeats`): `repeats`, `order` (the arms in execution order, ABBA), `runs`
(every run of each arm, by repeat), `summary` (median, min, max and the values over the
repeats of each arm and of the per-repeat ratio RandKV / plain, for output tokens/s, TTFT
p50 and inter-token latency p50) and `representative_repeat`. `arms` and `ratios` keep their
version-1 shape and describe the representative repeat (the one whose throughput ratio is
nearest the median); `targets` is judged on the medians over repeats.

Optional `reference` (`--ample-pool-blocks`): the third arm, plain vLLM with ample memory,
one run per repeat (`order` names it "ample"): its pool, runs, the run of the representative
repeat (`arm`), its spread over the repeats (`summary`), each iso-memory arm's throughput over
its own in the same repeat (`share_of_throughput`), and whether it ever preempted.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Final, Generic, Literal, TypeVar

from randkv.bench.records import OMITTED_WHEN_NONE, Count, NonNegative, Schema, Share
from randkv.bench.timing import Machine
from randkv.bench.workload import WorkloadSpec
from randkv.spec.config import RandKVConfig

SCHEMA_NAME: Final = "randkv.bench.serve"
SCHEMA_VERSION: Final = 2

#: The arms: plain vLLM and vLLM + RandKV at the same pool, and plain vLLM with ample memory.
ArmName = Literal["plain", "randkv", "ample"]
#: How vLLM scheduled an arm, as its scheduler reported it.
Scheduling = Literal["async", "sync"]

Item = TypeVar("Item")


@dataclass(frozen=True, kw_only=True)
class Percentiles:
    """Mean and percentiles of one latency over the completed requests, in seconds."""

    mean: NonNegative
    p50: NonNegative
    p90: NonNegative
    p99: NonNegative


@dataclass(frozen=True, kw_only=True)
class Eviction:
    """RandKV's work during an arm's run, from the server's counters."""

    rounds: Count
    planning_s: NonNegative
    compaction_s: NonNegative
    step_s: NonNegative
    share_of_step_time: Share  # (planning + compaction) / step


@dataclass(frozen=True, kw_only=True)
class Speculation:
    """Speculative decoding during an arm's run (both arms run the same configuration),
    from the server's counters: vLLM's draft tokens and accepted ones, and RandKV's cuts
    at round boundaries (0 for plain vLLM)."""

    drafted: Count
    accepted: Count
    acceptance_rate: Share  # accepted / drafted (0 when nothing was drafted)
    steps_shortened: Count = 0  # speculative steps cut so they end at a round
    drafts_dropped: Count = 0  # draft tokens those cuts dropped
    round_waits: Count = 0  # steps a round waited for verification (async scheduling)


@dataclass(frozen=True, kw_only=True)
class RequestOutput:
    """What one request generated, as streamed (`keep_outputs`)."""

    index: int
    token_ids: list[Count]
    text: str


@dataclass(frozen=True, kw_only=True)
class Timeline:
    """The scheduler's per-step record during the run, seconds since its start."""

    t_s: list[float]
    running_requests: list[float]
    waiting_requests: list[float]
    kv_blocks: list[float]


@dataclass(frozen=True, kw_only=True)
class Arm:
    """One arm's run on a fresh server."""

    randkv: RandKVConfig | None  # None: plain vLLM
    requests_sent: Count
    requests_completed: Count
    requests_failed: Count
    output_tokens: Count
    duration_s: NonNegative
    output_tokens_per_s: NonNegative
    running_requests_mean: NonNegative
    running_requests_peak: NonNegative
    preemptions: Count
    kv_blocks_peak: Count
    kv_blocks_mean: NonNegative
    ttft_s: Percentiles
    # Over requests, each (last - first token time) / (tokens - 1).
    itl_s: Percentiles
    eviction: Eviction | None  # None: plain vLLM
    timeline: Timeline
    scheduling: Scheduling | None = None  # as vLLM ran the arm (older files lack it)
    # With --speculative-config: drafted, accepted and RandKV's cuts (older files lack it).
    speculation: Speculation | None = field(default=None, metadata=OMITTED_WHEN_NONE)
    # `keep_outputs`: what each request generated, in request order.
    outputs: list[RequestOutput] | None = field(default=None, metadata=OMITTED_WHEN_NONE)


@dataclass(frozen=True, kw_only=True)
class Run(Arm):
    """An arm's run in a session of repeats: which repeat, and its place in the order."""

    repeat: Count
    position: Count

    @classmethod
    def of(cls, arm: Arm, *, repeat: int, position: int) -> Run:
        measured = {spec.name: getattr(arm, spec.name) for spec in dataclasses.fields(Arm)}
        return cls(**measured, repeat=repeat, position=position)


@dataclass(frozen=True, kw_only=True)
class PerArm(Generic[Item]):
    """One value for each iso-memory arm."""

    plain: Item
    randkv: Item


@dataclass(frozen=True, kw_only=True)
class Spread:
    """Median and range of the known values (None where a ratio had no denominator); every
    value is kept, in repeat order."""

    median: float | None
    min: float | None
    max: float | None
    values: Annotated[list[float | None], Schema(minItems=1)]

    @classmethod
    def of(cls, values: Sequence[float | None]) -> Spread:
        known = [v for v in values if v is not None]
        if not known:
            return cls(median=None, min=None, max=None, values=list(values))
        return cls(
            median=statistics.median(known), min=min(known), max=max(known), values=list(values)
        )


# What the repeat summary reports, read from one arm's run.
def _output_tokens_per_s(arm: Arm) -> float:
    return arm.output_tokens_per_s


def _ttft_p50(arm: Arm) -> float:
    return arm.ttft_s.p50


def _itl_p50(arm: Arm) -> float:
    return arm.itl_s.p50


@dataclass(frozen=True, kw_only=True)
class SummaryGroup:
    """The spread over the repeats of each summarized metric."""

    output_tokens_per_s: Spread
    ttft_p50_s: Spread
    itl_p50_s: Spread

    @classmethod
    def of(cls, spread_of: Callable[[Callable[[Arm], float]], Spread]) -> SummaryGroup:
        """Each metric's spread; `spread_of(read)` spreads what `read` reads of a run."""
        return cls(
            output_tokens_per_s=spread_of(_output_tokens_per_s),
            ttft_p50_s=spread_of(_ttft_p50),
            itl_p50_s=spread_of(_itl_p50),
        )


#: Each summarized metric's reader, by its name in `SummaryGroup`.
SUMMARY_READERS: dict[str, Callable[[Arm], float]] = {
    "output_tokens_per_s": _output_tokens_per_s,
    "ttft_p50_s": _ttft_p50,
    "itl_p50_s": _itl_p50,
}


@dataclass(frozen=True, kw_only=True)
class RepeatSummary:
    """Each arm's spread over the repeats, and that of the per-repeat ratio RandKV / plain."""

    plain: SummaryGroup
    randkv: SummaryGroup
    ratio: SummaryGroup


@dataclass(frozen=True, kw_only=True)
class Reference:
    """The third arm, plain vLLM with ample memory, one run per repeat."""

    pool_blocks: Count
    runs: Annotated[list[Run], Schema(minItems=1)]
    arm: Run  # the run of the representative repeat
    summary: SummaryGroup
    # Each iso-memory arm's throughput over the ample arm's, in the same repeat.
    share_of_throughput: PerArm[Spread]
    preempted: bool


@dataclass(frozen=True, kw_only=True)
class Versions:
    randkv: str
    vllm: str
    torch: str


@dataclass(frozen=True, kw_only=True)
class Engine:
    """What both arms' engines share."""

    pool_blocks: Count
    block_size: Count
    max_num_seqs: Count
    max_model_len: Count
    dtype: str
    async_scheduling: bool | None = None  # as asked; None: vLLM's choice
    # vLLM's speculative config as JSON, both arms alike (None: no speculation).
    speculative_config: str | None = field(default=None, metadata=OMITTED_WHEN_NONE)


@dataclass(frozen=True, kw_only=True)
class Ratios:
    """RandKV / plain in the representative repeat (None: plain measured 0)."""

    output_tokens_per_s: float | None
    running_requests_mean: float | None
    kv_blocks_peak: float | None
    ttft_p50: float | None
    itl_p50: float | None


@dataclass(frozen=True, kw_only=True)
class Targets:
    min_throughput_ratio: float
    max_eviction_share: float
    plain_preempted: bool
    met: bool
    judged_on: str | None = field(default=None, metadata=OMITTED_WHEN_NONE)


@dataclass(frozen=True, kw_only=True)
class ServeResult:
    """`result.json` of `randkv bench serve`."""

    schema: Literal["randkv.bench.serve"]
    schema_version: Literal[2]
    created: str
    machine: Machine
    versions: Versions
    model: str
    engine: Engine
    workload: WorkloadSpec
    repeats: Annotated[int, Schema(minimum=1)]
    order: list[ArmName]
    runs: PerArm[Annotated[list[Run], Schema(minItems=1)]]
    summary: RepeatSummary
    representative_repeat: Count
    arms: PerArm[Run]  # the runs of the representative repeat
    ratios: Ratios
    targets: Targets
    reference: Reference | None = field(default=None, metadata=OMITTED_WHEN_NONE)
