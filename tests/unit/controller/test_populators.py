"""The volume populators against the in-memory fake client: a claim naming a VolumeImportSource,
VolumeUploadSource or VolumeCloneSource is filled through a prime claim (import, upload) or the clone's
temporary claims, shows what the worker does there, and gets the volume; the prime goes once the claim
holds it. The end-to-end tests (tests/e2e/test_populators.py) show the same with real bytes."""

from __future__ import annotations

from typing import Any

from cdi.api import groups
from cdi.controller.clone.target import temp_claim_name
from cdi.controller.populators.base import GRANT_POLL, prime_name
from cdi.controller.populators.clones import ClonePopulator
from cdi.controller.populators.imports import ImportPopulator
from cdi.controller.populators.uploads import UploadPopulator
from cdi.controller.runtime import Context
from tests.support.fakekube import FakeKube
from tests.unit.controller.clone.objects import SOURCE, bind, settle, source_claim, stored
from tests.unit.controller.conftest import NAMESPACE, STORAGE_CLASS, events_of

Obj = dict[str, Any]
A = "cdi.kubevirt.io/"
S = A + "storage."
KEY = f"{NAMESPACE}/disk"


def claim(kube: FakeKube, kind: str, source: str = "src", *, namespace: str | None = None, size: str = "1Gi",
          storage_class: str = STORAGE_CLASS, **annotations: str) -> Obj:
    ref: Obj = {"apiGroup": "cdi.kubevirt.io", "kind": kind, "name": source,
                **({"namespace": namespace} if namespace else {})}
    return kube.add(groups.PVCS, {"metadata": {"name": "disk", "namespace": NAMESPACE, "annotations": annotations},
                                  "spec": {"storageClassName": storage_class, "accessModes": ["ReadWriteOnce"],
                                           "volumeMode": "Filesystem", "resources": {"requests": {"storage": size}},
                                           "dataSourceRef": ref},
                                  "status": {"phase": "Pending"}})


def import_source(kube: FakeKube, **spec: Any) -> None:
    kube.add(groups.VOLUMEIMPORTSOURCES, {"metadata": {"name": "src", "namespace": NAMESPACE}, "spec": {
        "source": {"http": {"url": "https://images.example/disk.img"}}, **spec}})


def annotate(kube: FakeKube, name: str, **annotations: str) -> Obj:
    obj = stored(kube, groups.PVCS, name)
    obj["metadata"].setdefault("annotations", {}).update(annotations)
    return kube.add(groups.PVCS, obj)


def handed_over(kube: FakeKube) -> None:
    """What the PV controller does once the prime's PV names the user's claim: binds it."""
    pv = stored(kube, groups.PVS, f"pv-{prime_name(stored(kube, groups.PVCS, 'disk'))}")
    user = stored(kube, groups.PVCS, "disk")
    assert pv["spec"]["claimRef"]["uid"] == user["metadata"]["uid"]
    user["spec"]["volumeName"] = pv["metadata"]["name"]
    user["status"] = {"phase": "Bound", "capacity": pv["spec"]["capacity"]}
    kube.add(groups.PVCS, user)


# -- import ---------------------------------------------------------------------------------------------

async def test_an_import_source_gets_a_prime_claim_the_importer_fills(kube: FakeKube, ctx: Context) -> None:
    user = claim(kube, "VolumeImportSource")
    import_source(kube, contentType="archive", preallocation=True)
    assert await ImportPopulator(ctx).reconcile(KEY) is None
    prime = stored(kube, groups.PVCS, prime_name(user))
    annotations = prime["metadata"]["annotations"]
    assert (annotations[S + "import.source"], annotations[S + "import.endpoint"]) == (
        "http", "https://images.example/disk.img")
    assert (annotations[S + "contentType"], annotations[S + "preallocation.requested"]) == ("archive", "true")
    assert annotations[S + "populator.kind"] == "VolumeImportSource"
    assert prime["metadata"]["ownerReferences"][0]["uid"] == user["metadata"]["uid"]
    assert prime["spec"] == {k: user["spec"][k] for k in ("accessModes", "resources", "storageClassName",
                                                           "volumeMode")}
    assert ("Normal", "CreatedPVCPrimeSuccessfully", "PVC Prime created successfully") in \
        await events_of(ctx, "disk")


