"""SnapshotClone (CDI's snap-clone.go): a claim restored from a VolumeSnapshot, in two forms.

- `SnapshotClonePhase`: the temporary claim `tmp-pvc-<target uid>` restored from the snapshot, at its
  restoreSize (a smart clone's own snapshot, or the snapshot a `source.snapshot` clone names); done
  once bound. PrepClaim and Rebind follow.
- `SourceRestorePhase`: a host-assisted copy reads a claim, never a snapshot: as CDI's
  planHostAssistedFromSnapshot, the snapshot is restored into `tmp-source-pvc-<target uid>` beside it,
  of the first class (by name) of the snapshot's driver, ReadWriteOnce, in the volume mode the snapshot
  was taken of, at its restore size; done once that claim exists (not bound: on a WaitForFirstConsumer
  class the clone source pod is its consumer). HostClone reads it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from cdi.api import annotations as ann
from cdi.api import groups
from cdi.api.views import ClaimView, ObjectView, SnapshotContentView, SnapshotView
from cdi.controller.clone.phase import WAIT, Step
from cdi.controller.clone.size import byte_count
from cdi.controller.clone.target import CloneTarget, temp_source_claim_name

SNAPSHOT_CLONE = "SnapshotClone"


def snapshot_ref(name: str) -> dict[str, str]:
    return {"apiGroup": groups.SNAPSHOT_GROUP, "kind": "VolumeSnapshot", "name": name}


@dataclass(frozen=True)
class SnapshotClonePhase:
    target: CloneTarget
    snapshot: str  # the VolumeSnapshot restored, in the source namespace
    taken_of: str | None = None  # the claim it was taken of, whose capacity sizes it when it has no restoreSize
    name: ClassVar[str] = SNAPSHOT_CLONE

    async def reconcile(self) -> Step | None:
        target = self.target
        if target.temp is not None:
            return None if ClaimView(target.temp).bound else WAIT
        namespace = target.source_namespace
        snapshot = await target.get(groups.VOLUMESNAPSHOTS, self.snapshot, namespace)
        source = target.ctx.cached(groups.PVCS, self.taken_of, namespace) if self.taken_of else None
        size = SnapshotView(snapshot or {}).restore_size or ClaimView(source or {}).capacity or \
            target.view.requested_storage
        await target.create_temp(size, snapshot_ref(self.snapshot))
        return Step()


@dataclass(frozen=True)
class SourceRestorePhase:
    target: CloneTarget
    name: ClassVar[str] = SNAPSHOT_CLONE

    async def reconcile(self) -> Step | None:
        target = self.target
        namespace, snapshot_name = target.source_namespace, target.source_name
        name = temp_source_claim_name(target.claim)
        if await target.get(groups.PVCS, name, namespace) is not None:
            return None
        snapshot = target.ctx.cached(groups.VOLUMESNAPSHOTS, snapshot_name, namespace)
        content_name = SnapshotView(snapshot or {}).content_name
        content = target.ctx.cached(groups.VOLUMESNAPSHOTCONTENTS, content_name, "") if content_name else None
        if snapshot is None or content is None or not SnapshotView(snapshot).ready_to_use:
            return WAIT  # the DataVolume's planning waits for a ready snapshot; the cache is behind
        driver = SnapshotContentView(content).driver
        classes = sorted(ObjectView(sc).name for sc in target.ctx.cached_list(groups.STORAGECLASSES)
                         if sc.get("provisioner") == driver)
        if not classes:
            # CDI's error, retried with back-off; the target's DataVolume stays in CloneScheduled
            raise RuntimeError("unable to find a valid storage class for the temporal source claim")
        size = SnapshotView(snapshot).restore_size
        if not byte_count(size):
            size = target.view.requested_storage
        claim = {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                 "metadata": {"name": name, "namespace": namespace, "labels": target.temporary_labels(),
                              "annotations": {ann.BIND_IMMEDIATE: "true"}},
                 "spec": {"storageClassName": classes[0], "accessModes": ["ReadWriteOnce"],
                          "volumeMode": SnapshotContentView(content).source_volume_mode or target.view.volume_mode,
                          "resources": {"requests": {"storage": size}},
                          "dataSource": snapshot_ref(snapshot_name)}}
        await target.create(groups.PVCS, claim)
        return Step()
