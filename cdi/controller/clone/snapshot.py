"""Snapshot (CDI's snapshot.go): a smart clone's first phase takes `tmp-snapshot-<target uid>` of the source
claim, of the VolumeSnapshotClass the planner found for the target's driver. Done once the snapshot is
ready to use (or the claim restored from it exists).

Once taken, the snapshot holds the data: the clone goes on from it whatever became of the source. One
that is not ready, of a source that is gone, never will be: the clone fails rather than wait for good."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from cdi.api import groups
from cdi.api.views import SnapshotView
from cdi.controller.clone import sourceclaim
from cdi.controller.clone.phase import STARTED, WAIT, CloneFailed, Step
from cdi.controller.clone.target import CloneTarget, temp_snapshot_name

SNAPSHOT = "Snapshot"


@dataclass(frozen=True)
class SnapshotPhase:
    target: CloneTarget
    snapshot_class: str | None  # None: the cluster's default for the driver
    name: ClassVar[str] = SNAPSHOT

    async def reconcile(self) -> Step | None:
        target = self.target
        if target.temp is not None:
            return None
        namespace, source = target.source_namespace, target.source_name
        snapshot = await target.get(groups.VOLUMESNAPSHOTS, temp_snapshot_name(target.claim), namespace)
        if snapshot is not None:
            taken = SnapshotView(snapshot)
            if taken.ready_to_use:
                return None
            if target.ctx.cached(groups.PVCS, source, namespace) is not None:
                return WAIT  # the snapshotter is still at it
            error = str((taken.status.get("error") or {}).get("message") or "")
            why = f"the source pvc {namespace}/{source} was deleted before its snapshot {taken.name} was taken"
            raise CloneFailed(f"{why}: {error}" if error else why)
        wait = sourceclaim.until_ready(target, self.name, instant=True)
        if wait is not None:
            return wait
        body: dict[str, Any] = {
            "apiVersion": groups.SNAPSHOT_API_VERSION, "kind": "VolumeSnapshot",
            "metadata": {"name": temp_snapshot_name(target.claim), "namespace": namespace,
                         "labels": target.temporary_labels()},
            "spec": {"source": {"persistentVolumeClaimName": source}}}
        if self.snapshot_class:
            body["spec"]["volumeSnapshotClassName"] = self.snapshot_class
        await target.create(groups.VOLUMESNAPSHOTS, body)
        return STARTED
