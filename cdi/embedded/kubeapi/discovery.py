"""Discovery documents (/api, /apis, group versions) and the OpenAPI v3 index kubectl reads to
learn that the server supports server-side field validation."""

from __future__ import annotations

import hashlib
from typing import Any

from cdi.embedded.kubeapi.resources import Registry, ResourceType

KUBERNETES_VERSION = {"major": "1", "minor": "32", "gitVersion": "v1.32.0-cdi", "gitCommit": "cdi",
                      "gitTreeState": "clean", "buildDate": "2026-11-21T00:00:00Z", "goVersion": "python",
                      "compiler": "cpython", "platform": "linux/amd64"}

_SUB_VERBS = {"status": ["get", "patch", "update"], "log": ["get"], "finalize": ["update"], "binding": ["create"]}


def _resource_entries(rtype: ResourceType) -> list[dict[str, Any]]:
    entry: dict[str, Any] = {
        "name": rtype.plural, "singularName": rtype.singular_name, "namespaced": rtype.namespaced,
        "kind": rtype.kind, "verbs": list(rtype.verbs),
    }
    if rtype.short_names:
        entry["shortNames"] = list(rtype.short_names)
    if rtype.categories:
        entry["categories"] = list(rtype.categories)
    if not rtype.builtin:
        entry["storageVersionHash"] = hashlib.sha256(rtype.key.encode()).hexdigest()[:12]
    entries = [entry]
    for sub in rtype.subresources:
        entries.append({"name": f"{rtype.plural}/{sub}", "singularName": "", "namespaced": rtype.namespaced,
                        "kind": rtype.kind, "verbs": _SUB_VERBS.get(sub, ["get"])})
    return entries


def resource_list(registry: Registry, group: str, version: str) -> dict[str, Any] | None:
    types = registry.types_in(group, version)
    if not types:
        return None
    resources = [e for t in sorted(types, key=lambda t: t.plural) for e in _resource_entries(t)]
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": f"{group}/{version}" if group else version,
            "resources": resources}


def api_versions(server_address: str) -> dict[str, Any]:
    return {"kind": "APIVersions", "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}]}


def _group(name: str, versions: list[str]) -> dict[str, Any]:
    entries = [{"groupVersion": f"{name}/{v}", "version": v} for v in versions]
    return {"name": name, "versions": entries, "preferredVersion": entries[0]}


def group_list(registry: Registry, aggregated: list[tuple[str, list[str]]]) -> dict[str, Any]:
    groups = [_group(name, versions) for name, versions in registry.ordered_groups() + aggregated if name]
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


def group(registry: Registry, name: str, aggregated: list[tuple[str, list[str]]]) -> dict[str, Any] | None:
    for group_name, versions in registry.ordered_groups() + aggregated:
        if group_name == name:
            return {"kind": "APIGroup", "apiVersion": "v1", **_group(name, versions)}
    return None


def openapi_index(registry: Registry) -> dict[str, Any]:
    paths = {}
    for name, versions in registry.ordered_groups():
        for version in versions:
            prefix = f"apis/{name}/{version}" if name else f"api/{version}"
            digest = hashlib.sha256(",".join(sorted(t.plural + t.kind for t in registry.types_in(name, version)))
                                    .encode()).hexdigest()[:16].upper()
            paths[prefix] = {"serverRelativeURL": f"/openapi/v3/{prefix}?hash={digest}"}
    return {"paths": paths}


def openapi_group_version(registry: Registry, group_name: str, version: str) -> dict[str, Any] | None:
    types = registry.types_in(group_name, version)
    if not types:
        return None
    base = f"/apis/{group_name}/{version}" if group_name else f"/api/{version}"
    param = {"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": True},
             "description": "fieldValidation instructs the server on how to handle objects in the request "
                            "containing unknown or duplicate fields."}
    paths: dict[str, Any] = {}
    for rtype in types:
        gvk = {"group": group_name, "version": version, "kind": rtype.kind}
        ops = {"x-kubernetes-group-version-kind": gvk, "parameters": [param],
               "responses": {"200": {"description": "OK"}}}
        item = f"{base}/namespaces/{{namespace}}/{rtype.plural}/{{name}}" if rtype.namespaced else \
            f"{base}/{rtype.plural}/{{name}}"
        collection = item.rsplit("/", 1)[0]
        paths[item] = {"get": {**ops, "parameters": []}, "put": ops, "patch": ops, "delete": ops}
        paths[collection] = {"get": {**ops, "parameters": []}, "post": ops}
    return {"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": KUBERNETES_VERSION["gitVersion"]},
            "paths": paths, "components": {"schemas": {}}}


def _pb_field(number: int, payload: bytes) -> bytes:
    length, encoded = len(payload), b""
    while True:
        byte, length = length & 0x7F, length >> 7
        encoded += bytes([byte | (0x80 if length else 0)])
        if not length:
            break
    return bytes([number << 3 | 2]) + encoded + payload


def openapi_v2(protobuf: bool) -> bytes | dict[str, Any]:
    """A valid, schema-less OpenAPI v2 document. kubectl reads it (as gnostic protobuf) only to
    validate `kind: List` files on the client; types it does not find there it does not check, and the
    server validates each object anyway."""
    version = KUBERNETES_VERSION["gitVersion"]
    if not protobuf:
        return {"swagger": "2.0", "info": {"title": "Kubernetes", "version": version}, "paths": {},
                "definitions": {}}
    info = _pb_field(1, b"Kubernetes") + _pb_field(2, version.encode())
    return _pb_field(1, b"2.0") + _pb_field(2, info) + _pb_field(8, b"") + _pb_field(9, b"")