async def test_no_prime_without_a_source_meant_for_the_claim_or_a_csi_class(kube: FakeKube, ctx: Context) -> None:
    populator = ImportPopulator(ctx)
    claim(kube, "VolumeImportSource")
    await populator.reconcile(KEY)  # the source does not exist (yet)
    import_source(kube, targetClaim="another")
    await populator.reconcile(KEY)  # it is meant for another claim
    kube.add(groups.STORAGECLASSES, {"metadata": {"name": "intree"}, "provisioner": "kubernetes.io/aws-ebs"})
    import_source(kube)
    claim(kube, "VolumeImportSource", storage_class="intree")
    await populator.reconcile(KEY)  # an in-tree class is no CSI storage
    assert kube.created(groups.PVCS) == []


async def test_a_wait_for_first_consumer_class_waits_for_a_node(kube: FakeKube, ctx: Context) -> None:
    kube.add(groups.STORAGECLASSES, {"metadata": {"name": "wffc"}, "provisioner": "cdi.local",
                                     "volumeBindingMode": "WaitForFirstConsumer"})
    import_source(kube)
    claim(kube, "VolumeImportSource", storage_class="wffc")
    await ImportPopulator(ctx).reconcile(KEY)
    assert kube.created(groups.PVCS) == []
    user = claim(kube, "VolumeImportSource", storage_class="wffc", **{"volume.kubernetes.io/selected-node": "node-1"})
    await ImportPopulator(ctx).reconcile(KEY)  # the scheduler chose a node for a consumer: the prime goes there
    assert kube.created(groups.PVCS) == [f"{NAMESPACE}/{prime_name(user)}"]
    annotations = stored(kube, groups.PVCS, prime_name(user))["metadata"]["annotations"]
    assert annotations["volume.kubernetes.io/selected-node"] == "node-1"


async def test_the_claim_shows_the_import_and_gets_the_volume(kube: FakeKube, ctx: Context) -> None:
    user = claim(kube, "VolumeImportSource")
    import_source(kube)
    populator = ImportPopulator(ctx)
    await populator.reconcile(KEY)
    prime = prime_name(user)
    bind(kube, prime, "1Gi")
    annotate(kube, prime, **{S + "pod.phase": "Running", S + "import.importPodName": "importer-prime",
                             S + "condition.running": "true"})
    assert await populator.reconcile(KEY) == 2.0  # progress is polled while the importer runs
    mine = stored(kube, groups.PVCS, "disk")["metadata"]["annotations"]
    assert (mine[S + "pod.phase"], mine[S + "condition.running"]) == ("Running", "true")
    assert mine[S + "populator.pvcPrime"] == prime

    annotate(kube, prime, **{S + "pod.phase": "Succeeded", S + "condition.running": "false"})
    await populator.reconcile(KEY)
    mine = stored(kube, groups.PVCS, "disk")["metadata"]["annotations"]
    assert (mine[S + "pod.phase"], mine[S + "populator.progress"]) == ("Succeeded", "100.0%")
    assert stored(kube, groups.PVS, f"pv-{prime}")["spec"]["claimRef"]["name"] == "disk"
    assert ("Normal", "importSucceeded", "Successfully imported into disk") in await events_of(ctx, "disk")
    assert kube.object(groups.PVCS, prime, NAMESPACE) is not None  # until the claim holds the volume

    handed_over(kube)
    await populator.reconcile(KEY)
    assert kube.object(groups.PVCS, prime, NAMESPACE) is None


async def test_a_prime_asked_to_be_kept_stays_lost_with_a_word(kube: FakeKube, ctx: Context) -> None:
    user = claim(kube, "VolumeImportSource", **{S + "pod.retainAfterCompletion": "true"})
    import_source(kube)
    populator = ImportPopulator(ctx)
    await populator.reconcile(KEY)
    prime = prime_name(user)
    bind(kube, prime, "1Gi")
    annotate(kube, prime, **{S + "pod.phase": "Succeeded"})
    await populator.reconcile(KEY)
    handed_over(kube)
    lost = stored(kube, groups.PVCS, prime)
    lost["status"]["phase"] = "Lost"
    kube.add(groups.PVCS, lost)
    await populator.reconcile(KEY)
    assert kube.object(groups.PVCS, prime, NAMESPACE) is not None
    assert ("Warning", "RetainedPVCPrime", "PVC Prime retained in Lost state for debugging purposes") in \
        await events_of(ctx, prime)
    # said once: an event about the prime brings the claim back, so saying it at each look was a loop (the kit's
    # controller patched the event 70,000 times in 13 minutes)
    for _ in range(3):
        await populator.reconcile(KEY)
    await ctx.recorder.flush(5)
    [retained] = [e for e in kube.objects(groups.EVENTS)
                  if e["reason"] == "RetainedPVCPrime" and e["involvedObject"]["name"] == prime]
    assert retained.get("count", 1) == 1, retained


