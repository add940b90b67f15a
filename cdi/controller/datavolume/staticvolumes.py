"""`cdi.kubevirt.io/storage.checkStaticVolume`: a DataVolume whose claim may be bound to a volume provisioned
beforehand (an administrator's PersistentVolume pre-bound to it with `spec.claimRef`), which then holds
the data already, as CDI's handleStaticVolume. Pure: which volumes would do, as CDI's
CheckVolumeSatisfyClaim judges them (looser than Kubernetes on an unnamed storage class)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from cdi.api.quantity import QuantityError, parse_bytes
from cdi.api.views import dig

Body = Mapping[str, Any]


def satisfies(pv: Body, claim_spec: Body) -> bool:
    if dig(pv, "metadata", "deletionTimestamp"):
        return False
    try:
        if parse_bytes(dig(pv, "spec", "capacity", "storage") or 0) < \
                parse_bytes(dig(claim_spec, "resources", "requests", "storage") or 0):
            return False
    except QuantityError:
        return False
    wanted_class = claim_spec.get("storageClassName") or ""
    if wanted_class and (dig(pv, "spec", "storageClassName") or "") != wanted_class:
        return False
    if (claim_spec.get("volumeMode") or "Filesystem") != (dig(pv, "spec", "volumeMode") or "Filesystem"):
        return False
    return set(claim_spec.get("accessModes") or []) <= set(dig(pv, "spec", "accessModes") or [])


def available_for(volumes: Iterable[Body], namespace: str, name: str, claim_spec: Body) -> list[str]:
    """The Available volumes pre-bound to claim `namespace/name` that can hold `claim_spec`, by name."""
    found = []
    for pv in volumes:
        ref: Body = dig(pv, "spec", "claimRef") or {}
        if (ref.get("namespace"), ref.get("name")) == (namespace, name) and \
                dig(pv, "status", "phase") == "Available" and satisfies(pv, claim_spec):
            found.append(str(dig(pv, "metadata", "name")))
    return sorted(found)
