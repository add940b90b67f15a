"""Events of a claim that works on behalf of another, repeated on the claim the user looks at.

A populator fills a prime claim and a clone fills a temporary one; what went wrong there (an importer's
404, a provisioning error) is recorded on that claim, which the user never sees and which is deleted when
the volume is handed over. CDI's CopyEvents re-emits each of them on the user's claim, prefixed with
`[<source claim>] : `, once: an event whose message the target already carries, with or without the
prefix, is not repeated."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cdi.api import groups
from cdi.api.views import ObjectView
from cdi.controller.runtime import Context
from cdi.kube import NORMAL, WARNING, ApiError

Body = Mapping[str, Any]


async def _events(ctx: Context, claim: Body) -> list[dict[str, Any]]:
    view = ObjectView(claim)
    selector = f"involvedObject.name={view.name},involvedObject.uid={view.uid}"
    listed = await ctx.client.list_all(groups.EVENTS, view.namespace, field_selector=selector)
    return listed.items


async def copy_events(ctx: Context, source: Body, target: Body) -> int:
    """Re-emit `source`'s events on `target` (CDI's CopyEvents); returns how many were queued. A failed
    list is logged by the caller's reconcile loop, never fatal: events are a courtesy."""
    try:
        theirs, mine = await _events(ctx, source), await _events(ctx, target)
    except ApiError:
        return 0
    prefix = f"[{ObjectView(source).name}] : "
    seen = {str(event.get("message", "")) for event in mine}
    copied = 0
    for event in theirs:
        message = str(event.get("message", ""))
        if message in seen or prefix + message in seen:
            continue
        kind = WARNING if event.get("type") == WARNING else NORMAL
        ctx.recorder.record(target, kind, str(event.get("reason", "")), prefix + message)
        seen.add(prefix + message)
        copied += 1
    return copied
