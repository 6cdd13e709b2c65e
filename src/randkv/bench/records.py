"""Typed results written as JSON: frozen dataclasses in memory, plain JSON on disk, and the
JSON Schema read off the same dataclasses.

- `to_json(record)`: a dataclass tree (dataclasses, lists, tuples, dicts, numbers, strings,
  None) as JSON values, fields in declaration order.
- `from_json(Type, data)`: the dataclass tree back, every value checked against its
  annotation (unknown keys and missing required fields are errors).
- `json_schema(Type)`: the JSON Schema (draft 2020-12) of what `to_json` writes.

The rules, one per notion of the schema:
- a field without a default is required; one with a default may be missing (older files);
- a field whose metadata is `OMITTED_WHEN_NONE` is left out while it is None;
- an object has exactly its dataclass's fields (`additionalProperties: false`);
- `Annotated[T, Schema(...)]` adds keywords to T's schema (`Count`: an integer >= 0);
- `Literal[...]` is an enum (a const for one value); `X | None` is X or null;
- `tuple[X, Y]` is an array of exactly those items, `tuple[X, ...]` and `list[X]` arrays;
- `dict[str, X]` is an object of X values; `Json` is any JSON value.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal, TypeAlias, TypeVar, Union, get_args, get_origin

#: Any JSON value (read-only containers, so a `dict[str, int]` is one too).
Json: TypeAlias = None | bool | int | float | str | Sequence["Json"] | Mapping[str, "Json"]
#: A JSON object, as `to_json` builds one.
JsonObject: TypeAlias = dict[str, Json]

#: Field metadata: leave the field out of the JSON while its value is None.
OMITTED_WHEN_NONE: Mapping[str, bool] = types.MappingProxyType({"omitted_when_none": True})

Record = TypeVar("Record")


class Schema:
    """JSON Schema keywords for `Annotated[T, Schema(minimum=0)]`."""

    def __init__(self, **keywords: Json) -> None:
        self.keywords = keywords

    def __repr__(self) -> str:
        return f"Schema({self.keywords!r})"

    def check(self, value: object, path: str) -> None:
        """Raise ValueError when `value` breaks a bound (minimum, maximum, minItems)."""
        low, high = self.keywords.get("minimum"), self.keywords.get("maximum")
        if isinstance(value, int | float) and isinstance(low, int | float) and value < low:
            raise ValueError(f"{path}: {value!r} is below the minimum {low}")
        if isinstance(value, int | float) and isinstance(high, int | float) and value > high:
            raise ValueError(f"{path}: {value!r} is above the maximum {high}")
        least = self.keywords.get("minItems")
        if isinstance(value, list | tuple) and isinstance(least, int) and len(value) < least:
            raise ValueError(f"{path}: {len(value)} items, fewer than {least}")


#: An integer >= 0 (counts, indices).
Count: TypeAlias = Annotated[int, Schema(minimum=0)]
#: A number >= 0 (seconds, rates, means).
NonNegative: TypeAlias = Annotated[float, Schema(minimum=0)]
#: A number in [0, 1].
Share: TypeAlias = Annotated[float, Schema(minimum=0, maximum=1)]


# --------------------------------------------------------------------------- to JSON


def to_json(value: object) -> Json:
    """`value` (a dataclass tree) as JSON values."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out: JsonObject = {}
        for spec in dataclasses.fields(value):
            item = getattr(value, spec.name)
            if item is None and spec.metadata.get("omitted_when_none"):
                continue
            out[spec.name] = to_json(item)
        return out
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        return [to_json(item) for item in value]
    if isinstance(value, Mapping):
        if not all(isinstance(key, str) for key in value):
            raise TypeError(f"JSON object keys must be strings, got {list(value)!r}")
        return {key: to_json(item) for key, item in value.items()}
    raise TypeError(f"{type(value).__name__} is not JSON: {value!r}")


# --------------------------------------------------------------------------- from JSON


def from_json(kind: type[Record], data: object) -> Record:
    """The `kind` record that `data` (parsed JSON) describes; ValueError when it does not
    match the annotations (the message names the path of the first mismatch)."""
    return typing.cast(Record, _load(kind, data, "$"))


