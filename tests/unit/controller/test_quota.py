"""A ResourceQuota too small for a DataVolume, against the fake client (which refuses as the API server
does): the DataVolume says `ErrExceededQuota` as CDI does, on Bound (its claim refused) or Running (its
worker's pod, scratch claim, prime claim or clone temporary refused), the reconcile is retried with
backoff, a change to a quota of the namespace brings it back at once, and once the quota has room it
goes on."""

from __future__ import annotations

from typing import Any

import pytest

from cdi.api import groups
from cdi.controller.clone import planner
from cdi.controller.clone.hostclone import HostClonePhase
from cdi.controller.clone.phase import Step
from cdi.controller.datavolume.clones import CloneReconciler
from cdi.controller.datavolume.imports import ImportReconciler
from cdi.controller.datavolume.importsource import ImportDataVolumeReconciler
from cdi.controller.populators.base import prime_name
from cdi.controller.populators.imports import ImportPopulator
from cdi.controller.quota import refusal
from cdi.controller.runtime import Context, RetryLater
from cdi.kube import Forbidden, Invalid
from tests.support.fakekube import FakeKube
from tests.unit.controller.clone.objects import SOURCE, annotations, clone, settle, source_claim, stored, target_claim
from tests.unit.controller.conftest import NAMESPACE, events_of
from tests.unit.controller.test_clone_reconciler import datavolume as datavolume_of_clone
from tests.unit.controller.test_clone_reconciler import strategy
from tests.unit.controller.test_populators import claim as populated_claim
from tests.unit.controller.test_populators import import_source
from tests.unit.controller.test_reconcilers import HTTP_SOURCE, A, bind, conditions, datavolume

Obj = dict[str, Any]
KEY = f"{NAMESPACE}/disk"


def set_quota(kube: FakeKube, hard: dict[str, str]) -> Obj:
    return kube.add(groups.RESOURCEQUOTAS, {"metadata": {"name": "small", "namespace": NAMESPACE},
                                            "spec": {"hard": hard}})


def condition(dv: Obj, type_: str) -> Obj:
    return next(c for c in dv["status"]["conditions"] if c["type"] == type_)


def quota_keys(reconciler: Any, quota: Obj) -> list[str]:
    """What a change of `quota` requeues, through the reconciler's own watches."""
    return [key for watch in reconciler.watches() if watch.kind == groups.RESOURCEQUOTAS
            for key in watch.keys_of(quota)]


async def test_a_claim_over_quota_leaves_the_datavolume_pending_until_the_quota_is_raised(
        kube: FakeKube, ctx: Context) -> None:
    quota = set_quota(kube, {"requests.storage": "512Mi"})
    kube.add(groups.DATAVOLUMES, datavolume("disk", HTTP_SOURCE))
    reconciler = ImportDataVolumeReconciler(ctx)
    for _ in range(2):  # retried: the same refusal, said once
        with pytest.raises(RetryLater):
            await reconciler.reconcile(KEY)

    assert kube.created(groups.PVCS) == []
    dv = kube.object(groups.DATAVOLUMES, "disk", NAMESPACE)
    assert dv is not None and dv["status"]["phase"] == "Pending"
    bound = condition(dv, "Bound")
    assert (bound["status"], bound["reason"]) == ("False", "ErrExceededQuota")
    assert bound["message"].startswith('persistentvolumeclaims "disk" is forbidden: exceeded quota: small, '
                                       "requested: requests.storage=")
    assert bound["message"].endswith("used: requests.storage=0, limited: requests.storage=512Mi")
    ready = condition(dv, "Ready")
    assert (ready["status"], ready["reason"], ready["message"]) == ("False", "ErrExceededQuota", bound["message"])
    assert await events_of(ctx, "disk") == [("Warning", "ErrExceededQuota", bound["message"])]
    assert quota_keys(reconciler, quota) == [KEY]

    quota = set_quota(kube, {"requests.storage": "10Gi"})
    await reconciler.reconcile(KEY)
    assert kube.created(groups.PVCS) == [KEY]
    dv = kube.object(groups.DATAVOLUMES, "disk", NAMESPACE)
    assert dv is not None and conditions(dv)["Bound"] == ("False", "Pending")
    assert quota_keys(reconciler, quota) == []  # no longer waiting


