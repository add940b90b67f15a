"""`cdi.kubevirt.io/storage.checkStaticVolume`: a DataVolume whose claim may be bound to a volume provisioned
beforehand (an administrator's PersistentVolume pre-bound to it with `spec.claimRef`), which then holds
the data already, as CDI's handleStaticVolume. Pure: which volumes would do, as CDI's
CheckVolumeSatisfyClaim judges them (looser than Kubernetes on an unnamed storage class)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from cdi.api.quantity import QuantityError, parse_bytes
from cdi.api.views import ClaimView, PersistentVolumeView

Body = Mapping[str, Any]


def satisfies(pv: Body, claim_spec: Body) -> bool:
    volume = PersistentVolumeView(pv)
    if volume.deleting:
        return False
    try:
        if parse_bytes(volume.capacity or 0) < parse_bytes(ClaimView({"spec": claim_spec}).requested_storage or 0):
            return False
    except QuantityError:
        return False
    wanted_class = claim_spec.get("storageClassName") or ""
    if wanted_class and volume.storage_class != wanted_class:
        return False
    if (claim_spec.get("volumeMode") or "Filesystem") != volume.volume_mode:
        return False
    return set(claim_spec.get("accessModes") or []) <= set(volume.access_modes)


def available_for(volumes: Iterable[Body], namespace: str, name: str, claim_spec: Body) -> list[str]:
    """The Available volumes pre-bound to claim `namespace/name` that can hold `claim_spec`, by name."""
    found = []
    for pv in volumes:
        volume = PersistentVolumeView(pv)
        ref = volume.claim_ref
        if (ref.get("namespace"), ref.get("name")) == (namespace, name) and \
                volume.phase == "Available" and satisfies(pv, claim_spec):
            found.append(volume.name)
    return sorted(found)
