"""Volume populators end to end (issue #19) on `cdi up`: the populator kinds are served, a PVC's
`dataSourceRef` is kept as kube-apiserver keeps it, and a plain PVC naming a `VolumeImportSource`,
`VolumeUploadSource` or `VolumeCloneSource` is filled by CDI (through a prime claim, or the clone
strategies' temporary claims), ends Bound with the right bytes, and leaves no prime claim behind,
also when the import failed."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.e2e.importing import read_back
from tests.e2e.target import TARGET, External
from tests.e2e.uploading import curl, token
from tests.e2e.workloads import (
    DESCRIBE,
    SPARSE_WRITE,
    get,
    new_namespace,
    pod,
    pvc,
    run_to_completion,
)
from tests.support.cluster import CdiUp, Kubectl, wait_for
from tests.support.images import Image
from tests.support.servers import FileServer

PRIME_ANNOTATION = "cdi.kubevirt.io/storage.populator.pvcPrime"
PROGRESS_ANNOTATION = "cdi.kubevirt.io/storage.populator.progress"


def claim(name: str, kind: str, source: str, size: str = "64Mi", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}},
                     "dataSourceRef": {"apiGroup": "cdi.kubevirt.io", "kind": kind, "name": source}, **spec}}


def import_source(name: str, source: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "VolumeImportSource", "metadata": {"name": name},
            "spec": {"source": source, **spec}}


def events_of(k: Kubectl, ns: str, name: str) -> list[tuple[str, str]]:
    items = k.json("get", "events", "-n", ns, "--field-selector", f"involvedObject.name={name}")["items"]
    return [(e["reason"], e["message"]) for e in sorted(items, key=lambda e: e.get("firstTimestamp") or "")]


def primes(k: Kubectl, ns: str) -> list[str]:
    return [p["metadata"]["name"] for p in k.json("get", "pvc", "-n", ns)["items"]
            if p["metadata"]["name"].startswith("prime-")]


def test_populator_kinds_are_served_with_cdis_schema(shared_kubectl: Kubectl) -> None:
    k = shared_kubectl
    ns = new_namespace(k, "popkinds")
    k.apply(import_source("imp", {"blank": {}}, preallocation=True), "-n", ns)
    k.apply({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "VolumeUploadSource", "metadata": {"name": "up"},
             "spec": {"contentType": "kubevirt"}}, "-n", ns)
    k.apply({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "VolumeCloneSource", "metadata": {"name": "cl"},
             "spec": {"source": {"kind": "PersistentVolumeClaim", "name": "src"}}}, "-n", ns)
    assert get(k, "volumeimportsource", "imp", ns)["spec"] == {"source": {"blank": {}}, "preallocation": True}
    assert get(k, "volumeuploadsources.cdi.kubevirt.io", "up", ns)["spec"] == {"contentType": "kubevirt"}
    assert get(k, "volumeclonesource", "cl", ns)["spec"]["source"]["name"] == "src"
    refused = k("apply", "-n", ns, "-f", "-", check=False, input=json.dumps(
        {"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "VolumeCloneSource", "metadata": {"name": "bad"},
         "spec": {"source": {"kind": "PersistentVolumeClaim"}}}))
    assert refused.returncode != 0 and "spec.source.name: Required value" in refused.stderr


def test_data_source_and_ref_are_kept_as_kube_apiserver_keeps_them(shared_kubectl: Kubectl) -> None:
    k = shared_kubectl
    ns = new_namespace(k, "popref")
    k.apply(claim("by-ref", "VolumeUploadSource", "nowhere"), "-n", ns)
    spec = get(k, "pvc", "by-ref", ns)["spec"]
    assert spec["dataSource"] == {"apiGroup": "cdi.kubevirt.io", "kind": "VolumeUploadSource", "name": "nowhere"}
    old_style = claim("by-source", "VolumeUploadSource", "nowhere")
    old_style["spec"]["dataSource"] = old_style["spec"].pop("dataSourceRef")
    k.apply(old_style, "-n", ns)
    assert get(k, "pvc", "by-source", ns)["spec"]["dataSourceRef"] == old_style["spec"]["dataSource"]
    # no populator for that name: the claim waits, as on a real cluster
    assert get(k, "pvc", "by-ref", ns)["status"]["phase"] == "Pending"
    mismatch = claim("mismatch", "VolumeUploadSource", "a")
    mismatch["spec"]["dataSource"] = {"apiGroup": "cdi.kubevirt.io", "kind": "VolumeUploadSource", "name": "b"}
    refused = k("apply", "-n", ns, "-f", "-", check=False, input=json.dumps(mismatch))
    assert refused.returncode != 0 and "must match dataSourceRef" in refused.stderr
    core = claim("core", "Pod", "x")
    core["spec"]["dataSourceRef"].pop("apiGroup")
    refused = k("apply", "-n", ns, "-f", "-", check=False, input=json.dumps(core))
    assert refused.returncode != 0
    assert ('spec.dataSourceRef: Invalid value: "Pod": must be \'PersistentVolumeClaim\' when referencing the '
            "default apiGroup") in refused.stderr


@pytest.mark.anycluster
def test_import_populator_fills_a_plain_claim_and_leaves_no_prime(
        shared_kubectl: Kubectl, range_server: FileServer, images: dict[str, Image]) -> None:
    k = shared_kubectl
    ns = new_namespace(k, "popimport")
    image = images["qcow2.qcow2"]
    k.apply(import_source("disk", {"http": {"url": f"{range_server.url}/{image.name}",
                                            "checksum": f"sha256:{image.file_sha256}"}}), "-n", ns)
    k.apply(claim("target", "VolumeImportSource", "disk"), "-n", ns)
    uid = get(k, "pvc", "target", ns)["metadata"]["uid"]

    def bound() -> Any:
        pvc = get(k, "pvc", "target", ns)
        return pvc if pvc["status"].get("phase") == "Bound" else None

    pvc = wait_for(bound, 120, 0.2, message="the populated claim bound")
    annotations = pvc["metadata"]["annotations"]
    assert annotations[PRIME_ANNOTATION] == f"prime-{uid}"
    assert annotations[PROGRESS_ANNOTATION] == "100.0%"
    assert annotations["cdi.kubevirt.io/storage.pod.phase"] == "Succeeded"
    reasons = [r for r, _ in events_of(k, ns, "target")]
    assert "CreatedPVCPrimeSuccessfully" in reasons
    assert ("importSucceeded", "Successfully imported into target") in events_of(k, ns, "target")
    pv = get(k, "pv", pvc["spec"]["volumeName"], "")
    assert pv["spec"]["claimRef"]["uid"] == uid
    wait_for(lambda: not primes(k, ns), 60, 0.2, message="the prime claim deleted")
    assert read_back(k, "target", image.virtual_size, namespace=ns) == image.sha256


@pytest.mark.anycluster
def test_a_failed_import_leaves_the_claim_pending_and_no_prime_once_deleted(
        shared_kubectl: Kubectl, range_server: FileServer) -> None:
    k = shared_kubectl
    ns = new_namespace(k, "popfail")
    k.apply(import_source("gone", {"http": {"url": f"{range_server.url}/no-such-file.img"}}), "-n", ns)
    k.apply(claim("target", "VolumeImportSource", "gone"), "-n", ns)
    wait_for(lambda: ("importFailed", "import into target failed") in events_of(k, ns, "target"), 120, 0.2,
             message="the importFailed event")
    pvc = get(k, "pvc", "target", ns)
    assert pvc["status"]["phase"] == "Pending"
    assert pvc["metadata"]["annotations"]["cdi.kubevirt.io/storage.import.fatalError"] == "true"
    assert primes(k, ns) == [f"prime-{pvc['metadata']['uid']}"]
    # the importer's own words, recorded on the prime, are repeated on the claim the user looks at (CopyEvents)
    prefix = f"[prime-{pvc['metadata']['uid']}] : "
    wait_for(lambda: [m for r, m in events_of(k, ns, "target") if r == "ImportFailed" and m.startswith(prefix)
                      and "no-such-file.img" in m], 60, 0.2, message="the prime's ImportFailed copied")
    k("delete", "pvc", "target", "-n", ns, "--wait=false")
    wait_for(lambda: not primes(k, ns) and not get(k, "pvc", "target", ns), 60, 0.2,
             message="the claim and its prime deleted")


@pytest.mark.anycluster
def test_upload_populator_takes_an_upload_through_the_proxy(
        shared_cdi_up: CdiUp | External, shared_kubectl: Kubectl, images: dict[str, Image]) -> None:
    k = shared_kubectl
    ns = new_namespace(k, "popupload")
    image = images["qcow2.qcow2"]
    k.apply({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "VolumeUploadSource", "metadata": {"name": "up"},
             "spec": {"contentType": "kubevirt"}}, "-n", ns)
    k.apply(claim("target", "VolumeUploadSource", "up"), "-n", ns)
    uid = get(k, "pvc", "target", ns)["metadata"]["uid"]
    wait_for(lambda: (get(k, "pvc", "target", ns)["metadata"].get("annotations") or {})
             .get("cdi.kubevirt.io/storage.pod.ready") == "true", 90, 0.2, message="the upload server ready")
    assert get(k, "pvc", "target", ns)["metadata"]["annotations"][PRIME_ANNOTATION] == f"prime-{uid}"
    status, body, _ = curl(shared_cdi_up, k, "/v1beta1/upload", "--data-binary", f"@{image.path}",
                           bearer=token(k, "target", ns))
    assert status == 200, body

    def bound() -> Any:
        pvc = get(k, "pvc", "target", ns)
        return pvc if pvc["status"].get("phase") == "Bound" else None

    pvc = wait_for(bound, 120, 0.2, message="the uploaded claim bound")
    assert PRIME_ANNOTATION not in pvc["metadata"]["annotations"]
    assert ("UploadSucceeded", "Successfully uploaded into target") in events_of(k, ns, "target")
    wait_for(lambda: not primes(k, ns), 60, 0.2, message="the prime claim deleted")
    assert read_back(k, "target", image.virtual_size, namespace=ns) == image.sha256


def describe(k: Kubectl, ns: str, claim_name: str, pod_name: str) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(run_to_completion(k, ns, pod(pod_name, DESCRIBE, claim_name, python=True)))
    return result


@pytest.mark.anycluster
def test_clone_populator_clones_with_the_planned_strategy(shared_kubectl: Kubectl) -> None:
    """csi-clone on the capable class, host-assisted copy where the driver cannot clone: both end
    Bound with the source's bytes, and no temporary claim is left."""
    k = shared_kubectl
    ns = new_namespace(k, "popclone")
    for class_name, strategy in ((TARGET.storage_class, TARGET.smart_clone),
                                 (TARGET.copy_class, "copy")):
        golden = f"golden-{class_name}"
        k.apply(pvc(golden, "64Mi", storage_class=class_name), "-n", ns)
        run_to_completion(k, ns, pod(f"fill-{class_name}", SPARSE_WRITE, golden, python=True))
        original = describe(k, ns, golden, f"describe-{golden}")
        k.apply({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "VolumeCloneSource",
                 "metadata": {"name": f"from-{class_name}"},
                 "spec": {"source": {"kind": "PersistentVolumeClaim", "name": golden}}}, "-n", ns)
        target = f"copy-{class_name}"
        k.apply(claim(target, "VolumeCloneSource", f"from-{class_name}", storageClassName=class_name), "-n", ns)

        def done(name: str = target) -> Any:
            obj = get(k, "pvc", name, ns)
            phase = (obj["metadata"].get("annotations") or {}).get("cdi.kubevirt.io/clonePhase")
            return obj if obj["status"].get("phase") == "Bound" and phase == "Succeeded" else None

        obj = wait_for(done, 120, 0.2, message=f"the {strategy} clone done")
        assert obj["metadata"]["annotations"]["cdi.kubevirt.io/cloneType"] == strategy
        assert describe(k, ns, target, f"describe-{target}")["sha256"] == original["sha256"]
    wait_for(lambda: not [p["metadata"]["name"] for p in k.json("get", "pvc", "-n", ns)["items"]
                          if p["metadata"]["name"].startswith("tmp-pvc-")], 60, 0.2,
             message="the temporary claims deleted")


