"""RandKV's metric table: the README, the Prometheus series and randkv_stats() merging all
follow it."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("vllm")

from randkv.vllm.metrics import (  # noqa: E402
    METRICS,
    Ranks,
    RankStats,
    RequestRecord,
    Source,
    markdown_table,
    merge_ranks,
)

pytestmark = [pytest.mark.vllm]

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_readme_shows_the_metric_table():
    assert markdown_table() in README.read_text(), (
        "README's /metrics table differs from randkv.vllm.metrics.METRICS; paste "
        "randkv.vllm.metrics.markdown_table() into it"
    )


def test_every_metric_has_one_series_with_its_name():
    from randkv.vllm.metrics import _collectors

    collectors = _collectors()
    assert set(collectors) == {m.name for m in METRICS}
    for metric in METRICS:
        collector = collectors[metric.name]
        collector.labels("test-model", "0")
        family = collector.collect()[0]
        assert family.type == metric.kind
        assert metric.series in {sample.name for sample in family.samples}


def _rank(counters: dict[str, float]) -> RankStats:
    return RankStats(counters, {}, layers=[0], kv_heads=[0], counts_evictions=True)


def test_rank_stats_cross_vllms_rpc_as_plain_data():
    """vLLM encodes RPC results with msgpack: a worker's answer is a dict of plain values,
    and LLM.randkv_stats rebuilds the same typed record from it."""
    rank = RankStats(
        {"rounds": 2}, {"planning": 0.5}, layers=[0, 1], kv_heads=[2, 3],
        counts_evictions=False, requests={"r": RequestRecord(rounds=2, tokens_seen=40)},
    )  # fmt: skip
    wire = rank.to_wire()
    assert isinstance(wire["requests"]["r"], dict) and wire["kv_heads"] == [2, 3]
    assert RankStats.from_wire(wire) == rank


def test_ranks_merge_by_the_table():
    summed = [m.key for m in METRICS if m.stats_group == "counters" and m.ranks is Ranks.SUMMED]
    once = [m.key for m in METRICS if m.stats_group == "counters" and m.ranks is Ranks.ONCE]
    assert "kv_entries_evicted" in summed and "rounds" in once
    rank0 = _rank({key: 3 for key in summed + once})
    rank1 = _rank({key: 5 if key in summed else 3 for key in summed + once})
    merged = merge_ranks([rank0, rank1], "counters")
    assert all(merged[key] == 8 for key in summed)
    assert all(merged[key] == 3 for key in once)
    rank1.counters["rounds"] = 4
    with pytest.raises(RuntimeError, match="ranks disagree on rounds"):
        merge_ranks([rank0, rank1], "counters")


def test_worker_metrics_cover_the_stats_groups():
    groups = {(m.source, m.stats_group) for m in METRICS}
    assert (Source.WORKER, "counters") in groups and (Source.WORKER, "seconds") in groups
    assert (Source.SCHEDULER, "scheduler") in groups