async def test_a_failed_import_is_said_on_the_claim(kube: FakeKube, ctx: Context) -> None:
    user = claim(kube, "VolumeImportSource")
    import_source(kube)
    populator = ImportPopulator(ctx)
    await populator.reconcile(KEY)
    annotate(kube, prime_name(user), **{S + "pod.phase": "Running", S + "import.fatalError": "true"})
    assert await populator.reconcile(KEY) is None
    assert ("Warning", "importFailed", "import into disk failed") in await events_of(ctx, "disk")
    assert stored(kube, groups.PVCS, "disk")["metadata"]["annotations"][S + "import.fatalError"] == "true"


# -- upload ---------------------------------------------------------------------------------------------

async def test_an_upload_source_gets_a_prime_the_upload_server_fills(kube: FakeKube, ctx: Context) -> None:
    user = claim(kube, "VolumeUploadSource")
    kube.add(groups.VOLUMEUPLOADSOURCES, {"metadata": {"name": "src", "namespace": NAMESPACE},
                                          "spec": {"contentType": "kubevirt"}})
    populator = UploadPopulator(ctx)
    await populator.reconcile(KEY)
    prime = prime_name(user)
    annotations = stored(kube, groups.PVCS, prime)["metadata"]["annotations"]
    assert annotations[S + "upload.target"] == ""
    assert (annotations[S + "populator.kind"], annotations[S + "preallocation.requested"]) == (
        "VolumeUploadSource", "false")

    bind(kube, prime, "1Gi")
    annotate(kube, prime, **{S + "pod.phase": "Running", S + "pod.ready": "true"})
    await populator.reconcile(KEY)
    # the upload proxy follows the claim's pvcPrime to the server
    assert stored(kube, groups.PVCS, "disk")["metadata"]["annotations"][S + "populator.pvcPrime"] == prime

    annotate(kube, prime, **{S + "pod.phase": "Succeeded", S + "pod.ready": "false"})
    await populator.reconcile(KEY)
    mine = stored(kube, groups.PVCS, "disk")["metadata"]["annotations"]
    assert S + "populator.pvcPrime" not in mine  # no more uploads go to the prime
    assert mine[S + "pod.phase"] == "Succeeded"
    assert stored(kube, groups.PVS, f"pv-{prime}")["spec"]["claimRef"]["name"] == "disk"
    assert ("Normal", "UploadSucceeded", "Successfully uploaded into disk") in await events_of(ctx, "disk")


async def test_a_failed_upload_is_said_on_the_claim(kube: FakeKube, ctx: Context) -> None:
    user = claim(kube, "VolumeUploadSource")
    kube.add(groups.VOLUMEUPLOADSOURCES, {"metadata": {"name": "src", "namespace": NAMESPACE}, "spec": {}})
    await UploadPopulator(ctx).reconcile(KEY)
    annotate(kube, prime_name(user), **{S + "pod.phase": "Failed"})
    await UploadPopulator(ctx).reconcile(KEY)
    assert ("Warning", "UploadFailed", "Upload into disk failed") in await events_of(ctx, "disk")


# -- clone ----------------------------------------------------------------------------------------------

def clone_source(kube: FakeKube, namespace: str = NAMESPACE) -> None:
    kube.add(groups.VOLUMECLONESOURCES, {"metadata": {"name": "src", "namespace": namespace}, "spec": {
        "source": {"kind": "PersistentVolumeClaim", "name": SOURCE}}})


