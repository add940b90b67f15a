"""StorageProfiles follow StorageClasses, CDIConfig reflects the CDI resource, and the controller's
metrics carry CDI's names."""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.importing import datavolume, read_back, wait_phase
from tests.e2e.target import TARGET
from tests.e2e.workloads import get, new_namespace
from tests.support.cluster import CdiUp, Kubectl, wait_for
from tests.support.images import Image
from tests.support.servers import FileServer

RWO, RWX = "ReadWriteOnce", "ReadWriteMany"
FS, BLOCK = "Filesystem", "Block"


def test_a_profile_per_storage_class(shared_kubectl: Kubectl) -> None:
    k = shared_kubectl
    wait_for(lambda: k.exists("storageprofile", "local", "") and k.exists("storageprofile", "local-nosnap", ""),
             30, message="profiles for the local classes")
    local = k.json("get", "storageprofile", "local")
    assert local["status"]["provisioner"] == "local.storage.cdi.kubevirt.io"
    assert local["status"]["cloneStrategy"] == "csi-clone"
    assert local["status"]["snapshotClass"] == "local"
    assert local["status"]["claimPropertySets"][0] == {"accessModes": ["ReadWriteOnce"], "volumeMode": "Filesystem"}
    recognized = local["status"]["conditions"][0]
    assert (recognized["type"], recognized["status"], recognized["reason"]) == \
        ("Recognized", "True", "RecognizedProvisioner")
    assert k.json("get", "storageprofile", "local-nosnap")["status"]["cloneStrategy"] == "copy"
    k.apply({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": "mystery"},
             "provisioner": "example.com/unknown"})
    wait_for(lambda: k.exists("storageprofile", "mystery", ""), 30, message="profile for a new class")
    mystery = k.json("get", "storageprofile", "mystery")
    assert mystery["status"]["conditions"][0]["reason"] == "UnrecognizedProvisioner"
    assert "claimPropertySets" not in mystery["status"]
    k("patch", "storageprofile", "mystery", "--type", "merge", "-p", json.dumps(
        {"spec": {"claimPropertySets": [{"accessModes": ["ReadWriteMany"], "volumeMode": "Block"}]}}))
    wait_for(lambda: k.json("get", "storageprofile", "mystery")["status"].get("claimPropertySets") ==
             [{"accessModes": ["ReadWriteMany"], "volumeMode": "Block"}], 30, message="spec overrides the table")
    k("delete", "storageclass", "mystery")
    wait_for(lambda: not k.exists("storageprofile", "mystery", ""), 30, message="profile deleted with its class")


def test_cdiconfig_follows_the_cdi_resource(shared_kubectl: Kubectl) -> None:
    k = shared_kubectl
    wait_for(lambda: k.exists("cdiconfig", "config", ""), 30, message="CDIConfig")
    status = k.json("get", "cdiconfig", "config")["status"]
    assert status["filesystemOverhead"]["global"] == "0.06"
    assert status["filesystemOverhead"]["storageClass"]["local"] == "0.06"
    assert status["defaultPodResourceRequirements"]["limits"]["memory"] == "600M"
    k("patch", "cdi", "cdi", "--type", "merge", "-p", json.dumps({"spec": {"config": {
        "filesystemOverhead": {"global": "0.1", "storageClass": {"local-wffc": "0.2"}},
        "scratchSpaceStorageClass": "local-wffc", "uploadProxyURLOverride": "https://upload.example.com"}}}))

    def updated() -> bool:
        current = k.json("get", "cdiconfig", "config")["status"]
        return current["filesystemOverhead"]["global"] == "0.1"
    wait_for(updated, 30, message="CDIConfig status from the CDI resource")
    status = k.json("get", "cdiconfig", "config")["status"]
    assert status["filesystemOverhead"]["storageClass"] == {"local": "0.1", "local-wffc": "0.2", "local-nosnap": "0.1"}
    assert status["scratchSpaceStorageClass"] == "local-wffc"
    assert status["uploadProxyURL"] == "https://upload.example.com"
    assert k.json("get", "cdi", "cdi")["status"]["phase"] == "Deployed"
    k("patch", "cdi", "cdi", "--type", "merge", "-p", '{"spec":{"config":{}}}')


