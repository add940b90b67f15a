"""Structural OpenAPI v3 validation, pruning and defaulting of custom resources, with the messages
a real API server gives ("spec.contentType: Unsupported value: ...")."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from cdi.embedded.kubeapi.errors import Cause

Schema = Mapping[str, Any]


@dataclass
class Outcome:
    value: Any
    causes: list[Cause] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)


_TYPE_NAMES = {bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "object"}


def _type_name(value: Any) -> str:
    name = _TYPE_NAMES.get(type(value))
    if name is not None:
        return name
    return "object" if isinstance(value, Mapping) else "null"


def _fits(value: Any, type_: str) -> bool:
    actual = _type_name(value)
    return actual == type_ or (type_ == "number" and actual == "integer")


def _show(value: Any) -> str:
    return json.dumps(value) if isinstance(value, str) else json.dumps(value, default=str)


@lru_cache(maxsize=256)
def _regex(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


def validate(schema: Schema, value: Any, *, path: str = "", skip_root_metadata: bool = True) -> Outcome:
    """Prune unknown fields, apply defaults and collect every violation (not just the first)."""
    out = Outcome(None)
    out.value = _walk(schema, value, path, out, root=skip_root_metadata)
    return out


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _walk(schema: Schema, value: Any, path: str, out: Outcome, root: bool = False) -> Any:
    if value is None:
        if schema.get("nullable"):
            return None
        return None
    if schema.get("x-kubernetes-int-or-string"):
        if not isinstance(value, (int, str)) or isinstance(value, bool):
            out.causes.append(Cause(path, f"Invalid value: \"{_type_name(value)}\": {path} in body must be "
                                          f"of type integer,string: \"{_type_name(value)}\"", "FieldValueTypeInvalid"))
        elif isinstance(value, str) and "pattern" in schema and not _regex(schema["pattern"]).search(value):
            out.causes.append(Cause(path, f"Invalid value: {_show(value)}: {path} in body should match "
                                          f"'{schema['pattern']}'"))
        return value
    type_ = schema.get("type")
    if type_ and not _fits(value, type_):
        out.causes.append(Cause(path, f"Invalid value: \"{_type_name(value)}\": {path} in body must be of type "
                                      f"{type_}: \"{_type_name(value)}\"", "FieldValueTypeInvalid"))
        return value
    if "enum" in schema and value not in schema["enum"]:
        supported = ", ".join(_show(v) for v in schema["enum"])
        out.causes.append(Cause(path, f"Unsupported value: {_show(value)}: supported values: {supported}",
                                "FieldValueNotSupported"))
    if isinstance(value, str):
        _check_string(schema, value, path, out)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        _check_number(schema, value, path, out)
    elif isinstance(value, list):
        return _walk_array(schema, value, path, out)
    elif isinstance(value, Mapping):
        return _walk_object(schema, value, path, out, root)
    return value


def _check_string(schema: Schema, value: str, path: str, out: Outcome) -> None:
    if "pattern" in schema and not _regex(schema["pattern"]).search(value):
        out.causes.append(Cause(path, f"Invalid value: {_show(value)}: {path} in body should match "
                                      f"'{schema['pattern']}'"))
    if "minLength" in schema and len(value) < schema["minLength"]:
        out.causes.append(Cause(path, f"Invalid value: {_show(value)}: {path} in body should be at least "
                                      f"{schema['minLength']} chars long"))
    if "maxLength" in schema and len(value) > schema["maxLength"]:
        out.causes.append(Cause(path, f"Too long: may not be longer than {schema['maxLength']}", "FieldValueTooLong"))


def _check_number(schema: Schema, value: float, path: str, out: Outcome) -> None:
    if "minimum" in schema and value < schema["minimum"]:
        out.causes.append(Cause(path, f"Invalid value: {value}: {path} in body should be greater than or equal "
                                      f"to {schema['minimum']}"))
    if "maximum" in schema and value > schema["maximum"]:
        out.causes.append(Cause(path, f"Invalid value: {value}: {path} in body should be less than or equal "
                                      f"to {schema['maximum']}"))


def _walk_array(schema: Schema, value: list[Any], path: str, out: Outcome) -> list[Any]:
    if "maxItems" in schema and len(value) > schema["maxItems"]:
        out.causes.append(Cause(path, f"Too many: {len(value)}: must have at most {schema['maxItems']} items",
                                "FieldValueTooMany"))
    if "minItems" in schema and len(value) < schema["minItems"]:
        out.causes.append(Cause(path, f"Invalid value: {len(value)}: {path} in body should have at least "
                                      f"{schema['minItems']} items"))
    items = schema.get("items")
    if not isinstance(items, Mapping):
        return value
    return [_walk(items, item, f"{path}[{i}]", out) for i, item in enumerate(value)]


def _walk_object(schema: Schema, value: Mapping[str, Any], path: str, out: Outcome, root: bool) -> dict[str, Any]:
    properties: Mapping[str, Schema] = schema.get("properties") or {}
    additional = schema.get("additionalProperties")
    preserve = bool(schema.get("x-kubernetes-preserve-unknown-fields"))
    result: dict[str, Any] = {}
    for key, item in value.items():
        sub = _join(path, key)
        if root and key in ("apiVersion", "kind", "metadata"):
            result[key] = item
        elif key in properties:
            result[key] = _walk(properties[key], item, sub, out)
        elif isinstance(additional, Mapping):
            result[key] = _walk(additional, item, f"{path}[{key}]", out)
        elif additional is True or preserve:
            result[key] = item
        else:
            out.unknown.append(sub)
    for key, prop in properties.items():
        if key not in result and "default" in prop:
            result[key] = json.loads(json.dumps(prop["default"]))
    for key in schema.get("required") or []:
        if result.get(key) is None:
            out.causes.append(Cause(_join(path, key), "Required value", "FieldValueRequired"))
    return result
