"""The clone reconciler's first steps against the in-memory fake client, for the states a race leaves
behind that the end-to-end tests cannot hold still (issue #27): a smart clone's source written by a
pod, a snapshot clone whose source was deleted after its snapshot was asked for, with the snapshot taken
or never to be."""

from __future__ import annotations

from typing import Any

from cdi.api import groups
from cdi.controller.clone import planner
from cdi.controller.clone.target import temp_claim_name, temp_snapshot_name
from cdi.controller.datavolume.clones import CloneReconciler
from cdi.controller.runtime import Context
from tests.support.fakekube import FakeKube
from tests.unit.controller.conftest import NAMESPACE, STORAGE_CLASS, events_of

Obj = dict[str, Any]
A = "cdi.kubevirt.io/"


def source_claim(kube: FakeKube) -> None:
    kube.add(groups.PVCS, {"metadata": {"name": "golden", "namespace": NAMESPACE},
                           "spec": {"storageClassName": STORAGE_CLASS, "volumeName": "pv-golden",
                                    "resources": {"requests": {"storage": "1Gi"}}},
                           "status": {"phase": "Bound", "capacity": {"storage": "1Gi"}}})


def target(kube: FakeKube, strategy: str) -> Obj:
    """A clone DataVolume's target as the reconciler created it, the DataVolume showing its phase."""
    kube.add(groups.DATAVOLUMES, {"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
                                  "metadata": {"name": "copy", "namespace": NAMESPACE, "uid": "dv-uid"},
                                  "spec": {"source": {"pvc": {"namespace": NAMESPACE, "name": "golden"}}},
                                  "status": {"phase": "CloneScheduled"}})
    return kube.add(groups.PVCS, {"metadata": {
        "name": "copy", "namespace": NAMESPACE, "annotations": {
            A + "cloneType": strategy, A + "clonePhase": "Pending",
            A + "storage.clone.source": f"pvc/{NAMESPACE}/golden"},
        "ownerReferences": [{"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume", "name": "copy",
                             "uid": "dv-uid", "controller": True}]},
        "spec": {"storageClassName": STORAGE_CLASS, "accessModes": ["ReadWriteOnce"],
                 "resources": {"requests": {"storage": "1Gi"}}}})


def snapshot(kube: FakeKube, claim: Obj, ready: bool) -> None:
    kube.add(groups.VOLUMESNAPSHOTS, {"metadata": {"name": temp_snapshot_name(claim), "namespace": NAMESPACE},
                                      "spec": {"source": {"persistentVolumeClaimName": "golden"}},
                                      "status": {"readyToUse": ready, **({"restoreSize": "1Gi"} if ready else {})}})


