"""The three patch formats of the Kubernetes API: JSON merge patch (RFC 7386), JSON patch
(RFC 6902, via the `jsonpatch` library) and strategic merge patch for built-in kinds, which merges
lists of named things (containers, volumes, env, conditions ...) by key instead of replacing them."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import jsonpatch

from cdi.common.patches import merge_patch, strategic_merge_patch
from cdi.embedded.kubeapi.errors import StatusError, bad_request

__all__ = ["APPLY", "JSON", "MERGE", "STRATEGIC", "apply_patch", "json_patch", "merge_patch", "strategic_merge_patch"]

MERGE = "application/merge-patch+json"
JSON = "application/json-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
APPLY = "application/apply-patch+yaml"


def json_patch(target: dict[str, Any], operations: Any) -> dict[str, Any]:
    if not isinstance(operations, list):
        raise bad_request("json patch must be a list of operations")
    try:
        result = jsonpatch.JsonPatch(operations).apply(target)
    except jsonpatch.JsonPatchTestFailed as exc:
        raise StatusError(422, f"the server rejected our request due to an error in our request: {exc}",
                          "Invalid") from exc
    except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException, KeyError, IndexError,
            TypeError) as exc:
        raise StatusError(422, f"the server rejected our request due to an error in our request: {exc}",
                          "Invalid") from exc
    if not isinstance(result, dict):
        raise bad_request("json patch must leave an object")
    return result


def apply_patch(content_type: str, target: dict[str, Any], patch: Any, *, strategic_allowed: bool) -> dict[str, Any]:
    kind = content_type.split(";", maxsplit=1)[0].strip()
    if kind == JSON:
        return json_patch(copy.deepcopy(target), patch)
    if not isinstance(patch, Mapping):
        raise bad_request("patch body must be a JSON object")
    if kind == MERGE:
        result = merge_patch(target, patch)
    elif kind == STRATEGIC and strategic_allowed:
        result = strategic_merge_patch(target, patch)
    else:
        accepted = [JSON, MERGE] + ([STRATEGIC] if strategic_allowed else [])
        raise StatusError(415, "the body of the request was in an unknown format - accepted media types "
                               "include: " + ", ".join(accepted), "UnsupportedMediaType")
    if not isinstance(result, dict):
        raise bad_request("patch must leave an object")
    return result
