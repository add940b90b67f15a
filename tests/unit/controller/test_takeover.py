"""What cdi's reconcilers do with what CDI left (issue 29 item 1, taking over from CDI): a DataVolume CDI
finished stays as CDI left it, whatever its source; CDI's upload server is replaced by cdi's; an upload
server that ends because its deadline passed (CDI's does) is started again, never taken for a finished
upload. The end-to-end test (tests/e2e/test_takeover.py) builds the whole state on `cdi up`."""

from __future__ import annotations

import json
from typing import Any

from cdi.api import groups
from cdi.controller.dataimportcron import DataImportCronReconciler
from cdi.controller.datasource import DataSourceReconciler
from cdi.controller.datavolume.clones import CloneReconciler
from cdi.controller.datavolume.importsource import ImportDataVolumeReconciler
from cdi.controller.datavolume.uploads import UploadReconciler
from cdi.controller.datavolume.uploadsource import UploadDataVolumeReconciler
from cdi.controller.runtime import Context
from tests.support.fakekube import FakeKube
from tests.unit.controller.conftest import NAMESPACE, STORAGE_CLASS, reconciled

Obj = dict[str, Any]
A = "cdi.kubevirt.io/"
STAMP = "2025-11-03T09:15:00Z"
VDDK = {"vddk": {"url": "https://vcenter.example/sdk", "uuid": "52260566", "backingFile": "[ds] vm.vmdk",
                 "thumbprint": "20:6C", "secretRef": "vddk"}}


