"""Rebind (CDI's rebind.go): the filled temporary claim's volume is handed to the target by moving the PV's
claimRef; the PV controller then binds the target and leaves the temporary claim Lost. The clone is in
this phase until the target holds the volume (`execute.advance` looks at that before any phase)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from cdi.api import groups
from cdi.api.views import ClaimView, PersistentVolumeView
from cdi.controller.clone.phase import WAIT, Step
from cdi.controller.clone.target import CloneTarget

Body = Mapping[str, Any]

REBIND = "Rebind"


@dataclass(frozen=True)
class RebindPhase:
    target: CloneTarget
    name: ClassVar[str] = REBIND

    async def reconcile(self) -> Step | None:
        target = self.target
        if target.temp is None:
            return WAIT  # the phases before make it
        await rebind(target, target.temp)
        return Step()


async def rebind(target: CloneTarget, temp: Body) -> None:
    """Point the volume of `temp` at the target claim; nothing to do when it already is."""
    pv_name = ClaimView(temp).volume_name
    pv = await target.get(groups.PVS, pv_name, "") if pv_name else None
    if pv is None:
        return
    ref, claim = PersistentVolumeView(pv).claim_ref, target.view
    if ref.get("uid") == claim.uid:
        return
    if ref.get("uid") != ClaimView(temp).uid:
        raise RuntimeError(f"PV {pv_name} bound to unexpected claim {ref.get('name')}")
    await target.ctx.client.patch(groups.PVS, pv_name, {"spec": {"claimRef": {
        "kind": "PersistentVolumeClaim", "apiVersion": "v1", "namespace": claim.namespace, "name": claim.name,
        "uid": claim.uid, "resourceVersion": claim.resource_version}}})
