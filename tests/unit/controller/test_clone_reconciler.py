"""The clone DataVolume reconciler against the in-memory fake client: the target it renders, the phases
the DataVolume shows (each with its event) while `cdi.controller.clone` walks the strategy's phases, and
what stops a clone before it starts (no source, a target smaller than the source, a claim of that name
already there, a clone from another namespace without its token). The end-to-end tests show the same
against `cdi up` with real bytes; these pin each step in milliseconds."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from cdi.api import groups
from cdi.api.upload import upload_service_name
from cdi.common import uploadtoken
from cdi.controller.clone.target import temp_claim_name, temp_snapshot_name
from cdi.controller.datavolume.clones import CloneReconciler
from cdi.controller.runtime import Context
from tests.support.fakekube import FakeKube, Write
from tests.unit.controller.clone.objects import SOURCE, settle, source_claim, stored
from tests.unit.controller.conftest import NAMESPACE, STORAGE_CLASS, events_of

Obj = dict[str, Any]
A = "cdi.kubevirt.io/"
KEY = f"{NAMESPACE}/copy"


def datavolume(kube: FakeKube, size: str = "2Gi", namespace: str = NAMESPACE, **annotations: str) -> Obj:
    return kube.add(groups.DATAVOLUMES, {
        "apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
        "metadata": {"name": "copy", "namespace": NAMESPACE, "annotations": annotations},
        "spec": {"source": {"pvc": {"namespace": namespace, "name": SOURCE}},
                 "pvc": {"accessModes": ["ReadWriteOnce"], "storageClassName": STORAGE_CLASS,
                         "resources": {"requests": {"storage": size}}}}})


def strategy(kube: FakeKube, name: str | None, *, expansion: bool = True) -> None:
    """The class allows expansion (a larger target), and its profile asks for `name`."""
    klass = kube.object(groups.STORAGECLASSES, STORAGE_CLASS)
    profile = kube.object(groups.STORAGEPROFILES, STORAGE_CLASS)
    assert klass is not None and profile is not None
    klass["allowVolumeExpansion"] = expansion
    kube.add(groups.STORAGECLASSES, klass)
    if name:
        profile["status"]["cloneStrategy"] = name
        kube.add(groups.STORAGEPROFILES, profile)


def dv(kube: FakeKube) -> Obj:
    return stored(kube, groups.DATAVOLUMES, "copy")


async def run(kube: FakeKube, ctx: Context, reconciler: CloneReconciler, *, storage: bool = True,
              looks: int = 30) -> list[str]:
    """Reconcile until the DataVolume ends (the storage side doing its part between looks, unless
    `storage` is False); the phases it showed, in order."""
    shown: list[str] = []
    for _ in range(looks):
        await reconciler.reconcile(KEY)
        phase = dv(kube)["status"]["phase"]
        if not shown or shown[-1] != phase:
            shown.append(phase)
        if phase in ("Succeeded", "Failed"):
            break
        if storage:
            settle(kube)
    return shown


def upload_server(kube: FakeKube) -> None:
    """What the upload reconciler and its server do for a host-assisted copy's temporary claim: a Service
    and a server ready once bound, which has Succeeded once the clone source pod has sent the source."""
    for claim in kube.objects(groups.PVCS, NAMESPACE):
        annotations = claim["metadata"].get("annotations") or {}
        if A + "storage.upload.target" not in annotations or claim["status"].get("phase") != "Bound":
            continue
        kube.add(groups.SERVICES, {"metadata": {"name": upload_service_name(claim["metadata"]["name"]),
                                                "namespace": NAMESPACE}, "spec": {"clusterIP": "10.96.0.7"}})
        sent = any(p["metadata"]["labels"].get("cdi.kubevirt.io") == "cdi-clone-source"
                   for p in kube.objects(groups.PODS, NAMESPACE))
        annotations[A + "storage.pod.ready"] = "true"
        if sent:
            annotations[A + "storage.pod.phase"] = "Succeeded"
        kube.add(groups.PVCS, claim)


async def test_a_csi_clone_shows_each_phase_with_its_event(kube: FakeKube, ctx: Context) -> None:
    source_claim(kube, capacity="1Gi")
    strategy(kube, "csi-clone")
    datavolume(kube, "2Gi")
    reconciler = CloneReconciler(ctx)
    assert await run(kube, ctx, reconciler) == [
        "CloneScheduled", "CSICloneInProgress", "PrepClaimInProgress", "RebindInProgress", "Succeeded"]
    target = stored(kube, groups.PVCS, "copy")
    annotations = target["metadata"]["annotations"]
    assert (annotations[A + "cloneType"], annotations[A + "clonePhase"]) == ("csi-clone", "Succeeded")
    assert annotations[A + "storage.clone.source"] == f"pvc/{NAMESPACE}/{SOURCE}"
    assert annotations["k8s.io/CloneRequest"] == f"{NAMESPACE}/{SOURCE}"
    assert target["spec"]["dataSourceRef"]["kind"] == "VolumeCloneSource"
    assert target["metadata"]["ownerReferences"][0]["kind"] == "DataVolume"
    assert kube.object(groups.PVCS, temp_claim_name(target), NAMESPACE) is None
    assert dv(kube)["status"]["progress"] == "100.0%"
    events = [(kind, reason) for kind, reason, _ in await events_of(ctx, "copy")]
    assert [e for e in events if e[1] != "Bound"] == [
        ("Normal", "CloneScheduled"), ("Normal", "CSICloneInProgress"), ("Normal", "PrepClaimInProgress"),
        ("Normal", "RebindInProgress"), ("Normal", "CloneSucceeded")]
    messages = {reason: message for _, reason, message in await events_of(ctx, "copy")}
    assert messages["CloneSucceeded"] == f"Successfully cloned from {NAMESPACE}/{SOURCE} into {NAMESPACE}/copy"
    assert messages["CloneScheduled"].startswith(f"Cloning from {NAMESPACE}/{SOURCE} into {NAMESPACE}/copy "
                                                 "scheduled: csi-clone: CSI volume clone")


async def test_a_smart_clone_goes_through_its_snapshot(kube: FakeKube, ctx: Context) -> None:
    source_claim(kube, capacity="1Gi")
    strategy(kube, None)  # snapshot, the default
    kube.add(groups.VOLUMESNAPSHOTCLASSES, {"metadata": {"name": "snapclass"}, "driver": "cdi.local"})
    datavolume(kube, "1Gi")
    assert await run(kube, ctx, CloneReconciler(ctx)) == [
        "CloneScheduled", "SnapshotForSmartCloneInProgress", "CloneFromSnapshotSourceInProgress",
        "RebindInProgress", "Succeeded"]
    target = stored(kube, groups.PVCS, "copy")
    assert kube.created(groups.VOLUMESNAPSHOTS) == [f"{NAMESPACE}/{temp_snapshot_name(target)}"]
    assert kube.object(groups.VOLUMESNAPSHOTS, temp_snapshot_name(target), NAMESPACE) is None


async def test_a_host_assisted_copy_is_explained_and_streamed(kube: FakeKube, ctx: Context) -> None:
    source_claim(kube, capacity="1Gi")
    strategy(kube, None)  # snapshot, but no VolumeSnapshotClass for the driver: a copy
    datavolume(kube, "1Gi")
    reconciler = CloneReconciler(ctx)
    shown: list[str] = []
    for _ in range(30):
        shown += await run(kube, ctx, reconciler, looks=1)
        upload_server(kube)
        if shown[-1] == "Succeeded":
            break
    assert [p for i, p in enumerate(shown) if not i or shown[i - 1] != p] == [
        "CloneScheduled", "CloneInProgress", "RebindInProgress", "Succeeded"]
    target = stored(kube, groups.PVCS, "copy")
    assert target["metadata"]["annotations"][A + "cloneFallbackReason"] == "No compatible volumesnapshotclass found"
    assert ("Warning", "NoVolumeSnapshotClass", "No compatible volumesnapshotclass found") in \
        await events_of(ctx, "copy")  # on the target claim, which has the DataVolume's name
    [pod] = [f"{NAMESPACE}/{name}" for name in kube.created(groups.PODS)]
    assert pod.endswith("-source-pod")
    assert kube.objects(groups.PODS) == []  # the source pod went with the copy


async def test_a_missing_source_is_said_once_and_waited_for(kube: FakeKube, ctx: Context) -> None:
    datavolume(kube)
    reconciler = CloneReconciler(ctx)
    assert await reconciler.reconcile(KEY) == 1.0
    await reconciler.reconcile(KEY)
    assert dv(kube)["status"]["phase"] == "Pending"
    message = f"The source pvc {SOURCE} doesn't exist"
    assert [e for e in await events_of(ctx, "copy") if e[1] == "CloneWithoutSource"] == \
        [("Warning", "CloneWithoutSource", message)]
    assert kube.created(groups.PVCS) == []
    source_claim(kube)
    await reconciler.reconcile(KEY)
    assert kube.created(groups.PVCS) == [KEY]


async def test_a_target_smaller_than_its_source_is_refused(kube: FakeKube, ctx: Context) -> None:
    source_claim(kube, capacity="2Gi")
    datavolume(kube, "1Gi")
    await CloneReconciler(ctx).reconcile(KEY)
    bound = next(c for c in dv(kube)["status"]["conditions"] if c["type"] == "Bound")
    assert bound["reason"] == "CloneValidationFailed"
    reasons = [reason for _, reason, _ in await events_of(ctx, "copy")]
    assert "ErrIncompatiblePVC" in reasons and "CloneValidationFailed" in reasons
    assert kube.created(groups.PVCS) == []


async def test_a_claim_of_that_name_not_its_own_is_left_alone(kube: FakeKube, ctx: Context) -> None:
    source_claim(kube)
    kube.add(groups.PVCS, {"metadata": {"name": "copy", "namespace": NAMESPACE}, "spec": {}})
    datavolume(kube)
    await CloneReconciler(ctx).reconcile(KEY)
    message = 'Resource "copy" already exists and is not managed by DataVolume'
    assert ("Warning", "ErrResourceExists", message) in await events_of(ctx, "copy")
    assert [w for w in kube.writes if w.gvr != groups.EVENTS] == [
        Write("replace", groups.DATAVOLUMES, NAMESPACE, "copy", "status")]  # its status, nothing else


async def test_a_succeeded_clone_whose_claim_is_deleted_says_so(kube: FakeKube, ctx: Context) -> None:
    source_claim(kube, capacity="1Gi")
    strategy(kube, "csi-clone")
    datavolume(kube, "1Gi")
    reconciler = CloneReconciler(ctx)
    await run(kube, ctx, reconciler)
    await kube.delete(groups.PVCS, "copy", NAMESPACE)
    await reconciler.reconcile(KEY)
    bound = next(c for c in dv(kube)["status"]["conditions"] if c["type"] == "Bound")
    assert (bound["reason"], bound["message"]) == ("ClaimLost", "PVC was deleted")


SIGNING_KEY = uploadtoken.generate_private_key()


def signing_key(kube: FakeKube) -> bytes:
    """cdi-apiserver's key, which signs clone tokens, where the controller reads it."""
    kube.add(groups.SECRETS, {"metadata": {"name": "cdi-api-signing-key", "namespace": "cdi"},
                              "data": {"id_rsa": base64.b64encode(SIGNING_KEY).decode()}})
    return SIGNING_KEY