def writer(kube: FakeKube, read_only: bool = False) -> None:
    mount: Obj = {"name": "data", "mountPath": "/data", **({"readOnly": True} if read_only else {})}
    kube.add(groups.PODS, {"metadata": {"name": "vm" if not read_only else "reader", "namespace": NAMESPACE},
                           "spec": {"containers": [{"name": "main", "volumeMounts": [mount]}],
                                    "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "golden"}}]},
                           "status": {"phase": "Running"}})


def annotations(kube: FakeKube) -> dict[str, str]:
    claim = kube.object(groups.PVCS, "copy", NAMESPACE)
    assert claim is not None
    result: dict[str, str] = claim["metadata"]["annotations"]
    return result


async def test_a_smart_clone_waits_while_a_pod_writes_to_its_source(kube: FakeKube, ctx: Context) -> None:
    source_claim(kube)
    claim = target(kube, planner.CSI_CLONE)
    writer(kube)
    writer(kube, read_only=True)  # a reader holds no clone, as in CDI
    clones = CloneReconciler(ctx)
    await clones._advance(claim)
    assert kube.object(groups.PVCS, temp_claim_name(claim), NAMESPACE) is None
    message = f"pod {NAMESPACE}/vm using PersistentVolumeClaim golden"
    assert annotations(kube)[A + "clonePhase"] == "CSIClone"
    assert (annotations(kube)[A + "storage.condition.running"],
            annotations(kube)[A + "storage.condition.running.reason"],
            annotations(kube)[A + "storage.condition.running.message"]) == ("false", "CloneSourceInUse", message)
    assert ("Warning", "CloneSourceInUse", message) in await events_of(ctx, "copy")
    await kube.delete(groups.PODS, "vm", NAMESPACE)
    await clones._advance(kube.object(groups.PVCS, "copy", NAMESPACE) or {})
    temp = kube.object(groups.PVCS, temp_claim_name(claim), NAMESPACE)
    assert temp is not None and temp["spec"]["dataSource"] == {"kind": "PersistentVolumeClaim", "name": "golden"}
    assert A + "storage.condition.running.reason" not in annotations(kube)


async def test_a_snapshot_clone_goes_on_from_its_snapshot_when_the_source_is_gone(
        kube: FakeKube, ctx: Context) -> None:
    claim = target(kube, planner.SNAPSHOT)
    claim["metadata"]["annotations"][A + "clonePhase"] = "Snapshot"
    kube.add(groups.PVCS, claim)
    snapshot(kube, claim, ready=True)  # taken; then the source DataVolume and its claim were deleted
    await CloneReconciler(ctx)._advance(kube.object(groups.PVCS, "copy", NAMESPACE) or {})
    temp = kube.object(groups.PVCS, temp_claim_name(claim), NAMESPACE)
    assert temp is not None, "the clone waits for a source it no longer needs"
    assert temp["spec"]["dataSource"] == {"apiGroup": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot",
                                          "name": temp_snapshot_name(claim)}
    assert temp["spec"]["resources"]["requests"]["storage"] == "1Gi"
    assert annotations(kube)[A + "clonePhase"] == "SnapshotClone"


async def test_a_snapshot_that_can_never_be_taken_fails_the_clone_and_goes(kube: FakeKube, ctx: Context) -> None:
    claim = target(kube, planner.SNAPSHOT)
    claim["metadata"]["annotations"][A + "clonePhase"] = "Snapshot"
    kube.add(groups.PVCS, claim)
    snapshot(kube, claim, ready=False)  # asked for, and the source deleted before it was taken
    await CloneReconciler(ctx)._advance(kube.object(groups.PVCS, "copy", NAMESPACE) or {})
    assert annotations(kube)[A + "clonePhase"] == "Error"
    why = f"the source pvc {NAMESPACE}/golden was deleted before its snapshot {temp_snapshot_name(claim)} was taken"
    assert annotations(kube)[A + "cloneError"] == why
    assert (annotations(kube)[A + "storage.condition.running.reason"],
            annotations(kube)[A + "storage.condition.running.message"]) == ("Error", why)
    assert kube.object(groups.VOLUMESNAPSHOTS, temp_snapshot_name(claim), NAMESPACE) is None


async def test_a_smart_clone_does_not_start_from_a_source_being_deleted(kube: FakeKube, ctx: Context) -> None:
    """The pod that held the source went, and the source's claim, deleted meanwhile, waits only for that pod's
    volume to be let go: no snapshot is asked of it, and the clone says why it waits."""
    source_claim(kube)
    golden = kube.object(groups.PVCS, "golden", NAMESPACE) or {}
    golden["metadata"].update(deletionTimestamp="2026-03-02T10:15:00Z", finalizers=["kubernetes.io/pvc-protection"])
    kube.add(groups.PVCS, golden)
    claim = target(kube, planner.SNAPSHOT)
    await CloneReconciler(ctx)._advance(claim)
    assert kube.object(groups.VOLUMESNAPSHOTS, temp_snapshot_name(claim), NAMESPACE) is None
    message = f"The source pvc {NAMESPACE}/golden is being deleted"
    assert annotations(kube)[A + "clonePhase"] == "Snapshot"
    assert (annotations(kube)[A + "storage.condition.running.reason"],
            annotations(kube)[A + "storage.condition.running.message"]) == ("CloneWithoutSource", message)
    assert ("Warning", "CloneWithoutSource", message) in await events_of(ctx, "copy")
