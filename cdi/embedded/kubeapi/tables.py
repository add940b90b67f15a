"""Server-side printing: the `Table` kind that `kubectl get` asks for, with the columns kubectl
shows for built-in kinds and a CRD's additionalPrinterColumns for custom resources."""

from __future__ import annotations

import datetime
from collections.abc import Callable, Mapping
from typing import Any

from cdi.embedded.kubeapi import jsonpath
from cdi.embedded.kubeapi.resources import ResourceType

Obj = Mapping[str, Any]
Column = tuple[str, str, str, int, Callable[[Obj], Any]]  # name, type, format, priority, getter


def human_duration(seconds: float) -> str:
    """Kubernetes' duration.HumanDuration: "45s", "5m10s", "3h", "2d5h", ..."""
    if seconds < -1:
        return "<invalid>"
    if seconds < 0:
        return "0s"
    s = int(seconds)
    if s < 60 * 2:
        return f"{s}s"
    minutes = s // 60
    if minutes < 10:
        rest = s % 60
        return f"{minutes}m{rest}s" if rest else f"{minutes}m"
    if minutes < 60 * 3:
        return f"{minutes}m"
    hours = minutes // 60
    if hours < 8:
        rest = minutes % 60
        return f"{hours}h{rest}m" if rest else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        rest = hours % 24
        return f"{hours // 24}d{rest}h" if rest else f"{hours // 24}d"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        return f"{hours // 24 // 365}y{hours // 24 % 365}d"
    return f"{hours // 24 // 365}y"


def age(timestamp: Any) -> str:
    if not timestamp:
        return "<unknown>"
    try:
        then = datetime.datetime.fromisoformat(str(timestamp).replace("Z", "+00:00"))
    except ValueError:
        return "<unknown>"
    return human_duration((datetime.datetime.now(datetime.UTC) - then).total_seconds())


def _meta(obj: Obj, key: str) -> Any:
    return (obj.get("metadata") or {}).get(key)


def _dig(obj: Any, *path: str) -> Any:
    for step in path:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(step)
    return obj


_MODES = {"ReadWriteOnce": "RWO", "ReadOnlyMany": "ROX", "ReadWriteMany": "RWX", "ReadWriteOncePod": "RWOP"}


def _access_modes(modes: Any) -> str:
    return ",".join(_MODES.get(m, m) for m in modes or [])


def _pod_ready(obj: Obj) -> str:
    statuses = _dig(obj, "status", "containerStatuses") or []
    total = len(_dig(obj, "spec", "containers") or [])
    return f"{sum(1 for s in statuses if s.get('ready'))}/{total}"


def _pod_status(obj: Obj) -> str:
    status = obj.get("status") or {}
    reason = status.get("reason") or status.get("phase") or "Unknown"
    for cs in status.get("containerStatuses") or []:
        state = cs.get("state") or {}
        if state.get("waiting", {}).get("reason"):
            reason = state["waiting"]["reason"]
        elif state.get("terminated", {}).get("reason"):
            reason = state["terminated"]["reason"]
    if _meta(obj, "deletionTimestamp"):
        reason = "Terminating"
    return str(reason)


def _pod_restarts(obj: Obj) -> int:
    return sum(int(s.get("restartCount") or 0) for s in _dig(obj, "status", "containerStatuses") or [])


def _ports(obj: Obj) -> str:
    parts = []
    for port in _dig(obj, "spec", "ports") or []:
        text = f"{port.get('port')}/{port.get('protocol', 'TCP')}"
        if port.get("nodePort"):
            text = f"{port.get('port')}:{port['nodePort']}/{port.get('protocol', 'TCP')}"
        parts.append(text)
    return ",".join(parts) or "<none>"


def _endpoints(obj: Obj) -> str:
    out = []
    for subset in obj.get("subsets") or []:
        for address in subset.get("addresses") or []:
            for port in subset.get("ports") or [{}]:
                out.append(f"{address.get('ip')}:{port.get('port')}" if port else str(address.get("ip")))
    return ",".join(out) or "<none>"


def _ingress_hosts(obj: Obj) -> str:
    """kubectl's: the rules' first three hosts (and how many rules more), "*" when none names one."""
    rules = _dig(obj, "spec", "rules") or []
    hosts: list[str] = []
    more = False
    for rule in rules:
        more = more or len(hosts) == 3
        if not more and rule.get("host"):
            hosts.append(str(rule["host"]))
    if not hosts:
        return "*"
    return ",".join(hosts) + (f" + {len(rules) - 3} more..." if more else "")


def _ingress_address(obj: Obj) -> str:
    found = _dig(obj, "status", "loadBalancer", "ingress") or []
    return ",".join(str(i.get("ip") or i.get("hostname") or "") for i in found)