@pytest.mark.parametrize("token", ["none", "other target"])
async def test_a_clone_from_another_namespace_needs_its_token(kube: FakeKube, ctx: Context, token: str) -> None:
    key = signing_key(kube)
    annotations = {} if token == "none" else {A + "storage.clone.token": uploadtoken.issue(
        key, "golden-ns", SOURCE, operation=uploadtoken.OPERATION_CLONE,
        params={"targetNamespace": NAMESPACE, "targetName": "another"})}
    datavolume(kube, namespace="golden-ns", **annotations)
    assert await CloneReconciler(ctx).reconcile(KEY) == 30.0
    bound = next(c for c in dv(kube)["status"]["conditions"] if c["type"] == "Bound")
    assert bound["reason"] == "CloneTokenInvalid"
    assert bound["message"] == ("token missing" if token == "none" else "invalid token")
    assert kube.created(groups.PVCS) == []


async def test_a_valid_token_is_traded_for_one_bound_to_the_datavolume(kube: FakeKube, ctx: Context) -> None:
    key = signing_key(kube)
    token = uploadtoken.issue(key, "golden-ns", SOURCE, operation=uploadtoken.OPERATION_CLONE,
                              params={"targetNamespace": NAMESPACE, "targetName": "copy"})
    made = datavolume(kube, namespace="golden-ns", **{A + "storage.clone.token": token})
    await CloneReconciler(ctx).reconcile(KEY)
    extended = dv(kube)["metadata"]["annotations"][A + "storage.extended.clone.token"]
    payload = uploadtoken.verify(extended, uploadtoken.public_key_pem(key), issuer=uploadtoken.EXTENDED_ISSUER)
    assert payload.params["uid"] == made["metadata"]["uid"]


async def test_without_the_signing_key_a_cross_namespace_clone_waits(kube: FakeKube, ctx: Context) -> None:
    datavolume(kube, namespace="golden-ns")
    assert await CloneReconciler(ctx).reconcile(KEY) == 1.0
    bound = next(c for c in dv(kube)["status"]["conditions"] if c["type"] == "Bound")
    assert bound["message"] == "waiting for cdi-apiserver's signing key"
