"""Snapshot: a smart clone's snapshot of its source, which then holds the data whatever becomes of the
source; one that can never be taken fails the clone."""

from __future__ import annotations

import pytest

from cdi.api import groups
from cdi.controller.clone import planner
from cdi.controller.clone.phase import STARTED, WAIT, CloneFailed
from cdi.controller.clone.snapshot import SnapshotPhase
from cdi.controller.clone.target import temp_claim_name, temp_snapshot_name
from cdi.controller.runtime import Context
from tests.support.fakekube import FakeKube
from tests.unit.controller.clone.objects import (
    ALLOW_IN_USE,
    SOURCE,
    A,
    bind,
    clone,
    pod,
    source_claim,
    stored,
    target_claim,
)
from tests.unit.controller.conftest import NAMESPACE, events_of


def taken(kube: FakeKube, target: dict[str, object], ready: bool, error: str = "") -> None:
    status: dict[str, object] = {"readyToUse": ready, **({"restoreSize": "1Gi"} if ready else {}),
                                 **({"error": {"message": error}} if error else {})}
    kube.add(groups.VOLUMESNAPSHOTS, {"metadata": {"name": temp_snapshot_name(target), "namespace": NAMESPACE},
                                      "spec": {"source": {"persistentVolumeClaimName": SOURCE}}, "status": status})


async def test_the_source_is_snapshotted_with_the_planned_class(kube: FakeKube, ctx: Context) -> None:
    source_claim(kube)
    target = target_claim(kube, planner.SNAPSHOT)
    assert await SnapshotPhase(clone(ctx, kube), "csi-snapclass").reconcile() == STARTED
    snapshot = stored(kube, groups.VOLUMESNAPSHOTS, temp_snapshot_name(target))
    assert snapshot["spec"] == {"source": {"persistentVolumeClaimName": SOURCE},
                                "volumeSnapshotClassName": "csi-snapclass"}
    assert snapshot["metadata"]["labels"][A + "OwnedByUID"] == target["metadata"]["uid"]
    await SnapshotPhase(clone(ctx, kube), None).reconcile()  # asked for once
    assert kube.created(groups.VOLUMESNAPSHOTS) == [f"{NAMESPACE}/{temp_snapshot_name(target)}"]


async def test_without_a_class_the_drivers_default_is_left_to_the_snapshotter(kube: FakeKube, ctx: Context) -> None:
    source_claim(kube)
    target = target_claim(kube, planner.SNAPSHOT)
    await SnapshotPhase(clone(ctx, kube), None).reconcile()
    assert "volumeSnapshotClassName" not in stored(kube, groups.VOLUMESNAPSHOTS, temp_snapshot_name(target))["spec"]


async def test_nothing_is_snapshotted_while_a_pod_writes_to_the_source(kube: FakeKube, ctx: Context) -> None:
    source_claim(kube)
    target = target_claim(kube, planner.SNAPSHOT)
    pod(kube, "vm")
    step = await SnapshotPhase(clone(ctx, kube), None).reconcile()
    assert step is not None and step.annotations[A + "storage.condition.running.reason"] == "CloneSourceInUse"
    assert kube.object(groups.VOLUMESNAPSHOTS, temp_snapshot_name(target), NAMESPACE) is None


async def test_a_target_that_allows_it_is_snapshotted_while_a_pod_writes(kube: FakeKube, ctx: Context) -> None:
    source_claim(kube)
    target = target_claim(kube, planner.SNAPSHOT, extra=ALLOW_IN_USE)
    pod(kube, "vm")
    assert await SnapshotPhase(clone(ctx, kube), None).reconcile() == STARTED
    assert kube.object(groups.VOLUMESNAPSHOTS, temp_snapshot_name(target), NAMESPACE) is not None
    assert [e[1] for e in await events_of(ctx, "copy")] == ["CrashConsistentClone"]


async def test_done_once_the_snapshot_is_ready(kube: FakeKube, ctx: Context) -> None:
    source_claim(kube)
    target = target_claim(kube, planner.SNAPSHOT, phase="Snapshot")
    taken(kube, target, ready=False)
    assert await SnapshotPhase(clone(ctx, kube), None).reconcile() is WAIT  # the snapshotter is at it
    taken(kube, target, ready=True)
    assert await SnapshotPhase(clone(ctx, kube), None).reconcile() is None


async def test_a_taken_snapshot_outlives_its_source(kube: FakeKube, ctx: Context) -> None:
    target = target_claim(kube, planner.SNAPSHOT, phase="Snapshot")  # the source claim was deleted since
    taken(kube, target, ready=True)
    assert await SnapshotPhase(clone(ctx, kube), None).reconcile() is None
    kube.add(groups.PVCS, {"metadata": {"name": temp_claim_name(target), "namespace": NAMESPACE}, "spec": {}})
    await kube.delete(groups.VOLUMESNAPSHOTS, temp_snapshot_name(target), NAMESPACE)
    bind(kube, temp_claim_name(target), "1Gi")
    assert await SnapshotPhase(clone(ctx, kube), None).reconcile() is None  # restored: nothing to look at


@pytest.mark.parametrize("error", ["", "the volume is gone"])
async def test_a_snapshot_of_a_deleted_source_that_is_not_taken_fails_the_clone(
        kube: FakeKube, ctx: Context, error: str) -> None:
    target = target_claim(kube, planner.SNAPSHOT, phase="Snapshot")
    taken(kube, target, ready=False, error=error)
    with pytest.raises(CloneFailed) as failed:
        await SnapshotPhase(clone(ctx, kube), None).reconcile()
    why = f"the source pvc {NAMESPACE}/{SOURCE} was deleted before its snapshot {temp_snapshot_name(target)} was taken"
    assert str(failed.value) == (f"{why}: {error}" if error else why)