def scrape_controller_metrics(cdi_up: CdiUp) -> str:
    url = re.search(r"controller metrics (\S+)", cdi_up.log_path.read_text())
    assert url, "cdi up prints where the controller's metrics are"
    with urllib.request.urlopen(url.group(1), timeout=5) as resp:
        text: str = resp.read().decode()
        return text


def test_controller_metrics_carry_cdis_names(shared_cdi_up: CdiUp, shared_kubectl: Kubectl) -> None:
    def scrape() -> str:
        return scrape_controller_metrics(shared_cdi_up)
    wait_for(lambda: 'storageclass="local"' in scrape(), 30, message="storageprofile_info for local")
    text = scrape()
    local = next(line for line in text.splitlines()
                 if line.startswith("kubevirt_cdi_storageprofile_info{") and 'storageclass="local"' in line)
    assert 'smartclone="true"' in local and 'default="true"' in local
    assert 'degraded="false"' in local  # one node: no RWX needed for live migration
    assert "kubevirt_cdi_datavolume_pending 0.0" in text
    assert 'cdi_controller_reconciles_total{controller="storageprofile",outcome="success"}' in text
    assert "cdi_controller_workqueue_depth" in text


# -- CDI's known-provisioner table: keys derived from StorageClass parameters ---------------------------

def sets(*pairs: tuple[str, str]) -> list[dict[str, Any]]:
    return [{"accessModes": [mode], "volumeMode": volume} for mode, volume in pairs]


# name: (provisioner, parameters, expected claimPropertySets, expected minimumSupportedPvcSize)
PARAMETER_CLASSES: dict[str, tuple[str, dict[str, str], list[dict[str, Any]], str | None]] = {
    "ebs-io2": ("ebs.csi.aws.com", {"type": "io2"}, sets((RWX, BLOCK), (RWO, BLOCK), (RWO, FS)), "4Gi"),
    "ebs-gp3": ("ebs.csi.aws.com", {"type": "gp3"}, sets((RWO, BLOCK)), "1Gi"),
    "trident-nas": ("csi.trident.netapp.io", {"backendType": "ontap-nas-economy"}, sets((RWX, FS), (RWO, FS)), None),
    "trident-san": ("csi.trident.netapp.io", {"backendType": "ontap-san"}, sets((RWX, BLOCK)), None),
    "longhorn-migratable": ("driver.longhorn.io", {"migratable": "true", "numberOfReplicas": "3"},
                            sets((RWX, BLOCK), (RWO, BLOCK)), None),
    "longhorn-nfs": ("driver.longhorn.io", {"nfsOptions": "vers=4.2,noresvport"}, sets((RWX, FS), (RWO, FS)), None),
    "hpp-pool": ("kubevirt.io.hostpath-provisioner", {"storagePool": "local"}, sets((RWO, FS)), None),
    "hpp-overlay": ("kubevirt.io.hostpath-provisioner", {"storagePool": "local", "overlayCSI": "true"},
                    sets((RWX, FS)), None),
}


def storage_class(name: str, provisioner: str, parameters: dict[str, str] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": name},
                            "provisioner": provisioner}
    if parameters:
        body["parameters"] = parameters
    return body


def profile_of(k: Kubectl, name: str) -> dict[str, Any]:
    """The class's StorageProfile once the controller has written its status."""
    def ready() -> Any:
        if not k.exists("storageprofile", name, ""):
            return None
        profile: dict[str, Any] = k.json("get", "storageprofile", name)
        return profile if (profile.get("status") or {}).get("conditions") else None
    result: dict[str, Any] = wait_for(ready, 30, message=f"StorageProfile {name}")
    return result


@pytest.fixture
def classes(shared_kubectl: Kubectl) -> Iterator[list[str]]:
    """Names of StorageClasses a test creates; deleted afterwards (CDIConfig lists every class)."""
    names: list[str] = []
    yield names
    for name in names:
        shared_kubectl("delete", "storageclass", name, "--ignore-not-found")
    wait_for(lambda: not any(shared_kubectl.exists("storageprofile", name, "") for name in names), 30,
             message="profiles deleted with their classes")