def _load(kind: Any, data: object, path: str) -> object:
    if kind is Any or _is_json(kind):
        _check_json(data, path)
        return data
    origin, args = get_origin(kind), get_args(kind)
    if origin is Annotated:
        value = _load(args[0], data, path)
        for note in args[1:]:
            if isinstance(note, Schema):
                note.check(value, path)
        return value
    if origin is Literal:
        if data in args and type(data) in {type(a) for a in args}:
            return data
        raise ValueError(f"{path}: {data!r} is not one of {list(args)!r}")
    if origin in (Union, types.UnionType):
        if data is None and type(None) in args:
            return None
        errors = []
        for option in (a for a in args if a is not type(None)):
            try:
                return _load(option, data, path)
            except ValueError as error:
                errors.append(str(error))
        raise ValueError("; ".join(errors))
    if kind is type(None):
        if data is None:
            return None
        raise ValueError(f"{path}: expected null, got {data!r}")
    if kind is bool:
        if isinstance(data, bool):
            return data
        raise ValueError(f"{path}: expected a boolean, got {data!r}")
    if kind is int:
        if isinstance(data, int) and not isinstance(data, bool):
            return data
        raise ValueError(f"{path}: expected an integer, got {data!r}")
    if kind is float:
        if isinstance(data, int | float) and not isinstance(data, bool):
            return float(data)
        raise ValueError(f"{path}: expected a number, got {data!r}")
    if kind is str:
        if isinstance(data, str):
            return data
        raise ValueError(f"{path}: expected a string, got {data!r}")
    if origin in (list, tuple):
        if not isinstance(data, list):
            raise ValueError(f"{path}: expected an array, got {data!r}")
        if origin is list or (len(args) == 2 and args[1] is Ellipsis):
            items = [_load(args[0], item, f"{path}[{i}]") for i, item in enumerate(data)]
            return items if origin is list else tuple(items)
        if len(data) != len(args):
            raise ValueError(f"{path}: expected {len(args)} items, got {len(data)}")
        pairs = enumerate(zip(args, data, strict=True))
        return tuple(_load(a, item, f"{path}[{i}]") for i, (a, item) in pairs)
    if origin is dict:
        if not isinstance(data, dict):
            raise ValueError(f"{path}: expected an object, got {data!r}")
        return {key: _load(args[1], item, f"{path}.{key}") for key, item in data.items()}
    record = origin if origin is not None else kind
    if dataclasses.is_dataclass(record):
        return _load_record(record, args, data, path)
    raise TypeError(f"{path}: cannot read {kind!r} from JSON")


def _load_record(record: Any, args: tuple[Any, ...], data: object, path: str) -> object:
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected an object, got {data!r}")
    hints = _field_types(record, args)
    unknown = set(data) - set(hints)
    if unknown:
        raise ValueError(f"{path}: unknown fields {sorted(unknown)} for {record.__name__}")
    values = {}
    for spec in dataclasses.fields(record):
        if spec.name in data:
            values[spec.name] = _load(hints[spec.name], data[spec.name], f"{path}.{spec.name}")
        elif _required(spec):
            raise ValueError(f"{path}: {record.__name__} needs {spec.name!r}")
    try:
        return record(**values)
    except (TypeError, ValueError) as error:  # the record's own checks (__post_init__)
        raise ValueError(f"{path}: {error}") from error


def _check_json(data: object, path: str) -> None:
    if data is None or isinstance(data, bool | int | float | str):
        return
    if isinstance(data, list):
        for i, item in enumerate(data):
            _check_json(item, f"{path}[{i}]")
    elif isinstance(data, dict) and all(isinstance(key, str) for key in data):
        for key, item in data.items():
            _check_json(item, f"{path}.{key}")
    else:
        raise ValueError(f"{path}: {data!r} is not JSON")


# --------------------------------------------------------------------------- JSON Schema

_SIMPLE = {type(None): "null", bool: "boolean", int: "integer", float: "number", str: "string"}


