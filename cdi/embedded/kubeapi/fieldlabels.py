"""The fields a field selector may name, kind by kind, as kube-apiserver's field label conversions
allow them; a selector on any other field is refused with 400 and kube-apiserver's message instead of
being matched against whatever the object happens to hold."""

from __future__ import annotations

from collections.abc import Mapping

from cdi.embedded.kubeapi.errors import StatusError, bad_request
from cdi.embedded.kubeapi.resources import ResourceType
from cdi.embedded.kubeapi.selectors import FieldRequirement, FieldSelector

_META = ("metadata.name", "metadata.namespace")


def _same(*labels: str) -> dict[str, str]:
    return {label: label for label in labels}


# (group, plural) -> selector label -> the field of the served object it compares (pkg/apis/core/v1
# conversion.go and events/v1 for events.k8s.io, whose labels name events.k8s.io's own fields).
_LABELS: dict[tuple[str, str], dict[str, str]] = {
    ("", "pods"): {**_same(*_META, "spec.nodeName", "spec.restartPolicy", "spec.schedulerName",
                           "spec.serviceAccountName", "spec.hostNetwork", "status.phase", "status.podIP",
                           "status.podIPs", "status.nominatedNodeName"),
                   "spec.host": "spec.nodeName"},
    ("", "nodes"): _same("metadata.name", "spec.unschedulable"),
    ("", "namespaces"): _same("metadata.name", "status.phase"),
    ("", "secrets"): _same(*_META, "type"),
    ("", "services"): _same(*_META, "spec.clusterIP", "spec.type"),
    ("", "events"): {**_same(*_META, "involvedObject.kind", "involvedObject.namespace", "involvedObject.name",
                             "involvedObject.uid", "involvedObject.apiVersion", "involvedObject.resourceVersion",
                             "involvedObject.fieldPath", "reason", "reportingComponent", "type"),
                     "source": "source.component"},
    ("events.k8s.io", "events"): _same(*_META, "regarding.kind", "regarding.namespace", "regarding.name",
                                       "regarding.uid", "regarding.apiVersion", "regarding.resourceVersion",
                                       "regarding.fieldPath", "reason", "reportingController", "type"),
}

# Booleans the object leaves out when false still select as "false" (the typed field is false).
_DEFAULTS: Mapping[str, str] = {"spec.hostNetwork": "false", "spec.unschedulable": "false"}


def _labels(rtype: ResourceType) -> dict[str, str]:
    known = _LABELS.get((rtype.group, rtype.plural))
    if known is not None:
        return known
    if rtype.builtin:
        return _same(*_META)
    labels = _same("metadata.name", *(("metadata.namespace",) if rtype.namespaced else ()))
    return {**labels, **_same(*rtype.selectable_fields)}


def _unsupported(rtype: ResourceType, label: str) -> StatusError:
    if rtype.builtin and (rtype.group, rtype.plural) not in _LABELS:
        # runtime.DefaultMetaV1FieldSelectorConversion, for kinds without their own conversion
        return bad_request(f'"{label}" is not a known field selector: only "metadata.name", "metadata.namespace"')
    return bad_request(f"field label not supported: {label}")


def convert(rtype: ResourceType, selector: FieldSelector) -> FieldSelector:
    """`selector` with each label checked against what `rtype` supports and turned into the field it
    compares; 400 for the first label `rtype` does not support."""
    if selector.empty:
        return selector
    labels = _labels(rtype)
    requirements = []
    for req in selector.requirements:
        label = ".".join(req.path)
        field = labels.get(label)
        if field is None:
            raise _unsupported(rtype, label)
        requirements.append(FieldRequirement(tuple(field.split(".")), req.negate, req.value,
                                             _DEFAULTS.get(field, "")))
    return FieldSelector(tuple(requirements))
