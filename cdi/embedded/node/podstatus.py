"""Pod phase and conditions from container states, by the kubelet's rules (`getPhase`,
`GeneratePodReadyCondition` ...), kept pure so that they can be tested without running anything."""

from __future__ import annotations

import datetime
from typing import Any

Obj = dict[str, Any]


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def pod_phase(restart_policy: str, init_statuses: list[Obj], statuses: list[Obj], init_failed: bool) -> str:
    """The pod phase the kubelet reports for these container statuses."""
    if init_failed and restart_policy == "Never":
        return "Failed"
    init_done = all("terminated" in (s.get("state") or {}) and s["state"]["terminated"].get("exitCode") == 0
                    for s in init_statuses)
    if not init_done:
        return "Pending"
    waiting = running = stopped = succeeded = 0
    for status in statuses:
        state = status.get("state") or {}
        if "running" in state:
            running += 1
        elif "terminated" in state:
            stopped += 1
            if state["terminated"].get("exitCode") == 0:
                succeeded += 1
        elif "terminated" in (status.get("lastState") or {}):
            stopped += 1
        else:
            waiting += 1
    if waiting:
        return "Pending"
    if running:
        return "Running"
    if stopped:
        if restart_policy == "Always":
            return "Running"
        if stopped == succeeded:
            return "Succeeded"
        return "Running" if restart_policy == "OnFailure" else "Failed"
    return "Pending"


def _condition(kind: str, ok: bool, reason: str = "", message: str = "") -> Obj:
    cond: Obj = {"type": kind, "status": "True" if ok else "False", "lastProbeTime": None}
    if reason:
        cond["reason"] = reason
    if message:
        cond["message"] = message
    return cond


def pod_conditions(phase: str, scheduled: Obj | None, sandbox_ready: bool, init_statuses: list[Obj],
                   statuses: list[Obj]) -> list[Obj]:
    """PodReadyToStartContainers, Initialized, Ready, ContainersReady, PodScheduled."""
    pending_init = [s["name"] for s in init_statuses
                    if not ("terminated" in (s.get("state") or {}) and
                            s["state"]["terminated"].get("exitCode") == 0)]
    if pending_init:
        initialized = _condition("Initialized", False, "ContainersNotInitialized",
                                 f"containers with incomplete status: [{' '.join(pending_init)}]")
    elif init_statuses and phase in ("Succeeded", "Failed"):
        initialized = _condition("Initialized", True, "PodCompleted")
    else:
        initialized = _condition("Initialized", True)
    if phase == "Succeeded":
        ready = _condition("ContainersReady", False, "PodCompleted")
    else:
        unready = [s["name"] for s in statuses if not s.get("ready")]
        if unready:
            ready = _condition("ContainersReady", False, "ContainersNotReady",
                               f"containers with unready status: [{' '.join(unready)}]")
        else:
            ready = _condition("ContainersReady", True)
    pod_ready = {**ready, "type": "Ready"}
    conditions = [_condition("PodReadyToStartContainers", sandbox_ready and phase not in ("Succeeded", "Failed")),
                  initialized, pod_ready, ready]
    conditions.append(scheduled or _condition("PodScheduled", True))
    return conditions


def carry_transition_times(new: list[Obj], old: list[Obj]) -> list[Obj]:
    """Keep `lastTransitionTime` of conditions whose status did not change."""
    previous = {c.get("type"): c for c in old}
    stamp = now()
    for cond in new:
        before = previous.get(cond["type"])
        if before is not None and before.get("status") == cond["status"] and before.get("lastTransitionTime"):
            cond["lastTransitionTime"] = before["lastTransitionTime"]
        elif not cond.get("lastTransitionTime"):
            cond["lastTransitionTime"] = stamp
    return new
