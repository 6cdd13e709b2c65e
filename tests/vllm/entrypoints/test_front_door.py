"""Every route of the running server that generates text answers what RandKV refuses with
HTTP 400 and RandKV's message, before any stream starts: never a 500, a cut stream or an
error inside a 200. The routes come from the running app (its OpenAPI schema), so a route a
new vLLM release adds fails `test_every_post_route_is_classified` until it is covered here.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("vllm")

import httpx  # noqa: E402
from serving import CONFIG, ENGINE_ARGS, one_cpu  # noqa: E402

from randkv.bench.server import SERVED_MODEL_NAME, running_server  # noqa: E402

pytestmark = [pytest.mark.engine, pytest.mark.vllm]

LONG_TEXT = "a" * (CONFIG.budget + 16)  # byte-level tokenizer: over K = 64 on every route
M = SERVED_MODEL_NAME


def _messages(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


#: Request bodies of the routes that generate: (text, stream) -> body, or None where the
#: route cannot stream. `XARGS` says where a route takes RandKV's request fields.
GENERATING: dict[str, Callable[[str, bool], dict[str, Any] | None]] = {
    "/v1/completions": lambda text, stream: {
        "model": M, "prompt": text, "max_tokens": 4, "stream": stream
    },
    "/v1/chat/completions": lambda text, stream: {
        "model": M, "messages": _messages(text), "max_tokens": 4, "stream": stream
    },
    "/v1/chat/completions/batch": lambda text, stream: None if stream else {
        "model": M, "messages": [_messages(text), _messages("short")], "max_tokens": 4
    },
    "/v1/responses": lambda text, stream: {
        "model": M, "input": text, "max_output_tokens": 16, "stream": stream
    },
    "/v1/messages": lambda text, stream: {
        "model": M, "messages": _messages(text), "max_tokens": 4, "stream": stream
    },
    "/inference/v1/generate": lambda text, stream: {
        "model": M, "token_ids": list(text.encode()), "stream": stream,
        "sampling_params": {"max_tokens": 4},
    },
    "/generative_scoring": lambda text, stream: None if stream else {
        "model": M, "query": text, "items": ["b", "c"], "label_token_ids": [97, 98]
    },
    # SageMaker's route takes a completions (or chat) body.
    "/invocations": lambda text, stream: {
        "model": M, "prompt": text, "max_tokens": 4, "stream": stream
    },
    # Structured decisions: the tiny model has no decision head (vLLM answers 501 with or
    # without RandKV).
    "/v1/systemone": lambda text, stream: None if stream else {
        "model": M, "state": text, "questions": {"q": {"type": "yes_no"}}
    },
    "/v1/decisions": lambda text, stream: None if stream else {
        "model": M, "state": text, "questions": {"q": {"type": "yes_no"}}
    },
}  # fmt: skip
UNSUPPORTED_BY_THE_MODEL = {"/v1/systemone", "/v1/decisions"}
#: POST routes that never generate (tokenizing, rendering, cancelling, scaling, scoring).
NOT_GENERATING = frozenset(
    {
        "/tokenize",
        "/detokenize",
        "/ping",
        "/scale_elastic_ep",
        "/is_scaling_elastic_ep",
        "/v1/messages/count_tokens",
        "/v1/responses/{response_id}/cancel",
        "/inference/v1/abort_requests",
        "/abort_requests",
        "/v1/completions/render",
        "/v1/completions/derender",
        "/v1/chat/completions/render",
        "/v1/chat/completions/derender",
        "/v1/messages/render",
        "/v1/responses/render",
        "/cohere/v2/chat/render",
        "/release_kv_cache_memory",
        "/shutdown_weight_transfer_engine",
        "/weight_checker",
    }
)


def _scale_out_flag() -> dict[str, bool]:
    """vLLM 0.32+ serves /inference/v1/generate only with --enable-scale-out."""
    from randkv.vllm.entrypoints.serve import build_serve_parser

    parser, _ = build_serve_parser()
    try:
        parser.parse_args(["serve", "m", "--enable-scale-out"])
    except SystemExit:
        return {}
    return {"enable_scale_out": True}


@pytest.fixture(scope="module")
def server(tiny_model_path, tmp_path_factory):
    log = tmp_path_factory.mktemp("routes") / "server.log"
    engine_args = {**ENGINE_ARGS, **_scale_out_flag()}
    with one_cpu(), running_server(str(tiny_model_path), CONFIG, engine_args, log) as running:
        yield running


@pytest.fixture(scope="module")
def schema(server) -> dict[str, Any]:
    return httpx.get(f"{server.base_url}/openapi.json", timeout=30).json()


@functools.cache
def _http() -> httpx.Client:
    return httpx.Client(timeout=120.0)


def _post(server, path: str, body: dict[str, Any]) -> httpx.Response:
    return _http().post(f"{server.base_url}{path}", json=body)


def _routes(schema: dict[str, Any]) -> set[str]:
    return {path for path, ops in schema["paths"].items() if "post" in ops}


def _takes_xargs(schema: dict[str, Any], path: str) -> bool:
    body = schema["paths"][path]["post"].get("requestBody", {})
    ref = body.get("content", {}).get("application/json", {}).get("schema", {}).get("$ref")
    if ref is None:
        return path == "/invocations"  # a raw body routed to completions
    model = schema["components"]["schemas"][ref.rsplit("/", 1)[1]]
    return "vllm_xargs" in model.get("properties", {}) or path == "/inference/v1/generate"


def _with_fields(path: str, body: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    if path == "/inference/v1/generate":
        return {**body, "sampling_params": {**body["sampling_params"], "extra_args": fields}}
    return {**body, "vllm_xargs": fields}


def _message(response: httpx.Response) -> str:
    return response.json()["error"]["message"]


def test_every_post_route_is_classified(schema):
    unknown = _routes(schema) - set(GENERATING) - NOT_GENERATING
    assert not unknown, f"classify these routes of this vLLM release: {sorted(unknown)}"
    assert {"/v1/completions", "/v1/chat/completions", "/v1/responses"} <= _routes(schema)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_over_budget_prompts_get_400_on_every_generating_route(server, schema, stream):
    before = server.metrics()["randkv:rejected_prompts_total"]
    checked = []
    for path in sorted(_routes(schema) & set(GENERATING)):
        body = GENERATING[path](LONG_TEXT, stream)
        if body is None:
            continue
        response = _post(server, path, body)
        if path in UNSUPPORTED_BY_THE_MODEL:
            assert response.status_code == 501, response.text
            continue
        assert response.status_code == 400, (path, response.text)
        assert "exceeds the RandKV budget K=64" in response.text, (path, response.text)
        assert "min_generated" in response.text  # the setting that serves such prompts
        checked.append(path)
    assert len(checked) >= 5
    after = server.metrics()["randkv:rejected_prompts_total"]
    assert after - before == len(checked)


def test_bad_randkv_fields_get_400_on_every_route_that_takes_them(server, schema):
    cases = {
        "boolean key": ({"randkv_key": True}, "got bool True"),
        "boolean key false": ({"randkv_key": False}, "got bool False"),
        "float key": ({"randkv_key": 1.5}, "a request key must be an int"),
        "budget over the maximum": ({"randkv_budget": 65}, "randkv_budget must be in [1, 64]"),
        "boolean budget": ({"randkv_budget": True}, "must be an integer in [1, 64]"),
        "unknown field": ({"randkv_buget": 3}, "unknown RandKV request field(s) ['randkv_buget']"),
    }
    checked = set()
    for path in sorted(_routes(schema) & set(GENERATING) - UNSUPPORTED_BY_THE_MODEL):
        body = GENERATING[path]("Hello", False)
        if body is None or not _takes_xargs(schema, path):
            continue
        for name, (fields, message) in cases.items():
            response = _post(server, path, _with_fields(path, body, fields))
            assert response.status_code == 400, (path, name, response.text)
            assert message in _message(response), (path, name, response.text)
        good = _post(
            server, path, _with_fields(path, body, {"randkv_key": "k", "randkv_budget": 32})
        )
        assert good.status_code == 200, (path, good.text)
        checked.add(path)
    assert {"/v1/completions", "/v1/chat/completions", "/v1/responses"} <= checked


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_beam_search_is_served_when_its_beams_fit_and_refused_up_front_otherwise(server, path):
    prompt = {"prompt": "Hello world"} if path == "/v1/completions" else {
        "messages": _messages("Hello world")
    }  # fmt: skip
    body = {"model": M, "use_beam_search": True, "n": 2, **prompt}
    fits = _post(server, path, {**body, "max_tokens": 8})
    assert fits.status_code == 200, fits.text
    prompt_tokens = fits.json()["usage"]["prompt_tokens"]
    over = CONFIG.budget - prompt_tokens + 2  # the last step's prompt: P + max_tokens - 1 > K
    refused = _post(server, path, {**body, "max_tokens": over})
    assert refused.status_code == 400, refused.text
    assert "beam search" in _message(refused) and "K=64" in _message(refused)


def test_nothing_is_left_behind(server):
    values = server.metrics()
    assert values["randkv:kv_blocks_held"] == 0
    assert values["vllm:num_requests_running"] == 0
