"""Whether a clone may read its source claim now (CDI's IsSourceClaimReady): it exists, it is bound, and no
running pod may write to it, since a copy or a snapshot of a volume being written is not the disk anyone
meant. Until then the clone waits in the phase that would start, and says why: a Warning event per cause
on the DataVolume (the claim of a clone populator) and the target's Running condition, once."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cdi.api import annotations as ann
from cdi.api import groups
from cdi.api.views import ClaimView, PodView
from cdi.controller.clone.phase import WAIT, Step
from cdi.controller.clone.target import SOURCE_CONTAINER, CloneTarget
from cdi.kube import WARNING

Obj = dict[str, Any]
Body = Mapping[str, Any]

CLONE_SOURCE_IN_USE = "CloneSourceInUse"
CLONE_WITHOUT_SOURCE = "CloneWithoutSource"


def _writes(pod: PodView, claim: str) -> bool:
    """The pod mounts the claim writable in one of its containers (a block device always is)."""
    for volume in pod.volumes:
        source: Body = volume.get("persistentVolumeClaim") or {}
        if source.get("claimName") != claim or source.get("readOnly"):
            continue
        for container in pod.containers:
            if any(m.get("name") == volume.get("name") and not m.get("readOnly")
                   for m in container.get("volumeMounts") or []):
                return True
            if any(d.get("name") == volume.get("name") for d in container.get("volumeDevices") or []):
                return True
    return False


def pods_using(target: CloneTarget, claim: str) -> list[Obj]:
    """Running pods that may write to `claim` in the source namespace (CDI's GetPodsUsingPVCs allowing
    read-only users). Pods that only read it, and clone source pods, do not hold a clone."""
    out = []
    for pod in target.ctx.cached_list(groups.PODS, target.source_namespace):
        view = PodView(pod)
        if view.finished or view.labels.get(ann.LABEL_OWNED_BY_UID) == target.view.uid or \
                view.labels.get(ann.LABEL_COMPONENT) == SOURCE_CONTAINER:
            continue
        if _writes(view, claim):
            out.append(pod)
    return out


def waiting(target: CloneTarget, phase: str, reason: str, messages: list[str]) -> Step:
    """The clone cannot start `phase` yet (CloneSourceInUse, CloneWithoutSource): an event per cause and
    the Running condition, unless the target says so already."""
    claim, message = target.view, "; ".join(messages)
    if claim.annotations.get(ann.CONDITION_RUNNING_MESSAGE) == message and \
            claim.annotations.get(ann.CLONE_PHASE) == phase:
        return WAIT
    owner = target.ctx.cached(groups.DATAVOLUMES, claim.name, claim.namespace)
    for each in messages:
        target.ctx.recorder.record(owner or target.claim, WARNING, reason, each)
    return Step({ann.CONDITION_RUNNING: "false", ann.CONDITION_RUNNING_REASON: reason,
                 ann.CONDITION_RUNNING_MESSAGE: message})


def while_in_use(target: CloneTarget, phase: str, claim: str) -> Step | None:
    """A wait while a pod may write to `claim`, else None."""
    users = pods_using(target, claim)
    if not users:
        return None
    return waiting(target, phase, CLONE_SOURCE_IN_USE,
                   [f"pod {PodView(p).key} using PersistentVolumeClaim {claim}" for p in users])


def until_ready(target: CloneTarget, phase: str) -> Step | None:
    """A wait while the source claim is missing, unbound or in use, else None (CDI's IsSourceClaimReady)."""
    namespace, name = target.source_namespace, target.source_name
    source = target.ctx.cached(groups.PVCS, name, namespace)
    if source is None or not ClaimView(source).bound:
        return waiting(target, phase, CLONE_WITHOUT_SOURCE,
                       [f"The source pvc {namespace}/{name} doesn't exist" if source is None else
                        f"The source pvc {namespace}/{name} is not bound"])
    return while_in_use(target, phase, name)
