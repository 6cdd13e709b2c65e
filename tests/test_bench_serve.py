"""`randkv bench serve` end to end on a small workload: both arms served for real, the JSON
result checked against its schema and against numbers known without the benchmark."""

from __future__ import annotations

import copy

import pytest

pytest.importorskip("vllm")
jsonschema = pytest.importorskip("jsonschema")

from randkv import RandKVConfig, num_rounds  # noqa: E402
from randkv.bench.serve import ServeBench, format_table, run  # noqa: E402
from randkv.bench.serve_schema import SCHEMA_VERSION, validate  # noqa: E402
from randkv.bench.workload import WorkloadSpec, build_requests  # noqa: E402

pytestmark = pytest.mark.engine

CONFIG = RandKVConfig(budget=48, buffer_size=8, seed=1)
WORKLOAD = WorkloadSpec(requests=6, prompt_tokens=(10, 30), output_tokens=(150, 220), seed=3)


@pytest.fixture(scope="module")
def bench_run(tiny_model_path, tmp_path_factory):
    bench = ServeBench(
        model=str(tiny_model_path),
        workload=WORKLOAD,
        randkv=CONFIG,
        pool_blocks=26,  # 25 usable: 6 RandKV requests need 6 x 4, plain ones up to 6 x 16
        block_size=16,
        max_num_seqs=6,
        results_dir=tmp_path_factory.mktemp("bench-serve"),
    )
    return bench, run(bench, progress=False)


def test_result_follows_the_versioned_schema(bench_run):
    bench, result = bench_run
    assert result["schema_version"] == SCHEMA_VERSION
    validate(result)
    broken = copy.deepcopy(result)
    del broken["arms"]["randkv"]["preemptions"]
    with pytest.raises(jsonschema.ValidationError):
        validate(broken)
    assert (bench.results_dir / "result.json").is_file()
    png = (bench.results_dir / "timeline.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    assert "plain vLLM" in format_table(result)


def test_both_arms_serve_the_whole_workload(bench_run, tiny_model_path):
    from transformers import AutoTokenizer

    _, result = bench_run
    requests = build_requests(WORKLOAD, AutoTokenizer.from_pretrained(tiny_model_path))
    asked = sum(r.max_tokens for r in requests)  # ignore_eos: every request runs to the end
    for arm in ("plain", "randkv"):
        assert result["arms"][arm]["requests_completed"] == WORKLOAD.requests
        assert result["arms"][arm]["output_tokens"] == asked
        assert result["arms"][arm]["timeline"]["t_s"], "the scheduler timeline is empty"


def test_memory_and_rounds_match_what_the_spec_predicts(bench_run, tiny_model_path):
    from transformers import AutoTokenizer

    bench, result = bench_run
    plain, ours = result["arms"]["plain"], result["arms"]["randkv"]
    requests = build_requests(WORKLOAD, AutoTokenizer.from_pretrained(tiny_model_path))
    # Every RandKV request holds at most ceil((K + 2r) / block) blocks.
    per_request = -(-CONFIG.max_physical_length // bench.block_size)
    assert ours["kv_blocks_peak"] <= WORKLOAD.requests * per_request
    # Plain vLLM's requests together outgrow the pool, so it must preempt.
    full = sum(-(-(len(r.prompt_token_ids) + r.max_tokens) // 16) for r in requests)
    assert full > bench.pool_blocks - 1
    assert plain["preemptions"] > 0 and ours["preemptions"] == 0
    assert plain["kv_blocks_peak"] > ours["kv_blocks_peak"]
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
    assert ours["eviction"]["rounds"] == expected
    assert 0 < ours["eviction"]["share_of_step_time"] < 1
    assert result["targets"]["plain_preempted"] is True
