"""The DataVolume, import, upload and DataSource reconcilers against the in-memory fake client: what
each writes (claims, pods, Services, annotations, phases, conditions, events) for the states a cluster
moves through. The end-to-end tests show the same against `cdi up`; these pin each step in
milliseconds."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from cdi.api import groups
from cdi.controller.datasource import DataSourceReconciler
from cdi.controller.datavolume.externalpopulation import ExternalPopulationReconciler
from cdi.controller.datavolume.imports import ImportReconciler
from cdi.controller.datavolume.importsource import ImportDataVolumeReconciler
from cdi.controller.datavolume.uploads import UploadReconciler
from cdi.controller.datavolume.uploadsource import UploadDataVolumeReconciler
from cdi.controller.runtime import Context
from tests.support.fakekube import FakeKube
from tests.unit.controller.conftest import NAMESPACE, STORAGE_CLASS, events_of

Obj = dict[str, Any]
A = "cdi.kubevirt.io/storage."


def datavolume(name: str, source: Obj) -> Obj:
    return {"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"source": source, "storage": {"resources": {"requests": {"storage": "1Gi"}}}}}


def conditions(obj: Obj) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c.get("reason", "")) for c in obj["status"]["conditions"]}


def bind(kube: FakeKube, name: str) -> None:
    """What a provisioner does: the claim is Bound."""
    pvc = kube.object(groups.PVCS, name, NAMESPACE)
    assert pvc is not None
    pvc["status"] = {"phase": "Bound", "capacity": {"storage": "2Gi"}}
    kube.add(groups.PVCS, pvc)


def annotate(kube: FakeKube, name: str, annotations: dict[str, str]) -> None:
    """What the import or upload reconciler leaves on the claim."""
    pvc = kube.object(groups.PVCS, name, NAMESPACE)
    assert pvc is not None
    pvc["metadata"]["annotations"].update(annotations)
    kube.add(groups.PVCS, pvc)


HTTP_SOURCE = {"http": {"url": "https://images.example/disk.qcow2", "secretRef": "creds",
                        "certConfigMap": "ca", "checksum": "sha256:" + "ab" * 32,
                        "extraHeaders": ["X-Token: 1"]}}


async def test_an_import_datavolume_gets_its_claim_annotated_with_the_source(kube: FakeKube, ctx: Context) -> None:
    started = time.monotonic()
    dv = kube.add(groups.DATAVOLUMES, datavolume("disk", HTTP_SOURCE))
    await ImportDataVolumeReconciler(ctx).reconcile(f"{NAMESPACE}/disk")

    assert kube.created(groups.PVCS) == [f"{NAMESPACE}/disk"]
    pvc = kube.object(groups.PVCS, "disk", NAMESPACE)
    assert pvc is not None
    annotations = pvc["metadata"]["annotations"]
    assert annotations[A + "import.source"] == "http"
    assert annotations[A + "import.endpoint"] == "https://images.example/disk.qcow2"
    assert annotations[A + "import.secretName"] == "creds"
    assert annotations[A + "import.certConfigMap"] == "ca"
    assert annotations[A + "import.checksum"] == "sha256:" + "ab" * 32
    assert json.loads(annotations[A + "import.extraHeaders"]) == ["X-Token: 1"]
    assert annotations["cdi.kubevirt.io/createdForDataVolume"] == dv["metadata"]["uid"]
    owner = pvc["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["uid"], owner["controller"]) == ("DataVolume", dv["metadata"]["uid"], True)
    # the storage API's gaps filled from the profile: class, modes, and the size grown by the overhead
    assert pvc["spec"]["storageClassName"] == STORAGE_CLASS
    assert pvc["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert pvc["spec"]["volumeMode"] == "Filesystem"
    assert pvc["spec"]["resources"]["requests"]["storage"] != "1Gi"

    status = kube.object(groups.DATAVOLUMES, "disk", NAMESPACE)
    assert status is not None
    assert status["status"]["phase"] == "Pending"
    assert status["status"]["claimName"] == "disk"
    assert conditions(status)["Bound"] == ("False", "Pending")
    assert conditions(status)["Ready"][0] == "False"
    assert time.monotonic() - started < 2


async def test_a_registry_datavolume_keeps_its_pull_method(kube: FakeKube, ctx: Context) -> None:
    kube.add(groups.DATAVOLUMES, datavolume("reg", {"registry": {"url": "docker://quay.io/disk:1",
                                                                 "pullMethod": "node"}}))
    await ImportDataVolumeReconciler(ctx).reconcile(f"{NAMESPACE}/reg")
    pvc = kube.object(groups.PVCS, "reg", NAMESPACE)
    assert pvc is not None
    assert pvc["metadata"]["annotations"][A + "import.registryImportMethod"] == "node"
    assert pvc["metadata"]["annotations"][A + "import.endpoint"] == "docker://quay.io/disk:1"


async def test_the_datavolume_follows_its_claim_through_the_import(kube: FakeKube, ctx: Context) -> None:
    kube.add(groups.DATAVOLUMES, datavolume("disk", HTTP_SOURCE))
    reconciler = ImportDataVolumeReconciler(ctx)
    await reconciler.reconcile(f"{NAMESPACE}/disk")

    bind(kube, "disk")
    await reconciler.reconcile(f"{NAMESPACE}/disk")
    dv = kube.object(groups.DATAVOLUMES, "disk", NAMESPACE)
    assert dv is not None
    assert dv["status"]["phase"] == "ImportScheduled"
    assert conditions(dv)["Bound"] == ("True", "Bound")

    annotate(kube, "disk", {A + "pod.phase": "Running", A + "condition.running": "true",
                            A + "condition.running.reason": "Pod is running"})
    requeue = await reconciler.reconcile(f"{NAMESPACE}/disk")
    dv = kube.object(groups.DATAVOLUMES, "disk", NAMESPACE)
    assert dv is not None
    assert dv["status"]["phase"] == "ImportInProgress"
    assert conditions(dv)["Running"][0] == "True"
    assert requeue == 2.0  # progress is polled while it runs

    annotate(kube, "disk", {A + "pod.phase": "Succeeded", A + "condition.running": "false",
                            A + "condition.running.reason": "Completed", A + "pod.restarts": "1"})
    assert await reconciler.reconcile(f"{NAMESPACE}/disk") is None
    dv = kube.object(groups.DATAVOLUMES, "disk", NAMESPACE)
    assert dv is not None
    assert dv["status"]["phase"] == "Succeeded"
    assert dv["status"]["progress"] == "100.0%"
    assert dv["status"]["restartCount"] == 1
    assert conditions(dv)["Ready"] == ("True", "")
    assert conditions(dv)["Running"] == ("False", "Completed")
    reasons = [reason for _, reason, _ in await events_of(ctx, "disk")]
    # each phase's event, then the Bound condition's when it changed with it
    assert reasons == ["Pending", "ImportScheduled", "Bound", "ImportInProgress", "ImportSucceeded"]


async def test_a_failed_import_fails_the_datavolume(kube: FakeKube, ctx: Context) -> None:
    kube.add(groups.DATAVOLUMES, datavolume("disk", HTTP_SOURCE))
    reconciler = ImportDataVolumeReconciler(ctx)
    await reconciler.reconcile(f"{NAMESPACE}/disk")
    bind(kube, "disk")
    annotate(kube, "disk", {A + "pod.phase": "Failed", A + "import.fatalError": "true",
                            A + "condition.running": "false", A + "condition.running.reason": "NotFound",
                            A + "condition.running.message": "404 from the server"})
    await reconciler.reconcile(f"{NAMESPACE}/disk")
    dv = kube.object(groups.DATAVOLUMES, "disk", NAMESPACE)
    assert dv is not None
    assert dv["status"]["phase"] == "Failed"
    running = next(c for c in dv["status"]["conditions"] if c["type"] == "Running")
    assert (running["status"], running["reason"], running["message"]) == ("False", "NotFound", "404 from the server")
    assert ("Warning", "ImportFailed", "Failed to import into PVC disk") in await events_of(ctx, "disk")


async def test_an_unsupported_source_is_refused_at_once(kube: FakeKube, ctx: Context) -> None:
    kube.add(groups.DATAVOLUMES, datavolume("vd", {"vddk": {"url": "https://vcenter", "uuid": "x",
                                                            "backingFile": "f", "thumbprint": "t",
                                                            "secretRef": "s"}}))
    await ImportDataVolumeReconciler(ctx).reconcile(f"{NAMESPACE}/vd")
    dv = kube.object(groups.DATAVOLUMES, "vd", NAMESPACE)
    assert dv is not None
    assert dv["status"]["phase"] == "Failed"
    assert kube.created(groups.PVCS) == []


# -- the import reconciler: the claim's importer pod ----------------------------------------------------

async def import_claim(kube: FakeKube, ctx: Context, name: str = "disk") -> None:
    kube.add(groups.DATAVOLUMES, datavolume(name, HTTP_SOURCE))
    await ImportDataVolumeReconciler(ctx).reconcile(f"{NAMESPACE}/{name}")
    bind(kube, name)


def env_of(pod: Obj) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in pod["spec"]["containers"][0]["env"]}


async def test_a_bound_import_claim_gets_an_importer_pod(kube: FakeKube, ctx: Context) -> None:
    await import_claim(kube, ctx)
    await ImportReconciler(ctx).reconcile(f"{NAMESPACE}/disk")

    assert kube.created(groups.PODS) == [f"{NAMESPACE}/importer-disk"]
    pod = kube.object(groups.PODS, "importer-disk", NAMESPACE)
    assert pod is not None
    variables = env_of(pod)
    assert variables["IMPORTER_SOURCE"] == "http"
    assert variables["IMPORTER_ENDPOINT"] == "https://images.example/disk.qcow2"
    assert variables["IMPORTER_EXTRA_HEADER_0"] == "X-Token: 1"
    assert variables["IMPORTER_CHECKSUM"] == "sha256:" + "ab" * 32
    assert variables["IMPORTER_CERT_DIR"]
    claims = [v["persistentVolumeClaim"]["claimName"] for v in pod["spec"]["volumes"] if "persistentVolumeClaim" in v]
    assert claims == ["disk"]
    assert {v["configMap"]["name"] for v in pod["spec"]["volumes"] if "configMap" in v} == {"ca"}
    pvc = kube.object(groups.PVCS, "disk", NAMESPACE)
    assert pvc is not None
    assert pvc["metadata"]["annotations"][A + "import.importPodName"] == "importer-disk"
    assert pvc["metadata"]["annotations"][A + "pod.phase"] == "Pending"


async def test_a_succeeded_importer_is_recorded_and_removed(kube: FakeKube, ctx: Context) -> None:
    await import_claim(kube, ctx)
    reconciler = ImportReconciler(ctx)
    await reconciler.reconcile(f"{NAMESPACE}/disk")
    pod = kube.object(groups.PODS, "importer-disk", NAMESPACE)
    assert pod is not None
    pod["status"] = {"phase": "Succeeded", "containerStatuses": [{"name": "importer", "ready": False, "state": {
        "terminated": {"exitCode": 0, "reason": "Completed", "message": json.dumps(
            {"message": "Import Complete", "checksum": "sha256:abc"})}}}]}
    kube.add(groups.PODS, pod)

    await reconciler.reconcile(f"{NAMESPACE}/disk")
    pvc = kube.object(groups.PVCS, "disk", NAMESPACE)
    assert pvc is not None
    annotations = pvc["metadata"]["annotations"]
    assert annotations[A + "pod.phase"] == "Succeeded"
    assert annotations[A + "condition.running.reason"] == "Completed"
    assert annotations[A + "condition.running.message"] == "Import Complete"
    assert kube.object(groups.PODS, "importer-disk", NAMESPACE) is None


async def test_a_retryable_failure_starts_the_next_attempt_later(kube: FakeKube, ctx: Context) -> None:
    await import_claim(kube, ctx)
    reconciler = ImportReconciler(ctx)
    await reconciler.reconcile(f"{NAMESPACE}/disk")
    pod = kube.object(groups.PODS, "importer-disk", NAMESPACE)
    assert pod is not None
    pod["status"] = {"phase": "Failed", "containerStatuses": [{"name": "importer", "ready": False, "state": {
        "terminated": {"exitCode": 1, "reason": "Error", "message": json.dumps(
            {"message": "connection reset", "reason": "TransportError", "retryable": True})}}}]}
    kube.add(groups.PODS, pod)

    requeue = await reconciler.reconcile(f"{NAMESPACE}/disk")
    assert requeue == ctx.settings.retry_base  # 2 ** 0 times the base for the first retry
    pvc = kube.object(groups.PVCS, "disk", NAMESPACE)
    assert pvc is not None
    annotations = pvc["metadata"]["annotations"]
    assert annotations[A + "pod.restarts"] == "1"
    assert annotations[A + "import.importPodName"] == "importer-disk-retry-1"
    assert annotations[A + "condition.running.reason"] == "TransportError"
    assert A + "import.fatalError" not in annotations
    assert kube.object(groups.PODS, "importer-disk", NAMESPACE) is None
    events = await events_of(ctx, "disk")
    assert any(reason == "TransportError" and "retrying" in message for _, reason, message in events)


@pytest.mark.parametrize("pod_phase", ["Failed", "Running"])  # a real kubelet reports the container's end first
async def test_a_permanent_failure_is_fatal_without_retries(kube: FakeKube, ctx: Context, pod_phase: str) -> None:
    await import_claim(kube, ctx)
    reconciler = ImportReconciler(ctx)
    await reconciler.reconcile(f"{NAMESPACE}/disk")
    pod = kube.object(groups.PODS, "importer-disk", NAMESPACE)
    assert pod is not None
    pod["status"] = {"phase": pod_phase, "containerStatuses": [{"name": "importer", "ready": False, "state": {
        "terminated": {"exitCode": 1, "reason": "Error", "message": json.dumps(
            {"message": "404 Not Found", "reason": "NotFound", "retryable": False})}}}]}
    kube.add(groups.PODS, pod)

    assert await reconciler.reconcile(f"{NAMESPACE}/disk") is None
    pvc = kube.object(groups.PVCS, "disk", NAMESPACE)
    assert pvc is not None
    annotations = pvc["metadata"]["annotations"]
    assert annotations[A + "import.fatalError"] == "true"
    assert annotations[A + "pod.phase"] == "Failed"  # what the DataVolume and the import populator go by
    assert annotations[A + "pod.restarts"] == "0"
    assert kube.created(groups.PODS) == [f"{NAMESPACE}/importer-disk"]
    assert ("Warning", "ImportFailed", "Failed to import into PVC disk: NotFound: 404 Not Found") in \
        await events_of(ctx, "disk")


async def test_a_deleted_claim_stops_its_importer_at_once(kube: FakeKube, ctx: Context) -> None:
    await import_claim(kube, ctx)
    reconciler = ImportReconciler(ctx)
    await reconciler.reconcile(f"{NAMESPACE}/disk")
    assert kube.object(groups.PODS, "importer-disk", NAMESPACE) is not None
    pvc = kube.object(groups.PVCS, "disk", NAMESPACE)
    assert pvc is not None
    pvc["metadata"].update(finalizers=["kubernetes.io/pvc-protection"], deletionTimestamp="2026-01-01T00:00:00Z")
    kube.add(groups.PVCS, pvc)  # what deleting the DataVolume does to its claim: held by pvc-protection

    await reconciler.reconcile(f"{NAMESPACE}/disk")
    assert kube.object(groups.PODS, "importer-disk", NAMESPACE) is None
    assert [(w.verb, w.name) for w in kube.writes if w.gvr == groups.PODS] == [
        ("create", "importer-disk"), ("delete", "importer-disk")]


async def test_wait_for_first_consumer_is_honoured_when_the_gate_says_so(kube: FakeKube, ctx: Context) -> None:
    storage_class = kube.object(groups.STORAGECLASSES, STORAGE_CLASS)
    config = kube.object(groups.CDICONFIGS, groups.CDI_CONFIG_NAME)
    assert storage_class is not None and config is not None
    kube.add(groups.STORAGECLASSES, {**storage_class, "volumeBindingMode": "WaitForFirstConsumer"})
    kube.add(groups.CDICONFIGS, {**config, "spec": {"featureGates": ["HonorWaitForFirstConsumer"]}})
    kube.add(groups.DATAVOLUMES, datavolume("disk", HTTP_SOURCE))
    await ImportDataVolumeReconciler(ctx).reconcile(f"{NAMESPACE}/disk")
    pvc = kube.object(groups.PVCS, "disk", NAMESPACE)
    assert pvc is not None
    assert A + "bind.immediate.requested" not in pvc["metadata"]["annotations"]

    await ImportDataVolumeReconciler(ctx).reconcile(f"{NAMESPACE}/disk")
    dv = kube.object(groups.DATAVOLUMES, "disk", NAMESPACE)
    assert dv is not None
    assert dv["status"]["phase"] == "WaitForFirstConsumer"
    await ImportReconciler(ctx).reconcile(f"{NAMESPACE}/disk")
    assert kube.created(groups.PODS) == []  # the first consumer binds the claim, then the importer runs


# -- the upload reconciler: the claim's upload server -------------------------------------------------

async def test_an_upload_datavolume_gets_an_upload_server_and_its_service(kube: FakeKube, ctx: Context) -> None:
    kube.add(groups.DATAVOLUMES, datavolume("up", {"upload": {}}))
    await UploadDataVolumeReconciler(ctx).reconcile(f"{NAMESPACE}/up")
    pvc = kube.object(groups.PVCS, "up", NAMESPACE)
    assert pvc is not None
    assert A + "upload.target" in pvc["metadata"]["annotations"]
    bind(kube, "up")

    await UploadReconciler(ctx).reconcile(f"{NAMESPACE}/up")
    assert kube.created(groups.PODS) == [f"{NAMESPACE}/cdi-upload-up"]
    assert kube.created(groups.SERVICES) == [f"{NAMESPACE}/cdi-upload-up"]
    service = kube.object(groups.SERVICES, "cdi-upload-up", NAMESPACE)
    assert service is not None
    assert service["spec"]["ports"][0]["port"] == 8443
    pod = kube.object(groups.PODS, "cdi-upload-up", NAMESPACE)
    assert pod is not None
    assert env_of(pod)["DESTINATION"] == "/data/disk.img"
    pvc = kube.object(groups.PVCS, "up", NAMESPACE)
    assert pvc is not None
    assert pvc["metadata"]["annotations"][A + "uploadPodName"] == "cdi-upload-up"

    # the server is ready: the DataVolume says so
    annotate(kube, "up", {A + "pod.ready": "true", A + "pod.phase": "Running"})
    await UploadDataVolumeReconciler(ctx).reconcile(f"{NAMESPACE}/up")
    dv = kube.object(groups.DATAVOLUMES, "up", NAMESPACE)
    assert dv is not None
    assert dv["status"]["phase"] == "UploadReady"
    assert ("Normal", "UploadReady", "Upload into up ready") in await events_of(ctx, "up")


async def test_the_upload_server_gets_cdiconfigs_tls_profile_in_cdis_env_names(kube: FakeKube,
                                                                              ctx: Context) -> None:
    """As CDI's controller: the profile's cipher names comma-separated and its minimum version."""
    config = kube.object(groups.CDICONFIGS, groups.CDI_CONFIG_NAME)
    assert config is not None
    kube.add(groups.CDICONFIGS, {**config, "spec": {"tlsSecurityProfile": {"type": "Modern", "modern": {}}}})
    kube.add(groups.DATAVOLUMES, datavolume("up", {"upload": {}}))
    await UploadDataVolumeReconciler(ctx).reconcile(f"{NAMESPACE}/up")
    bind(kube, "up")
    await UploadReconciler(ctx).reconcile(f"{NAMESPACE}/up")
    pod = kube.object(groups.PODS, "cdi-upload-up", NAMESPACE)
    assert pod is not None
    assert env_of(pod)["TLS_CIPHERS"] == "TLS_AES_128_GCM_SHA256,TLS_AES_256_GCM_SHA384,TLS_CHACHA20_POLY1305_SHA256"
    assert env_of(pod)["TLS_MIN_VERSION"] == "VersionTLS13"


# -- the DataSource reconciler --------------------------------------------------------------------------

async def test_a_datasource_is_ready_once_its_datavolume_succeeded(kube: FakeKube, ctx: Context) -> None:
    kube.add(groups.DATASOURCES, {"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataSource",
                                  "metadata": {"name": "golden", "namespace": NAMESPACE},
                                  "spec": {"source": {"pvc": {"name": "disk", "namespace": NAMESPACE}}}})
    reconciler = DataSourceReconciler(ctx)
    await reconciler.reconcile(f"{NAMESPACE}/golden")
    ds = kube.object(groups.DATASOURCES, "golden", NAMESPACE)
    assert ds is not None
    assert conditions(ds)["Ready"] == ("False", "NotFound")
    assert ds["status"]["source"] == {}

    dv = datavolume("disk", HTTP_SOURCE)
    dv["metadata"]["labels"] = {"instancetype.kubevirt.io/default-preference": "fedora", "other": "x"}
    dv["status"] = {"phase": "ImportInProgress"}
    kube.add(groups.DATAVOLUMES, dv)
    await reconciler.reconcile(f"{NAMESPACE}/golden")
    ds = kube.object(groups.DATASOURCES, "golden", NAMESPACE)
    assert ds is not None
    assert conditions(ds)["Ready"] == ("False", "ImportInProgress")

    dv["status"] = {"phase": "Succeeded"}
    kube.add(groups.DATAVOLUMES, dv)
    await reconciler.reconcile(f"{NAMESPACE}/golden")
    ds = kube.object(groups.DATASOURCES, "golden", NAMESPACE)
    assert ds is not None
    assert conditions(ds)["Ready"] == ("True", "Ready")
    assert ds["status"]["source"] == {"pvc": {"name": "disk", "namespace": NAMESPACE}}
    # labels and status in one pass: the status is written on the labelled version, not refused with a 409
    assert ds["metadata"]["labels"] == {"instancetype.kubevirt.io/default-preference": "fedora"}


async def test_a_datasource_may_not_name_itself(kube: FakeKube, ctx: Context) -> None:
    kube.add(groups.DATASOURCES, {"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataSource",
                                  "metadata": {"name": "loop", "namespace": NAMESPACE},
                                  "spec": {"source": {"dataSource": {"name": "loop"}}}})
    await DataSourceReconciler(ctx).reconcile(f"{NAMESPACE}/loop")
    ds = kube.object(groups.DATASOURCES, "loop", NAMESPACE)
    assert ds is not None
    assert conditions(ds)["Ready"] == ("False", "SelfReference")


async def test_external_population_needs_the_classs_csi_driver(kube: FakeKube, ctx: Context) -> None:
    """CDI's checkPopulationRequirements: a claim an external populator bound is Succeeded only where the
    class's provisioner is a CSI driver; otherwise both objects get NoCSIDriverForExternalPopulation."""
    dv = datavolume("ext", {})
    del dv["spec"]["source"]
    dv["spec"]["storage"]["dataSourceRef"] = {"apiGroup": "populator.example.com", "kind": "Example", "name": "g"}
    kube.add(groups.DATAVOLUMES, dv)
    reconciler = ExternalPopulationReconciler(ctx)
    await reconciler.reconcile(f"{NAMESPACE}/ext")
    pvc = kube.object(groups.PVCS, "ext", NAMESPACE)
    assert pvc is not None and pvc["spec"]["dataSourceRef"]["kind"] == "Example"
    bind(kube, "ext")
    await reconciler.reconcile(f"{NAMESPACE}/ext")
    status = kube.object(groups.DATAVOLUMES, "ext", NAMESPACE)
    assert status is not None and status["status"]["phase"] != "Succeeded"
    message = "No CSI drivers were found: External population not supported"
    assert ("Warning", "NoCSIDriverForExternalPopulation", message) in await events_of(ctx, "ext")

    kube.add(groups.CSIDRIVERS, {"metadata": {"name": "cdi.local"}})
    await reconciler.reconcile(f"{NAMESPACE}/ext")
    status = kube.object(groups.DATAVOLUMES, "ext", NAMESPACE)
    assert status is not None and status["status"]["phase"] == "Succeeded"
    assert ("Normal", "ExternalPopulationSucceeded", "PVC ext successfully populated by g") in \
        await events_of(ctx, "ext")
