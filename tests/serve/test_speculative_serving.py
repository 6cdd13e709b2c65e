"""`randkv serve` with speculative decoding on (ngram): a bad request is still an HTTP 400
with RandKV's message before any stream starts, good requests run with drafts, and the
speculation series reach /metrics next to RandKV's."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("vllm")

import httpx  # noqa: E402
from serving import CONFIG, ENGINE_ARGS, one_cpu  # noqa: E402

from randkv.bench.server import SERVED_MODEL_NAME, running_server  # noqa: E402

pytestmark = [pytest.mark.vllm]

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}
REPEATS = "one two three " * 2  # 28 tokens, under K = 64; ngram finds its drafts here


@pytest.fixture(scope="module")
def server(tiny_model_path, tmp_path_factory):
    log = tmp_path_factory.mktemp("speculative") / "server.log"
    engine_args = {**ENGINE_ARGS, "speculative_config": json.dumps(NGRAM)}
    with one_cpu(), running_server(str(tiny_model_path), CONFIG, engine_args, log) as running:
        yield running


def _complete(server, prompt: str, max_tokens: int, **extra) -> httpx.Response:
    body = {"model": SERVED_MODEL_NAME, "prompt": prompt, "max_tokens": max_tokens, **extra}
    return httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=300.0)


def test_an_over_budget_prompt_is_still_a_400(server):
    for stream in (False, True):
        bad = _complete(server, " ".join(str(i) for i in range(80)), 10, stream=stream)
        assert bad.status_code == 400, bad.text
        assert "exceeds the RandKV budget K=64" in bad.json()["error"]["message"]


def test_requests_run_with_drafts_and_rounds(server):
    before = server.metrics()
    ok = _complete(server, REPEATS, 200, ignore_eos=True, temperature=0)
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 200
    after = server.metrics()

    def grew(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    assert grew("vllm:spec_decode_num_draft_tokens_total") > 0
    assert grew("randkv:rounds_total") >= (200 - CONFIG.max_physical_length) // 8
    assert after["randkv:kv_blocks_held"] == 0  # every block back
