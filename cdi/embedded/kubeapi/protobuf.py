"""Decoding of Kubernetes' protobuf request bodies for the built-in kinds kubectl's generators create
(`kubectl create namespace|configmap|secret|serviceaccount|service|role|...` send protobuf and do not
fall back to JSON). Responses stay JSON, which those clients also accept.

The envelope is the 4-byte magic `k8s\\0` then a `runtime.Unknown` message whose `raw` field holds
the typed object; field numbers are those of k8s.io/api's generated.proto files."""

from __future__ import annotations

import base64
import datetime
from typing import Any

from cdi.embedded.kubeapi.errors import StatusError

MAGIC = b"k8s\x00"

# field number -> (json name, type); a type is a scalar name, a message name, ("map", key, value) or
# [element type] for repeated fields.
_S, _B, _I, _BOOL = "string", "bytes", "int", "bool"
_SCHEMAS: dict[str, dict[int, tuple[str, Any]]] = {
    "Unknown": {1: ("typeMeta", "TypeMeta"), 2: ("raw", _B), 3: ("contentEncoding", _S), 4: ("contentType", _S)},
    "TypeMeta": {1: ("apiVersion", _S), 2: ("kind", _S)},
    "ObjectMeta": {1: ("name", _S), 2: ("generateName", _S), 3: ("namespace", _S), 5: ("uid", _S),
                   6: ("resourceVersion", _S), 7: ("generation", _I), 8: ("creationTimestamp", "Time"),
                   9: ("deletionTimestamp", "Time"), 10: ("deletionGracePeriodSeconds", _I),
                   11: ("labels", ("map", _S, _S)), 12: ("annotations", ("map", _S, _S)),
                   13: ("ownerReferences", ["OwnerReference"]), 14: ("finalizers", [_S])},
    "OwnerReference": {5: ("apiVersion", _S), 1: ("kind", _S), 3: ("name", _S), 4: ("uid", _S),
                       6: ("controller", _BOOL), 7: ("blockOwnerDeletion", _BOOL)},
    "Time": {1: ("seconds", _I), 2: ("nanos", _I)},
    "LabelSelector": {1: ("matchLabels", ("map", _S, _S)), 2: ("matchExpressions", ["LabelSelectorRequirement"])},
    "LabelSelectorRequirement": {1: ("key", _S), 2: ("operator", _S), 3: ("values", [_S])},
    "Namespace": {1: ("metadata", "ObjectMeta"), 2: ("spec", "NamespaceSpec")},
    "NamespaceSpec": {1: ("finalizers", [_S])},
    "ConfigMap": {1: ("metadata", "ObjectMeta"), 4: ("immutable", _BOOL), 2: ("data", ("map", _S, _S)),
                  3: ("binaryData", ("map", _S, _B))},
    "Secret": {1: ("metadata", "ObjectMeta"), 5: ("immutable", _BOOL), 2: ("data", ("map", _S, _B)),
               4: ("stringData", ("map", _S, _S)), 3: ("type", _S)},
    "ServiceAccount": {1: ("metadata", "ObjectMeta"), 2: ("secrets", ["ObjectReference"]),
                       3: ("imagePullSecrets", ["LocalObjectReference"]),
                       4: ("automountServiceAccountToken", _BOOL)},
    "ObjectReference": {1: ("kind", _S), 2: ("namespace", _S), 3: ("name", _S), 4: ("uid", _S),
                        5: ("apiVersion", _S), 6: ("resourceVersion", _S), 7: ("fieldPath", _S)},
    "LocalObjectReference": {1: ("name", _S)},
    "Service": {1: ("metadata", "ObjectMeta"), 2: ("spec", "ServiceSpec")},
    "ServiceSpec": {1: ("ports", ["ServicePort"]), 2: ("selector", ("map", _S, _S)), 3: ("clusterIP", _S),
                    18: ("clusterIPs", [_S]), 4: ("type", _S), 5: ("externalIPs", [_S]),
                    7: ("sessionAffinity", _S), 10: ("externalName", _S), 19: ("ipFamilies", [_S]),
                    17: ("ipFamilyPolicy", _S), 22: ("internalTrafficPolicy", _S)},
    "ServicePort": {1: ("name", _S), 2: ("protocol", _S), 6: ("appProtocol", _S), 3: ("port", _I),
                    4: ("targetPort", "IntOrString"), 5: ("nodePort", _I)},
    "IntOrString": {1: ("type", _I), 2: ("intVal", _I), 3: ("strVal", _S)},
    "ResourceQuota": {1: ("metadata", "ObjectMeta"), 2: ("spec", "ResourceQuotaSpec")},
    "ResourceQuotaSpec": {1: ("hard", ("map", _S, "Quantity")), 2: ("scopes", [_S]),
                          3: ("scopeSelector", "ScopeSelector")},
    "ScopeSelector": {1: ("matchExpressions", ["ScopedResourceSelectorRequirement"])},
    "ScopedResourceSelectorRequirement": {1: ("scopeName", _S), 2: ("operator", _S), 3: ("values", [_S])},
    "Quantity": {1: ("string", _S)},
    "Role": {1: ("metadata", "ObjectMeta"), 2: ("rules", ["PolicyRule"])},
    "ClusterRole": {1: ("metadata", "ObjectMeta"), 2: ("rules", ["PolicyRule"]),
                    3: ("aggregationRule", "AggregationRule")},
    "AggregationRule": {1: ("clusterRoleSelectors", ["LabelSelector"])},
    "PolicyRule": {1: ("verbs", [_S]), 2: ("apiGroups", [_S]), 3: ("resources", [_S]), 4: ("resourceNames", [_S]),
                   5: ("nonResourceURLs", [_S])},
    "RoleBinding": {1: ("metadata", "ObjectMeta"), 2: ("subjects", ["Subject"]), 3: ("roleRef", "RoleRef")},
    "ClusterRoleBinding": {1: ("metadata", "ObjectMeta"), 2: ("subjects", ["Subject"]), 3: ("roleRef", "RoleRef")},
    "Subject": {1: ("kind", _S), 2: ("apiGroup", _S), 3: ("name", _S), 4: ("namespace", _S)},
    "RoleRef": {1: ("apiGroup", _S), 2: ("kind", _S), 3: ("name", _S)},
    # authorization.k8s.io/v1: `kubectl auth can-i` sends a SelfSubjectAccessReview
    "SelfSubjectAccessReview": {1: ("metadata", "ObjectMeta"), 2: ("spec", "SelfSubjectAccessReviewSpec")},
    "SelfSubjectAccessReviewSpec": {1: ("resourceAttributes", "ResourceAttributes"),
                                    2: ("nonResourceAttributes", "NonResourceAttributes")},
    "SubjectAccessReview": {1: ("metadata", "ObjectMeta"), 2: ("spec", "SubjectAccessReviewSpec")},
    "LocalSubjectAccessReview": {1: ("metadata", "ObjectMeta"), 2: ("spec", "SubjectAccessReviewSpec")},
    "SubjectAccessReviewSpec": {1: ("resourceAttributes", "ResourceAttributes"),
                                2: ("nonResourceAttributes", "NonResourceAttributes"), 3: ("user", _S),
                                4: ("groups", [_S]), 6: ("uid", _S)},
    "ResourceAttributes": {1: ("namespace", _S), 2: ("verb", _S), 3: ("group", _S), 4: ("version", _S),
                           5: ("resource", _S), 6: ("subresource", _S), 7: ("name", _S)},
    "NonResourceAttributes": {1: ("path", _S), 2: ("verb", _S)},
    # `kubectl auth can-i --list` sends a SelfSubjectRulesReview, `kubectl auth whoami` a SelfSubjectReview
    "SelfSubjectRulesReview": {1: ("metadata", "ObjectMeta"), 2: ("spec", "SelfSubjectRulesReviewSpec")},
    "SelfSubjectRulesReviewSpec": {1: ("namespace", _S)},
    "SelfSubjectReview": {1: ("metadata", "ObjectMeta")},
}


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data):
            raise ValueError("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def _fields(data: bytes) -> list[tuple[int, int, Any]]:
    out, pos = [], 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(data, pos)
        elif wire == 2:
            length, pos = _varint(data, pos)
            value, pos = data[pos:pos + length], pos + length
        elif wire == 1:
            value, pos = data[pos:pos + 8], pos + 8
        elif wire == 5:
            value, pos = data[pos:pos + 4], pos + 4
        else:
            raise ValueError(f"unsupported wire type {wire}")
        out.append((number, wire, value))
    return out


def _scalar(kind: str, value: Any) -> Any:
    if kind == _S:
        return bytes(value).decode()
    if kind == _B:
        return base64.b64encode(bytes(value)).decode()
    if kind == _BOOL:
        return bool(value)
    if kind == _I:
        return value - (1 << 64) if value >= 1 << 63 else value
    return _message(kind, bytes(value))


def _message(name: str, data: bytes) -> Any:
    schema = _SCHEMAS.get(name)
    if schema is None:
        raise ValueError(f"no protobuf schema for {name}")
    obj: dict[str, Any] = {}
    for number, _, value in _fields(data):
        if number not in schema:
            continue
        field, kind = schema[number]
        if isinstance(kind, list):
            obj.setdefault(field, []).append(_scalar(kind[0], value))
        elif isinstance(kind, tuple):
            entry = {n: v for n, _, v in _fields(bytes(value))}
            obj.setdefault(field, {})[_scalar(kind[1], entry.get(1, b""))] = _scalar(kind[2], entry.get(2, b""))
        else:
            scalar = _scalar(kind, value)
            if scalar not in ("", 0, False, None) or name in ("Time", "IntOrString", "Quantity"):
                obj[field] = scalar  # gogo writes empty scalars; JSON clients omit them (omitempty)
    return _finish(name, obj)


def _finish(name: str, obj: dict[str, Any]) -> Any:
    if name == "Time":
        stamp = datetime.datetime.fromtimestamp(obj.get("seconds", 0), datetime.UTC)
        return stamp.strftime("%Y-%m-%dT%H:%M:%SZ")
    if name == "IntOrString":
        return obj.get("strVal", "") if obj.get("type") == 1 else obj.get("intVal", 0)
    if name == "Quantity":
        return obj.get("string", "0")
    return obj


def decode(body: bytes) -> dict[str, Any]:
    if not body.startswith(MAGIC):
        raise StatusError(400, "the body of the request was not a Kubernetes protobuf message", "BadRequest")
    try:
        envelope = _message("Unknown", body[len(MAGIC):])
        type_meta = envelope.get("typeMeta") or {}
        kind = type_meta.get("kind", "")
        raw = base64.b64decode(envelope.get("raw", ""))
        obj = _message(kind, raw)
    except ValueError as exc:
        raise StatusError(415, f"the body of the request was in an unknown format: {exc} - accepted media types "
                               "include: application/json, application/yaml", "UnsupportedMediaType") from exc
    obj["apiVersion"], obj["kind"] = type_meta.get("apiVersion", ""), kind
    return obj