def left_by_cdi(kube: FakeKube, name: str, source: Obj, phase: str, progress: str, running: str,
                claim_annotations: dict[str, str]) -> Obj:
    """A DataVolume and its bound claim as CDI leaves them once the worker succeeded."""
    dv = kube.add(groups.DATAVOLUMES, {
        "apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
        "metadata": {"name": name, "namespace": NAMESPACE, "annotations": {A + "storage.usePopulator": "false"}},
        "spec": {"source": source, "storage": {"storageClassName": STORAGE_CLASS,
                                               "resources": {"requests": {"storage": "1Gi"}}}},
        "status": {"phase": phase, "progress": progress, "restartCount": 0, "claimName": name, "conditions": [
            {"type": t, "status": s, "message": m, "reason": r, "lastTransitionTime": STAMP,
             "lastHeartbeatTime": STAMP}
            for t, s, m, r in (("Bound", "True", f"PVC {name} Bound", "Bound"), ("Ready", "True", "", ""),
                               ("Running", "False", running, "Completed"))]}})
    kube.add(groups.PVCS, {
        "metadata": {"name": name, "namespace": NAMESPACE, "annotations": {
            A + "storage.pod.phase": "Succeeded", A + "storage.pod.ready": "false", A + "storage.pod.restarts": "0",
            A + "storage.condition.running": "false", A + "storage.condition.running.message": running,
            A + "storage.condition.running.reason": "Completed", **claim_annotations},
            "ownerReferences": [{"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume", "name": name,
                                 "uid": dv["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}]},
        "spec": {"storageClassName": STORAGE_CLASS, "accessModes": ["ReadWriteOnce"], "volumeName": f"pv-{name}",
                 "resources": {"requests": {"storage": "1Gi"}}},
        "status": {"phase": "Bound", "capacity": {"storage": "1Gi"}}})
    return dv


async def test_a_vddk_import_cdi_finished_stays_succeeded(kube: FakeKube, ctx: Context) -> None:
    """cdi refuses VMware sources for new DataVolumes; one CDI imported holds its disk and stays as it was."""
    dv = left_by_cdi(kube, "vm", VDDK, "Succeeded", "100.0%", "Import Complete", {})
    await ImportDataVolumeReconciler(ctx).reconcile(f"{NAMESPACE}/vm")
    now = kube.object(groups.DATAVOLUMES, "vm", NAMESPACE)
    assert now is not None
    assert now["status"] == dv["status"]
    assert now["metadata"]["resourceVersion"] == dv["metadata"]["resourceVersion"]
    assert kube.created(groups.PODS) == [] and kube.created(groups.PVCS) == []


async def test_a_vddk_import_whose_claim_went_is_refused_not_imported_again(kube: FakeKube, ctx: Context) -> None:
    left_by_cdi(kube, "vm", VDDK, "Succeeded", "100.0%", "Import Complete", {})
    await kube.delete(groups.PVCS, "vm", NAMESPACE)
    await ImportDataVolumeReconciler(ctx).reconcile(f"{NAMESPACE}/vm")
    now = kube.object(groups.DATAVOLUMES, "vm", NAMESPACE)
    assert now is not None and now["status"]["phase"] == "Failed"
    assert kube.created(groups.PVCS) == []


async def test_a_finished_uploads_status_stays_as_cdi_wrote_it(kube: FakeKube, ctx: Context) -> None:
    """CDI leaves a succeeded upload's progress `N/A`; a finished DataVolume's status is not rewritten."""
    dv = left_by_cdi(kube, "up", {"upload": {}}, "Succeeded", "N/A", "Upload Complete",
                     {A + "storage.upload.target": ""})
    await UploadDataVolumeReconciler(ctx).reconcile(f"{NAMESPACE}/up")
    now = kube.object(groups.DATAVOLUMES, "up", NAMESPACE)
    assert now is not None
    assert now["metadata"]["resourceVersion"] == dv["metadata"]["resourceVersion"], now["status"]


async def test_a_host_assisted_clone_an_older_cdi_finished_is_left_alone(kube: FakeKube, ctx: Context) -> None:
    """Before its clone populator, CDI copied into the target in place and marked it `k8s.io/CloneOf`, with no
    clonePhase: such a DataVolume stays Succeeded, is not cloned again, nor looked at again and again."""
    kube.add(groups.PVCS, {"metadata": {"name": "src", "namespace": NAMESPACE}, "spec": {
        "storageClassName": STORAGE_CLASS, "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": "1Gi"}}}, "status": {"phase": "Bound", "capacity": {"storage": "1Gi"}}})
    dv = left_by_cdi(kube, "copy", {"pvc": {"namespace": NAMESPACE, "name": "src"}}, "Succeeded", "100.0%",
                     "Clone Complete", {"k8s.io/CloneRequest": f"{NAMESPACE}/src", "k8s.io/CloneOf": "true",
                                        A + "storage.sourceClonePodName": "x-source-pod",
                                        A + "storage.clone.cloneUniqeId": "ns-copy-source-pod"})
    requeue = await CloneReconciler(ctx).reconcile(f"{NAMESPACE}/copy")
    assert requeue is None
    now = kube.object(groups.DATAVOLUMES, "copy", NAMESPACE)
    assert now is not None
    assert now["metadata"]["resourceVersion"] == dv["metadata"]["resourceVersion"], now["status"]
    assert kube.created(groups.PODS) == [] and kube.created(groups.PVCS) == []


def waiting_upload(kube: FakeKube) -> None:
    """A claim CDI's upload server serves: the pod and its headless Service, both with CDI's marker."""
    claim = kube.add(groups.PVCS, {
        "metadata": {"name": "up", "namespace": NAMESPACE, "annotations": {
            A + "storage.upload.target": "", A + "storage.contentType": "kubevirt",
            A + "storage.uploadPodName": "cdi-upload-up", A + "storage.pod.phase": "Running",
            A + "storage.pod.ready": "true", A + "storage.pod.restarts": "0"}},
        "spec": {"storageClassName": STORAGE_CLASS, "accessModes": ["ReadWriteOnce"], "volumeName": "pv-up",
                 "resources": {"requests": {"storage": "1Gi"}}},
        "status": {"phase": "Bound", "capacity": {"storage": "1Gi"}}})
    owned = [{"apiVersion": "v1", "kind": "PersistentVolumeClaim", "name": "up", "uid": claim["metadata"]["uid"],
              "controller": True, "blockOwnerDeletion": True}]
    marker = {A + "storage.createdByUploadController": "yes"}
    kube.add(groups.SERVICES, {"metadata": {"name": "cdi-upload-up", "namespace": NAMESPACE, "annotations": marker,
                                            "ownerReferences": owned},
                               "spec": {"clusterIP": "None", "selector": {"service": "cdi-upload-up"},
                                        "ports": [{"protocol": "TCP", "port": 8443, "targetPort": 8443}]}})
    kube.add(groups.PODS, {"metadata": {"name": "cdi-upload-up", "namespace": NAMESPACE, "annotations": marker,
                                        "labels": {"cdi.kubevirt.io": "cdi-upload-server", "service": "cdi-upload-up"},
                                        "ownerReferences": owned},
                           "spec": {"containers": [{"name": "cdi-upload-server",
                                                    "image": "quay.io/kubevirt/cdi-uploadserver:v1.62.0"}]},
                           "status": {"phase": "Running", "containerStatuses": [
                               {"name": "cdi-upload-server", "ready": True, "state": {"running": {}}}]}})


async def test_cdis_upload_server_is_replaced_by_cdis_own(kube: FakeKube, ctx: Context) -> None:
    waiting_upload(kube)
    reconciler = UploadReconciler(ctx)
    await reconciler.reconcile(f"{NAMESPACE}/up")
    assert kube.object(groups.PODS, "cdi-upload-up", NAMESPACE) is None
    assert kube.object(groups.SERVICES, "cdi-upload-up", NAMESPACE) is None
    pvc = kube.object(groups.PVCS, "up", NAMESPACE)
    assert pvc is not None
    annotations = pvc["metadata"]["annotations"]
    assert (annotations[A + "storage.pod.phase"], annotations[A + "storage.pod.ready"]) == ("", "false")

    await reconciler.reconcile(f"{NAMESPACE}/up")  # the pod watch brings the claim back
    pod = kube.object(groups.PODS, "cdi-upload-up", NAMESPACE)
    service = kube.object(groups.SERVICES, "cdi-upload-up", NAMESPACE)
    assert pod is not None and service is not None
    assert A + "storage.createdByUploadController" not in (pod["metadata"].get("annotations") or {})
    assert service["spec"].get("clusterIP") != "None"
    assert pod["spec"]["containers"][0]["image"] == ctx.settings.uploadserver_image


async def test_an_upload_server_whose_deadline_passed_is_started_again(kube: FakeKube, ctx: Context) -> None:
    """CDI's upload server exits 0 when its certificates' deadline passes, saying so in its termination
    message: nothing was uploaded, the claim is not Succeeded, and a new server is started."""
    waiting_upload(kube)
    pod = kube.object(groups.PODS, "cdi-upload-up", NAMESPACE)
    assert pod is not None
    del pod["metadata"]["annotations"]  # whoever started it: the termination message is what counts
    pod["status"] = {"phase": "Succeeded", "containerStatuses": [{"name": "cdi-upload-server", "ready": False,
                                                                  "state": {"terminated": {
                                                                      "exitCode": 0, "reason": "Completed",
                                                                      "message": json.dumps({
                                                                          "message": "Deadline Passed",
                                                                          "deadlinePassed": True})}}}]}
    kube.add(groups.PODS, pod)
    reconciler = UploadReconciler(ctx)
    await reconciler.reconcile(f"{NAMESPACE}/up")
    pvc = kube.object(groups.PVCS, "up", NAMESPACE)
    assert pvc is not None
    annotations = pvc["metadata"]["annotations"]
    assert annotations[A + "storage.pod.phase"] == "" and annotations[A + "storage.pod.ready"] == "false"
    assert kube.object(groups.PODS, "cdi-upload-up", NAMESPACE) is None

    await reconciler.reconcile(f"{NAMESPACE}/up")
    assert kube.object(groups.PODS, "cdi-upload-up", NAMESPACE) is not None
    pvc = kube.object(groups.PVCS, "up", NAMESPACE)
    assert pvc is not None and pvc["metadata"]["annotations"][A + "storage.pod.phase"] == "Pending"


async def test_a_cron_cdi_left_between_runs_waits_for_its_schedule_and_collects_as_cdi(kube: FakeKube,
                                                                                      ctx: Context) -> None:
    """CDI's per-cron state (next and last run, desired digest, storage class in annotations; current and
    last import in status) is read as it is: no poll and no import before the next run CDI recorded, the
    newest imports kept by last use up to importsToKeep, and older ones collected, as CDI's GC does (here
    the admin lowered importsToKeep from 3 to 2 since CDI's last collection)."""
    digests = ["sha256:" + str(i) * 12 + "f" * 52 for i in (1, 2, 3)]
    names = [f"golden-{d[7:19]}" for d in digests]
    for name, used in zip(names, ("2025-10-01T00:00:00Z", "2025-10-20T00:00:00Z", "2025-11-01T00:00:00Z"),
                          strict=True):
        labels = {A + "dataImportCron": "cron", "app.kubernetes.io/component": "storage",
                  "app.kubernetes.io/managed-by": "cdi-controller"}
        left_by_cdi(kube, name, {"registry": {"url": "docker://registry.example/golden@" + digests[0]}},
                    "Succeeded", "100.0%", "Import Complete", {})
        for gvr in (groups.DATAVOLUMES, groups.PVCS):
            obj = kube.object(gvr, name, NAMESPACE)
            assert obj is not None
            obj["metadata"].setdefault("labels", {}).update(labels)
            obj["metadata"]["annotations"][A + "storage.import.lastUseTime"] = used
            kube.add(gvr, obj)
    next_run = "2099-07-01T00:00:00Z"
    annotations = {A + "storage.import.nextCronTime": next_run, A + "storage.import.lastCronTime": STAMP,
                   A + "storage.import.sourceDesiredDigest": digests[-1],
                   A + "storage.import.storageClass": STORAGE_CLASS}
    kube.add(groups.DATAIMPORTCRONS, {
        "apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataImportCron",
        "metadata": {"name": "cron", "namespace": NAMESPACE, "annotations": dict(annotations)},
        "spec": {"schedule": "0 0 1 7 *", "managedDataSource": "golden", "importsToKeep": 2,
                 "garbageCollect": "Outdated", "template": {"spec": {
                     "source": {"registry": {"url": "docker://registry.example/golden"}},
                     "storage": {"storageClassName": STORAGE_CLASS, "resources": {"requests": {"storage": "1Gi"}}}}}},
        "status": {"currentImports": [{"DataVolumeName": names[-1], "Digest": digests[-1]}],
                   "lastImportedPVC": {"namespace": NAMESPACE, "name": names[-1]},
                   "lastExecutionTimestamp": STAMP, "lastImportTimestamp": STAMP, "sourceFormat": "pvc",
                   "conditions": [{"type": "Progressing", "status": "False", "message": "No current import",
                                   "reason": "NoImport", "lastTransitionTime": STAMP, "lastHeartbeatTime": STAMP},
                                  {"type": "UpToDate", "status": "True", "message": "Latest import is up to date",
                                   "reason": "UpToDate", "lastTransitionTime": STAMP, "lastHeartbeatTime": STAMP}]}})
    kube.add(groups.DATASOURCES, {"metadata": {"name": "golden", "namespace": NAMESPACE,
                                               "labels": {A + "dataImportCron": "cron"}},
                                  "spec": {"source": {"pvc": {"namespace": NAMESPACE, "name": names[-1]}}}})
    reconciler = DataImportCronReconciler(ctx)
    await reconciled(reconciler, "cron")
    await reconciled(reconciler, "cron")
    assert kube.created(groups.PODS) == [] and kube.created(groups.DATAVOLUMES) == []
    stored = kube.object(groups.DATAIMPORTCRONS, "cron", NAMESPACE)
    assert stored is not None
    assert stored["metadata"]["annotations"] == annotations
    assert stored["status"]["lastImportedPVC"]["name"] == names[-1]
    assert stored["status"]["lastImportTimestamp"] == STAMP
    assert kube.object(groups.PVCS, names[0], NAMESPACE) is None  # the least recently used, past importsToKeep
    assert kube.object(groups.DATAVOLUMES, names[0], NAMESPACE) is None
    for name in names[1:]:
        assert kube.object(groups.PVCS, name, NAMESPACE) is not None
    await DataSourceReconciler(ctx).reconcile(f"{NAMESPACE}/golden")
    source = kube.object(groups.DATASOURCES, "golden", NAMESPACE)
    assert source is not None
    ready = next(c for c in source["status"]["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True" and source["status"]["source"]["pvc"]["name"] == names[-1]
