"""Owner references, both ways: the one reference the controller and the operator write on what they create
for an object (so the garbage collector removes it with its owner, and a foreground delete of the owner
waits for it), and the owners an event's object names (how a claim's event finds its DataVolume). It is
the one writer of `blockOwnerDeletion` outside the embedded API server (`tests/test_code_quality.py`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cdi.api.groups import GVR
from cdi.api.views import ObjectView

Obj = dict[str, Any]


def owner_reference(gvr: GVR, owner: Mapping[str, Any]) -> Obj:
    """`owner` (an object of kind `gvr`) as the controller of what carries this reference. The kind and
    version come from `gvr`, not from the object: objects listed by an informer may carry neither."""
    view = ObjectView(owner)
    return {"apiVersion": gvr.api_version, "kind": gvr.kind, "name": view.name, "uid": view.uid,
            "controller": True, "blockOwnerDeletion": True}


def owner_keys(obj: Mapping[str, Any], kind: str) -> list[str]:
    """namespace/name of the owners of `obj` of one kind (how a PVC event finds its DataVolume)."""
    meta = obj.get("metadata") or {}
    namespace = meta.get("namespace", "")
    return [f"{namespace}/{ref['name']}" if namespace else str(ref["name"])
            for ref in meta.get("ownerReferences") or [] if ref.get("kind") == kind]
