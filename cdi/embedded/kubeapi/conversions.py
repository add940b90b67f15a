"""Serving one stored object in several versions: CRD versions (no conversion beyond apiVersion,
as `strategy: None`) and events.k8s.io/v1 Events, which are core Events under other field names."""

from __future__ import annotations

from typing import Any

from cdi.embedded.kubeapi.resources import ResourceType

Obj = dict[str, Any]

# events.k8s.io/v1 field -> core/v1 field
_EVENT_FIELDS = {
    "regarding": "involvedObject", "note": "message", "deprecatedSource": "source",
    "deprecatedFirstTimestamp": "firstTimestamp", "deprecatedLastTimestamp": "lastTimestamp",
    "deprecatedCount": "count", "reportingController": "reportingComponent",
}
_CORE_TO_EVENTS = {v: k for k, v in _EVENT_FIELDS.items()}


def to_storage(rtype: ResourceType, obj: Obj, storage: ResourceType) -> Obj:
    if rtype.group == "events.k8s.io":
        converted = {_EVENT_FIELDS.get(k, k): v for k, v in obj.items()}
        converted["apiVersion"], converted["kind"] = "v1", "Event"
        return converted
    obj["apiVersion"] = storage.api_version
    return obj


def from_storage(rtype: ResourceType, obj: Obj) -> Obj:
    if rtype.group == "events.k8s.io":
        converted = {_CORE_TO_EVENTS.get(k, k): v for k, v in obj.items()}
        converted["apiVersion"], converted["kind"] = rtype.api_version, "Event"
        return converted
    obj["apiVersion"] = rtype.api_version
    return obj


def needs_conversion(rtype: ResourceType, stored_api_version: str) -> bool:
    return rtype.group == "events.k8s.io" or rtype.api_version != stored_api_version
