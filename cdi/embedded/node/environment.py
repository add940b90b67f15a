"""A container's environment as the kubelet builds it: `envFrom` first, then `env` in order, each
value able to refer to earlier ones with `$(NAME)`; `valueFrom` reads Secrets, ConfigMaps, the pod's
own fields (the downward API, including `status.podIP` and `metadata.uid`) and resource fields.

A reference to a missing object or key that is not `optional` is a configuration error: the
container waits with reason `CreateContainerConfigError` and the message the kubelet gives."""

from __future__ import annotations

import base64
import math
import re
from collections.abc import Callable
from typing import Any

from cdi.api.quantity import QuantityError, parse_decimal
from cdi.embedded.node.expansion import expand

Obj = dict[str, Any]
Getter = Callable[[str, str], Obj | None]  # (namespace, name) -> object or None

_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
_INDEXED = re.compile(r"^metadata\.(labels|annotations)\['(.+)'\]$")

# what the node offers when a container sets no limit (resourceFieldRef falls back to allocatable)
NODE_ALLOCATABLE = {"cpu": "2", "memory": "8Gi", "ephemeral-storage": "100Gi"}


class ConfigError(Exception):
    """Reason CreateContainerConfigError."""


def field_value(pod: Obj, path: str) -> str:
    """The downward-API value of `path` for `pod`."""
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    simple = {
        "metadata.name": meta.get("name", ""), "metadata.namespace": meta.get("namespace", ""),
        "metadata.uid": meta.get("uid", ""), "spec.nodeName": spec.get("nodeName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName", ""),
        "status.hostIP": status.get("hostIP", ""), "status.podIP": status.get("podIP", ""),
        "status.hostIPs": ",".join(i.get("ip", "") for i in status.get("hostIPs") or []),
        "status.podIPs": ",".join(i.get("ip", "") for i in status.get("podIPs") or []),
    }
    if path in simple:
        return str(simple[path])
    match = _INDEXED.match(path)
    if match:
        return str((meta.get(match.group(1)) or {}).get(match.group(2), ""))
    if path in ("metadata.labels", "metadata.annotations"):
        values = meta.get(path.split(".")[1]) or {}
        return "\n".join(f'{k}="{v}"' for k, v in sorted(values.items()))
    raise ConfigError(f'unsupported fieldPath: "{path}"')


def resource_value(container: Obj, ref: Obj) -> str:
    """`resourceFieldRef`: the container's limit (else request for requests.*, else node allocatable),
    divided by the divisor and rounded up, as the kubelet reports it."""
    resource = ref.get("resource", "")
    kind, _, name = resource.partition(".")
    resources = container.get("resources") or {}
    value = (resources.get(kind) or {}).get(name)
    if value is None:
        value = (resources.get("limits") or {}).get(name) if kind == "requests" else None
    if value is None:
        value = NODE_ALLOCATABLE.get(name, "0") if kind == "limits" else "0"
    try:
        amount = parse_decimal(value)
        divisor = parse_decimal(ref.get("divisor") or "1")
    except QuantityError as exc:
        raise ConfigError(str(exc)) from exc
    if divisor == 0:
        divisor = parse_decimal("1")
    return str(math.ceil(amount / divisor))


def _decode(obj: Obj, key: str, kind: str) -> str | None:
    if kind == "Secret":
        raw = (obj.get("data") or {}).get(key)
        return None if raw is None else base64.b64decode(raw).decode(errors="replace")
    if key in (obj.get("data") or {}):
        return str(obj["data"][key])
    raw = (obj.get("binaryData") or {}).get(key)
    return None if raw is None else base64.b64decode(raw).decode(errors="replace")


def build_env(pod: Obj, container: Obj, secrets: Getter, configmaps: Getter,
              base: dict[str, str] | None = None) -> dict[str, str]:
    """The container's environment: `base` (image defaults), then envFrom, then env."""
    namespace = pod["metadata"]["namespace"]
    env: dict[str, str] = dict(base or {})
    for source in container.get("envFrom") or []:
        prefix = source.get("prefix", "")
        for kind, ref_key, getter in (("ConfigMap", "configMapRef", configmaps), ("Secret", "secretRef", secrets)):
            ref = source.get(ref_key)
            if ref is None:
                continue
            obj = getter(namespace, ref.get("name", ""))
            if obj is None:
                if ref.get("optional"):
                    continue
                raise ConfigError(f'{kind.lower()} "{ref.get("name", "")}" not found')
            keys = sorted(set(obj.get("data") or {}) | set(obj.get("binaryData") or {}))
            for key in keys:
                name = prefix + key
                value = _decode(obj, key, kind)
                if value is not None and _ENV_NAME.match(name):
                    env[name] = value
    defined: dict[str, str] = dict(env)
    for var in container.get("env") or []:
        name = var.get("name", "")
        if "value" in var or "valueFrom" not in var:
            env[name] = expand(str(var.get("value", "")), defined.get)
        else:
            value = _value_from(pod, container, var["valueFrom"], namespace, secrets, configmaps)
            if value is None:
                continue
            env[name] = value
        defined[name] = env[name]
    return env


def _value_from(pod: Obj, container: Obj, source: Obj, namespace: str, secrets: Getter,
                configmaps: Getter) -> str | None:
    if "fieldRef" in source:
        return field_value(pod, (source["fieldRef"] or {}).get("fieldPath", ""))
    if "resourceFieldRef" in source:
        return resource_value(container, source["resourceFieldRef"] or {})
    for kind, ref_key, getter in (("Secret", "secretKeyRef", secrets), ("ConfigMap", "configMapKeyRef",
                                                                        configmaps)):
        ref = source.get(ref_key)
        if ref is None:
            continue
        name, key = ref.get("name", ""), ref.get("key", "")
        obj = getter(namespace, name)
        if obj is None:
            if ref.get("optional"):
                return None
            raise ConfigError(f'{kind.lower()} "{name}" not found')
        value = _decode(obj, key, kind)
        if value is None:
            if ref.get("optional"):
                return None
            raise ConfigError(f"couldn't find key {key} in {kind} {namespace}/{name}")
        return value
    return None


def expand_args(argv: list[str], env: dict[str, str]) -> list[str]:
    return [expand(arg, env.get) for arg in argv]
