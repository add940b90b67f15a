"""CDI's feature gates (CDIConfig `spec.featureGates`) and the claim-adoption rules that depend on one:
whether a PVC that exists before its DataVolume may be taken over by it. Pure: the admission webhook
and the DataVolume reconciler apply the same rules to what they read."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from cdi.api import annotations as ann

Body = Mapping[str, Any]

# worker pods wait for a consumer to bind a claim of a WaitForFirstConsumer class (in CDI's released CR)
HONOR_WAIT_FOR_FIRST_CONSUMER: Final = "HonorWaitForFirstConsumer"
# a DataVolume may adopt a same-named PVC that is not its own
DATA_VOLUME_CLAIM_ADOPTION: Final = "DataVolumeClaimAdoption"
# what `cdi up` installs, as CDI's released `cdi-cr.yaml`
RELEASED_GATES: Final = (HONOR_WAIT_FOR_FIRST_CONSUMER,)

_TRUE = {"1", "t", "T", "TRUE", "true", "True"}


def enabled(config: Body | None, gate: str) -> bool:
    """Whether CDIConfig `config` (the whole object) lists `gate`."""
    spec: Body = (config or {}).get("spec") or {}
    return gate in (spec.get("featureGates") or [])


def _annotations(obj: Body) -> Mapping[str, str]:
    return (obj.get("metadata") or {}).get("annotations") or {}


def populated_for(pvc: Body, dv: Body) -> bool:
    """The claim says it already holds the data of this DataVolume (`storage.populatedFor: <dv name>`)."""
    return _annotations(pvc).get(ann.POPULATED_FOR) == (dv.get("metadata") or {}).get("name")


def allow_claim_adoption(pvc: Body, dv: Body, gate_enabled: bool) -> bool:
    """CDI's AllowClaimAdoption: never a claim this DataVolume created itself; else the DataVolume's
    `allowClaimAdoption` annotation when present (Go's ParseBool, anything else is false), else the
    `DataVolumeClaimAdoption` gate."""
    uid = (dv.get("metadata") or {}).get("uid")
    if uid and _annotations(pvc).get(ann.CREATED_FOR_DATAVOLUME) == uid:
        return False
    value = _annotations(dv).get(ann.ALLOW_CLAIM_ADOPTION)
    if value is not None:
        return value in _TRUE
    return gate_enabled


def claim_requires_work(pvc: Body, dv: Body, gate_enabled: bool) -> bool:
    """CDI's pvcRequiresWork: False when the DataVolume takes the claim as it is (already populated for
    it, or adopted) instead of filling it."""
    return not (populated_for(pvc, dv) or allow_claim_adoption(pvc, dv, gate_enabled))