def test_storage_class_parameters_select_cdis_provisioner_keys(shared_kubectl: Kubectl, classes: list[str]) -> None:
    k = shared_kubectl
    for name, (provisioner, parameters, _, _) in PARAMETER_CLASSES.items():
        k.apply(storage_class(name, provisioner, parameters))
        classes.append(name)
    for name, (_, _, expected_sets, minimum) in PARAMETER_CLASSES.items():
        profile = profile_of(k, name)
        assert profile["status"].get("claimPropertySets") == expected_sets, name
        recognized = profile["status"]["conditions"][0]
        assert (recognized["type"], recognized["status"], recognized["reason"], recognized["message"]) == \
            ("Recognized", "True", "RecognizedProvisioner", "Provisioner is recognized"), name
        assert (profile["metadata"].get("annotations") or {}).get("cdi.kubevirt.io/minimumSupportedPvcSize") == \
            minimum, name


def test_trident_backend_type_selects_clone_strategy_and_cron_source_format(
        shared_kubectl: Kubectl, classes: list[str]) -> None:
    k = shared_kubectl
    k.apply({"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotClass",
             "metadata": {"name": "trident-snapshots"}, "driver": "csi.trident.netapp.io", "deletionPolicy": "Delete"})
    try:
        k.apply(storage_class("trident-san-snap", "csi.trident.netapp.io", {"backendType": "ontap-san-economy"}))
        classes.append("trident-san-snap")
        wait_for(lambda: profile_of(k, "trident-san-snap")["status"].get("snapshotClass") == "trident-snapshots",
                 30, message="snapshot class seen")
        status = profile_of(k, "trident-san-snap")["status"]
        assert status["cloneStrategy"] == "snapshot"
        assert status["dataImportCronSourceFormat"] == "snapshot"
        assert status["claimPropertySets"] == sets((RWX, BLOCK))
    finally:
        k("delete", "volumesnapshotclass", "trident-snapshots", "--ignore-not-found")


def test_unknown_parameter_combination_is_reported_as_cdi_does(shared_kubectl: Kubectl, classes: list[str]) -> None:
    k = shared_kubectl
    k.apply(storage_class("trident-unknown", "csi.trident.netapp.io", {"backendType": "solidfire-san"}))
    classes.append("trident-unknown")
    profile = profile_of(k, "trident-unknown")
    assert "claimPropertySets" not in profile["status"]
    recognized = profile["status"]["conditions"][0]
    assert (recognized["type"], recognized["status"], recognized["reason"], recognized["message"]) == \
        ("Recognized", "False", "UnrecognizedStorageClassParameters", "Storage class parameters are not recognized")


def test_object_bucket_provisioner_gets_an_empty_profile_never_counted_incomplete(
        shared_cdi_up: CdiUp, shared_kubectl: Kubectl, classes: list[str]) -> None:
    """CDI keeps a StorageProfile for object-bucket classes (its reconciler skips no class) but never counts
    them as incomplete, so CDIStorageProfilesIncomplete does not fire for a cluster running NooBaa."""
    k = shared_kubectl
    k.apply(storage_class("buckets", "openshift-storage.noobaa.io/obc", {"bucketclass": "noobaa-default"}))
    k.apply(storage_class("mystery-unknown", "example.com/unknown"))
    classes.extend(["buckets", "mystery-unknown"])
    profile = profile_of(k, "buckets")
    assert "claimPropertySets" not in profile["status"]
    assert profile["status"]["conditions"][0]["reason"] == "UnrecognizedProvisioner"

    def info(name: str) -> str | None:
        return next((line for line in scrape_controller_metrics(shared_cdi_up).splitlines()
                     if line.startswith("kubevirt_cdi_storageprofile_info{") and f'storageclass="{name}"' in line),
                    None)
    buckets = wait_for(lambda: info("buckets"), 30, message="storageprofile_info for buckets")
    unknown = wait_for(lambda: info("mystery-unknown"), 30, message="storageprofile_info for mystery-unknown")
    assert 'complete="true"' in buckets
    assert 'complete="false"' in unknown


