"""The scheduler of a one-node cluster: a pending pod goes to this node once its node selector and
required node affinity match the node, and its claims allow it. A claim of a
`WaitForFirstConsumer` class is what the pod is waiting for: the scheduler marks it with
`volume.kubernetes.io/selected-node` (so the provisioner makes its volume) and binds the pod only
once the claim is bound, as the volume binding plugin does. A pod whose claims are missing or
unbound with `Immediate` binding is reported `Unschedulable`."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from cdi.api import annotations as ann
from cdi.api.groups import NODES, PODS, PVCS, STORAGECLASSES
from cdi.embedded.control import Controller, Key, LocalApi
from cdi.embedded.node.podstatus import now

log = logging.getLogger(__name__)

Obj = dict[str, Any]


def _match_expression(labels: dict[str, str], expr: Obj) -> bool:
    key, op, values = expr.get("key", ""), expr.get("operator", "In"), expr.get("values") or []
    if op == "In":
        return labels.get(key) in values
    if op == "NotIn":
        return labels.get(key) not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    if op in ("Gt", "Lt"):
        try:
            value, bound = int(labels.get(key, "")), int(values[0])
        except (ValueError, IndexError):
            return False
        return value > bound if op == "Gt" else value < bound
    return False


def node_matches(pod: Obj, node: Obj) -> bool:
    """nodeSelector and requiredDuringSchedulingIgnoredDuringExecution node affinity."""
    labels = node["metadata"].get("labels") or {}
    spec = pod.get("spec") or {}
    for key, value in (spec.get("nodeSelector") or {}).items():
        if labels.get(key) != value:
            return False
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = required.get("nodeSelectorTerms") or []
    if terms:
        fields = {"metadata.name": node["metadata"]["name"]}
        return any(all(_match_expression(labels, e) for e in term.get("matchExpressions") or []) and
                   all(_match_expression(fields, e) for e in term.get("matchFields") or [])
                   for term in terms)
    return True


def claim_names(pod: Obj) -> list[str]:
    return [v["persistentVolumeClaim"]["claimName"] for v in (pod.get("spec") or {}).get("volumes") or []
            if (v.get("persistentVolumeClaim") or {}).get("claimName")]


class Scheduler(Controller):
    name = "scheduler"

    def __init__(self, api: LocalApi, node_name: str) -> None:
        super().__init__()
        self.api = api
        self.node_name = node_name
        self.resync = 10.0
        self._reported: dict[Key, str] = {}

    def sources(self) -> Iterable[tuple[Any, Any]]:
        def pod_key(type_: str, pod: Obj) -> Iterable[Key]:
            if type_ != "DELETED" and not (pod.get("spec") or {}).get("nodeName"):
                yield pod["metadata"]["namespace"], pod["metadata"]["name"]

        def from_claim(_: str, pvc: Obj) -> Iterable[Key]:
            ns = pvc["metadata"]["namespace"]
            for pod in self.api.pods_of_claim(ns, pvc["metadata"]["name"]):
                if not (pod.get("spec") or {}).get("nodeName"):
                    yield ns, pod["metadata"]["name"]

        return [(PODS, pod_key), (PVCS, from_claim), (NODES, lambda _t, _o: self.all_keys())]

    def all_keys(self) -> Iterable[Key]:
        return [(p["metadata"]["namespace"], p["metadata"]["name"]) for p in self.api.list(PODS)
                if not (p.get("spec") or {}).get("nodeName")]

    async def reconcile(self, key: Key) -> None:
        ns, name = key
        pod = self.api.get(PODS, ns, name)
        if pod is None:
            self._reported.pop(key, None)
            return
        spec = pod.get("spec") or {}
        if spec.get("nodeName") or pod["metadata"].get("deletionTimestamp"):
            return
        if spec.get("schedulerName", "default-scheduler") != "default-scheduler":
            return
        if spec.get("schedulingGates"):
            await self._condition(pod, "False", "SchedulingGated", "Scheduling is blocked due to non-empty "
                                                                   "scheduling gates")
            return
        node = self.api.get(NODES, None, self.node_name)
        if node is None:
            return
        if not node_matches(pod, node):
            await self._unschedulable(pod, "0/1 nodes are available: 1 node(s) didn't match Pod's node "
                                           "affinity/selector. preemption: 0/1 nodes are available: 1 Preemption "
                                           "is not helpful for scheduling.")
            return
        waiting = False
        for claim in claim_names(pod):
            pvc = self.api.get(PVCS, ns, claim)
            if pvc is None:
                await self._unschedulable(pod, f'0/1 nodes are available: persistentvolumeclaim "{claim}" not '
                                               "found. preemption: 0/1 nodes are available: 1 Preemption is not "
                                               "helpful for scheduling.")
                return
            if pvc["metadata"].get("deletionTimestamp"):
                await self._unschedulable(pod, f'0/1 nodes are available: persistentvolumeclaim "{claim}" is '
                                               "being deleted. preemption: 0/1 nodes are available: 1 Preemption "
                                               "is not helpful for scheduling.")
                return
            if (pvc.get("spec") or {}).get("volumeName") and (pvc.get("status") or {}).get("phase") == "Bound":
                continue
            class_name = (pvc.get("spec") or {}).get("storageClassName")
            sc = self.api.get(STORAGECLASSES, None, class_name) if class_name else None
            if sc is not None and sc.get("volumeBindingMode") == "WaitForFirstConsumer":
                annotations = pvc["metadata"].get("annotations") or {}
                if annotations.get(ann.SELECTED_NODE) != self.node_name:
                    await self.api.patch(PVCS, ns, claim, {"metadata": {"annotations": {
                        ann.SELECTED_NODE: self.node_name}}})
                    log.info("selected node %s for claim %s/%s (pod %s)", self.node_name, ns, claim, name)
                waiting = True
                continue
            await self._unschedulable(pod, "0/1 nodes are available: pod has unbound immediate "
                                           "PersistentVolumeClaims. preemption: 0/1 nodes are available: 1 "
                                           "Preemption is not helpful for scheduling.")
            return
        if waiting:
            return  # bound later: a claim event brings the pod back here
        await self._condition(pod, "True")  # before the binding, as the Binding call sets both at once
        await self.api.patch(PODS, ns, name, {"spec": {"nodeName": self.node_name}})
        self._reported.pop(key, None)
        await self.api.record_event({**pod, "kind": "Pod", "apiVersion": "v1"}, "Scheduled",
                                    f"Successfully assigned {ns}/{name} to {self.node_name}",
                                    component="default-scheduler")

    async def _condition(self, pod: Obj, status: str, reason: str = "", message: str = "") -> None:
        conditions = [c for c in (pod.get("status") or {}).get("conditions") or [] if c.get("type") != "PodScheduled"]
        cond: Obj = {"type": "PodScheduled", "status": status, "lastProbeTime": None, "lastTransitionTime": now()}
        if reason:
            cond["reason"] = reason
        if message:
            cond["message"] = message
        current = self.api.get(PODS, pod["metadata"]["namespace"], pod["metadata"]["name"])
        if current is None:
            return
        await self.api.patch(PODS, pod["metadata"]["namespace"], pod["metadata"]["name"],
                             {"status": {"conditions": [*conditions, cond]}}, status=True)

    async def _unschedulable(self, pod: Obj, message: str) -> None:
        key = (pod["metadata"]["namespace"], pod["metadata"]["name"])
        if self._reported.get(key) == message:
            return
        self._reported[key] = message
        await self._condition(pod, "False", "Unschedulable", message)
        await self.api.record_event({**pod, "kind": "Pod", "apiVersion": "v1"}, "FailedScheduling", message,
                                    "Warning", "default-scheduler")
