"""A small vocabulary for writing structural OpenAPI v3 schemas as Python expressions.

CRD schemas must be structural (every level typed, no free-form objects unless declared), and
writing them as nested dict literals hides mistakes; these helpers keep each schema a readable
one-liner per field."""

from typing import Any

Schema = dict[str, Any]


def string(description: str = "", **extra: Any) -> Schema:
    return _described({"type": "string", **extra}, description)


def enum(*values: str, description: str = "") -> Schema:
    return string(description, enum=list(values))


def boolean(description: str = "") -> Schema:
    return _described({"type": "boolean"}, description)


def integer(description: str = "", fmt: str = "int32", **extra: Any) -> Schema:
    return _described({"type": "integer", "format": fmt, **extra}, description)


def date_time(description: str = "") -> Schema:
    return _described({"type": "string", "format": "date-time"}, description)


def array(items: Schema, description: str = "", **extra: Any) -> Schema:
    return _described({"type": "array", "items": items, **extra}, description)


def obj(properties: dict[str, Schema] | None = None, required: tuple[str, ...] = (),
        description: str = "", **extra: Any) -> Schema:  # extra: OpenAPI keys such as maxItems
    schema: Schema = {"type": "object", **extra}
    if properties is not None:
        schema["properties"] = properties
    if required:
        schema["required"] = list(required)
    return _described(schema, description)


def map_of(values: Schema, description: str = "") -> Schema:
    return _described({"type": "object", "additionalProperties": values}, description)


def free_form(description: str = "") -> Schema:
    """An object whose content is not ours to define (affinity, tolerations, embedded metadata)."""
    return _described({"type": "object", "x-kubernetes-preserve-unknown-fields": True}, description)


_QUANTITY_PATTERN = (r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
                     r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$")


def quantity(description: str = "") -> Schema:
    return _described({
        "anyOf": [{"type": "integer"}, {"type": "string"}],
        "pattern": _QUANTITY_PATTERN,
        "x-kubernetes-int-or-string": True,
    }, description)


def _described(schema: Schema, description: str) -> Schema:
    if description:
        schema["description"] = description
    return schema


# -- shapes from core Kubernetes that CDI's kinds embed -------------------------------------------

def label_selector() -> Schema:
    return obj({
        "matchLabels": map_of(string()),
        "matchExpressions": array(obj({
            "key": string(), "operator": string(), "values": array(string()),
        }, required=("key", "operator"))),
    }) | {"x-kubernetes-map-type": "atomic"}


def resource_requirements() -> Schema:
    return obj({
        "limits": map_of(quantity()),
        "requests": map_of(quantity()),
        "claims": array(obj({"name": string(), "request": string()}, required=("name",))),
    })


def typed_local_object_reference() -> Schema:
    return obj({"apiGroup": string(), "kind": string(), "name": string()},
               required=("kind", "name")) | {"x-kubernetes-map-type": "atomic"}


def typed_object_reference() -> Schema:
    return obj({"apiGroup": string(), "kind": string(), "name": string(), "namespace": string()},
               required=("kind", "name"))


ACCESS_MODES = ("ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany", "ReadWriteOncePod")


def pvc_spec(description: str = "") -> Schema:
    return obj({
        "accessModes": array(string()),
        "dataSource": typed_local_object_reference(),
        "dataSourceRef": typed_object_reference(),
        "resources": resource_requirements(),
        "selector": label_selector(),
        "storageClassName": string(),
        "volumeAttributesClassName": string(),
        "volumeMode": string(),
        "volumeName": string(),
    }, description=description)


def condition(types_description: str) -> Schema:
    return obj({
        "type": string(types_description),
        "status": string("status of the condition, one of True, False, Unknown"),
        "lastTransitionTime": date_time(),
        "lastHeartbeatTime": date_time(),
        "reason": string("reason for the condition's last transition"),
        "message": string("human-readable message indicating details about last transition"),
    }, required=("type", "status"))


def node_placement() -> Schema:
    return obj({
        "nodeSelector": map_of(string()),
        "affinity": free_form(),
        "tolerations": array(free_form()),
    })