def import_dv(name: str, url: str, storage_class: str, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "annotations": annotations or {}}
    return {"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume", "metadata": meta,
            "spec": {"source": {"http": {"url": url}},
                     "storage": {"storageClassName": storage_class, "resources": {"requests": {"storage": "64Mi"}}}}}


def wait_dv(k: Kubectl, ns: str, name: str, phase: str, timeout: float = 120) -> dict[str, Any]:
    def reached() -> Any:
        dv = get(k, "dv", name, ns) or {}
        current = (dv.get("status") or {}).get("phase")
        if current == "Failed" and phase != "Failed":
            raise AssertionError(f"DataVolume {name} failed: {dv['status']}")
        return dv if current == phase else None

    result: dict[str, Any] = wait_for(reached, timeout, 0.2, message=f"DataVolume {ns}/{name} {phase}")
    return result


def outcome(dv: dict[str, Any]) -> tuple[Any, ...]:
    """What a user sees of a finished DataVolume, whichever path filled it."""
    conds = sorted((c["type"], c["status"], c.get("reason", "")) for c in dv["status"]["conditions"])
    return dv["status"]["phase"], dv["status"]["progress"], dv["status"].get("restartCount", 0), tuple(conds)


@pytest.mark.anycluster
def test_datavolumes_use_the_populator_on_csi_storage_unless_told_not_to(
        shared_kubectl: Kubectl, range_server: FileServer, images: dict[str, Image]) -> None:
    k = shared_kubectl
    ns = new_namespace(k, "popdv")
    image = images["qcow2.qcow2"]
    url = f"{range_server.url}/{image.name}"
    k.apply(import_dv("modern", url, TARGET.storage_class), "-n", ns)
    k.apply(import_dv("legacy", url, TARGET.storage_class, {"cdi.kubevirt.io/storage.usePopulator": "false"}), "-n", ns)
    modern, legacy = wait_dv(k, ns, "modern", "Succeeded"), wait_dv(k, ns, "legacy", "Succeeded")
    assert outcome(modern) == outcome(legacy)
    assert modern["metadata"]["annotations"]["cdi.kubevirt.io/storage.usePopulator"] == "true"
    assert legacy["metadata"]["annotations"]["cdi.kubevirt.io/storage.usePopulator"] == "false"
    modern_claim = wait_for(lambda: (c := get(k, "pvc", "modern", ns)) and c["status"]["phase"] == "Bound" and c,
                            60, 0.2, message="the populated claim bound")
    assert modern_claim["spec"]["dataSourceRef"] == {
        "apiGroup": "cdi.kubevirt.io", "kind": "VolumeImportSource",
        "name": f"volume-import-source-{modern['metadata']['uid']}"}
    assert "dataSourceRef" not in get(k, "pvc", "legacy", ns)["spec"]
    for name in ("modern", "legacy"):
        reasons = {r for r, _ in events_of(k, ns, name)}
        assert {"ImportScheduled", "ImportSucceeded"} <= reasons, (name, reasons)
        assert read_back(k, name, image.virtual_size, namespace=ns) == image.sha256
    wait_for(lambda: not primes(k, ns) and not k.json("get", "volumeimportsources", "-n", ns)["items"], 60, 0.2,
             message="no prime claim and no VolumeImportSource left")