def test_minimum_supported_pvc_size_raises_small_requests(shared_kubectl: Kubectl, classes: list[str]) -> None:
    k = shared_kubectl
    ns = new_namespace(k, "minsize")
    # the table's minimum: a 1Gi request on EBS io2 asks for 4Gi, in io2's preferred modes
    k.apply(storage_class("ebs-io2-min", "ebs.csi.aws.com", {"type": "io2"}))
    # a minimum an administrator set on the profile of a class the local provisioner serves
    k.apply(storage_class("local-min", "local.storage.cdi.kubevirt.io"))
    classes.extend(["ebs-io2-min", "local-min"])
    profile_of(k, "ebs-io2-min")
    profile_of(k, "local-min")
    k("annotate", "storageprofile", "local-min", "cdi.kubevirt.io/minimumSupportedPvcSize=4Gi")
    k.apply(datavolume("on-io2", {"blank": {}}, "1Gi", storage_class="ebs-io2-min"), "-n", ns)
    k.apply(datavolume("small", {"blank": {}}, "1Gi", storage_class="local-min"), "-n", ns)
    k.apply(datavolume("large", {"blank": {}}, "4Gi", storage_class="local-min"), "-n", ns)
    try:
        io2 = wait_for(lambda: k.exists("pvc", "on-io2", ns) and k.get("pvc", "on-io2", ns), 60,
                       message="claim of on-io2")
        assert io2["spec"]["resources"]["requests"]["storage"] == "4Gi"
        assert (io2["spec"]["accessModes"], io2["spec"]["volumeMode"]) == ([RWX], BLOCK)
        wait_phase(k, "small", "Succeeded", namespace=ns)
        small = k.get("pvc", "small", ns)
        assert small["spec"]["resources"]["requests"]["storage"] == "4Gi"  # not 1Gi inflated by the overhead
        assert small["status"]["capacity"]["storage"] == "4Gi"
        # above the minimum the request inflated by the filesystem overhead stands, in bytes
        wait_phase(k, "large", "Succeeded", namespace=ns)
        assert int(k.get("pvc", "large", ns)["spec"]["resources"]["requests"]["storage"]) > 4 * 1024 ** 3
        # a value the administrator set is kept; the table's value comes back when it is removed
        k("annotate", "--overwrite", "storageprofile", "ebs-io2-min", "cdi.kubevirt.io/minimumSupportedPvcSize=8Gi")
        k("annotate", "storageprofile", "local-min", "cdi.kubevirt.io/minimumSupportedPvcSize-")
        wait_for(lambda: "cdi.kubevirt.io/minimumSupportedPvcSize" not in
                 (k.json("get", "storageprofile", "local-min")["metadata"].get("annotations") or {}), 30,
                 message="no minimum on a class without one in the table")
        assert k.json("get", "storageprofile", "ebs-io2-min")["metadata"]["annotations"][
            "cdi.kubevirt.io/minimumSupportedPvcSize"] == "8Gi"
        k("annotate", "storageprofile", "ebs-io2-min", "cdi.kubevirt.io/minimumSupportedPvcSize-")
        wait_for(lambda: (k.json("get", "storageprofile", "ebs-io2-min")["metadata"].get("annotations") or {}).get(
            "cdi.kubevirt.io/minimumSupportedPvcSize") == "4Gi", 30, message="the table's minimum restored")
    finally:
        k("delete", "namespace", ns, "--wait=false")


