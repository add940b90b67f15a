"""The two merge-style patch formats of the Kubernetes API as pure functions: JSON merge patch (RFC 7386)
and strategic merge patch for built-in kinds, which merges lists of named things (containers, volumes,
env, conditions ...) by key instead of replacing them. The embedded API server serves them; cdi-operator
applies the `CDI` resource's `customizeComponents` patches with them."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any


def merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result



# Merge keys of the core API's lists (the `patchMergeKey` struct tags of k8s.io/api).
_MERGE_KEYS: dict[str, str] = {
    "containers": "name", "initContainers": "name", "ephemeralContainers": "name", "env": "name",
    "volumes": "name", "volumeMounts": "mountPath", "volumeDevices": "devicePath", "imagePullSecrets": "name",
    "conditions": "type", "ownerReferences": "uid", "hostAliases": "ip", "readinessGates": "conditionType",
    "resourceClaims": "name", "schedulingGates": "name", "secrets": "name", "topologySpreadConstraints": "topologyKey",
    "containerStatuses": "name", "initContainerStatuses": "name", "podIPs": "ip", "hostIPs": "ip",
    "addresses": "type", "taints": "key",
}
_SET_LISTS = {"finalizers"}  # primitive lists merged as sets


def _merge_key(field: str, items: list[Any]) -> str | None:
    if field == "ports":
        sample = next((i for i in items if isinstance(i, Mapping)), None)
        if sample is None:
            return None
        return "containerPort" if "containerPort" in sample else "port"
    return _MERGE_KEYS.get(field)


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    directive = patch.get("$patch")
    if directive == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    if directive == "delete":
        return None
    result = dict(target) if isinstance(target, Mapping) else {}
    retain = patch.get("$retainKeys")
    for key, value in patch.items():
        if key in ("$patch", "$retainKeys") or key.startswith("$setElementOrder/"):
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            field = key.split("/", 1)[1]
            remove = set(map(str, value or []))
            result[field] = [v for v in result.get(field) or [] if str(v) not in remove]
            continue
        if value is None:
            result.pop(key, None)
        elif isinstance(value, list):
            result[key] = _merge_list(key, result.get(key), value)
        elif isinstance(value, Mapping):
            merged = strategic_merge_patch(result.get(key), value)
            if merged is None:
                result.pop(key, None)
            else:
                result[key] = merged
        else:
            result[key] = value
    if isinstance(retain, list):
        result = {k: v for k, v in result.items() if k in retain}
    return result


def _merge_list(field: str, current: Any, patch: list[Any]) -> list[Any]:
    current = list(current) if isinstance(current, list) else []
    if any(isinstance(i, Mapping) and i.get("$patch") == "replace" for i in patch):
        return [copy.deepcopy(i) for i in patch if not (isinstance(i, Mapping) and "$patch" in i)]
    if field in _SET_LISTS:
        merged = list(current)
        for item in patch:
            if item not in merged:
                merged.append(item)
        return merged
    key = _merge_key(field, patch + current)
    if key is None:
        return copy.deepcopy(patch)
    merged = list(current)
    for item in patch:
        if not isinstance(item, Mapping) or key not in item:
            merged.append(copy.deepcopy(item))
            continue
        index = next((i for i, c in enumerate(merged) if isinstance(c, Mapping) and c.get(key) == item[key]), None)
        if item.get("$patch") == "delete":
            if index is not None:
                merged.pop(index)
            continue
        if index is None:
            merged.append(strategic_merge_patch({}, item))
        else:
            merged[index] = strategic_merge_patch(merged[index], item)
    return merged
