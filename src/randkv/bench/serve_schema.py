"""The versioned JSON Schema of `randkv bench serve` results, derived from the typed result
(`randkv.bench.serve_result`, where the versions are described) by
`randkv.bench.records.json_schema`. Only the document's own header is written here."""

from __future__ import annotations

import dataclasses

from randkv.bench.records import Json, JsonObject, from_json, json_schema
from randkv.bench.serve_result import (
    SCHEMA_NAME,
    SCHEMA_VERSION,
    ServeResult,
    SummaryGroup,
)

__all__ = ["SCHEMA", "SCHEMA_NAME", "SCHEMA_VERSION", "SUMMARY_METRICS", "load", "validate"]

SCHEMA: JsonObject = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "randkv bench serve result",
    **json_schema(ServeResult),
}

#: The metrics of the repeat summary (the fields of `SummaryGroup`).
SUMMARY_METRICS: tuple[str, ...] = tuple(spec.name for spec in dataclasses.fields(SummaryGroup))


def validate(result: Json) -> None:
    """Raise jsonschema.ValidationError when `result` (parsed JSON) does not follow SCHEMA."""
    import jsonschema

    jsonschema.validate(result, SCHEMA)


def load(document: Json) -> ServeResult:
    """A result file's JSON, validated against SCHEMA and read into a `ServeResult`."""
    validate(document)
    return from_json(ServeResult, document)
