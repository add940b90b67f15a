"""Events of a claim that works on behalf of another, repeated on the claim the user looks at.

A populator fills a prime claim and a clone fills a temporary one; what went wrong there (an importer's
404, a provisioning error) is recorded on that claim, which the user never sees and which is deleted when
the volume is handed over. CDI's CopyEvents re-emits each of them on the user's claim, prefixed with
`[<source claim>] : `, once: an event whose message the target already carries, with or without the
prefix, is not repeated.

The events are read from the controller's cache (an Event informer indexed by the involved object's uid), as
CDI reads them from controller-runtime's with its involvedObject field indexes: a LIST with a field selector
on every reconcile of every claim being populated cost two API requests each time, and each of them a scan of
all the namespace's events on the API server, so the cost of a DataVolume grew with the number of
DataVolumes (issue 29: 8 such LISTs per DataVolume, 43 % of the embedded API server's time at 500)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from cdi.api import groups
from cdi.api.views import ObjectView
from cdi.controller.runtime import Context
from cdi.kube import NORMAL, WARNING

Body = Mapping[str, Any]
INVOLVED_UID = "involvedObject.uid"


def _involved_uid(event: Body) -> Iterable[str]:
    uid = (event.get("involvedObject") or {}).get("uid")
    return [str(uid)] if uid else []


def events_of(ctx: Context, claim: Body) -> list[dict[str, Any]]:
    """The cached events about `claim` (its name and uid, as CDI's field selectors say)."""
    informer = ctx.informer(groups.EVENTS)
    if not informer.has_index(INVOLVED_UID):
        informer.add_index(INVOLVED_UID, _involved_uid)
    view = ObjectView(claim)
    return [event for event in informer.by_index(INVOLVED_UID, view.uid)
            if (event.get("involvedObject") or {}).get("name") == view.name]


async def copy_events(ctx: Context, source: Body, target: Body) -> int:
    """Re-emit `source`'s events on `target` (CDI's CopyEvents); returns how many were queued."""
    theirs, mine = events_of(ctx, source), events_of(ctx, target)
    prefix = f"[{ObjectView(source).name}] : "
    seen = {str(event.get("message", "")) for event in mine}
    copied = 0
    for event in theirs:
        message = str(event.get("message", ""))
        if message in seen or prefix + message in seen:
            continue
        kind = WARNING if event.get("type") == WARNING else NORMAL
        reason = str(event.get("reason", ""))
        # copied already, but not yet back in the cache: a second copy would only bump its count
        if ctx.recorder.recorded(target, kind, reason, prefix + message):
            continue
        ctx.recorder.record(target, kind, reason, prefix + message)
        seen.add(prefix + message)
        copied += 1
    return copied
