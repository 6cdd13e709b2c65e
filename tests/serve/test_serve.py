"""`randkv serve` for real: a server process on loopback, ordinary HTTP clients, /metrics."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("vllm")
openai = pytest.importorskip("openai")

import httpx  # noqa: E402
from serving import CONFIG, ENGINE_ARGS, PROMPT, one_cpu  # noqa: E402

from randkv import num_rounds, request_key_from_text  # noqa: E402
from randkv.bench.server import SERVED_MODEL_NAME, running_server  # noqa: E402

pytestmark = [pytest.mark.engine, pytest.mark.vllm, pytest.mark.vllm_part_1]


@pytest.fixture(scope="module")
def server(tiny_model_path, tmp_path_factory):
    log = tmp_path_factory.mktemp("serve") / "server.log"
    with one_cpu(), running_server(str(tiny_model_path), CONFIG, ENGINE_ARGS, log) as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)


def wait_for_metrics(server, check, timeout=30.0):
    deadline = time.monotonic() + timeout
    while True:
        values = server.metrics()
        if check(values) or time.monotonic() > deadline:
            return values
        time.sleep(0.2)


def test_completion_equals_the_transformers_reference_decode(server, client, tiny_model_path):
    import torch
    from transformers import AutoModelForCausalLM

    from randkv.hf import reference_decode, teacher_forced_logprobs

    new_tokens = 3 * CONFIG.max_physical_length
    before = server.metrics()
    response = client.completions.create(
        model=SERVED_MODEL_NAME,
        prompt=PROMPT,
        max_tokens=new_tokens,
        temperature=0,
        extra_body={
            "ignore_eos": True,
            "return_token_ids": True,
            "vllm_xargs": {"randkv_key": "serve-oracle"},
        },
    )
    choice = response.choices[0]
    prompt_ids = list(choice.prompt_token_ids)
    served = list(choice.token_ids)
    assert len(served) == new_tokens and choice.finish_reason == "length"

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, torch_dtype=torch.float32)
    reference, _ = reference_decode(
        model,
        prompt_ids,
        randkv=CONFIG,
        request_key=request_key_from_text("serve-oracle"),
        max_new_tokens=new_tokens,
    )
    if reference != served:
        # Different kernels may flip a near-tie argmax; then the served tokens must still
        # be what the reference scores as the argmax within float tolerance.
        forced = teacher_forced_logprobs(
            model,
            prompt_ids,
            served,
            randkv=CONFIG,
            request_key=request_key_from_text("serve-oracle"),
        )
        gap = forced.logprobs.max(dim=-1).values - forced.token_logprobs
        assert float(gap.max()) < 1e-3

    # The rounds counter moved by exactly the rounds the spec says this request went through.
    after = wait_for_metrics(
        server, lambda v: v["randkv:rounds_total"] > before["randkv:rounds_total"]
    )
    # The cache ends holding P + N - 1 tokens (the last token is never fed back); a round
    # due at T tokens is applied lazily, right before token T is written (docs/spec.md).
    written = len(prompt_ids) + new_tokens - 1
    expected = num_rounds(CONFIG, prompt_length=len(prompt_ids), tokens_seen=written - 1)
    assert expected >= 3
    assert after["randkv:rounds_total"] - before["randkv:rounds_total"] == expected
    assert (
        after["randkv:tokens_evicted_total"] - before["randkv:tokens_evicted_total"]
        == expected * CONFIG.buffer_size
    )
    # 2 layers x 2 KV heads of the tiny model, r entries each per round.
    assert (
        after["randkv:kv_entries_evicted_total"] - before["randkv:kv_entries_evicted_total"]
        == expected * CONFIG.buffer_size * 2 * 2
    )
    assert after["randkv:compaction_seconds_total"] > before["randkv:compaction_seconds_total"]
    assert after["randkv:planning_seconds_total"] > before["randkv:planning_seconds_total"]


def test_chat_and_streaming_give_the_same_tokens(client):
    messages = [{"role": "user", "content": "Count the rounds, please."}]
    extra = {"ignore_eos": True, "vllm_xargs": {"randkv_key": "chat"}}
    whole = client.chat.completions.create(
        model=SERVED_MODEL_NAME, messages=messages, max_tokens=150, temperature=0, extra_body=extra
    )
    assert whole.usage.completion_tokens == 150
    assert whole.usage.prompt_tokens + 150 > CONFIG.max_physical_length  # rounds fired
    stream = client.chat.completions.create(
        model=SERVED_MODEL_NAME,
        messages=messages,
        max_tokens=150,
        temperature=0,
        extra_body=extra,
        stream=True,
    )
    pieces = [chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices]
    assert len(pieces) > 10  # really streamed, not one final chunk
    assert "".join(pieces) == whole.choices[0].message.content


def test_cancel_mid_stream_frees_the_blocks(server):
    max_tokens = ENGINE_ARGS["max_model_len"] - 480
    body = {
        "model": SERVED_MODEL_NAME,
        "prompt": PROMPT,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    before = server.metrics()
    chunks = 0
    with (
        httpx.Client(timeout=60.0) as http,
        http.stream("POST", f"{server.base_url}/v1/completions", json=body) as response,
    ):
        assert response.status_code == 200
        for line in response.iter_lines():
            chunks += line.startswith("data:")
            if chunks == 20:
                # The scheduler sets RandKV's gauge every step; vLLM's own gauges are
                # published by the API server and may lag a step or two.
                during = wait_for_metrics(server, lambda v: v["randkv:kv_blocks_held"] > 0)
                break  # closing the connection cancels the request
    assert during["randkv:kv_blocks_held"] > 0
    after = wait_for_metrics(
        server,
        lambda v: v["vllm:num_requests_running"] == 0 and v["randkv:kv_blocks_held"] == 0,
    )
    assert after["vllm:num_requests_running"] == 0
    assert after["randkv:kv_blocks_held"] == 0
    assert after["vllm:kv_cache_usage_perc"] == 0.0  # every block back in the free pool
    # It really stopped early: far fewer tokens than asked for were generated.
    generated = after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"]
    assert 20 <= generated < max_tokens - 1000


def test_over_budget_prompt_fails_alone(server, client):
    long_prompt = "x" * (CONFIG.budget + 20)
    before = server.metrics()
    with httpx.Client(timeout=120.0) as http:
        bad = http.post(
            f"{server.base_url}/v1/completions",
            json={"model": SERVED_MODEL_NAME, "prompt": long_prompt, "max_tokens": 10},
        )
    assert bad.status_code == 400, bad.text
    assert "exceeds the RandKV budget K=64" in bad.json()["error"]["message"]
    ok = client.completions.create(
        model=SERVED_MODEL_NAME, prompt=PROMPT, max_tokens=20, extra_body={"ignore_eos": True}
    )
    assert ok.usage.completion_tokens == 20
    after = server.metrics()
    assert after["randkv:rejected_prompts_total"] - before["randkv:rejected_prompts_total"] == 1


def test_metrics_expose_every_randkv_series(server):
    text = httpx.get(f"{server.base_url}/metrics").text
    for name in (
        "randkv:rounds_total",
        "randkv:tokens_evicted_total",
        "randkv:kv_entries_evicted_total",
        "randkv:blocks_freed_total",
        "randkv:kv_blocks_held",
        "randkv:rejected_prompts_total",
        "randkv:preemptions_total",
        "randkv:planning_seconds_total",
        "randkv:compaction_seconds_total",
        "randkv:step_seconds_total",
    ):
        assert f'{name}{{engine="0",model_name="{SERVED_MODEL_NAME}"}}' in text, name
    assert "vllm:num_requests_running" in text  # vLLM's own series are still there
