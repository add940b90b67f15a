"""The storage classes, snapshot class and CSIDriver the local storage offers, and what each
provisioner can do.

Two provisioners share one backend: the capable one copies volumes for CSI clones and snapshots;
the `nosnap` one refuses both, as many real drivers do, so that CDI's host-assisted clone has
something to fall back for. A third, `unlisted`, is the nosnap one under a name CDI's table of known
provisioners does not list and with no class of its own: a class an admin makes of it gets a StorageProfile
without `claimPropertySets`, as a class of a driver CDI knows nothing about does on a real cluster."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cdi.api import annotations as ann
from cdi.api.groups import SNAPSHOT_API_VERSION

PROVISIONER = "local.storage.cdi.kubevirt.io"
NOSNAP_PROVISIONER = "nosnap.local.storage.cdi.kubevirt.io"
UNLISTED_PROVISIONER = "unlisted.local.storage.cdi.kubevirt.io"

CLASS_LOCAL = "local"
CLASS_WFFC = "local-wffc"
CLASS_NOSNAP = "local-nosnap"
SNAPSHOT_CLASS = "local"


@dataclass(frozen=True)
class Capabilities:
    clone: bool
    snapshot: bool


PROVISIONERS: dict[str, Capabilities] = {
    PROVISIONER: Capabilities(clone=True, snapshot=True),
    NOSNAP_PROVISIONER: Capabilities(clone=False, snapshot=False),
    UNLISTED_PROVISIONER: Capabilities(clone=False, snapshot=False),
}


def _storage_class(name: str, provisioner: str, binding: str, default: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": {"app.kubernetes.io/managed-by": "cdi-embedded"}}
    if default:
        meta["annotations"] = {ann.DEFAULT_STORAGE_CLASS: "true"}
    return {
        "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": meta,
        "provisioner": provisioner, "reclaimPolicy": "Delete", "volumeBindingMode": binding,
        "allowVolumeExpansion": True,
    }


def storage_classes() -> list[dict[str, Any]]:
    return [
        _storage_class(CLASS_LOCAL, PROVISIONER, "Immediate", default=True),
        _storage_class(CLASS_WFFC, PROVISIONER, "WaitForFirstConsumer"),
        _storage_class(CLASS_NOSNAP, NOSNAP_PROVISIONER, "Immediate"),
    ]


def snapshot_classes() -> list[dict[str, Any]]:
    return [{
        "apiVersion": SNAPSHOT_API_VERSION, "kind": "VolumeSnapshotClass",
        "metadata": {"name": SNAPSHOT_CLASS, "annotations": {ann.DEFAULT_SNAPSHOT_CLASS: "true"},
                     "labels": {"app.kubernetes.io/managed-by": "cdi-embedded"}},
        "driver": PROVISIONER, "deletionPolicy": "Delete",
    }]


def csi_drivers() -> list[dict[str, Any]]:
    return [{
        "apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver",
        "metadata": {"name": PROVISIONER, "labels": {"app.kubernetes.io/managed-by": "cdi-embedded"}},
        "spec": {"attachRequired": False, "podInfoOnMount": False, "volumeLifecycleModes": ["Persistent"],
                 "fsGroupPolicy": "File", "requiresRepublish": False, "storageCapacity": False},
    }]
