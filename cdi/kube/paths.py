"""REST paths and object keys for a `GVR`.

Kept apart from the client so the informer, the work queue's users and tests can build keys the same
way without a connection."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from cdi.api.groups import GVR


def resource_path(gvr: GVR, namespace: str | None = None, name: str | None = None,
                  subresource: str | None = None) -> str:
    """`/api/v1/namespaces/ns/pods/name/status` and friends; `namespace=None` means all namespaces."""
    base = f"/apis/{gvr.group}/{gvr.version}" if gvr.group else f"/api/{gvr.version}"
    if gvr.namespaced and namespace:
        base += f"/namespaces/{quote(namespace, safe='')}"
    base += f"/{gvr.plural}"
    if name is not None:
        if not name:
            raise ValueError(f"empty {gvr.kind} name")
        base += f"/{quote(name, safe='')}"
        if subresource:
            base += f"/{subresource}"
    elif subresource:
        raise ValueError("a subresource needs an object name")
    return base


def object_key(obj: Mapping[str, Any]) -> str:
    """"namespace/name" for namespaced objects, "name" for cluster-scoped ones (client-go's key format)."""
    meta = obj.get("metadata") or {}
    name = str(meta.get("name") or "")
    namespace = meta.get("namespace")
    return f"{namespace}/{name}" if namespace else name


def make_key(namespace: str | None, name: str) -> str:
    return f"{namespace}/{name}" if namespace else name


def split_key(key: str) -> tuple[str | None, str]:
    """The inverse of `object_key`: (namespace or None, name)."""
    namespace, sep, name = key.partition("/")
    return (namespace, name) if sep else (None, key)