async def test_an_importer_pod_over_quota_shows_on_the_running_condition(kube: FakeKube, ctx: Context) -> None:
    kube.add(groups.DATAVOLUMES, datavolume("disk", HTTP_SOURCE))
    datavolumes = ImportDataVolumeReconciler(ctx)
    await datavolumes.reconcile(KEY)
    bind(kube, "disk")
    quota = set_quota(kube, {"count/pods": "0"})
    importer = ImportReconciler(ctx)
    with pytest.raises(RetryLater):
        await importer.reconcile(KEY)

    assert kube.created(groups.PODS) == []
    message = ('pods "importer-disk" is forbidden: exceeded quota: small, requested: count/pods=1, used: '
               "count/pods=0, limited: count/pods=0")
    pvc = kube.object(groups.PVCS, "disk", NAMESPACE)
    assert pvc is not None
    annotations = pvc["metadata"]["annotations"]
    assert (annotations[A + "condition.running"], annotations[A + "condition.running.reason"],
            annotations[A + "condition.running.message"]) == ("false", "ErrExceededQuota", message)
    assert quota_keys(importer, quota) == [KEY]

    await datavolumes.reconcile(KEY)
    dv = kube.object(groups.DATAVOLUMES, "disk", NAMESPACE)
    assert dv is not None
    running = condition(dv, "Running")
    assert (running["status"], running["reason"], running["message"]) == ("False", "ErrExceededQuota", message)
    # the claim's event as CDI's HandleFailedPod records it, and the DataVolume's from its Running condition
    events = await events_of(ctx, "disk")
    assert events.count(("Warning", "ErrExceededQuota", message)) == 2

    set_quota(kube, {"count/pods": "1"})
    await importer.reconcile(KEY)
    assert kube.created(groups.PODS) == [f"{NAMESPACE}/importer-disk"]
    pvc = kube.object(groups.PVCS, "disk", NAMESPACE)
    assert pvc is not None and pvc["metadata"]["annotations"][A + "condition.running.reason"] == "Pending"


async def test_a_scratch_claim_over_quota_is_said_on_the_claim(kube: FakeKube, ctx: Context) -> None:
    kube.add(groups.DATAVOLUMES, datavolume("disk", HTTP_SOURCE))
    await ImportDataVolumeReconciler(ctx).reconcile(KEY)
    bind(kube, "disk")
    pvc = kube.object(groups.PVCS, "disk", NAMESPACE)
    assert pvc is not None
    pvc["metadata"]["annotations"][A + "import.requiresScratch"] = "true"
    kube.add(groups.PVCS, pvc)
    set_quota(kube, {"persistentvolumeclaims": "1"})
    with pytest.raises(RetryLater):
        await ImportReconciler(ctx).reconcile(KEY)

    assert kube.created(groups.PVCS) == [KEY] and kube.created(groups.PODS) == []
    pvc = kube.object(groups.PVCS, "disk", NAMESPACE)
    assert pvc is not None
    assert pvc["metadata"]["annotations"][A + "condition.running.message"] == (
        'persistentvolumeclaims "disk-scratch" is forbidden: exceeded quota: small, requested: '
        "persistentvolumeclaims=1, used: persistentvolumeclaims=1, limited: persistentvolumeclaims=1")


def test_only_a_quota_refusal_is_taken_for_one() -> None:
    quota_message = ('pods "p" is forbidden: exceeded quota: q, requested: pods=1, used: pods=1, '
                     "limited: pods=1")
    assert refusal(Forbidden(quota_message, code=403, reason="Forbidden")) == quota_message
    rbac = 'pods is forbidden: User "u" cannot create resource "pods" in API group "" in the namespace "ns"'
    assert refusal(Forbidden(rbac, code=403, reason="Forbidden")) is None
    assert refusal(Invalid(quota_message, code=422, reason="Invalid")) is None


