"""`randkv bench serve`: the iso-memory serving benchmark.

Same model, same KV pool (a fixed number of blocks), same seeded request mix, same
max_num_seqs: plain vLLM and vLLM + RandKV are each served by `randkv serve` on loopback, in
one invocation, and driven over HTTP with streaming completions.

With `repeats` > 1 the two arms run alternately in ABBA order (plain, RandKV, RandKV, plain,
plain, ...), each run on a freshly started server, so slow drifts of the machine (other jobs,
caches, clocks) fall on both arms alike; the result reports the median and the range of
each arm and of the per-repeat ratio, and keeps every run.

With `ample_pool_blocks` a third arm runs in every repeat, after its pair: plain vLLM with a
pool large enough never to preempt, the memory plain vLLM would need for this load. It is the
ceiling, not a competitor: the result says what share of it each iso-memory arm reaches.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import importlib.metadata
import json
import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

import numpy as np

from randkv.bench.loadgen import Progress, RequestTrace, run_load
from randkv.bench.records import to_json
from randkv.bench.serve_result import (
    SCHEMA_NAME,
    SCHEMA_VERSION,
    SUMMARY_READERS,
    Arm,
    ArmName,
    Engine,
    Eviction,
    PerArm,
    Percentiles,
    Ratios,
    Reference,
    RepeatSummary,
    RequestOutput,
    Run,
    Scheduling,
    ServeResult,
    Speculation,
    Spread,
    SummaryGroup,
    Targets,
    Timeline,
    Versions,
)
from randkv.bench.serve_schema import validate
from randkv.bench.server import EngineArgs, Server, running_server
from randkv.bench.timing import machine_info
from randkv.bench.workload import BenchRequest, WorkloadSpec, build_requests
from randkv.spec.config import RandKVConfig
from randkv.vllm.sched.timeline import (
    TIMELINE_ENV,
    TimelineScheduler,
    read_timeline,
    timeline_scheduling,
)

TARGET_THROUGHPUT_RATIO = 2.0
TARGET_EVICTION_SHARE = 0.05
ARMS: tuple[ArmName, ArmName] = ("plain", "randkv")
#: The optional third arm: plain vLLM with ample memory (`ServeBench.ample_pool_blocks`).
AMPLE: ArmName = "ample"

#: A progress bar factory: tqdm's keywords in, a context manager out.
ProgressFactory = Callable[..., AbstractContextManager[Progress]]


class PlatformDefaults(TypedDict):
    dtype: str
    gpu_memory_utilization: float
    enforce_eager: bool


def platform_defaults(cuda: bool | None = None) -> PlatformDefaults:
    """dtype, memory share and eager mode for the machine (cuda=None: ask torch).

    CPU: float32, eager, 20% of host memory. CUDA: bfloat16 (FlashAttention and FlashInfer
    refuse float32), CUDA graphs and compilation on, 80% of GPU memory (the pool size is
    fixed by num_gpu_blocks_override; the share only bounds profiling and activations).
    """
    if cuda is None:
        import torch

        cuda = torch.cuda.is_available()
    if cuda:
        return {"dtype": "bfloat16", "gpu_memory_utilization": 0.8, "enforce_eager": False}
    return {"dtype": "float32", "gpu_memory_utilization": 0.2, "enforce_eager": True}


@dataclass(frozen=True)
class ServeBench:
    """Everything both arms share, plus RandKV's settings for the second arm."""

    model: str | None = None  # None: the tiny local checkpoint
    workload: WorkloadSpec = field(default_factory=WorkloadSpec)
    # 16 requests of at most K + 2r = 256 tokens fill the pool; plain vLLM fits about 3.
    randkv: RandKVConfig = field(default_factory=lambda: RandKVConfig(budget=128, buffer_size=64))
    pool_blocks: int = 130
    block_size: int = 32  # vLLM 0.32's CPU attention takes multiples of 32 only
    max_num_seqs: int = 16
    max_model_len: int | None = None  # None: the longest request of the workload
    # None: chosen for the platform by `platform_defaults` (a GPU figure taken with the CPU
    # settings would measure Triton attention without CUDA graphs).
    dtype: str | None = None
    gpu_memory_utilization: float | None = None  # CPU backend: the share of host memory
    enforce_eager: bool | None = None
    async_scheduling: bool | None = None  # None: vLLM's choice, the same for both arms
    # vLLM's speculative config as JSON (`--speculative-config`), passed to both arms.
    speculative_config: str | None = None
    results_dir: Path = Path("results/bench-serve")
    repeats: int = 1  # runs of each arm, in ABBA order
    # A third arm, plain vLLM with this many blocks (None: two arms only).
    ample_pool_blocks: int | None = None

    def __post_init__(self) -> None:
        if self.repeats < 1:
            raise ValueError(f"repeats must be at least 1, got {self.repeats}")
        if self.ample_pool_blocks is not None and self.ample_pool_blocks <= self.pool_blocks:
            raise ValueError(
                f"--ample-pool-blocks {self.ample_pool_blocks} is not more than --pool-blocks "
                f"{self.pool_blocks}; give plain vLLM the pool it needs never to preempt"
            )
        for name, value in platform_defaults().items():
            if getattr(self, name) is None:
                object.__setattr__(self, name, value)  # frozen: resolve once, here

    @property
    def resolved_dtype(self) -> str:
        """The dtype both arms run in (resolved for the platform at construction)."""
        if self.dtype is None:
            raise RuntimeError("ServeBench.dtype was not resolved")
        return self.dtype

    def model_len(self) -> int:
        """vLLM refuses a max_model_len whose one sequence does not fit in the pool."""
        if self.max_model_len is not None:
            return self.max_model_len
        return self.workload.prompt_tokens[1] + self.workload.output_tokens[1]

    def engine_args(self) -> EngineArgs:
        return {
            "dtype": self.dtype,
            "block_size": self.block_size,
            "num_gpu_blocks_override": self.pool_blocks,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "max_model_len": self.model_len(),
            "max_num_seqs": self.max_num_seqs,
            "enforce_eager": self.enforce_eager,
            "async_scheduling": self.async_scheduling,
            "speculative_config": self.speculative_config,
            "seed": 0,
        }

    def check(self, requests: list[BenchRequest]) -> None:
        longest_prompt = max(len(r.prompt_token_ids) for r in requests)
        if longest_prompt > self.randkv.budget:
            raise ValueError(
                f"a prompt of {longest_prompt} tokens exceeds the RandKV budget "
                f"K={self.randkv.budget}; lower --prompt-tokens or raise --budget"
            )
        longest = max(len(r.prompt_token_ids) + r.max_tokens for r in requests)
        if longest > self.model_len():
            raise ValueError(
                f"a request reaches {longest} tokens, over --max-model-len {self.model_len()}"
            )
        one_request = -(-self.model_len() // self.block_size)
        if one_request > self.pool_blocks - 1:
            raise ValueError(
                f"plain vLLM needs {one_request} blocks for one request of max_model_len "
                f"{self.model_len()} tokens, but the pool has {self.pool_blocks - 1} usable "
                "blocks; raise --pool-blocks or shorten --output-tokens"
            )


def _percentiles(values: list[float]) -> Percentiles:
    if not values:
        return Percentiles(mean=0.0, p50=0.0, p90=0.0, p99=0.0)
    data = np.asarray(values, dtype=np.float64)
    p50, p90, p99 = np.percentile(data, [50, 90, 99])
    return Percentiles(mean=float(data.mean()), p50=float(p50), p90=float(p90), p99=float(p99))


def _time_mean(t: list[float], values: list[float]) -> float:
    """Time-weighted mean of a sampled step function."""
    if len(t) < 2:
        return float(values[0]) if values else 0.0
    widths = np.diff(np.asarray(t))
    return float(np.sum(np.asarray(values[:-1]) * widths) / np.sum(widths))


def _wait_idle(server: Server, timeout: float = 60.0) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    while True:
        values = server.metrics()
        if values.get("vllm:num_requests_running", 0) == 0 or time.monotonic() > deadline:
            return values
        time.sleep(0.2)


def _timeline(
    rows: list[tuple[float, int, int, int]], start_unix: float, makespan: float
) -> Timeline:
    """The scheduler's per-step record during the run, in seconds since its start."""
    kept = [row for row in rows if start_unix <= row[0] <= start_unix + makespan]
    return Timeline(
        t_s=[row[0] - start_unix for row in kept],
        running_requests=[float(row[1]) for row in kept],
        waiting_requests=[float(row[2]) for row in kept],
        kv_blocks=[float(row[3]) for row in kept],
    )


def _speculation(delta: Callable[[str], float]) -> Speculation:
    drafted = int(delta("vllm:spec_decode_num_draft_tokens_total"))
    accepted = int(delta("vllm:spec_decode_num_accepted_tokens_total"))
    return Speculation(
        drafted=drafted,
        accepted=accepted,
        acceptance_rate=accepted / drafted if drafted else 0.0,
        steps_shortened=int(delta("randkv:draft_steps_shortened_total")),
        drafts_dropped=int(delta("randkv:draft_tokens_dropped_total")),
        round_waits=int(delta("randkv:round_waits_total")),
    )


def _summarize(
    randkv: RandKVConfig | None,
    traces: list[RequestTrace],
    timeline: Timeline,
    makespan: float,
    before: dict[str, float],
    after: dict[str, float],
    speculative: bool = False,
) -> Arm:
    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    done = [t for t in traces if t.error is None and t.finish_reason is not None]
    tokens = sum(t.output_tokens for t in done)
    eviction = None
    if randkv is not None:
        planning = delta("randkv:planning_seconds_total")
        compaction = delta("randkv:compaction_seconds_total")
        step = delta("randkv:step_seconds_total")
        eviction = Eviction(
            rounds=int(delta("randkv:rounds_total")),
            planning_s=planning,
            compaction_s=compaction,
            step_s=step,
            share_of_step_time=(planning + compaction) / step if step > 0 else 0.0,
        )
    return Arm(
        randkv=randkv,
        requests_sent=len(traces),
        requests_completed=len(done),
        requests_failed=len(traces) - len(done),
        output_tokens=tokens,
        duration_s=makespan,
        output_tokens_per_s=tokens / makespan if makespan > 0 else 0.0,
        running_requests_mean=_time_mean(timeline.t_s, timeline.running_requests),
        running_requests_peak=max(timeline.running_requests, default=0.0),
        preemptions=int(delta("vllm:num_preemptions_total")),
        kv_blocks_peak=int(max(timeline.kv_blocks, default=0)),
        kv_blocks_mean=_time_mean(timeline.t_s, timeline.kv_blocks),
        ttft_s=_percentiles([t.ttft for t in done if t.ttft is not None]),
        itl_s=_percentiles([t.itl for t in done if t.itl is not None]),
        eviction=eviction,
        timeline=timeline,
        speculation=_speculation(delta) if speculative else None,
    )


def _scheduling(reported: str | None) -> Scheduling | None:
    """The scheduling mode a timeline file reported."""
    if reported is None:
        return None
    if reported == "async":
        return "async"
    if reported == "sync":
        return "sync"
    raise ValueError(f"the scheduler reported an unknown scheduling mode {reported!r}")


def run_arm(
    bench: ServeBench,
    model: str,
    randkv: RandKVConfig | None,
    requests: list[BenchRequest],
    name: str,
    progress_factory: ProgressFactory,
    keep_outputs: bool = False,
) -> Arm:
    """One arm on a fresh server; with `keep_outputs`, its result also holds every request's
    streamed token ids and text (`outputs`, in request order)."""
    log = bench.results_dir / f"server-{name}.log"
    timeline_file = bench.results_dir / f"timeline-{name}.txt"
    timeline_file.unlink(missing_ok=True)
    engine_args = bench.engine_args()
    if randkv is None:
        engine_args["scheduler_cls"] = TimelineScheduler.__module__ + ".TimelineScheduler"
    env = {TIMELINE_ENV: str(timeline_file.resolve())}
    with running_server(model, randkv, engine_args, log, extra_env=env) as server:
        warmup = [dataclasses.replace(requests[0], index=-1, max_tokens=8)]
        asyncio.run(run_load(server.base_url, warmup, progress=_Null()))
        before = _wait_idle(server)
        with progress_factory(total=len(requests), desc=f"{name:>6}", unit="req") as progress:
            traces, start_unix, makespan = asyncio.run(
                run_load(server.base_url, requests, progress=progress)
            )
        after = _wait_idle(server)
    timeline = _timeline(read_timeline(timeline_file), start_unix, makespan)
    speculative = bench.speculative_config is not None
    summary = _summarize(randkv, traces, timeline, makespan, before, after, speculative)
    outputs = None
    if keep_outputs:
        outputs = [RequestOutput(index=t.index, token_ids=t.token_ids, text=t.text) for t in traces]
    # As vLLM ran it.
    scheduling = _scheduling(timeline_scheduling(timeline_file))
    return dataclasses.replace(summary, scheduling=scheduling, outputs=outputs)


class _Null:
    def update(self, n: int) -> None:
        pass


def _ratio(ours: float | None, plain: float | None) -> float | None:
    return ours / plain if ours is not None and plain else None


def abba_order(repeats: int, *, ample: bool = False) -> list[tuple[int, ArmName]]:
    """(repeat, arm) in execution order: A B, B A, A B, ... (A = plain, B = RandKV).

    Each repeat is one adjacent pair, and every second pair is reversed, so a drift over
    the session favours neither arm and neither always runs first. With `ample`, the
    ample-memory arm follows each pair.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    order: list[tuple[int, ArmName]] = []
    for repeat in range(repeats):
        pair: tuple[ArmName, ...] = ARMS if repeat % 2 == 0 else ARMS[::-1]
        arms = (*pair, AMPLE) if ample else pair
        order += [(repeat, arm) for arm in arms]
    return order


def spread(values: Sequence[float | None]) -> Spread:
    """Median and range (min, max) of the known values; every value is kept."""
    return Spread.of(values)


#: Every run of each arm, by repeat: `runs[arm][repeat]`.
Runs = Mapping[str, Sequence[Run]]


def summarize_repeats(runs: Runs) -> RepeatSummary:
    """Per metric: the spread of each arm over its repeats, and of the per-repeat ratio
    RandKV / plain (each repeat's pair, never the ratio of two medians)."""
    plain, ours = runs["plain"], runs["randkv"]
    if len(plain) != len(ours):
        raise ValueError("both arms need the same number of repeats")

    def ratio(read: Callable[[Arm], float]) -> Spread:
        return spread([_ratio(read(b), read(a)) for a, b in zip(plain, ours, strict=True)])

    return RepeatSummary(
        plain=SummaryGroup.of(lambda read: spread([read(run) for run in plain])),
        randkv=SummaryGroup.of(lambda read: spread([read(run) for run in ours])),
        ratio=SummaryGroup.of(ratio),
    )


def representative_repeat(summary: RepeatSummary) -> int:
    """The repeat whose throughput ratio is nearest the median ratio (the earliest on a tie):
    its runs fill `arms`, the table and the timeline plot."""
    ratio = summary.ratio.output_tokens_per_s
    median = ratio.median
    if median is None:
        return 0

    def distance(repeat: int) -> tuple[float, int]:
        value = ratio.values[repeat]
        if value is None:
            return (math.inf, repeat)
        # Rounded: with an even number of repeats the two middle ones tie exactly.
        return (round(abs(value - median), 9), repeat)

    return min(range(len(ratio.values)), key=distance)


def ample_reference(bench: ServeBench, runs: Runs, chosen: int) -> Reference:
    """The ample-memory arm's runs, its spread over the repeats, and what share of its
    throughput each iso-memory arm reached in the same repeat."""
    ample = list(runs[AMPLE])
    if len(ample) != len(runs["plain"]) or bench.ample_pool_blocks is None:
        raise ValueError("the ample arm needs one run per repeat and its pool")
    tokens = SUMMARY_READERS["output_tokens_per_s"]

    def share(arm: ArmName) -> Spread:
        pairs = zip(runs[arm], ample, strict=True)
        return spread([_ratio(tokens(mine), tokens(ref)) for mine, ref in pairs])

    return Reference(
        pool_blocks=bench.ample_pool_blocks,
        runs=ample,
        arm=ample[chosen],
        summary=SummaryGroup.of(lambda read: spread([read(run) for run in ample])),
        share_of_throughput=PerArm(plain=share("plain"), randkv=share("randkv")),
        preempted=any(run.preemptions > 0 for run in ample),
    )


def assemble(
    bench: ServeBench,
    model: str,
    runs: Runs,
    order: list[tuple[int, ArmName]] | None = None,
) -> ServeResult:
    """The result from every run of every arm (`runs[arm][repeat]`; the ample arm's, when
    there, go to `reference`)."""
    repeats = len(runs["plain"])
    order = order if order is not None else abba_order(repeats, ample=AMPLE in runs)
    summary = summarize_repeats(runs)
    chosen = representative_repeat(summary)
    plain, ours = runs["plain"][chosen], runs["randkv"][chosen]
    ratios = Ratios(
        output_tokens_per_s=_ratio(ours.output_tokens_per_s, plain.output_tokens_per_s),
        running_requests_mean=_ratio(ours.running_requests_mean, plain.running_requests_mean),
        kv_blocks_peak=_ratio(ours.kv_blocks_peak, plain.kv_blocks_peak),
        ttft_p50=_ratio(ours.ttft_s.p50, plain.ttft_s.p50),
        itl_p50=_ratio(ours.itl_s.p50, plain.itl_s.p50),
    )
    # Judged on the medians over repeats, so one lucky or unlucky pair decides nothing.
    share = statistics.median(
        run.eviction.share_of_step_time if run.eviction is not None else math.inf
        for run in runs["randkv"]
    )
    preempted = all(run.preemptions > 0 for run in runs["plain"])
    met = (
        preempted
        and (summary.ratio.output_tokens_per_s.median or 0) >= TARGET_THROUGHPUT_RATIO
        and share < TARGET_EVICTION_SHARE
        and all(run.requests_failed == 0 for run in runs["randkv"])
    )
    return ServeResult(
        schema=SCHEMA_NAME,
        schema_version=SCHEMA_VERSION,
        created=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        machine=machine_info(),
        versions=Versions(
            randkv=importlib.metadata.version("randkv"),
            vllm=_vllm_version(),
            torch=importlib.metadata.version("torch"),
        ),
        model=model,
        engine=Engine(
            pool_blocks=bench.pool_blocks,
            block_size=bench.block_size,
            max_num_seqs=bench.max_num_seqs,
            max_model_len=bench.model_len(),
            dtype=bench.resolved_dtype,
            async_scheduling=bench.async_scheduling,  # as asked; None: vLLM's choice
            speculative_config=bench.speculative_config,
        ),
        workload=bench.workload,
        repeats=repeats,
        order=[arm for _, arm in order],
        runs=PerArm(plain=list(runs["plain"]), randkv=list(runs["randkv"])),
        summary=summary,
        representative_repeat=chosen,
        arms=PerArm(plain=plain, randkv=ours),
        ratios=ratios,
        targets=Targets(
            min_throughput_ratio=TARGET_THROUGHPUT_RATIO,
            max_eviction_share=TARGET_EVICTION_SHARE,
            plain_preempted=preempted,
            met=bool(met),
            judged_on=f"medians over {repeats} repeat(s)",
        ),
        reference=ample_reference(bench, runs, chosen) if AMPLE in runs else None,
    )


def _vllm_version() -> str:
    import vllm

    return str(vllm.__version__)


def run(bench: ServeBench, *, progress: bool = True, keep_outputs: bool = False) -> ServeResult:
    """Both arms, `bench.repeats` times each in ABBA order, then JSON (`result.json`) and the
    timeline plot of the representative repeat (`timeline.png`). `keep_outputs`: every run
    also keeps what each request generated (see `run_arm`)."""
    from tqdm import tqdm
    from transformers import AutoTokenizer

    from randkv.bench.plots import plot_timeline

    model = bench.model
    if model is None:
        from randkv.models import build_tiny_checkpoint

        model = str(build_tiny_checkpoint())
    requests = build_requests(bench.workload, AutoTokenizer.from_pretrained(model))
    bench.check(requests)
    bench.results_dir.mkdir(parents=True, exist_ok=True)

    def progress_factory(**kwargs: object) -> AbstractContextManager[Progress]:
        bar: AbstractContextManager[Progress] = tqdm(disable=not progress, **kwargs)
        return bar

    configs: dict[ArmName, RandKVConfig | None] = {
        "plain": None,
        "randkv": bench.randkv,
        AMPLE: None,
    }
    benches: dict[ArmName, ServeBench] = {"plain": bench, "randkv": bench}
    if bench.ample_pool_blocks is not None:
        benches[AMPLE] = dataclasses.replace(
            bench, pool_blocks=bench.ample_pool_blocks, ample_pool_blocks=None
        )
    order = abba_order(bench.repeats, ample=AMPLE in benches)
    runs: dict[str, list[Run]] = {arm: [] for arm in benches}
    for position, (repeat, arm) in enumerate(order):
        name = arm if bench.repeats == 1 else f"{arm}-{repeat}"
        measured = run_arm(
            benches[arm], model, configs[arm], requests, name, progress_factory, keep_outputs
        )
        runs[arm].append(Run.of(measured, repeat=repeat, position=position))
    result = assemble(bench, model, runs, order)
    document = to_json(result)
    validate(document)
    (bench.results_dir / "result.json").write_text(json.dumps(document, indent=2))
    plot_timeline(result, bench.results_dir / "timeline.png")
    return result


#: The rows of the side-by-side table: label, what it reads of an arm, format.
_TABLE_ROWS: tuple[tuple[str, Callable[[Arm], float], str], ...] = (
    ("output tokens/s", lambda arm: arm.output_tokens_per_s, "{:.0f}"),
    ("requests completed", lambda arm: arm.requests_completed, "{:d}"),
    ("mean running requests", lambda arm: arm.running_requests_mean, "{:.1f}"),
    ("peak running requests", lambda arm: arm.running_requests_peak, "{:.0f}"),
    ("preemptions", lambda arm: arm.preemptions, "{:d}"),
    ("peak KV blocks", lambda arm: arm.kv_blocks_peak, "{:d}"),
    ("duration (s)", lambda arm: arm.duration_s, "{:.1f}"),
)


def format_table(result: ServeResult, *, with_target: bool = True) -> str:
    """The side-by-side table printed by `randkv bench serve` and the demo."""
    plain, ours = result.arms.plain, result.arms.randkv
    lines = [f"{'':24s}{'plain vLLM':>14s}{'vLLM + RandKV':>16s}{'ratio':>9s}"]
    for label, read, fmt in _TABLE_ROWS:
        a, b = read(plain), read(ours)
        ratio = f"{b / a:.2f}x" if a else "-"
        lines.append(f"{label:24s}{fmt.format(a):>14s}{fmt.format(b):>16s}{ratio:>9s}")
    for label, key in (("TTFT", "ttft_s"), ("inter-token latency", "itl_s")):
        ours_percentiles: Percentiles = getattr(ours, key)
        plain_percentiles: Percentiles = getattr(plain, key)
        for pct in ("p50", "p90", "p99"):
            a = getattr(plain_percentiles, pct) * 1e3
            b = getattr(ours_percentiles, pct) * 1e3
            ratio = f"{b / a:.2f}x" if a else "-"
            lines.append(f"{f'{label} {pct} (ms)':24s}{a:>14.1f}{b:>16.1f}{ratio:>9s}")
    if plain.speculation is not None and ours.speculation is not None:
        theirs, mine = plain.speculation, ours.speculation
        rates = theirs.acceptance_rate, mine.acceptance_rate
        ratio = f"{rates[1] / rates[0]:.2f}x" if rates[0] else "-"
        lines.append(
            f"{'drafts accepted':24s}{f'{theirs.accepted}/{theirs.drafted}':>14s}"
            f"{f'{mine.accepted}/{mine.drafted}':>16s}{'':>9s}"
        )
        lines.append(f"{'acceptance rate':24s}{rates[0]:>14.2f}{rates[1]:>16.2f}{ratio:>9s}")
    eviction = ours.eviction
    if eviction is None:
        raise ValueError("the RandKV arm has no eviction record")
    lines.append(
        f"RandKV: {eviction.rounds} rounds, planning {eviction.planning_s:.2f} s + "
        f"compaction {eviction.compaction_s:.2f} s = "
        f"{100 * eviction.share_of_step_time:.2f}% of step time"
    )
    if not with_target:
        return "\n".join(lines)
    targets = result.targets
    lines.append(
        f"target (>= {targets.min_throughput_ratio:.0f}x tokens/s with plain vLLM "
        f"preempting, eviction < {100 * targets.max_eviction_share:.0f}% of step time): "
        + ("met" if targets.met else "NOT met")
        + (f", on the medians of {result.repeats} repeats" if result.repeats > 1 else "")
    )
    return "\n".join(lines)


def format_reference(result: ServeResult) -> str | None:
    """What share of the ample-memory arm's throughput each iso-memory arm reached (None
    without that arm)."""
    reference = result.reference
    if reference is None:
        return None
    tokens = reference.summary.output_tokens_per_s
    share = reference.share_of_throughput
    runs = reference.runs
    lines = [
        f"plain vLLM with ample memory ({reference.pool_blocks} blocks): "
        f"{tokens.median:.0f} output tokens/s, "
        f"peak {max(run.kv_blocks_peak for run in runs)} KV blocks, "
        f"{sum(run.preemptions for run in runs)} preemptions"
        + (f" (median of {result.repeats} runs)" if result.repeats > 1 else ""),
        f"share of its throughput: vLLM + RandKV {share.randkv.median:.2f}x, "
        f"plain vLLM at the same pool {share.plain.median:.2f}x",
    ]
    if reference.preempted:
        lines.append("the ample arm preempted: not ample; raise --ample-pool-blocks")
    return "\n".join(lines)


def _spread_cell(stat: Spread, scale: float, fmt: str, suffix: str = "") -> str:
    if stat.median is None or stat.min is None or stat.max is None:
        return "-"
    low, mid, high = (format(value * scale, fmt) for value in (stat.min, stat.median, stat.max))
    return f"{mid}{suffix} [{low}, {high}]"


def format_repeats(result: ServeResult) -> str:
    """Median [min, max] over the repeats, for each arm and for the per-repeat ratio."""
    summary = result.summary
    rows = [
        ("output tokens/s", "output_tokens_per_s", 1.0, ".0f"),
        ("TTFT p50 (ms)", "ttft_p50_s", 1e3, ".1f"),
        ("inter-token latency p50 (ms)", "itl_p50_s", 1e3, ".1f"),
    ]
    order = " ".join("A" if arm == "plain" else "B" for arm in result.order)
    lines = [
        f"{result.repeats} repeats, run order {order} (A = plain, B = RandKV); "
        "median [min, max]; the table above is repeat "
        f"{result.representative_repeat} (ratio nearest the median)",
        f"{'':30s}{'plain vLLM':>26s}{'vLLM + RandKV':>26s}{'ratio':>22s}",
    ]
    for label, metric, scale, fmt in rows:
        groups = (summary.plain, summary.randkv)
        cells = [_spread_cell(getattr(group, metric), scale, fmt) for group in groups]
        cells.append(_spread_cell(getattr(summary.ratio, metric), 1.0, ".2f", "x"))
        widths = (26, 26, 22)  # room for "11104.7 [6085.9, 11104.7]" and a gap
        lines.append(
            f"{label:30s}" + "".join(f"{c:>{w}s}" for c, w in zip(cells, widths, strict=True))
        )
    return "\n".join(lines)