def test_no_provisioner_profile_takes_the_modes_of_its_volumes(shared_kubectl: Kubectl, classes: list[str]) -> None:
    """A class of statically provisioned volumes: CDI offers the access and volume modes of its PVs."""
    k = shared_kubectl
    k.apply(storage_class("static", "kubernetes.io/no-provisioner"))
    classes.append("static")
    assert "claimPropertySets" not in profile_of(k, "static")["status"]
    pv = {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "static-disk-1"},
          "spec": {"storageClassName": "static", "capacity": {"storage": "1Gi"}, "volumeMode": "Block",
                   "accessModes": [RWX, RWO], "persistentVolumeReclaimPolicy": "Retain",
                   "local": {"path": "/dev/null"},
                   "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                       {"key": "kubernetes.io/hostname", "operator": "Exists"}]}]}}}}
    k.apply(pv)
    try:
        wait_for(lambda: profile_of(k, "static")["status"].get("claimPropertySets") == sets((RWX, BLOCK), (RWO, BLOCK)),
                 30, message="the profile follows the class's volumes")
    finally:
        k("delete", "pv", "static-disk-1", "--ignore-not-found", "--wait=false")
    wait_for(lambda: "claimPropertySets" not in profile_of(k, "static")["status"], 30,
             message="the profile forgets a deleted volume")


def test_claims_are_sized_as_cdis_code_sizes_them(shared_kubectl: Kubectl, classes: list[str]) -> None:
    """CDI's GetRequiredSpace (pkg/util/util.go, as fixed in CDI's PR #3779, and in CDI's source today):
    ceil(RoundUp(request, 1MiB) * (1 + overhead)). The reference once said `/ (1 - overhead)`; CDI's
    source wins. 100Mi at 0.2 asks for 125829120 bytes, 1Gi at 0.06 for 1138166334. Each class names its
    overhead, so the test does not depend on the global one another test may be changing."""
    k = shared_kubectl
    ns = new_namespace(k, "sizing")
    overheads = {"sizing-20": "0.2", "sizing-06": "0.06"}
    for name in overheads:
        k.apply(storage_class(name, "local.storage.cdi.kubevirt.io"))
        classes.append(name)
    k("patch", "cdi", "cdi", "--type", "merge", "-p", json.dumps(
        {"spec": {"config": {"filesystemOverhead": {"storageClass": overheads}}}}))
    try:
        wait_for(lambda: all(k.json("get", "cdiconfig", "config")["status"]["filesystemOverhead"]["storageClass"]
                             .get(name) == value for name, value in overheads.items()), 30,
                 message="the classes' overheads in CDIConfig")
        k.apply(datavolume("hundred", {"blank": {}}, "100Mi", storage_class="sizing-20"), "-n", ns)
        k.apply(datavolume("gig", {"blank": {}}, "1Gi", storage_class="sizing-06"), "-n", ns)
        for name, size in (("hundred", "125829120"), ("gig", "1138166334")):
            claim = wait_for(lambda n=name: k.exists("pvc", n, ns) and k.get("pvc", n, ns), 60,
                             message=f"claim of {name}")
            assert claim["spec"]["resources"]["requests"]["storage"] == size, name
    finally:
        k("patch", "cdi", "cdi", "--type", "merge", "-p", '{"spec":{"config":{}}}')
        k("delete", "namespace", ns, "--wait=false")


def bound_condition(k: Kubectl, ns: str, name: str) -> dict[str, Any]:
    dv = get(k, "dv", name, ns) or {}
    return next((c for c in (dv.get("status") or {}).get("conditions") or [] if c["type"] == "Bound"), {})


def warnings_of(k: Kubectl, ns: str, name: str) -> list[tuple[str, str]]:
    items = k.json("get", "events", "-n", ns, "--field-selector", f"involvedObject.name={name}")["items"]
    return [(e["reason"], e["message"]) for e in items if e.get("type") == "Warning"]


def waits_with(k: Kubectl, ns: str, name: str, message: str) -> None:
    """The DataVolume says (its Bound condition) that it waits, and why; it has no claim."""
    wait_for(lambda: bound_condition(k, ns, name).get("message") == message, 60, 0.2,
             message=f"DataVolume {ns}/{name} waiting with {message!r}: {bound_condition(k, ns, name)}")
    assert not k.exists("pvc", name, ns)


def populated_claim(name: str, source: str, storage_class: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name},
            "spec": {"accessModes": [RWO], "storageClassName": storage_class,
                     "resources": {"requests": {"storage": "64Mi"}},
                     "dataSourceRef": {"apiGroup": "cdi.kubevirt.io", "kind": "VolumeImportSource", "name": source}}}


