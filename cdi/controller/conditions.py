"""DataVolume conditions (Bound, Running, Ready) exactly as CDI sets them: what changes a
transition time, what only a heartbeat, and how PVC annotations written by the worker-pod
controllers become the Running condition."""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

from cdi.api import annotations as ann
from cdi.api.views import ClaimView

Obj = dict[str, Any]
Body = Mapping[str, Any]

POD_RUNNING_REASON = "Pod is running"
SCRATCH_REQUIRED_REASON = "Scratch space required"
SCRATCH_REQUIRED_MESSAGE = "scratch space required and none found"  # CDI's, not worth a Warning event
IMAGE_PULL_FAILED_REASON = "ImagePullFailed"
TRANSFER_RUNNING = "TransferRunning"


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def find(conditions: list[Obj], type_: str) -> Obj | None:
    return next((c for c in conditions if c.get("type") == type_), None)


def running_message(status: Mapping[str, Any]) -> str | None:
    """The Running condition's message while it is True, else None: what a DataVolume keeps saying while
    its worker pod cannot be asked (between two scrapes, or while it restarts)."""
    running = find(list(status.get("conditions") or []), "Running")
    return str(running.get("message", "")) if running and running.get("status") == "True" else None


def update(conditions: list[Obj], type_: str, status: str, message: str, reason: str) -> list[Obj]:
    """A new status stamps the transition; a new reason or message only the heartbeat."""
    condition = find(conditions, type_)
    if condition is None:
        condition = {"type": type_}
        conditions.append(condition)
    stamp = now()
    if condition.get("status") != status:
        condition.update(lastTransitionTime=stamp, lastHeartbeatTime=stamp, message=message, reason=reason)
    elif condition.get("message") != message or condition.get("reason") != reason:
        condition.update(lastHeartbeatTime=stamp, message=message, reason=reason)
    condition["status"] = status
    return conditions


def update_bound(conditions: list[Obj], pvc: Body | None, message: str = "", reason: str = "") -> list[Obj]:
    if pvc is None:
        update(conditions, "Bound", "False", message or "No PVC found", reason or "NotFound")
        return update(conditions, "Ready", "False", "", "")
    claim = ClaimView(pvc)
    name, phase, annotations = claim.name, claim.phase, claim.annotations
    claim_condition = annotations.get(ann.CONDITION_BOUND)
    if phase == "Bound":
        if claim_condition in (None, "true"):
            return update(conditions, "Bound", "True", f"PVC {name} Bound", "Bound")
        update(conditions, "Bound", "False", annotations.get(ann.CONDITION_BOUND_MESSAGE, ""),
               annotations.get(ann.CONDITION_BOUND_REASON, ""))
    elif phase == "Pending":
        if claim_condition in (None, "true"):
            update(conditions, "Bound", "False", f"PVC {name} Pending", "Pending")
        else:
            update(conditions, "Bound", "False",
                   f"target PVC {name} Pending and {annotations.get(ann.CONDITION_BOUND_MESSAGE, '')}",
                   annotations.get(ann.CONDITION_BOUND_REASON, ""))
    elif phase == "Lost":
        update(conditions, "Bound", "False", "Claim Lost", "ClaimLost")
    else:
        update(conditions, "Bound", "False", "", "")
    return update(conditions, "Ready", "False", "", "")


def update_running(conditions: list[Obj], annotations: Mapping[str, str],
                   running_message: str | None = None, *, worker_running: bool = False) -> list[Obj]:
    """`running_message`, when given, says what the running pod is doing (what it is retrying, or the step
    it is in, read from its metrics) in place of the annotation's message. `worker_running`: a worker the
    claim's annotations do not speak for (a host-assisted copy's clone source) answered: Running, unless
    the annotations say otherwise."""
    if annotations.get(ann.POD_SCHEDULABLE) == "false":
        return update(conditions, "Running", "False", "Importer pod cannot be scheduled", "Unschedulable")
    value = annotations.get(ann.CONDITION_RUNNING)
    if value is None and worker_running:
        value, annotations = "true", {ann.CONDITION_RUNNING_REASON: POD_RUNNING_REASON}
    message = annotations.get(ann.CONDITION_RUNNING_MESSAGE, "")
    reason = annotations.get(ann.CONDITION_RUNNING_REASON, "")
    if value is None or value.lower() == "false":
        return update(conditions, "Running", "False", message, reason)
    if value.lower() == "true":
        update(conditions, "Running", "True", message if running_message is None else running_message, reason)
        return update(conditions, "Ready", "False", "", TRANSFER_RUNNING)
    return update(conditions, "Running", "Unknown", message, reason)


def update_all(status: Obj, pvc: Body | None, message: str = "", reason: str = "", *,
               running_message: str | None = None, worker_running: bool = False) -> None:
    """The three conditions from the claim and the DataVolume's phase. Idempotent: the steps below may set
    one condition more than once on the way (Ready is reset by the Bound and Running steps), so a condition
    whose final status, reason and message are the ones it had keeps its timestamps. Otherwise every
    reconcile that crossed a second boundary would stamp a new heartbeat, write the status again and repeat
    the transition's event."""
    before = {c.get("type"): c for c in status.get("conditions") or []}
    conditions: list[Obj] = [dict(c) for c in status.get("conditions") or []]
    phase = status.get("phase")
    ready = "True" if phase == "Succeeded" else "Unknown" if phase == "Unknown" else "False"
    update_bound(conditions, pvc, message, reason)
    update(conditions, "Ready", ready, message, reason)
    annotations = ClaimView(pvc).annotations if pvc else {}
    update_running(conditions, annotations, running_message, worker_running=worker_running)
    for condition in conditions:
        old = before.get(condition.get("type"))
        if old is None or old.get("status") != condition.get("status"):
            continue
        condition["lastTransitionTime"] = old.get("lastTransitionTime", condition.get("lastTransitionTime"))
        if (old.get("reason"), old.get("message")) == (condition.get("reason"), condition.get("message")):
            condition["lastHeartbeatTime"] = old.get("lastHeartbeatTime", condition.get("lastHeartbeatTime"))
    status["conditions"] = conditions
