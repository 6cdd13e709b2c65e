"""The versioned JSON schema of `randkv bench serve` results.

Bump SCHEMA_VERSION on any change a reader would notice (renamed or removed field, changed
meaning or unit); adding an optional field does not need a bump.

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

from typing import Any

SCHEMA_NAME = "randkv.bench.serve"
SCHEMA_VERSION = 2

_NUMBER = {"type": "number"}
_COUNT = {"type": "integer", "minimum": 0}
_NONNEG = {"type": "number", "minimum": 0}
_PERCENTILES = {
    "type": "object",
    "required": ["mean", "p50", "p90", "p99"],
    "properties": {key: _NONNEG for key in ("mean", "p50", "p90", "p99")},
    "additionalProperties": False,
}
_SERIES = {"type": "array", "items": _NUMBER}

ARM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": [
        "randkv",
        "requests_sent",
        "requests_completed",
        "requests_failed",
        "output_tokens",
        "duration_s",
        "output_tokens_per_s",
        "running_requests_mean",
        "running_requests_peak",
        "preemptions",
        "kv_blocks_peak",
        "kv_blocks_mean",
        "ttft_s",
        "itl_s",
        "eviction",
        "timeline",
    ],
    "properties": {
        "randkv": {"type": ["object", "null"]},
        "scheduling": {"enum": ["async", "sync", None]},  # optional: as vLLM ran the arm
        "requests_sent": _COUNT,
        "requests_completed": _COUNT,
        "requests_failed": _COUNT,
        "output_tokens": _COUNT,
        "duration_s": _NONNEG,
        "output_tokens_per_s": _NONNEG,
        "running_requests_mean": _NONNEG,
        "running_requests_peak": _NONNEG,
        "preemptions": _COUNT,
        "kv_blocks_peak": _COUNT,
        "kv_blocks_mean": _NONNEG,
        "ttft_s": _PERCENTILES,
        "itl_s": _PERCENTILES,  # over requests, each (last - first token time) / (tokens - 1)
        "eviction": {
            "type": ["object", "null"],
            "required": [
                "rounds",
                "planning_s",
                "compaction_s",
                "step_s",
                "share_of_step_time",
            ],
            "properties": {
                "rounds": _COUNT,
                "planning_s": _NONNEG,
                "compaction_s": _NONNEG,
                "step_s": _NONNEG,
                "share_of_step_time": {"type": "number", "minimum": 0, "maximum": 1},
            },
        },
        "outputs": {  # optional (`keep_outputs`): what each request generated
            "type": "array",
            "items": {
                "type": "object",
                "required": ["index", "token_ids", "text"],
                "properties": {
                    "index": {"type": "integer"},
                    "token_ids": {"type": "array", "items": _COUNT},
                    "text": {"type": "string"},
                },
            },
        },
        "timeline": {
            "type": "object",
            "required": ["t_s", "running_requests", "waiting_requests", "kv_blocks"],
            "properties": {
                "t_s": _SERIES,
                "running_requests": _SERIES,
                "waiting_requests": _SERIES,
                "kv_blocks": _SERIES,
            },
        },
    },
}

RUN_SCHEMA: dict[str, Any] = {
    "allOf": [ARM_SCHEMA],
    "required": ["repeat", "position"],
    "properties": {"repeat": _COUNT, "position": _COUNT},
}

_MAYBE_NUMBER = {"type": ["number", "null"]}
_SPREAD = {
    "type": "object",
    "required": ["median", "min", "max", "values"],
    "properties": {
        "median": _MAYBE_NUMBER,
        "min": _MAYBE_NUMBER,
        "max": _MAYBE_NUMBER,
        "values": {"type": "array", "items": _MAYBE_NUMBER, "minItems": 1},
    },
    "additionalProperties": False,
}
SUMMARY_METRICS = ("output_tokens_per_s", "ttft_p50_s", "itl_p50_s")
_SUMMARY_GROUP = {
    "type": "object",
    "required": list(SUMMARY_METRICS),
    "properties": {metric: _SPREAD for metric in SUMMARY_METRICS},
}


def _per_arm(schema: dict[str, Any]) -> dict[str, Any]:
    """An object with one `schema` entry for each iso-memory arm, plain and RandKV."""
    return {
        "type": "object",
        "required": ["plain", "randkv"],
        "properties": {"plain": schema, "randkv": schema},
        "additionalProperties": False,
    }


_REFERENCE = {
    "type": "object",
    "required": ["pool_blocks", "runs", "arm", "summary", "share_of_throughput", "preempted"],
    "properties": {
        "pool_blocks": _COUNT,
        "runs": {"type": "array", "items": RUN_SCHEMA, "minItems": 1},
        "arm": ARM_SCHEMA,
        "summary": _SUMMARY_GROUP,
        "share_of_throughput": _per_arm(_SPREAD),
        "preempted": {"type": "boolean"},
    },
    "additionalProperties": False,
}

SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "randkv bench serve result",
    "type": "object",
    "required": [
        "schema",
        "schema_version",
        "created",
        "machine",
        "versions",
        "model",
        "engine",
        "workload",
        "repeats",
        "order",
        "runs",
        "summary",
        "representative_repeat",
        "arms",
        "ratios",
        "targets",
    ],
    "properties": {
        "schema": {"const": SCHEMA_NAME},
        "schema_version": {"const": SCHEMA_VERSION},
        "created": {"type": "string"},
        "machine": {"type": "object"},
        "versions": {
            "type": "object",
            "required": ["randkv", "vllm", "torch"],
            "properties": {key: {"type": "string"} for key in ("randkv", "vllm", "torch")},
        },
        "model": {"type": "string"},
        "engine": {
            "type": "object",
            "required": ["pool_blocks", "block_size", "max_num_seqs", "max_model_len", "dtype"],
        },
        "workload": {
            "type": "object",
            "required": ["requests", "prompt_tokens", "output_tokens", "seed"],
        },
        "repeats": {"type": "integer", "minimum": 1},
        "order": {"type": "array", "items": {"enum": ["plain", "randkv", "ample"]}},
        "runs": _per_arm({"type": "array", "items": RUN_SCHEMA, "minItems": 1}),
        "summary": {
            "type": "object",
            "required": ["plain", "randkv", "ratio"],
            "properties": {group: _SUMMARY_GROUP for group in ("plain", "randkv", "ratio")},
            "additionalProperties": False,
        },
        "representative_repeat": _COUNT,
        "reference": _REFERENCE,
        "arms": _per_arm(ARM_SCHEMA),
        "ratios": {
            "type": "object",
            "required": [
                "output_tokens_per_s",
                "running_requests_mean",
                "kv_blocks_peak",
                "ttft_p50",
                "itl_p50",
            ],
            "properties": {
                key: {"type": ["number", "null"]}
                for key in (
                    "output_tokens_per_s",
                    "running_requests_mean",
                    "kv_blocks_peak",
                    "ttft_p50",
                    "itl_p50",
                )
            },
        },
        "targets": {
            "type": "object",
            "required": [
                "min_throughput_ratio",
                "max_eviction_share",
                "plain_preempted",
                "met",
            ],
            "properties": {
                "min_throughput_ratio": _NUMBER,
                "max_eviction_share": _NUMBER,
                "plain_preempted": {"type": "boolean"},
                "met": {"type": "boolean"},
                "judged_on": {"type": "string"},
            },
        },
    },
}


def validate(result: dict[str, Any]) -> None:
    """Raise jsonschema.ValidationError when `result` does not follow SCHEMA."""
    import jsonschema

    jsonschema.validate(result, SCHEMA)
