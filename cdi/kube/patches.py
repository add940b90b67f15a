"""Building patches, so controllers send small, intention-revealing changes instead of whole objects.

A PUT of a whole object conflicts with every concurrent writer and silently drops fields our
structural schema does not know; a merge patch of just the fields we own does neither. Where order
matters (finalizers), a JSON patch with a `test` of the resourceVersion gives optimistic concurrency
without resending the object. Note the different answers to a stale object: a merge patch carrying
`metadata.resourceVersion` gets 409 `Conflict`, a JSON patch whose `test` fails gets 422 `Invalid`
(as from kube-apiserver)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

Obj = dict[str, Any]
JsonPatch = list[dict[str, Any]]
_MISSING: Any = object()


def merge_diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> Obj:
    """The JSON merge patch (RFC 7386) that turns `old` into `new`: changed keys, None for removed keys.

    Lists are replaced as a whole (that is what merge patches do)."""
    patch: Obj = {}
    for key in old:
        if key not in new:
            patch[key] = None
    for key, value in new.items():
        before = old.get(key, _MISSING)
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            sub = merge_diff(before, value)
            if sub:
                patch[key] = sub
        elif before is _MISSING or before != value:
            patch[key] = _plain(value)
    return patch


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def with_resource_version(patch: Mapping[str, Any], resource_version: str) -> Obj:
    """A merge patch that the server applies only if the object is still at `resource_version`
    (otherwise 409 Conflict)."""
    out = dict(patch)
    meta = dict(out.get("metadata") or {})
    meta["resourceVersion"] = resource_version
    out["metadata"] = meta
    return out


def add_finalizer_patch(obj: Mapping[str, Any], finalizer: str) -> JsonPatch:
    """JSON patch adding `finalizer` if missing, applied only if `obj` is unchanged ([] if present)."""
    meta = obj.get("metadata") or {}
    finalizers = list(meta.get("finalizers") or [])
    if finalizer in finalizers:
        return []
    ops: JsonPatch = [{"op": "test", "path": "/metadata/resourceVersion", "value": meta.get("resourceVersion")}]
    if finalizers:
        ops.append({"op": "add", "path": "/metadata/finalizers/-", "value": finalizer})
    else:
        ops.append({"op": "add", "path": "/metadata/finalizers", "value": [finalizer]})
    return ops


def remove_finalizer_patch(obj: Mapping[str, Any], finalizer: str) -> JsonPatch:
    """JSON patch removing `finalizer` if present, applied only if `obj` is unchanged ([] if absent)."""
    meta = obj.get("metadata") or {}
    finalizers = list(meta.get("finalizers") or [])
    if finalizer not in finalizers:
        return []
    return [{"op": "test", "path": "/metadata/resourceVersion", "value": meta.get("resourceVersion")},
            {"op": "remove", "path": f"/metadata/finalizers/{finalizers.index(finalizer)}"}]