def test_a_datavolume_waiting_for_a_class_of_a_known_provisioner_goes_on_when_the_class_comes(
        shared_kubectl: Kubectl, classes: list[str], range_server: FileServer, images: dict[str, Image]) -> None:
    """The simpler case of the workflow below (issue 27, point 1): the class a `storage` DataVolume names
    comes after it, of a provisioner CDI knows, so its StorageProfile is complete from the start: creating
    the class is all it takes. (Not on a real cluster: CDI knows no provisioner of the kit, whose classes
    are of hostpath.csi.k8s.io; there the workflow below, with the profile's step, is what a user meets.)"""
    k = shared_kubectl
    ns = new_namespace(k, "latecls")
    name = f"cdi-e2e-late-{ns}"
    image = images["qcow2.qcow2"]
    k.apply(datavolume("late", {"http": {"url": f"{range_server.url}/{image.name}"}}, storage_class=name), "-n", ns)
    waits_with(k, ns, "late", "DataVolume.storage spec is missing accessMode and no storageClass to choose profile")

    classes.append(name)
    k.apply(storage_class(name, "local.storage.cdi.kubevirt.io"))  # cdi up's own provisioner, which CDI's table lists
    status = profile_of(k, name)["status"]
    assert status["claimPropertySets"] == sets((RWO, FS), (RWO, BLOCK)), status
    assert (status["conditions"][0]["type"], status["conditions"][0]["reason"]) == \
        ("Recognized", "RecognizedProvisioner")
    wait_phase(k, "late", "Succeeded", namespace=ns, timeout=180)
    claim = get(k, "pvc", "late", ns)
    assert (claim["spec"]["storageClassName"], claim["spec"]["accessModes"], claim["spec"]["volumeMode"]) == \
        (name, [RWO], FS)
    assert read_back(k, "late", image.virtual_size, namespace=ns) == image.sha256
    assert not any(message.startswith("Spec is missing") for _, message in warnings_of(k, ns, "late")), \
        warnings_of(k, ns, "late")


@pytest.mark.anycluster
def test_the_storage_profile_workflow_needs_nothing_but_the_admins_steps(
        shared_kubectl: Kubectl, classes: list[str], range_server: FileServer, images: dict[str, Image]) -> None:
    """CDI's documented workflow for a class of a driver it does not know: a `storage` DataVolume naming the
    class waits (first for the class, then with ErrClaimNotValid for the class's StorageProfile), the admin
    creates the class and completes its profile's `claimPropertySets`, and that is all: the waiting import,
    clone and populated claim go on by themselves (CDI's controllers watch StorageClasses and StorageProfiles)."""
    k = shared_kubectl
    ns = new_namespace(k, "spflow")
    name = f"cdi-e2e-unlisted-{ns}"
    image = images["qcow2.qcow2"]
    url = f"{range_server.url}/{image.name}"
    k.apply(datavolume("source", {"http": {"url": url}}, storage_class=TARGET.storage_class), "-n", ns)
    k.apply(datavolume("early", {"http": {"url": url}}, storage_class=name), "-n", ns)
    clone = datavolume("copy", {"pvc": {"name": "source", "namespace": ns}}, storage_class=name)
    del clone["spec"]["storage"]["resources"]  # CDI's size: the source's
    k.apply(clone, "-n", ns)
    k.apply({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "VolumeImportSource", "metadata": {"name": "disk"},
             "spec": {"source": {"http": {"url": url}}}}, "-n", ns)
    k.apply(populated_claim("filled", "disk", name), "-n", ns)
    waits_with(k, ns, "early", "DataVolume.storage spec is missing accessMode and no storageClass to choose profile")
    wait_phase(k, "source", "Succeeded", namespace=ns)

    classes.append(name)  # the admin's first step: the class
    k.apply(storage_class(name, TARGET.unlisted_provisioner))
    assert "claimPropertySets" not in profile_of(k, name)["status"]
    missing = f"Spec is missing accessMode and volumeMode, cannot get access mode from StorageProfile {name}"
    for dv in ("early", "copy"):
        waits_with(k, ns, dv, missing)
        assert ("ErrClaimNotValid", missing) in warnings_of(k, ns, dv)

    # the second: the profile's claim property sets, as README and CDI's documentation say
    k("patch", "storageprofile", name, "--type=merge",
      "-p", json.dumps({"spec": {"claimPropertySets": [{"accessModes": [RWO], "volumeMode": FS}]}}))
    for dv in ("early", "copy"):
        wait_phase(k, dv, "Succeeded", namespace=ns, timeout=180)
        assert get(k, "pvc", dv, ns)["spec"]["storageClassName"] == name
        assert read_back(k, dv, image.virtual_size, namespace=ns) == image.sha256
    wait_for(lambda: (get(k, "pvc", "filled", ns) or {}).get("status", {}).get("phase") == "Bound", 180, 0.2,
             message="the populated claim of the new class bound")
    assert read_back(k, "filled", image.virtual_size, namespace=ns) == image.sha256