def _quota_column(obj: Obj, limits: bool) -> str:
    """kubectl's REQUEST or LIMIT cell of a ResourceQuota: `name: used/hard` of status.hard, sorted; the
    `limits.*` names in LIMIT, the others in REQUEST."""
    hard, used = _dig(obj, "status", "hard") or {}, _dig(obj, "status", "used") or {}
    return ", ".join(f"{name}: {used.get(name, '0')}/{hard[name]}" for name in sorted(hard)
                     if (name.split(".", 1)[0] == "limits" and "." in name) == limits)


def _involved(obj: Obj) -> str:
    ref = obj.get("involvedObject") or obj.get("regarding") or {}
    return f"{str(ref.get('kind', '')).lower()}/{ref.get('name', '')}"


def _node_status(obj: Obj) -> str:
    for cond in _dig(obj, "status", "conditions") or []:
        if cond.get("type") == "Ready":
            return "Ready" if cond.get("status") == "True" else "NotReady"
    return "Unknown"


def _last_seen(obj: Obj) -> str:
    stamp = obj.get("lastTimestamp") or obj.get("eventTime") or _meta(obj, "creationTimestamp")
    return age(stamp)


_NAME: Column = ("Name", "string", "name", 0, lambda o: _meta(o, "name"))
_AGE: Column = ("Age", "string", "", 0, lambda o: age(_meta(o, "creationTimestamp")))

_BUILTIN_COLUMNS: dict[tuple[str, str], list[Column]] = {
    ("", "pods"): [
        _NAME, ("Ready", "string", "", 0, _pod_ready), ("Status", "string", "", 0, _pod_status),
        ("Restarts", "string", "", 0, lambda o: str(_pod_restarts(o))), _AGE,
        ("IP", "string", "", 1, lambda o: _dig(o, "status", "podIP") or "<none>"),
        ("Node", "string", "", 1, lambda o: _dig(o, "spec", "nodeName") or "<none>"),
    ],
    ("", "namespaces"): [_NAME, ("Status", "string", "", 0, lambda o: _dig(o, "status", "phase")), _AGE],
    ("", "persistentvolumeclaims"): [
        _NAME, ("Status", "string", "", 0, lambda o: _dig(o, "status", "phase")),
        ("Volume", "string", "", 0, lambda o: _dig(o, "spec", "volumeName") or ""),
        ("Capacity", "string", "", 0, lambda o: _dig(o, "status", "capacity", "storage") or ""),
        ("Access Modes", "string", "", 0, lambda o: _access_modes(_dig(o, "status", "accessModes"))),
        ("StorageClass", "string", "", 0, lambda o: _dig(o, "spec", "storageClassName") or "<unset>"),
        ("VolumeAttributesClass", "string", "", 0, lambda o: "<unset>"), _AGE,
        ("VolumeMode", "string", "", 1, lambda o: _dig(o, "spec", "volumeMode") or ""),
    ],
    ("", "persistentvolumes"): [
        _NAME, ("Capacity", "string", "", 0, lambda o: _dig(o, "spec", "capacity", "storage") or ""),
        ("Access Modes", "string", "", 0, lambda o: _access_modes(_dig(o, "spec", "accessModes"))),
        ("Reclaim Policy", "string", "", 0, lambda o: _dig(o, "spec", "persistentVolumeReclaimPolicy") or ""),
        ("Status", "string", "", 0, lambda o: _dig(o, "status", "phase") or ""),
        ("Claim", "string", "", 0, lambda o: (f"{_dig(o, 'spec', 'claimRef', 'namespace')}/"
                                              f"{_dig(o, 'spec', 'claimRef', 'name')}")
         if _dig(o, "spec", "claimRef") else ""),
        ("StorageClass", "string", "", 0, lambda o: _dig(o, "spec", "storageClassName") or ""),
        ("VolumeAttributesClass", "string", "", 0, lambda o: "<unset>"),
        ("Reason", "string", "", 0, lambda o: _dig(o, "status", "reason") or ""), _AGE,
        ("VolumeMode", "string", "", 1, lambda o: _dig(o, "spec", "volumeMode") or ""),
    ],
    ("", "services"): [
        _NAME, ("Type", "string", "", 0, lambda o: _dig(o, "spec", "type")),
        ("Cluster-IP", "string", "", 0, lambda o: _dig(o, "spec", "clusterIP") or "<none>"),
        ("External-IP", "string", "", 0, lambda o: "<none>"), ("Port(s)", "string", "", 0, _ports), _AGE,
        ("Selector", "string", "", 1, lambda o: ",".join(f"{k}={v}" for k, v in
                                                           (_dig(o, "spec", "selector") or {}).items()) or "<none>"),
    ],
    ("", "endpoints"): [_NAME, ("Endpoints", "string", "", 0, _endpoints), _AGE],
    ("", "secrets"): [_NAME, ("Type", "string", "", 0, lambda o: o.get("type")),
                      ("Data", "integer", "", 0, lambda o: len(o.get("data") or {})), _AGE],
    ("", "configmaps"): [_NAME, ("Data", "integer", "", 0,
                                 lambda o: len(o.get("data") or {}) + len(o.get("binaryData") or {})), _AGE],
    ("", "serviceaccounts"): [_NAME, ("Secrets", "integer", "", 0, lambda o: len(o.get("secrets") or [])), _AGE],
    ("", "nodes"): [_NAME, ("Status", "string", "", 0, _node_status),
                    ("Roles", "string", "", 0, lambda o: "control-plane"), _AGE,
                    ("Version", "string", "", 0, lambda o: _dig(o, "status", "nodeInfo", "kubeletVersion") or "")],
    ("", "resourcequotas"): [_NAME, _AGE, ("Request", "string", "", 0, lambda o: _quota_column(o, False)),
                             ("Limit", "string", "", 0, lambda o: _quota_column(o, True))],
    ("", "events"): [
        ("Last Seen", "string", "", 0, _last_seen), ("Type", "string", "", 0, lambda o: o.get("type")),
        ("Reason", "string", "", 0, lambda o: o.get("reason")), ("Object", "string", "", 0, _involved),
        ("Message", "string", "", 0, lambda o: o.get("message") or o.get("note") or ""),
    ],
    ("storage.k8s.io", "storageclasses"): [
        ("Name", "string", "name", 0, lambda o: str(_meta(o, "name")) + (
            " (default)" if (_meta(o, "annotations") or {}).get("storageclass.kubernetes.io/is-default-class")
            == "true" else "")), ("Provisioner", "string", "", 0, lambda o: o.get("provisioner")),
        ("ReclaimPolicy", "string", "", 0, lambda o: o.get("reclaimPolicy", "Delete")),
        ("VolumeBindingMode", "string", "", 0, lambda o: o.get("volumeBindingMode", "Immediate")),
        ("AllowVolumeExpansion", "string", "", 0, lambda o: str(bool(o.get("allowVolumeExpansion"))).lower()), _AGE,
    ],
    ("networking.k8s.io", "ingresses"): [
        _NAME, ("Class", "string", "", 0, lambda o: _dig(o, "spec", "ingressClassName") or "<none>"),
        ("Hosts", "string", "", 0, _ingress_hosts), ("Address", "string", "", 0, _ingress_address),
        ("Ports", "string", "", 0, lambda o: "80, 443" if _dig(o, "spec", "tls") else "80"), _AGE,
    ],
    ("coordination.k8s.io", "leases"): [
        _NAME, ("Holder", "string", "", 0, lambda o: _dig(o, "spec", "holderIdentity") or ""), _AGE,
    ],
    ("apiextensions.k8s.io", "customresourcedefinitions"): [
        _NAME, ("Created At", "date", "", 0, lambda o: _meta(o, "creationTimestamp")),
    ],
}
_BUILTIN_COLUMNS[("events.k8s.io", "events")] = _BUILTIN_COLUMNS[("", "events")]


