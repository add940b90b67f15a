"""Creates the API server refuses for a ResourceQuota, reported as CDI reports them and retried until
the quota has room.

CDI's controllers tell a quota refusal from any other error by the API server's words (`exceeded
quota:`, its ErrQuotaExceeded) and report it with the reason `ErrExceededQuota`: a DataVolume whose claim
is refused stays Pending with that reason and the API server's message on its Bound and Ready conditions
(`claim_refused`); a claim whose worker pod, scratch claim, prime claim or clone temporary is refused
gets a Warning event and the Running condition (`worker_refused`), which its DataVolume shows and
repeats as a Warning. Then the reconcile raises `RetryLater`: the key is retried with the work queue's
backoff, and, sooner, whenever a ResourceQuota of its namespace changes (`quota_watch`), so raising the
quota, or deleting what filled it, is all an admin has to do.

Unlike CDI, a refused worker pod's message is the API server's (which quota, how much was asked, used and
allowed) rather than "request access to cdi-deploy logs": a quota is the namespace's own, readable by
whoever may read the DataVolume."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from cdi.api import annotations as ann
from cdi.api import groups
from cdi.api.phases import EventReason
from cdi.api.views import ObjectView
from cdi.controller.claims import annotate
from cdi.controller.runtime import Context, RetryLater
from cdi.controller.watches import Watch
from cdi.kube import WARNING, Forbidden

Body = Mapping[str, Any]

ERR_EXCEEDED_QUOTA = EventReason.ERR_EXCEEDED_QUOTA.value
QUOTA_TEXT = "exceeded quota:"  # CDI's ErrQuotaExceeded looks for these words in the API server's refusal


def refusal(exc: BaseException) -> str | None:
    """The API server's message when `exc` is a quota refusal, else None."""
    if isinstance(exc, Forbidden) and QUOTA_TEXT in exc.message:
        return exc.message
    return None


async def worker_refused(ctx: Context, claim: Body, message: str) -> RetryLater:
    """A worker's pod or claim was refused for quota: a Warning on `claim` (CDI's HandleFailedPod event) and
    its Running condition False with `ErrExceededQuota` and the API server's message (what the DataVolume
    shows). Returns what the caller raises."""
    ctx.recorder.record(claim, WARNING, ERR_EXCEEDED_QUOTA, message)
    await annotate(ctx, claim, {ann.CONDITION_RUNNING: "false", ann.CONDITION_RUNNING_REASON: ERR_EXCEEDED_QUOTA,
                                ann.CONDITION_RUNNING_MESSAGE: message})
    return RetryLater(message)


async def worker_admitted(ctx: Context, claim: Body) -> None:
    """What a quota refused was created after all: the Running condition no longer says it was (for the
    callers whose next write does not set that condition anyway)."""
    if ObjectView(claim).annotations.get(ann.CONDITION_RUNNING_REASON) == ERR_EXCEEDED_QUOTA:
        await annotate(ctx, claim, {ann.CONDITION_RUNNING: None, ann.CONDITION_RUNNING_REASON: None,
                                    ann.CONDITION_RUNNING_MESSAGE: None})


def waiting_on_quota(obj: Body) -> bool:
    """A claim whose worker, or a DataVolume whose claim or whose claim's worker or clone temporary (its
    Running condition), a quota refused (and that is retried)."""
    view = ObjectView(obj)
    if view.annotations.get(ann.CONDITION_RUNNING_REASON) == ERR_EXCEEDED_QUOTA:
        return True
    conditions = view.status.get("conditions")
    return any(isinstance(c, Mapping) and c.get("type") in ("Bound", "Running") and
               c.get("reason") == ERR_EXCEEDED_QUOTA for c in conditions or ())


def quota_watch(ctx: Context, kind: groups.GVR, ours: Callable[[Body], bool]) -> Watch:
    """A ResourceQuota change (raised, or with room freed) requeues the objects of `kind` in its namespace
    that a quota held back and that `ours` says are this reconciler's."""

    def keys(quota: Body) -> Iterable[str]:
        namespace = ObjectView(quota).namespace
        return [ObjectView(obj).key for obj in ctx.cached_list(kind, namespace) if waiting_on_quota(obj) and ours(obj)]

    return Watch(groups.RESOURCEQUOTAS, keys)