def test_a_class_without_a_csi_driver_takes_the_legacy_path(shared_kubectl: Kubectl, range_server: FileServer,
                                                            images: dict[str, Image]) -> None:
    """`cdi up`'s `local-nosnap` has no CSIDriver object (every class of the real cluster has one): its
    DataVolumes go the legacy way, as if told `usePopulator: "false"`, and end the same."""
    k = shared_kubectl
    ns = new_namespace(k, "popnocsi")
    url = f"{range_server.url}/{images['qcow2.qcow2'].name}"
    k.apply(import_dv("nocsi", url, "local-nosnap"), "-n", ns)
    k.apply(import_dv("legacy", url, "local", {"cdi.kubevirt.io/storage.usePopulator": "false"}), "-n", ns)
    nocsi, legacy = wait_dv(k, ns, "nocsi", "Succeeded"), wait_dv(k, ns, "legacy", "Succeeded")
    assert nocsi["metadata"]["annotations"]["cdi.kubevirt.io/storage.usePopulator"] == "false"
    assert "dataSourceRef" not in get(k, "pvc", "nocsi", ns)["spec"]
    assert outcome(nocsi) == outcome(legacy)


@pytest.mark.anycluster
def test_wait_for_first_consumer_shows_pending_population_until_a_consumer_exists(
        shared_kubectl: Kubectl, range_server: FileServer, images: dict[str, Image]) -> None:
    k = shared_kubectl
    ns = new_namespace(k, "popwffc")
    image = images["qcow2.qcow2"]
    k.apply(import_dv("late", f"{range_server.url}/{image.name}", TARGET.wffc_class), "-n", ns)
    wait_dv(k, ns, "late", "PendingPopulation", 60)
    assert not primes(k, ns)
    assert get(k, "pvc", "late", ns)["status"]["phase"] == "Pending"
    assert read_back(k, "late", image.virtual_size, namespace=ns) == image.sha256  # the consumer
    assert wait_dv(k, ns, "late", "Succeeded")["status"]["progress"] == "100.0%"
    wait_for(lambda: not primes(k, ns), 60, 0.2, message="the prime claim deleted")