def _crd_columns(rtype: ResourceType) -> list[Column]:
    columns: list[Column] = [_NAME]
    specs = rtype.columns or ({"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},)
    for spec in specs:
        path = jsonpath.compile_path(str(spec["jsonPath"]))
        type_ = str(spec.get("type", "string"))

        def getter(obj: Obj, path: Any = path, type_: str = type_) -> Any:
            found = jsonpath.find(obj, path)
            if not found:
                return None
            value = found[0]
            if type_ == "date":
                return age(value)
            return value

        columns.append((str(spec["name"]), "string" if type_ == "date" else type_, str(spec.get("format", "")),
                        int(spec.get("priority", 0)), getter))
    return columns


def columns_for(rtype: ResourceType) -> list[Column]:
    if not rtype.builtin:
        return _crd_columns(rtype)
    return _BUILTIN_COLUMNS.get((rtype.group, rtype.plural), [_NAME, _AGE])


def _partial_metadata(obj: Obj) -> dict[str, Any]:
    return {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
            "metadata": dict(obj.get("metadata") or {})}


def table(rtype: ResourceType, objects: list[Obj], include_object: str = "Metadata",
          list_meta: dict[str, Any] | None = None) -> dict[str, Any]:
    columns = columns_for(rtype)
    rows = []
    for obj in objects:
        cells = []
        for _, _, _, _, getter in columns:
            try:
                cells.append(getter(obj))
            except (KeyError, TypeError, ValueError):
                cells.append(None)
        row: dict[str, Any] = {"cells": cells}
        if include_object == "Object":
            row["object"] = dict(obj)
        elif include_object != "None":
            row["object"] = _partial_metadata(obj)
        rows.append(row)
    return {
        "kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": list_meta or {},
        "columnDefinitions": [{"name": n, "type": t, "format": f, "description": "", "priority": p}
                              for n, t, f, p, _ in columns],
        "rows": rows,
    }
