"""The storage admission plugins a real API server runs, registered with the embedded one by the
local storage: DefaultStorageClass (a claim without `storageClassName` gets the default class),
StorageObjectInUseProtection (claims and volumes get their protection finalizers), and
PersistentVolumeClaimResize (a claim may only grow when bound and its class allows expansion)."""

from __future__ import annotations

from typing import Any

from cdi.api import annotations as ann
from cdi.api.groups import PVCS, PVS, STORAGECLASSES
from cdi.api.quantity import QuantityError, parse_bytes
from cdi.embedded.control import LocalApi
from cdi.embedded.kubeapi.errors import StatusError
from cdi.embedded.kubeapi.objects import AdmissionRequest
from cdi.embedded.storage.claims import PV_PROTECTION, PVC_PROTECTION

Obj = dict[str, Any]

_PVC_KEY = "/persistentvolumeclaims"
_PV_KEY = "/persistentvolumes"


def default_class(classes: list[Obj]) -> str | None:
    """The newest class marked default, as Kubernetes picks when several are."""
    marked = [c for c in classes
              if (c["metadata"].get("annotations") or {}).get(ann.DEFAULT_STORAGE_CLASS) == "true" or
              (c["metadata"].get("annotations") or {}).get(ann.DEFAULT_STORAGE_CLASS_BETA) == "true"]
    if not marked:
        return None
    marked.sort(key=lambda c: (c["metadata"].get("creationTimestamp", ""), c["metadata"]["name"]))
    name: str = marked[-1]["metadata"]["name"]
    return name


def _storage(obj: Obj | None) -> str | None:
    value = (((obj or {}).get("spec") or {}).get("resources") or {}).get("requests", {}).get("storage")
    return None if value is None else str(value)


class StorageAdmission:
    def __init__(self, api: LocalApi) -> None:
        self.api = api

    async def mutate(self, request: AdmissionRequest) -> Obj | None:
        if request.operation != "CREATE" or request.obj is None or request.subresource:
            return None
        key = request.rtype.key
        if key == _PVC_KEY:
            obj = request.obj
            spec = obj.setdefault("spec", {})
            if "storageClassName" not in spec or spec["storageClassName"] is None:
                name = default_class(self.api.list(STORAGECLASSES))
                if name:
                    spec["storageClassName"] = name
            finalizers = obj["metadata"].setdefault("finalizers", [])
            if PVC_PROTECTION not in finalizers:
                finalizers.append(PVC_PROTECTION)
            return obj
        if key == _PV_KEY:
            obj = request.obj
            finalizers = obj["metadata"].setdefault("finalizers", [])
            if PV_PROTECTION not in finalizers:
                finalizers.append(PV_PROTECTION)
            return obj
        return None

    async def validate(self, request: AdmissionRequest) -> None:
        if request.operation != "UPDATE" or request.rtype.key != _PVC_KEY or request.subresource:
            return
        new, old = _storage(request.obj), _storage(request.old)
        if new is None or old is None:
            return
        try:
            if parse_bytes(new) <= parse_bytes(old):
                return
        except QuantityError:
            return
        assert request.old is not None
        old_spec = request.old.get("spec") or {}
        volume = old_spec.get("volumeName")
        sc = self.api.get(STORAGECLASSES, None, old_spec.get("storageClassName") or "")
        bound = (request.old.get("status") or {}).get("phase") == "Bound" and volume and \
            self.api.get(PVS, None, volume) is not None
        if not bound or sc is None or not sc.get("allowVolumeExpansion"):
            raise StatusError(403, f'persistentvolumeclaims "{request.name}" is forbidden: only dynamically '
                                   "provisioned pvc can be resized and the storageclass that provisions the pvc "
                                   "must support resize", "Forbidden",
                              details={"name": request.name, "kind": PVCS.plural})
