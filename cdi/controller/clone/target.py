"""One clone as its phases see it: the target claim, the source it records, and the temporary objects
made for it in the source namespace (CDI names them after the target's uid, so a clone finds its own
again at every look):

- `tmp-pvc-<target uid>`, the claim that is filled (cloned, restored or copied into) and whose volume
  is then handed to the target;
- `tmp-snapshot-<target uid>`, a smart clone's snapshot of the source;
- `tmp-source-pvc-<target uid>`, a snapshot restored for a host-assisted copy to read;
- `<tmp-pvc uid>-source-pod` (and its Secret), the clone source pod of a host-assisted copy.

The target records its source in `cdi.kubevirt.io/storage.clone.source` (`kind/namespace/name`, written
when the clone is planned: by the clone DataVolume reconciler or the clone populator) and where the clone
is in `cdi.kubevirt.io/clonePhase` (written by `CloneTarget.record` alone)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cdi.api import annotations as ann
from cdi.api import groups
from cdi.api.views import ClaimView
from cdi.api.workeroverrides import WORKER_OVERRIDES
from cdi.controller import quota
from cdi.controller.claims import delete_if_present, get_if_present
from cdi.controller.runtime import Context
from cdi.kube import WARNING, AlreadyExists, Forbidden

Obj = dict[str, Any]
Body = Mapping[str, Any]

SOURCE_UNAUTHORIZED = "CloneSourceUnauthorized"  # ours: the recorded source is not one the clone may read
MESSAGE_SOURCE_UNAUTHORIZED = "The clone does not go on"
SOURCE_CONTAINER = "cdi-clone-source"  # the clone source pod's container, and its component label


def temp_claim_name(target: Body) -> str:
    return f"tmp-pvc-{ClaimView(target).uid}"


def temp_snapshot_name(target: Body) -> str:
    return f"tmp-snapshot-{ClaimView(target).uid}"


def temp_source_claim_name(target: Body) -> str:
    """CDI's `tmp-source-pvc-<target uid>`: a snapshot restored for a host-assisted copy to read."""
    return f"tmp-source-pvc-{ClaimView(target).uid}"


def source_pod_name(temp: Body) -> str:
    """CDI's `<uid>-source-pod` (the uid of the claim the upload server fills)."""
    return f"{ClaimView(temp).uid}-source-pod"


def recorded_source(target: Body) -> tuple[str, str, str]:
    """(kind, namespace, name) of the source the target records; empty strings where it records none."""
    kind, _, rest = ClaimView(target).annotations.get(ann.CLONE_SOURCE, "").partition("/")
    namespace, _, name = rest.partition("/")
    return kind, namespace, name


def refuse(ctx: Context, target: Body, why: str) -> None:
    """The recorded source (an annotation on a claim its user may edit) is not one this clone may read:
    a Warning on the target says why, and the clone does not move."""
    ctx.recorder.record(target, WARNING, SOURCE_UNAUTHORIZED,
                        f"{MESSAGE_SOURCE_UNAUTHORIZED}: {ann.CLONE_SOURCE}: {why}")


@dataclass(frozen=True)
class CloneTarget:
    """The target claim (as read when the look began), its source, and the temporary claim if it exists.
    Every phase of one look shares it."""

    ctx: Context
    claim: Body
    source_kind: str  # "pvc" or "snapshot"
    source_namespace: str  # where every temporary object lives
    source_name: str
    temp: Obj | None  # `tmp-pvc-<target uid>`, read from the API when the look began

    @property
    def view(self) -> ClaimView:
        return ClaimView(self.claim)

    async def get(self, gvr: groups.GVR, name: str, namespace: str) -> Obj | None:
        return await get_if_present(self.ctx, gvr, name, namespace)

    async def delete(self, gvr: groups.GVR, name: str, namespace: str) -> None:
        await delete_if_present(self.ctx, gvr, name, namespace, cached=False)

    async def create(self, gvr: groups.GVR, body: Body) -> None:
        """Create `body` in the source namespace, where it may already be from an earlier look; over a quota
        there, the target says so (CDI's checkQuotaExceeded) and the clone is tried again."""
        try:
            await self.ctx.client.create(gvr, body, self.source_namespace)
        except AlreadyExists:
            pass
        except Forbidden as exc:
            message = quota.refusal(exc)
            if message is None:
                raise
            raise await quota.worker_refused(self.ctx, self.claim, message) from exc
        else:
            await quota.worker_admitted(self.ctx, self.claim)

    def temp_claim(self, size: str, data_source: Obj | None) -> Obj:
        """`tmp-pvc-<target uid>`: the target's spec at `size`, filled from `data_source` (none: by a copy)."""
        spec = json.loads(json.dumps(self.view.spec))
        for key in ("dataSourceRef", "dataSource", "volumeName"):
            spec.pop(key, None)
        spec["resources"]["requests"]["storage"] = size
        # ours: the upload server that receives a host-assisted copy is one of the target's worker pods
        annotations = {ann.BIND_IMMEDIATE: "true",
                       **{k: v for k, v in self.view.annotations.items() if k in WORKER_OVERRIDES}}
        if data_source is not None:
            spec["dataSource"] = data_source
        elif self.view.annotations.get(ann.SELECTED_NODE):
            # a copy is made where the target's consumer runs (a WaitForFirstConsumer target waited for it):
            # the provisioner makes the temporary volume on that node, and the upload server runs beside it
            annotations[ann.SELECTED_NODE] = self.view.annotations[ann.SELECTED_NODE]
        return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": {"name": temp_claim_name(self.claim), "namespace": self.source_namespace,
                             "labels": self.temporary_labels(), "annotations": annotations},
                "spec": spec}

    def temporary_labels(self) -> dict[str, str]:
        """What marks an object made for this clone: CDI's app label, out of backups, owned by the target."""
        return {ann.LABEL_APP: ann.LABEL_APP_VALUE, ann.LABEL_EXCLUDE_FROM_BACKUP: "true",
                ann.LABEL_OWNED_BY_UID: self.view.uid}

    async def create_temp(self, size: str, data_source: Obj) -> None:
        await self.create(groups.PVCS, self.temp_claim(size, data_source))

    async def record(self, phase: str, extra: Mapping[str, str | None] | None = None) -> Obj | None:
        """Write the clone phase (with `extra` annotations) on the target; the target as written, or None
        when it already says so. The DataVolume's status is computed from the written claim at once, so
        that every phase shows (and has its event) however short."""
        changes: dict[str, str | None] = {ann.CLONE_PHASE: phase, **(extra or {})}
        if all(self.view.annotations.get(k) == v for k, v in changes.items()):
            return None
        result: Obj = await self.ctx.client.patch(groups.PVCS, self.view.name,
                                                  {"metadata": {"annotations": changes}}, self.view.namespace)
        return result

    async def delete_temporaries(self) -> None:
        for gvr, name in ((groups.PVCS, temp_claim_name(self.claim)),
                          (groups.VOLUMESNAPSHOTS, temp_snapshot_name(self.claim)),
                          (groups.PVCS, temp_source_claim_name(self.claim))):
            await self.delete(gvr, name, self.source_namespace)
