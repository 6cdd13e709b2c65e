"""Stock vLLM's OpenAI server with only `--additional-config '{"randkv": ...}'`: RandKV through
the plugin, RandKV's series on /metrics, and HTTP 400 for what RandKV refuses (completions
and chat, streaming or not), checked with the openai client and raw httpx on loopback."""

from __future__ import annotations

import dataclasses
import json
import re
import sys

import pytest

pytest.importorskip("vllm")
openai = pytest.importorskip("openai")

import httpx  # noqa: E402
from serving import CONFIG, ENGINE_ARGS, PROMPT, one_cpu  # noqa: E402

from randkv import num_rounds  # noqa: E402
from randkv.bench.server import (  # noqa: E402
    SERVED_MODEL_NAME,
    Server,
    free_port,
    running_server,
)

pytestmark = [pytest.mark.engine, pytest.mark.vllm, pytest.mark.vllm_part_1]

KEY = "stock-server"


def _flags(engine_args: dict) -> list[str]:
    return [f"--{name.replace('_', '-')}" + ("" if v is True else f"={v}")
            for name, v in engine_args.items()]  # fmt: skip


@pytest.fixture(scope="module")
def pinned_cpu():
    with one_cpu():
        yield


@pytest.fixture(scope="module")
def stock(tiny_model_path, tmp_path_factory, pinned_cpu):
    folder = tmp_path_factory.mktemp("stock")
    metrics_dir = folder / "prometheus"
    metrics_dir.mkdir()  # empty, before the server starts (prometheus_client's rule)
    port = free_port()
    argv = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        f"--model={tiny_model_path}", f"--served-model-name={SERVED_MODEL_NAME}",
        "--host=127.0.0.1", f"--port={port}",
        "--additional-config", json.dumps({"randkv": dataclasses.asdict(CONFIG)}),
        *_flags(ENGINE_ARGS),
    ]  # fmt: skip
    env = {"PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)}
    server = Server(argv, port, folder / "server.log", env)
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def client(stock):
    return openai.OpenAI(base_url=f"{stock.base_url}/v1", api_key="unused", max_retries=0)


def _complete(client, **extra) -> list[int]:
    response = client.completions.create(
        model=SERVED_MODEL_NAME,
        prompt=PROMPT,
        max_tokens=2 * CONFIG.max_physical_length,
        temperature=0,
        extra_body={"ignore_eos": True, "return_token_ids": True, **extra},
    )
    choice = response.choices[0]
    return list(choice.prompt_token_ids), list(choice.token_ids)


def test_stock_server_runs_randkv_and_counts_the_specs_rounds(stock, client):
    before = stock.metrics()
    prompt_ids, tokens = _complete(client, vllm_xargs={"randkv_key": KEY})
    after = stock.metrics()
    written = len(prompt_ids) + len(tokens) - 1  # the last token is never fed back
    expected = num_rounds(CONFIG, prompt_length=len(prompt_ids), tokens_seen=written - 1)
    assert expected >= 2
    assert after["randkv:rounds_total"] - before["randkv:rounds_total"] == expected
    assert (
        after["randkv:kv_entries_evicted_total"] - before["randkv:kv_entries_evicted_total"]
        == expected * CONFIG.buffer_size * 2 * 2
    )  # 2 layers x 2 KV heads


def test_stock_server_equals_randkv_serve(stock, client, tiny_model_path, tmp_path):
    _, from_stock = _complete(client, vllm_xargs={"randkv_key": KEY})
    with running_server(tiny_model_path, CONFIG, ENGINE_ARGS, tmp_path / "serve.log") as ours:
        wrapped = openai.OpenAI(base_url=f"{ours.base_url}/v1", api_key="unused", max_retries=0)
        _, from_randkv_serve = _complete(wrapped, vllm_xargs={"randkv_key": KEY})
    assert from_stock == from_randkv_serve


def _over_budget_bodies() -> list[tuple[str, dict]]:
    long_text = "x" * (CONFIG.budget + 20)
    completion = {"model": SERVED_MODEL_NAME, "prompt": long_text, "max_tokens": 8}
    chat = {
        "model": SERVED_MODEL_NAME,
        "messages": [{"role": "user", "content": long_text}],
        "max_tokens": 8,
    }
    return [
        (endpoint, {**body, "stream": stream})
        for endpoint, body in (("completions", completion), ("chat/completions", chat))
        for stream in (False, True)
    ]


@pytest.mark.parametrize(("endpoint", "body"), _over_budget_bodies())
def test_over_budget_prompt_is_a_400_before_any_stream(stock, client, endpoint, body):
    before = stock.metrics()
    with httpx.Client(timeout=60.0) as http:
        response = http.post(f"{stock.base_url}/v1/{endpoint}", json=body)
    assert response.status_code == 400, response.text
    message = response.json()["error"]["message"]
    assert "exceeds the RandKV budget K=64" in message
    assert '"min_generated"' in message and "raise the budget" in message  # what to set
    assert stock.metrics()["randkv:rejected_prompts_total"] == (
        before["randkv:rejected_prompts_total"] + 1
    )
    # The next request is served normally.
    _, tokens = _complete(client)
    assert len(tokens) == 2 * CONFIG.max_physical_length


def test_the_openai_client_sees_a_bad_request(client):
    long_text = "y" * (CONFIG.budget + 5)
    with pytest.raises(openai.BadRequestError, match="RandKV budget"):
        client.completions.create(model=SERVED_MODEL_NAME, prompt=long_text, max_tokens=4)
    with pytest.raises(openai.BadRequestError, match="RandKV budget"):
        stream = client.chat.completions.create(
            model=SERVED_MODEL_NAME,
            messages=[{"role": "user", "content": long_text}],
            max_tokens=4,
            stream=True,
        )
        list(stream)


@pytest.mark.parametrize(
    ("xargs", "message"),
    [
        ({"randkv_key": 1.5}, "a request key must be an int"),
        ({"randkv_key": True}, "a request key must be an int .* got bool True"),
        ({"randkv_key": [1, 2]}, "a request key must be an int"),
        # vLLM 0.32 refuses integers past 2**64 - 1 in extra_args itself.
        ({"randkv_key": 2**64}, r"out of range|between -2\*\*63 and 2\*\*64 - 1"),
        ({"randkv_budget": 65}, r"randkv_budget must be in \[1, 64\]"),
        ({"randkv_keyy": "a"}, r"unknown RandKV request field\(s\) \['randkv_keyy'\]"),
    ],
)
def test_bad_randkv_request_fields_are_a_400(stock, xargs, message):
    body = {"model": SERVED_MODEL_NAME, "prompt": PROMPT, "max_tokens": 4, "vllm_xargs": xargs}
    with httpx.Client(timeout=60.0) as http:
        response = http.post(f"{stock.base_url}/v1/completions", json=body)
    assert response.status_code == 400, response.text
    assert re.search(message, response.json()["error"]["message"])


def test_one_warning_line_per_rejection_and_no_traceback(stock):
    log = stock.log_tail(lines=400)
    assert log.count("RandKV rejects a request") >= 5
    assert "Traceback" not in log
