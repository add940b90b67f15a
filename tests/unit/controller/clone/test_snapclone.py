"""SnapshotClone: a claim restored from a snapshot, the temporary claim of a smart clone (or of a clone of
a VolumeSnapshot), or the claim a host-assisted copy of a snapshot reads."""

from __future__ import annotations

from typing import Any

import pytest

from cdi.api import groups
from cdi.controller.clone import planner
from cdi.controller.clone.phase import WAIT, Step
from cdi.controller.clone.snapclone import SnapshotClonePhase, SourceRestorePhase
from cdi.controller.clone.target import temp_claim_name, temp_snapshot_name, temp_source_claim_name
from cdi.controller.runtime import Context
from tests.support.fakekube import FakeKube
from tests.unit.controller.clone.objects import SOURCE, A, bind, clone, source_claim, stored, target_claim
from tests.unit.controller.conftest import NAMESPACE, STORAGE_CLASS

Obj = dict[str, Any]
SNAPSHOT_REF = {"apiGroup": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot"}


def snapshot(kube: FakeKube, name: str, *, restore_size: str | None = "1Gi", ready: bool = True,
             content: str | None = None) -> Obj:
    status: Obj = {"readyToUse": ready, **({"restoreSize": restore_size} if restore_size else {}),
                   **({"boundVolumeSnapshotContentName": content} if content else {})}
    return kube.add(groups.VOLUMESNAPSHOTS, {"metadata": {"name": name, "namespace": NAMESPACE},
                                             "spec": {"source": {"persistentVolumeClaimName": SOURCE}},
                                             "status": status})


def content(kube: FakeKube, name: str, driver: str, mode: str = "Block") -> None:
    kube.add(groups.VOLUMESNAPSHOTCONTENTS, {"metadata": {"name": name}, "spec": {
        "driver": driver, "sourceVolumeMode": mode}})


async def test_a_smart_clone_restores_its_snapshot_at_the_restore_size(kube: FakeKube, ctx: Context) -> None:
    source_claim(kube, capacity="3Gi")
    target = target_claim(kube, planner.SNAPSHOT, phase="Snapshot")
    snapshot(kube, temp_snapshot_name(target), restore_size="1Gi")
    phase = SnapshotClonePhase(clone(ctx, kube), temp_snapshot_name(target), taken_of=SOURCE)
    assert await phase.reconcile() == Step()
    temp = stored(kube, groups.PVCS, temp_claim_name(target))
    assert temp["spec"]["dataSource"] == {**SNAPSHOT_REF, "name": temp_snapshot_name(target)}
    assert temp["spec"]["resources"]["requests"]["storage"] == "1Gi"
    assert temp["spec"]["storageClassName"] == STORAGE_CLASS


@pytest.mark.parametrize(("taken_of", "size"), [(SOURCE, "3Gi"), (None, "2Gi")])
async def test_a_snapshot_without_a_restore_size_is_restored_at_its_sources_or_the_targets(
        kube: FakeKube, ctx: Context, taken_of: str | None, size: str) -> None:
    source_claim(kube, capacity="3Gi")
    target = target_claim(kube, planner.SNAPSHOT, size="2Gi")
    snapshot(kube, "snap", restore_size=None)
    await SnapshotClonePhase(clone(ctx, kube), "snap", taken_of=taken_of).reconcile()
    assert stored(kube, groups.PVCS, temp_claim_name(target))["spec"]["resources"]["requests"]["storage"] == size


async def test_done_once_the_restored_claim_is_bound(kube: FakeKube, ctx: Context) -> None:
    target = target_claim(kube, planner.SNAPSHOT, kind="snapshot", source="snap")
    snapshot(kube, "snap")
    await SnapshotClonePhase(clone(ctx, kube), "snap").reconcile()
    assert await SnapshotClonePhase(clone(ctx, kube), "snap").reconcile() is WAIT
    bind(kube, temp_claim_name(target), "1Gi")
    assert await SnapshotClonePhase(clone(ctx, kube), "snap").reconcile() is None
    assert kube.created(groups.PVCS) == [f"{NAMESPACE}/{temp_claim_name(target)}"]


async def test_a_copy_of_a_snapshot_reads_it_restored_in_a_class_of_its_driver(kube: FakeKube, ctx: Context) -> None:
    for name in ("zz-last", "aa-first"):
        kube.add(groups.STORAGECLASSES, {"metadata": {"name": name}, "provisioner": "snap.driver"})
    target = target_claim(kube, planner.COPY, kind="snapshot", source="snap", size="2Gi")
    snapshot(kube, "snap", restore_size="1Gi", content="content-1")
    content(kube, "content-1", "snap.driver", mode="Block")
    assert await SourceRestorePhase(clone(ctx, kube)).reconcile() == Step()
    restored = stored(kube, groups.PVCS, temp_source_claim_name(target))
    assert restored["spec"] == {"storageClassName": "aa-first", "accessModes": ["ReadWriteOnce"],
                                "volumeMode": "Block", "resources": {"requests": {"storage": "1Gi"}},
                                "dataSource": {**SNAPSHOT_REF, "name": "snap"}}
    assert restored["metadata"]["labels"][A + "OwnedByUID"] == target["metadata"]["uid"]
    # done as soon as it exists: on a WaitForFirstConsumer class the clone source pod is its consumer
    assert await SourceRestorePhase(clone(ctx, kube)).reconcile() is None


async def test_a_copy_of_a_snapshot_waits_for_it_to_be_ready(kube: FakeKube, ctx: Context) -> None:
    kube.add(groups.STORAGECLASSES, {"metadata": {"name": "other"}, "provisioner": "snap.driver"})
    target = target_claim(kube, planner.COPY, kind="snapshot", source="snap")
    snapshot(kube, "snap", ready=False, content="content-1")
    content(kube, "content-1", "snap.driver")
    assert await SourceRestorePhase(clone(ctx, kube)).reconcile() is WAIT
    assert kube.object(groups.PVCS, temp_source_claim_name(target), NAMESPACE) is None


async def test_a_copy_of_a_snapshot_whose_driver_has_no_class_is_retried(kube: FakeKube, ctx: Context) -> None:
    target_claim(kube, planner.COPY, kind="snapshot", source="snap")
    snapshot(kube, "snap", content="content-1")
    content(kube, "content-1", "gone.driver")
    with pytest.raises(RuntimeError, match="unable to find a valid storage class"):
        await SourceRestorePhase(clone(ctx, kube)).reconcile()
