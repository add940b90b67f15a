"""The `CDI` resource's `spec.customizeComponents`, as CDI's operator applies it to what it renders
before applying that to the cluster:

* `patches`: `{resourceName, resourceType, patch, type}` with `type` `json` (RFC 6902; a missing path is
  created on add and ignored on remove), `merge` (RFC 7386) or `strategic` (containers, volumes, env...
  merged by name); `resourceName`/`resourceType` match case-insensitively, `*` matches all. Only
  Deployments, Services, webhook configurations and APIServices are patched, as in CDI.
* `flags`: `api`, `controller`, `uploadProxy` maps of flag -> value, added to the command line of
  `cdi-apiserver`, `cdi-deployment`, `cdi-uploadproxy` (`--flag value`; an empty value is a bare switch).
  CDI's Go components take `-flag`; cdi's take the same names with two dashes, after their own arguments
  (so a flag given here wins over the operator's).

A patched object carries the annotation `cdi.kubevirt.io/customizer-identifier` (a hash of the
customizations), so a change of customizations changes the object and rolls its pods."""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping
from typing import Any

import jsonpatch

from cdi.api import annotations as ann
from cdi.common.patches import merge_patch, strategic_merge_patch

Obj = dict[str, Any]
PATCHABLE = ("Deployment", "Service", "ValidatingWebhookConfiguration", "MutatingWebhookConfiguration", "APIService")
FLAG_TARGETS = {"api": ("cdi-apiserver", "cdi-apiserver"), "controller": ("cdi-deployment", "cdi-deployment"),
                "uploadProxy": ("cdi-uploadproxy", "cdi-uploadproxy")}  # flags key -> (Deployment, container)


class CustomizeError(ValueError):
    """A patch that cannot be decoded or applied (reported on the CDI resource as Degraded)."""


def identifier(customize: Mapping[str, Any]) -> str:
    canonical = {"patches": sorted(json.dumps(p, sort_keys=True) for p in customize.get("patches") or []),
                 "flags": customize.get("flags") or {}}
    return hashlib.sha1(json.dumps(canonical, sort_keys=True).encode(), usedforsecurity=False).hexdigest()


def _matches(wanted: str, actual: str) -> bool:
    return wanted == "*" or wanted.lower() == actual.lower()


def _flag_args(flags: Mapping[str, str]) -> list[str]:
    args: list[str] = []
    for flag, value in flags.items():
        args.append(f"--{flag.lower().lstrip('-')}")
        if value != "":
            args.append(str(value))
    return args


def _apply_one(obj: Obj, patch: Mapping[str, Any]) -> Obj:
    kind, text = patch.get("type"), str(patch.get("patch") or "")
    try:
        body = json.loads(text)
    except ValueError as exc:
        raise CustomizeError(f"patch for {obj['kind']} {obj['metadata']['name']} is not JSON: {exc}") from exc
    if kind == "json":
        result: Any = copy.deepcopy(obj)
        for operation in body if isinstance(body, list) else [body]:
            try:
                try:
                    result = jsonpatch.JsonPatch([operation]).apply(result)
                except (jsonpatch.JsonPatchConflict, jsonpatch.JsonPointerException):
                    if operation.get("op") == "remove":
                        continue  # as CDI: a missing path is no error on remove...
                    if operation.get("op") != "add":
                        raise
                    # ...and is created on add
                    result = _add_creating_parents(result, str(operation["path"]), operation.get("value"))
            except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException, KeyError, IndexError, TypeError,
                    ValueError, AttributeError) as exc:
                raise CustomizeError(f"json patch for {obj['kind']} {obj['metadata']['name']}: {exc}") from exc
    elif kind == "merge":
        result = merge_patch(obj, body)
    elif kind == "strategic":
        result = strategic_merge_patch(obj, body)
    else:
        raise CustomizeError(f"patch type {kind!r} is not supported")
    if not isinstance(result, dict):
        raise CustomizeError(f"patch for {obj['kind']} {obj['metadata']['name']} must leave an object")
    return result


def _add_creating_parents(target: Obj, path: str, value: Any) -> Obj:
    """JSON patch `add` where the parents are missing: created as objects (CDI's EnsurePathExistsOnAdd)."""
    result = copy.deepcopy(target)
    parts = [p.replace("~1", "/").replace("~0", "~") for p in path.split("/")[1:]]
    node: Any = result
    for part in parts[:-1]:
        if isinstance(node, list):
            node = node[int(part)]
            continue
        node = node.setdefault(part, {})
    if isinstance(node, list):
        node.append(value) if parts[-1] == "-" else node.insert(int(parts[-1]), value)
    else:
        node[parts[-1]] = value
    return result


def customize(objects: list[Obj], customize_spec: Mapping[str, Any]) -> list[Obj]:
    """`objects` with the customizations applied (the others unchanged)."""
    patches = list(customize_spec.get("patches") or [])
    for key, flags in (customize_spec.get("flags") or {}).items():
        if key in FLAG_TARGETS and flags:
            deployment, container = FLAG_TARGETS[key]
            patches.append({"resourceName": deployment, "resourceType": "Deployment", "type": "flags",
                            "container": container, "args": _flag_args(flags)})
    if not patches:
        return objects
    mark = identifier(customize_spec)
    out = []
    for obj in objects:
        name, kind = obj["metadata"]["name"], obj["kind"]
        mine = [p for p in patches if kind in PATCHABLE and _matches(str(p.get("resourceType", "")), kind)
                and _matches(str(p.get("resourceName", "")), name)]
        if not mine:
            out.append(obj)
            continue
        for patch in mine:
            if patch["type"] == "flags":
                obj = copy.deepcopy(obj)
                for container in obj["spec"]["template"]["spec"]["containers"]:
                    if container["name"] == patch["container"]:
                        container["args"] = [*(container.get("args") or []), *patch["args"]]
            else:
                obj = _apply_one(obj, patch)
        obj.setdefault("metadata", {}).setdefault("annotations", {})[ann.CUSTOMIZER_IDENTIFIER] = mark
        out.append(obj)
    return out