async def test_a_clone_source_is_planned_and_cloned_through_the_phases(kube: FakeKube, ctx: Context) -> None:
    source_claim(kube, capacity="1Gi")
    clone_source(kube)
    user = claim(kube, "VolumeCloneSource")
    populator = ClonePopulator(ctx)
    assert await populator.reconcile(KEY) == 1.0
    annotations = stored(kube, groups.PVCS, "disk")["metadata"]["annotations"]
    assert (annotations[A + "cloneType"], annotations[A + "clonePhase"]) == ("copy", "Pending")
    assert annotations[S + "clone.source"] == f"pvc/{NAMESPACE}/{SOURCE}"
    # snapshot, the default, has no VolumeSnapshotClass for the driver: a host-assisted copy, and why
    assert annotations[A + "cloneFallbackReason"] == "No compatible volumesnapshotclass found"
    assert ("Warning", "NoVolumeSnapshotClass", "No compatible volumesnapshotclass found") in \
        await events_of(ctx, "disk")

    phases = []
    for _ in range(20):
        await populator.reconcile(KEY)
        settle(kube)
        for temp in kube.objects(groups.PVCS, NAMESPACE):  # the upload server, then the source pod's stream
            if temp["metadata"]["name"] == temp_claim_name(user) and temp["status"]["phase"] == "Bound":
                sent = bool(kube.objects(groups.PODS, NAMESPACE))
                annotate(kube, temp["metadata"]["name"], **{S + "pod.ready": "true",
                                                            **({S + "pod.phase": "Succeeded"} if sent else {})})
                kube.add(groups.SERVICES, {"metadata": {"name": f"cdi-upload-{temp['metadata']['name']}",
                                                        "namespace": NAMESPACE}, "spec": {"clusterIP": "10.0.0.9"}})
        phase = stored(kube, groups.PVCS, "disk")["metadata"]["annotations"][A + "clonePhase"]
        if not phases or phases[-1] != phase:
            phases.append(phase)
        if phase == "Succeeded":
            break
    assert phases == ["HostClone", "Rebind", "Succeeded"]
    assert stored(kube, groups.PVCS, "disk")["status"]["phase"] == "Bound"
    assert kube.object(groups.PVCS, temp_claim_name(user), NAMESPACE) is None
    assert await populator.reconcile(KEY) is None  # done


async def test_a_cross_namespace_clone_source_needs_a_reference_grant(kube: FakeKube, ctx: Context) -> None:
    clone_source(kube, "golden-ns")
    claim(kube, "VolumeCloneSource", namespace="golden-ns")
    assert await ClonePopulator(ctx).reconcile(KEY) == GRANT_POLL
    assert any(e[1] == "CrossNamespaceSourceNotGranted" for e in await events_of(ctx, "disk"))
    assert S + "clone.source" not in (stored(kube, groups.PVCS, "disk")["metadata"].get("annotations") or {})


async def test_a_recorded_source_its_clone_source_does_not_name_is_not_read(kube: FakeKube, ctx: Context) -> None:
    source_claim(kube)
    clone_source(kube)
    claim(kube, "VolumeCloneSource", **{A + "cloneType": "copy", A + "clonePhase": "Pending",
                                        S + "clone.source": "pvc/secrets/vault"})  # edited by the claim's user
    assert await ClonePopulator(ctx).reconcile(KEY) == 1.0
    assert ("Warning", "CloneSourceUnauthorized", "The clone does not go on: cdi.kubevirt.io/storage.clone.source: "
            "its VolumeCloneSource does not name pvc/secrets/vault") in await events_of(ctx, "disk")
    assert kube.created(groups.PVCS) == []


async def test_a_target_smaller_than_its_source_is_refused(kube: FakeKube, ctx: Context) -> None:
    source_claim(kube, capacity="2Gi")
    clone_source(kube)
    claim(kube, "VolumeCloneSource", size="1Gi")
    assert await ClonePopulator(ctx).reconcile(KEY) is None
    reasons = [e[1] for e in await events_of(ctx, "disk")]
    assert reasons == ["CloneValidationFailed"]


async def test_a_clone_datavolumes_target_is_left_to_the_clone_reconciler(kube: FakeKube, ctx: Context) -> None:
    source_claim(kube)
    clone_source(kube)
    user = claim(kube, "VolumeCloneSource")
    user["metadata"]["ownerReferences"] = [{"kind": "DataVolume", "name": "disk", "uid": "u", "controller": True}]
    kube.add(groups.PVCS, user)
    assert await ClonePopulator(ctx).reconcile(KEY) is None
    assert kube.writes == []
