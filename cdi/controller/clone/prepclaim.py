"""PrepClaim (CDI's prep-claim.go): the filled temporary claim is grown to the target's size when it came out
smaller (a CSI clone has the source's size, a restore its snapshot's); done once its capacity holds the
target's request. Expansion needs a class that allows it, which the planner checked."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from cdi.api import groups
from cdi.api.views import ClaimView
from cdi.controller.clone.phase import WAIT, Step
from cdi.controller.clone.size import byte_count
from cdi.controller.clone.target import CloneTarget

PREP_CLAIM = "PrepClaim"


@dataclass(frozen=True)
class PrepClaimPhase:
    target: CloneTarget
    name: ClassVar[str] = PREP_CLAIM

    async def reconcile(self) -> Step | None:
        target = self.target
        if target.temp is None or not ClaimView(target.temp).bound:
            return WAIT  # the phase before fills and binds it
        temp, wanted = ClaimView(target.temp), target.view.requested_storage
        want = byte_count(wanted) or 0
        if (byte_count(temp.capacity) or 0) >= want:
            return None
        if (byte_count(temp.requested_storage) or 0) < want:
            await target.ctx.client.patch(groups.PVCS, temp.name, {"spec": {"resources": {"requests": {
                "storage": wanted}}}}, target.source_namespace)
        return Step()
