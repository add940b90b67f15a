"""CSIClone (CDI's csi-clone.go): the temporary claim `tmp-pvc-<target uid>` in the source namespace with
the source claim as its `dataSource`, so that the CSI driver clones the volume. It has the source's
size (a driver clones no smaller; PrepClaim grows it after). Done once the clone is bound."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from cdi.api import groups
from cdi.api.views import ClaimView
from cdi.controller.clone import sourceclaim
from cdi.controller.clone.phase import STARTED, WAIT, Step
from cdi.controller.clone.target import CloneTarget

CSI_CLONE = "CSIClone"


@dataclass(frozen=True)
class CSIClonePhase:
    target: CloneTarget
    name: ClassVar[str] = CSI_CLONE

    async def reconcile(self) -> Step | None:
        target = self.target
        if target.temp is not None:
            return None if ClaimView(target.temp).bound else WAIT
        wait = sourceclaim.until_ready(target, self.name, instant=True)
        if wait is not None:
            return wait
        source = target.ctx.cached(groups.PVCS, target.source_name, target.source_namespace)
        size = ClaimView(source or {}).capacity or target.view.requested_storage
        await target.create_temp(size, {"kind": "PersistentVolumeClaim", "name": target.source_name})
        return STARTED
