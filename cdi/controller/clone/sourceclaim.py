"""Whether a clone may read its source claim now (CDI's IsSourceClaimReady): it exists, it is bound, and no
running pod may write to it, since a copy or a snapshot of a volume being written is not the disk anyone
meant. Until then the clone waits in the phase that would start, and says why: a Warning event per cause
on the DataVolume (the claim of a clone populator) and the target's Running condition, once.

Ours (an extension, README "Extensions"): a target that says `extensions.cdi.dev/clone.allowSourceInUse:
"true"` does not wait for writers when the storage takes the copy at one instant (a CSI clone, a
snapshot): the clone is what a power cut would have left on the source, and a Warning event
(`CrashConsistentClone`) names the pods that were writing. A host-assisted copy reads the source over
minutes, so no instant holds: it waits as before, and its message says the opt-in does not apply."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cdi.api import annotations as ann
from cdi.api import groups
from cdi.api.phases import EventReason
from cdi.api.views import ClaimView, PodView
from cdi.controller.clone.phase import WAIT, Step
from cdi.controller.clone.target import SOURCE_CONTAINER, CloneTarget
from cdi.kube import WARNING

Obj = dict[str, Any]
Body = Mapping[str, Any]

CLONE_SOURCE_IN_USE = EventReason.CLONE_SOURCE_IN_USE.value
CRASH_CONSISTENT_CLONE = "CrashConsistentClone"  # ours: the Warning of a clone taken while the source was written
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


def _told(target: CloneTarget) -> Body:
    """Whom the clone's events are about: the DataVolume of the target's name, else the claim itself."""
    return target.ctx.cached(groups.DATAVOLUMES, target.view.name, target.view.namespace) or target.claim


def waiting(target: CloneTarget, phase: str, reason: str, messages: list[str]) -> Step:
    """The clone cannot start `phase` yet (CloneSourceInUse, CloneWithoutSource): an event per cause and
    the Running condition, unless the target says so already."""
    claim, message = target.view, "; ".join(messages)
    if claim.annotations.get(ann.CONDITION_RUNNING_MESSAGE) == message and \
            claim.annotations.get(ann.CLONE_PHASE) == phase:
        return WAIT
    for each in messages:
        target.ctx.recorder.record(_told(target), WARNING, reason, each)
    return Step({ann.CONDITION_RUNNING: "false", ann.CONDITION_RUNNING_REASON: reason,
                 ann.CONDITION_RUNNING_MESSAGE: message})


def allows_in_use(target: CloneTarget) -> bool:
    return target.view.annotations.get(ann.CLONE_ALLOW_SOURCE_IN_USE) == "true"


def while_in_use(target: CloneTarget, phase: str, claim: str, *, instant: bool = False) -> Step | None:
    """A wait while a pod may write to `claim`, else None. `instant`: the phase copies the source at one
    instant (CSI clone, snapshot), so a target that allows it goes on, crash-consistent, with a Warning."""
    users = [PodView(p).key for p in pods_using(target, claim)]
    if not users:
        return None
    if instant and allows_in_use(target):
        target.ctx.recorder.record(
            _told(target), WARNING, CRASH_CONSISTENT_CLONE,
            f"cloning PersistentVolumeClaim {target.source_namespace}/{claim} while pod {', '.join(users)} may "
            f"write to it ({ann.CLONE_ALLOW_SOURCE_IN_USE}): the copy is crash-consistent")
        return None
    note = f" ({ann.CLONE_ALLOW_SOURCE_IN_USE} applies to csi-clone and snapshot clones only)" \
        if allows_in_use(target) else ""
    return waiting(target, phase, CLONE_SOURCE_IN_USE,
                   [f"pod {key} using PersistentVolumeClaim {claim}{note}" for key in users])


def until_ready(target: CloneTarget, phase: str, *, instant: bool = False) -> Step | None:
    """A wait while the source claim is missing, unbound, being deleted or in use, else None (CDI's
    IsSourceClaimReady; unlike CDI, a claim being deleted is no source to start from: the pod that held it
    just went, and a copy or snapshot begun now races its volume's deletion). `instant` as for `while_in_use`."""
    namespace, name = target.source_namespace, target.source_name
    source = target.ctx.cached(groups.PVCS, name, namespace)
    if source is None or not ClaimView(source).bound or ClaimView(source).deleting:
        return waiting(target, phase, CLONE_WITHOUT_SOURCE,
                       [f"The source pvc {namespace}/{name} doesn't exist" if source is None else
                        f"The source pvc {namespace}/{name} is being deleted" if ClaimView(source).deleting else
                        f"The source pvc {namespace}/{name} is not bound"])
    return while_in_use(target, phase, name, instant=instant)