def json_schema(kind: Any) -> JsonObject:
    """The JSON Schema of the JSON that `to_json` writes for a `kind` value."""
    if kind is Any or _is_json(kind):
        return {}
    if kind in _SIMPLE:
        return {"type": _SIMPLE[kind]}
    origin, args = get_origin(kind), get_args(kind)
    if origin is Annotated:
        extra: JsonObject = {}
        for note in args[1:]:
            if isinstance(note, Schema):
                extra.update(note.keywords)
        return {**json_schema(args[0]), **extra}
    if origin is Literal:
        return {"const": args[0]} if len(args) == 1 else {"enum": list(args)}
    if origin in (Union, types.UnionType):
        return _union(args)
    if origin in (list, tuple):
        if origin is list or (len(args) == 2 and args[1] is Ellipsis):
            return {"type": "array", "items": json_schema(args[0])}
        return {
            "type": "array",
            "prefixItems": [json_schema(a) for a in args],
            "minItems": len(args),
            "maxItems": len(args),
        }
    if origin is dict:
        values = json_schema(args[1])
        return {"type": "object", **({"additionalProperties": values} if values else {})}
    record = origin if origin is not None else kind
    if isinstance(record, type) and dataclasses.is_dataclass(record):
        hints = _field_types(record, args)
        specs = dataclasses.fields(record)
        return {
            "type": "object",
            "required": [spec.name for spec in specs if _required(spec)],
            "properties": {spec.name: json_schema(hints[spec.name]) for spec in specs},
            "additionalProperties": False,
        }
    raise TypeError(f"no JSON Schema for {kind!r}")


def _union(args: tuple[Any, ...]) -> JsonObject:
    """`X | None` as X's schema that also takes null; other unions as anyOf."""
    options = [json_schema(a) for a in args]
    if all(set(o) == {"type"} and isinstance(o["type"], str) for o in options):
        return {"type": [o["type"] for o in options]}
    nulls = [o for o in options if o == {"type": "null"}]
    rest = [o for o in options if o != {"type": "null"}]
    if nulls and len(rest) == 1:
        only = rest[0]
        if set(only) == {"enum"} and isinstance(only["enum"], list):
            return {"enum": [*only["enum"], None]}
        if set(only) == {"const"}:
            return {"enum": [only["const"], None]}
    alternatives: list[Json] = list(options)
    return {"anyOf": alternatives}


# --------------------------------------------------------------------------- helpers


def _is_json(kind: Any) -> bool:
    """Whether `kind` is `Json` (read by its members: `typing.get_type_hints` may rebuild
    the recursive alias)."""
    if get_origin(kind) not in (Union, types.UnionType):
        return False
    members = get_args(kind)
    return set(_SIMPLE) <= set(members) and {get_origin(m) for m in members} >= {Sequence, Mapping}


def _required(spec: dataclasses.Field[Any]) -> bool:
    return spec.default is dataclasses.MISSING and spec.default_factory is dataclasses.MISSING


@functools.cache
def _hints(record: type) -> dict[str, Any]:
    return typing.get_type_hints(record, include_extras=True)


def _field_types(record: type, args: tuple[Any, ...]) -> dict[str, Any]:
    """The field annotations of `record`, its type parameters replaced by `args`."""
    hints = _hints(record)
    parameters = getattr(record, "__parameters__", ())
    if not parameters:
        return hints
    mapping = dict(zip(parameters, args, strict=True))
    return {name: _substitute(hint, mapping) for name, hint in hints.items()}


def _substitute(kind: Any, mapping: dict[Any, Any]) -> Any:
    if isinstance(kind, TypeVar):
        return mapping[kind]
    origin, args = get_origin(kind), get_args(kind)
    if not args:
        return kind
    if origin is Annotated:
        return Annotated[(_substitute(args[0], mapping), *args[1:])]
    replaced = tuple(_substitute(a, mapping) for a in args)
    if origin in (Union, types.UnionType):
        return functools.reduce(operator.or_, replaced)
    return origin[replaced] if len(replaced) > 1 else origin[replaced[0]]


__all__ = [
    "OMITTED_WHEN_NONE",
    "Count",
    "Json",
    "JsonObject",
    "NonNegative",
    "Schema",
    "Share",
    "from_json",
    "json_schema",
    "to_json",
]
