"""A bounded fuzz run (schemathesis, fixed seed) of RandKV's routes, side by side with plain
vLLM: the same generated request goes to `randkv serve` (K = 64, r = 16) and to the same
server with `--no-randkv`.

The running app's schema is tightened so that requests reach the engine: the served model
name, short prompts (some over K), small `max_tokens`, `n`, streaming, beam search, and
RandKV's `vllm_xargs` fields with values of every JSON type. Checked for every case: RandKV
never answers 5xx where plain vLLM does not, a 200 stream ends with `[DONE]`, and RandKV
differs from plain vLLM only by its documented 400s. Afterwards the engine still serves and
`randkv:kv_blocks_held` is back to 0.
"""

from __future__ import annotations

import copy
import json
from collections import Counter
from typing import Any

import pytest

pytest.importorskip("vllm")
schemathesis = pytest.importorskip("schemathesis")

import httpx  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from serving import ENGINE_ARGS  # noqa: E402

from randkv import RandKVConfig  # noqa: E402
from randkv.bench.server import SERVED_MODEL_NAME, running_server  # noqa: E402

pytestmark = pytest.mark.engine

CONFIG = RandKVConfig(budget=64, buffer_size=16, seed=5)
EXAMPLES = 30  # per route: about half a minute of requests on the tiny model

RANDKV_FIELDS = {
    "type": "object",
    "properties": {
        "randkv_key": {
            "anyOf": [
                {"type": "string", "maxLength": 8},
                {"type": "integer", "minimum": -3, "maximum": 2**64 + 3},
                {"type": "number"},
                {"type": "boolean"},
                {"type": "array", "items": {"type": "integer"}, "maxItems": 2},
            ]
        },
        "randkv_budget": {
            "anyOf": [
                {"type": "integer", "minimum": -2, "maximum": 80},
                {"type": "boolean"},
                {"type": "string", "maxLength": 3},
            ]
        },
        "randkv_other": {"type": "integer"},
    },
    "additionalProperties": False,
}
SAMPLING = {
    "max_tokens": {"type": "integer", "minimum": 1, "maximum": 40},
    "temperature": {"type": "number", "minimum": 0, "maximum": 2},
    "n": {"type": "integer", "minimum": 1, "maximum": 3},
    "stream": {"type": "boolean"},
    "ignore_eos": {"type": "boolean"},
    "use_beam_search": {"type": "boolean"},
    "seed": {"type": "integer", "minimum": 0, "maximum": 1000},
    "vllm_xargs": RANDKV_FIELDS,
}
BODIES = {
    "/v1/completions": {
        "prompt": {
            "anyOf": [
                {"type": "string", "minLength": 1, "maxLength": 90},
                {
                    "type": "array",
                    "items": {"type": "integer", "minimum": 1, "maximum": 255},
                    "minItems": 1,
                    "maxItems": 90,
                },
            ]
        },
        "logprobs": {"type": "integer", "minimum": 0, "maximum": 3},
        **SAMPLING,
    },
    "/v1/chat/completions": {
        "messages": {
            "type": "array",
            "minItems": 1,
            "maxItems": 3,
            "items": {
                "type": "object",
                "properties": {
                    "role": {"enum": ["user", "assistant"]},
                    "content": {"type": "string", "maxLength": 40},
                },
                "required": ["role", "content"],
                "additionalProperties": False,
            },
        },
        "logprobs": {"type": "boolean"},
        **SAMPLING,
    },
}
REQUIRED = {"/v1/completions": ["model", "prompt"], "/v1/chat/completions": ["model", "messages"]}

#: What RandKV answers with 400 where plain vLLM serves the request.
RANDKV_REFUSALS = (
    "exceeds the RandKV budget",
    "a request key must be",
    "randkv_budget must be",
    "unknown RandKV request field",
    "beam search of",
)


def tightened(schema: dict[str, Any]) -> dict[str, Any]:
    """The app's schema with only the fuzzed routes, their bodies narrowed to the fields
    above (each must still exist in the app's own request model)."""
    out = copy.deepcopy(schema)
    out["paths"] = {}
    for path, fields in BODIES.items():
        operation = copy.deepcopy(schema["paths"][path]["post"])
        ref = operation["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        model = schema["components"]["schemas"][ref.rsplit("/", 1)[1]]
        missing = set(fields) - set(model["properties"])
        assert not missing, f"{path} no longer takes {missing}"
        body = {
            "type": "object",
            "properties": {"model": {"enum": [SERVED_MODEL_NAME]}, **fields},
            "required": REQUIRED[path],
            "additionalProperties": False,
        }
        operation["requestBody"]["content"]["application/json"]["schema"] = body
        operation.pop("responses", None)
        out["paths"][path] = {"post": operation}
    return out


@pytest.fixture(scope="module")
def servers(tiny_model_path, tmp_path_factory):
    logs = tmp_path_factory.mktemp("fuzz")
    args = {**ENGINE_ARGS, "max_model_len": 512}
    with (
        running_server(str(tiny_model_path), CONFIG, args, logs / "randkv.log") as randkv,
        running_server(str(tiny_model_path), None, args, logs / "plain.log") as plain,
    ):
        yield randkv, plain


@pytest.fixture(scope="module")
def fuzzed_schema(servers):
    randkv, _ = servers
    raw = httpx.get(f"{randkv.base_url}/openapi.json", timeout=30).json()
    return schemathesis.openapi.from_dict(tightened(raw))


def _outcome(response: Any) -> tuple[int, str]:
    text = response.text
    if response.status_code == 200 and "text/event-stream" in response.headers.get(
        "content-type", ""
    ):
        assert text.rstrip().endswith("data: [DONE]"), f"a cut stream: {text[-300:]}"
    return response.status_code, text


def test_fuzzed_requests_get_plain_vllms_answers_or_randkvs_400(servers, fuzzed_schema):
    randkv, plain = servers
    before = randkv.metrics()
    seen: Counter[str] = Counter()
    vllm_own_failures: list[str] = []

    for path in BODIES:
        strategy = fuzzed_schema[path]["POST"].as_strategy()

        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(strategy)
        def check(case: Any) -> None:
            ours_status, ours = _outcome(case.call(base_url=randkv.base_url, timeout=120))
            theirs_status, theirs = _outcome(case.call(base_url=plain.base_url, timeout=120))
            body = json.dumps(case.body)[:300]
            if ours_status >= 500:
                assert theirs_status == ours_status, f"RandKV {ours_status} on {body}: {ours}"
                vllm_own_failures.append(f"{ours_status} {body}")
            if ours_status == theirs_status:
                seen[f"same {ours_status}"] += 1
                return
            assert ours_status == 400 and theirs_status == 200, (
                f"RandKV {ours_status} vs plain vLLM {theirs_status} on {body}: {ours[:300]}"
            )
            assert any(reason in ours for reason in RANDKV_REFUSALS), ours[:300]
            seen["randkv 400"] += 1

        check()

    assert seen["same 200"] > 20 and seen["randkv 400"] > 5, seen
    assert not vllm_own_failures, vllm_own_failures
    # The engine still serves, and every block is back.
    assert httpx.get(f"{randkv.base_url}/health", timeout=10).status_code == 200
    after = randkv.metrics()
    assert after["randkv:kv_blocks_held"] == 0
    assert after["randkv:rounds_total"] > before["randkv:rounds_total"]