async def test_a_clone_temporary_over_quota_is_said_on_the_target_until_it_is_made(
        kube: FakeKube, ctx: Context) -> None:
    source_claim(kube)
    target_claim(kube, planner.COPY, size="2Gi")  # already there: the quota comes after it
    set_quota(kube, {"requests.storage": "1Gi"})
    with pytest.raises(RetryLater):
        await HostClonePhase(clone(ctx, kube), SOURCE).reconcile()
    running = {k.removeprefix(A + "condition.running"): v for k, v in annotations(kube).items()
               if k.startswith(A + "condition.running")}
    assert running[""] == "false" and running[".reason"] == "ErrExceededQuota"
    assert running[".message"].startswith('persistentvolumeclaims "tmp-pvc-')

    set_quota(kube, {"requests.storage": "10Gi"})
    assert await HostClonePhase(clone(ctx, kube), SOURCE).reconcile() == Step()
    assert not any(k.startswith(A + "condition.running") for k in annotations(kube))


async def test_a_prime_claim_over_quota_is_said_on_the_users_claim(kube: FakeKube, ctx: Context) -> None:
    user = populated_claim(kube, "VolumeImportSource")  # there before the quota
    import_source(kube)
    quota = set_quota(kube, {"requests.storage": "1Gi"})  # the user's claim holds it all
    populator = ImportPopulator(ctx)
    with pytest.raises(RetryLater):
        await populator.reconcile(KEY)
    pvc = kube.object(groups.PVCS, "disk", NAMESPACE)
    assert pvc is not None
    message = pvc["metadata"]["annotations"][A + "condition.running.message"]
    assert message.startswith(f'persistentvolumeclaims "{prime_name(user)}" is forbidden: exceeded quota: small')
    assert pvc["metadata"]["annotations"][A + "condition.running.reason"] == "ErrExceededQuota"
    assert ("Warning", "ErrCreatingPVCPrime", message) in await events_of(ctx, "disk")
    assert quota_keys(populator, quota) == [KEY]

    set_quota(kube, {"requests.storage": "2Gi"})
    await populator.reconcile(KEY)
    assert kube.object(groups.PVCS, prime_name(user), NAMESPACE) is not None


async def test_a_snapshot_clones_restored_claim_over_quota_shows_on_its_datavolume(
        kube: FakeKube, ctx: Context) -> None:
    """The snapshot is taken, the claim restored from it is refused: the DataVolume shows the phase that waits
    (CloneFromSnapshotSourceInProgress, not the snapshot's) and why on its Running condition, and a change
    of the namespace's quota brings it back."""
    source_claim(kube, capacity="1Gi")
    strategy(kube, None)  # snapshot
    kube.add(groups.VOLUMESNAPSHOTCLASSES, {"metadata": {"name": "snapclass"}, "driver": "cdi.local"})
    datavolume_of_clone(kube, "1Gi")
    reconciler = CloneReconciler(ctx)
    quota: Obj | None = None
    for _ in range(10):
        if quota is None and stored(kube, groups.DATAVOLUMES, "copy").get("status", {}).get("phase") == \
                "SnapshotForSmartCloneInProgress":
            quota = set_quota(kube, {"persistentvolumeclaims": "2"})  # the source and the target
        try:
            await reconciler.reconcile(f"{NAMESPACE}/copy")
        except RetryLater:
            break
        settle(kube)
    else:
        raise AssertionError("the restored claim was never refused")
    assert quota is not None
    dv = stored(kube, groups.DATAVOLUMES, "copy")
    assert dv["status"]["phase"] == "CloneFromSnapshotSourceInProgress"
    running = condition(dv, "Running")
    assert (running["status"], running["reason"]) == ("False", "ErrExceededQuota")
    assert running["message"].startswith('persistentvolumeclaims "tmp-pvc-')
    assert "exceeded quota: small" in running["message"]
    assert quota_keys(reconciler, quota) == [f"{NAMESPACE}/copy"]

    set_quota(kube, {"persistentvolumeclaims": "3"})
    for _ in range(10):
        await reconciler.reconcile(f"{NAMESPACE}/copy")
        if stored(kube, groups.DATAVOLUMES, "copy")["status"]["phase"] == "Succeeded":
            break
        settle(kube)
    assert stored(kube, groups.DATAVOLUMES, "copy")["status"]["phase"] == "Succeeded"
