"""One look at a clone, for the clone DataVolume reconciler and the clone populator alike (CDI's
planAndExecute): once the target holds the volume, every temporary object goes and the clone has
Succeeded; until then the planner's phases for the recorded strategy are walked in order and the first
that is not done is the one recorded in `cdi.kubevirt.io/clonePhase` (also when a quota holds it). A phase
that finds the clone can never complete ends it in Error: the cause in `cdi.kubevirt.io/cloneError` and the
Running condition (reason `Error`), and no temporary object left behind.

Whether the target may read the source it records is the caller's to check first: a DataVolume's clone
token, a populated claim's VolumeCloneSource."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from cdi.api import annotations as ann
from cdi.api import groups
from cdi.api.phases import PROGRESS_COMPLETE
from cdi.api.views import ClaimView
from cdi.controller.clone import planner
from cdi.controller.clone.phase import ERROR, SUCCEEDED, CloneFailed
from cdi.controller.clone.target import CloneTarget, recorded_source, temp_claim_name
from cdi.controller.copyevents import copy_events
from cdi.controller.runtime import Context, RetryLater

Obj = dict[str, Any]
Body = Mapping[str, Any]

POLL = 1.0  # seconds between looks while a clone moves (temporary objects carry no owner to map back)


async def advance(ctx: Context, claim: Body) -> Obj | None:
    """Move the clone of the target `claim` on by one look; the target as written when its recorded phase
    (or what goes with it) changed, else None."""
    kind, namespace, name = recorded_source(claim)
    target = CloneTarget(ctx, claim, kind, namespace, name, None)
    if ClaimView(claim).volume_name:
        return await _finish(target)
    temp = await target.get(groups.PVCS, temp_claim_name(claim), namespace)
    if temp is not None:  # what happens to the temporary claim shows on the target (CDI's CopyEvents)
        await copy_events(ctx, temp, claim)
    target = dataclasses.replace(target, temp=temp)
    try:
        for phase in planner.phases(target, planner.cluster_from(ctx)):
            try:
                step = await phase.reconcile()
            except RetryLater:
                # held (a quota refused a temporary, which the target says already): the target shows the
                # phase that waits, not the one before it
                await target.record(phase.name)
                raise
            if step is not None:
                return await target.record(phase.name, step.annotations) if step.record else None
    except CloneFailed as exc:
        await target.delete_temporaries()
        why = str(exc)
        return await target.record(ERROR, {
            ann.CLONE_ERROR: why, ann.CONDITION_RUNNING: "false", ann.CONDITION_RUNNING_REASON: "Error",
            ann.CONDITION_RUNNING_MESSAGE: why})
    return None  # Rebind is never done before the target holds the volume


async def _finish(target: CloneTarget) -> Obj | None:
    """The target holds the volume: remove every temporary object, then say so."""
    if not target.view.bound:
        return None
    await target.delete_temporaries()
    return await target.record(SUCCEEDED, {ann.POPULATOR_PROGRESS: PROGRESS_COMPLETE})
