"""What a user of clones and populated claims notices around the copy itself (issue #27): a claim filled
through a populator says it holds a disk image, so clones of it get CDI's size and a same-size Block
clone is accepted; a smart clone (csi-clone or snapshot) does not start while a pod writes to its source; a
snapshot clone whose source goes away finishes from its snapshot when it was taken, and otherwise waits
for a source saying why, never asking a snapshot of a claim being deleted; and no temporary claim or
snapshot outlives the DataVolume's success by more than a moment."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from cdi.api.sizing import required_space
from tests.e2e.importing import read_back
from tests.e2e.target import TARGET, External
from tests.e2e.test_clone import clone_dv, describe, events_of, filesystem_overhead, leftovers
from tests.e2e.uploading import image_upload
from tests.e2e.workloads import SPARSE_WRITE, get, new_namespace, pod, pvc, run_to_completion
from tests.support.cluster import CdiUp, Kubectl, wait_for
from tests.support.images import Image
from tests.support.servers import FileServer

MIB = 1024 * 1024
SMART_PHASE = {"csi-clone": "CSICloneInProgress", "snapshot": "SnapshotForSmartCloneInProgress"}
GONE_AT_ONCE = 3.0  # seconds after Succeeded within which the temporaries must be gone


def import_dv(name: str, source: dict[str, Any], size: str = "64Mi",
              storage_class: str | None = None) -> dict[str, Any]:
    return {"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume", "metadata": {"name": name},
            "spec": {"source": source, "storage": {"storageClassName": storage_class or TARGET.storage_class,
                                                   "resources": {"requests": {"storage": size}}}}}


def wait_dv(k: Kubectl, ns: str, name: str, *phases: str, timeout: float = 120) -> dict[str, Any]:
    """The DataVolume in one of `phases`; polled often, since some tests look at what follows at once."""
    def reached() -> dict[str, Any] | None:
        dv = get(k, "datavolume", name, ns) or {}
        current = (dv.get("status") or {}).get("phase")
        if current == "Failed" and "Failed" not in phases:
            raise AssertionError(f"DataVolume {ns}/{name} failed: {dv['status']}")
        return dv if current in phases else None

    result: dict[str, Any] = wait_for(reached, timeout, 0.05, message=f"DataVolume {ns}/{name} {phases}")
    return result


def running(dv: dict[str, Any]) -> dict[str, Any]:
    return next((c for c in (dv.get("status") or {}).get("conditions") or [] if c["type"] == "Running"), {})


def temporaries(k: Kubectl, ns: str) -> list[str]:
    """Prime claims and the clone strategies' temporary claims and snapshots in `ns`."""
    names = {*leftovers(k, ns), *(p["metadata"]["name"] for p in k.json("get", "pvc", "-n", ns)["items"])}
    return sorted(n for n in names if n.startswith(("prime-", "tmp-pvc-", "tmp-snapshot-")))


@pytest.mark.anycluster
def test_a_populated_claim_says_it_holds_a_disk_and_its_clones_get_cdis_size(
        shared_kubectl: Kubectl, range_server: FileServer, images: dict[str, Image]) -> None:
    k = shared_kubectl
    ns = new_namespace(k, "popsize")
    image = images["qcow2.qcow2"]
    k.apply(import_dv("golden", {"http": {"url": f"{range_server.url}/{image.name}"}}), "-n", ns)
    dv = wait_dv(k, ns, "golden", "Succeeded")
    claim = get(k, "pvc", "golden", ns)
    annotations = claim["metadata"]["annotations"]
    assert claim["spec"]["dataSourceRef"]["kind"] == "VolumeImportSource"  # filled by the import populator
    # what CDI writes on a DataVolume's claim, whichever path fills it
    assert annotations["cdi.kubevirt.io/storage.contentType"] == "kubevirt"
    assert annotations["cdi.kubevirt.io/createdForDataVolume"] == dv["metadata"]["uid"]
    assert annotations["cdi.kubevirt.io/storage.usePopulator"] == "true"
    assert annotations["cdi.kubevirt.io/storage.pod.restarts"] == "0"
    assert annotations["cdi.kubevirt.io/storage.preallocation.requested"] == "false"
    assert annotations["cdi.kubevirt.io/storage.populator.progress"] == "100.0%"

    # no size: the virtual size of the disk image (the importer grew it to the 64Mi asked for) with the
    # target's filesystem overhead, as CDI: the source's own request, not its capacity (which holds that
    # overhead already) inflated once more
    k.apply(clone_dv("fit", {"pvc": {"namespace": ns, "name": "golden"}}, storage_class=TARGET.storage_class),
            "-n", ns)
    wait_dv(k, ns, "fit", "Succeeded")
    size = str(required_space(filesystem_overhead(k, TARGET.storage_class), 64 * MIB))
    assert get(k, "pvc", "fit", ns)["spec"]["resources"]["requests"]["storage"] == size == \
        claim["spec"]["resources"]["requests"]["storage"]
    assert read_back(k, "fit", image.virtual_size, namespace=ns) == image.sha256
    if not TARGET.block:
        pytest.skip("the cluster's runtime gives non-root pods no block devices: the Block clone is not read")

    # into Block of the size the DataVolume asked for: the image fits, so CDI accepts it (permissive)
    block = clone_dv("block", {"pvc": {"namespace": ns, "name": "golden"}}, size="64Mi",
                     storage_class=TARGET.storage_class)
    block["spec"]["storage"]["volumeMode"] = "Block"
    k.apply(block, "-n", ns)
    assert wait_dv(k, ns, "block", "Succeeded")["metadata"]["annotations"][
        "cdi.kubevirt.io/permissiveClone"] == "true"
    assert [r for r, _ in events_of(k, ns, "block") if r in ("ErrIncompatiblePVC", "CloneValidationFailed")] == []
    assert read_back(k, "block", image.virtual_size, block=True, namespace=ns) == image.sha256


def profile_strategy(k: Kubectl, storage_class: str) -> Any:
    return ((get(k, "storageprofile", storage_class, "") or {}).get("status") or {}).get("cloneStrategy")


@contextmanager
def clone_strategy(k: Kubectl, storage_class: str, strategy: str) -> Iterator[None]:
    """The class's smart clones by `strategy`: its StorageProfile's `spec.cloneStrategy` set, as an admin sets
    it, when the class does not clone so by default, and put back after (the default seen again before the
    next test)."""
    profile = get(k, "storageprofile", storage_class, "") or {}
    before = (profile.get("spec") or {}).get("cloneStrategy")
    default = (profile.get("status") or {}).get("cloneStrategy")
    if strategy == default:
        yield
        return
    k("patch", "storageprofile", storage_class, "--type=merge", "-p", json.dumps({"spec": {"cloneStrategy": strategy}}))
    wait_for(lambda: profile_strategy(k, storage_class) == strategy, 60, 0.1,
             message=f"the StorageProfile of {storage_class} says {strategy}")
    try:
        yield
    finally:
        k("patch", "storageprofile", storage_class, "--type=merge", "-p",
          json.dumps({"spec": {"cloneStrategy": before}}))
        wait_for(lambda: profile_strategy(k, storage_class) == default, 60, 0.1,
                 message=f"the StorageProfile of {storage_class} back to {default}")


@pytest.mark.anycluster
@pytest.mark.parametrize("strategy", ["csi-clone", "snapshot"])
def test_a_smart_clone_waits_while_a_pod_writes_to_its_source(shared_kubectl: Kubectl, strategy: str) -> None:
    """Both smart strategies, on any cluster: the one the class uses by default and the other one set on its
    StorageProfile for the test."""
    k = shared_kubectl
    assert profile_strategy(k, TARGET.storage_class) == TARGET.smart_clone
    with clone_strategy(k, TARGET.storage_class, strategy):
        held_then_cloned(k, strategy)


def held_then_cloned(k: Kubectl, strategy: str) -> None:
    ns = new_namespace(k, "smartinuse")
    k.apply(pvc("golden", "64Mi", storage_class=TARGET.storage_class), "-n", ns)
    run_to_completion(k, ns, pod("fill", SPARSE_WRITE, "golden", python=True))
    original = describe(k, ns, "golden", "describe-golden")
    k.apply(pod("holder", "sleep 600", "golden"), "-n", ns)
    wait_for(lambda: (get(k, "pod", "holder", ns) or {}).get("status", {}).get("phase") == "Running", 60, 0.1,
             message="holder running")
    dv = clone_dv("copy", {"pvc": {"namespace": ns, "name": "golden"}}, storage_class=TARGET.storage_class)
    # the source's size exactly (the pvc API adds no overhead): no expansion, which not every class has
    dv["spec"]["pvc"] = {**dv["spec"].pop("storage"), "accessModes": ["ReadWriteOnce"],
                         "resources": {"requests": {"storage": "64Mi"}}}
    k.apply(dv, "-n", ns)
    message = f"pod {ns}/holder using PersistentVolumeClaim golden"

    def held() -> dict[str, Any] | None:
        dv = get(k, "datavolume", "copy", ns) or {}
        return dv if (running(dv).get("reason"), running(dv).get("message")) == ("CloneSourceInUse", message) \
            else None

    dv = wait_for(held, 60, 0.2, message="Running condition says CloneSourceInUse")
    assert dv["status"]["phase"] == SMART_PHASE[strategy]
    assert running(dv)["status"] == "False"
    assert ("CloneSourceInUse", message) in events_of(k, ns, "copy")
    assert temporaries(k, ns) == [], "the clone started while the source was written"
    k("delete", "pod", "holder", "-n", ns, "--wait=false")
    wait_dv(k, ns, "copy", "Succeeded")
    assert get(k, "pvc", "copy", ns)["metadata"]["annotations"]["cdi.kubevirt.io/cloneType"] == strategy
    assert describe(k, ns, "copy", "describe-copy")["sha256"] == original["sha256"]


@pytest.fixture
def snapshot_strategy(shared_kubectl: Kubectl) -> Iterator[None]:
    """The target's class clones with the snapshot strategy (its StorageProfile's cloneStrategy)."""
    with clone_strategy(shared_kubectl, TARGET.storage_class, "snapshot"):
        yield


def golden_image(k: Kubectl, ns: str, url: str) -> None:
    k.apply(import_dv("golden", {"http": {"url": url}}), "-n", ns)
    wait_dv(k, ns, "golden", "Succeeded")


def snapshot_ready(k: Kubectl, ns: str) -> bool:
    snapshots = [s for s in k.json("get", "volumesnapshot", "-n", ns)["items"]
                 if s["metadata"]["name"].startswith("tmp-snapshot-")]
    return len(snapshots) == 1 and (snapshots[0].get("status") or {}).get("readyToUse") is True


@pytest.mark.anycluster
def test_a_snapshot_clone_whose_source_goes_after_the_snapshot_finishes_from_it(
        shared_kubectl: Kubectl, range_server: FileServer, images: dict[str, Image], snapshot_strategy: None) -> None:
    """The snapshot is taken, then the source DataVolume is deleted: the data is in the snapshot, so the
    clone finishes from it with the source's bytes and leaves no temporary. The moment is the test's: a
    ResourceQuota of two claims (the source and the target) refuses the claim restored from the snapshot
    until the source's claim is gone, so the clone stands between its two steps while the source goes."""
    k = shared_kubectl
    ns = new_namespace(k, "snapafter")
    image = images["qcow2.qcow2"]
    golden_image(k, ns, f"{range_server.url}/{image.name}")
    k("create", "quota", "claims", "-n", ns, "--hard=persistentvolumeclaims=2")
    wait_for(lambda: ((get(k, "quota", "claims", ns) or {}).get("status") or {}).get("used", {}).get(
        "persistentvolumeclaims") == "1", 30, 0.1, message="the quota counts the source's claim")
    k.apply(clone_dv("copy", {"pvc": {"namespace": ns, "name": "golden"}}, size="64Mi",
                     storage_class=TARGET.storage_class), "-n", ns)

    def between_steps() -> dict[str, Any] | None:
        dv = get(k, "datavolume", "copy", ns) or {}
        return dv if running(dv).get("reason") == "ErrExceededQuota" and snapshot_ready(k, ns) else None

    dv = wait_for(between_steps, 60, 0.2, message="the snapshot taken and its restored claim held by the quota")
    assert dv["status"]["phase"] == "CloneFromSnapshotSourceInProgress"
    assert "exceeded quota: claims" in running(dv)["message"], running(dv)
    k("delete", "datavolume", "golden", "-n", ns, "--wait=false")
    wait_for(lambda: get(k, "pvc", "golden", ns) is None, 60, 0.1, message="the source claim gone")

    wait_dv(k, ns, "copy", "Succeeded")
    assert read_back(k, "copy", image.virtual_size, namespace=ns) == image.sha256
    wait_for(lambda: leftovers(k, ns) == [], 10, 0.2, message=f"no temporary left: {leftovers(k, ns)}")
    assert [r for r, _ in events_of(k, ns, "copy") if r in ("CloneFailed", "CloneWithoutSource")] == []


@pytest.mark.anycluster
def test_a_snapshot_clone_whose_source_goes_before_the_snapshot_waits_for_a_source(
        shared_kubectl: Kubectl, range_server: FileServer, images: dict[str, Image], snapshot_strategy: None) -> None:
    """The source DataVolume is deleted before its snapshot could be taken (a pod writing to the source holds
    the clone, as it holds the claim's deletion, until the test lets go): no snapshot is ever asked of a
    claim being deleted, and the clone waits in SnapshotForSmartCloneInProgress saying why (CDI's
    CloneWithoutSource: a source of that name may come again), with no snapshot or claim of its own left.
    When it does come, the clone takes its bytes."""
    k = shared_kubectl
    ns = new_namespace(k, "snapbefore")
    image = images["qcow2.qcow2"]
    url = f"{range_server.url}/{image.name}"
    golden_image(k, ns, url)
    k.apply(pod("holder", "sleep 600", "golden"), "-n", ns)
    wait_for(lambda: (get(k, "pod", "holder", ns) or {}).get("status", {}).get("phase") == "Running", 60, 0.1,
             message="holder running")
    k.apply(clone_dv("copy", {"pvc": {"namespace": ns, "name": "golden"}}, size="64Mi",
                     storage_class=TARGET.storage_class), "-n", ns)
    wait_for(lambda: running(get(k, "datavolume", "copy", ns) or {}).get("reason") == "CloneSourceInUse", 60, 0.2,
             message="the clone held by the writer")
    k("delete", "datavolume", "golden", "-n", ns, "--wait=false")

    def says(message: str) -> dict[str, Any] | None:
        dv = get(k, "datavolume", "copy", ns) or {}
        return dv if (running(dv).get("reason"), running(dv).get("message")) == ("CloneWithoutSource", message) \
            else None

    deleting = f"The source pvc {ns}/golden is being deleted"
    dv = wait_for(lambda: says(deleting), 60, 0.2, message="the clone says its source is being deleted")
    assert (get(k, "pvc", "golden", ns) or {}).get("metadata", {}).get("deletionTimestamp"), \
        "the writer holds the source's claim"
    assert dv["status"]["phase"] == "SnapshotForSmartCloneInProgress"
    k("delete", "pod", "holder", "-n", ns, "--wait=false")
    wait_for(lambda: get(k, "pvc", "golden", ns) is None, 60, 0.1, message="the source claim gone")
    gone = f"The source pvc {ns}/golden doesn't exist"
    dv = wait_for(lambda: says(gone), 60, 0.2, message="the clone says its source is gone")
    assert dv["status"]["phase"] == "SnapshotForSmartCloneInProgress"
    assert running(dv)["status"] == "False"
    assert {("CloneWithoutSource", deleting), ("CloneWithoutSource", gone)} <= set(events_of(k, ns, "copy"))
    assert leftovers(k, ns) == [], "a snapshot was asked of a source being deleted"
    assert temporaries(k, ns) == []

    golden_image(k, ns, url)  # a source of that name again
    wait_dv(k, ns, "copy", "Succeeded")
    assert read_back(k, "copy", image.virtual_size, namespace=ns) == image.sha256
    wait_for(lambda: leftovers(k, ns) == [], 10, 0.2, message=f"no temporary left: {leftovers(k, ns)}")


@pytest.mark.anycluster
def test_temporaries_are_gone_as_soon_as_the_datavolume_succeeds(
        shared_cdi_up: CdiUp | External, shared_kubectl: Kubectl, images: dict[str, Image]) -> None:
    """`kubectl get pvc` right after a DataVolume succeeded shows what the user made: the prime claim of a
    populated import or upload, the temporary claim and snapshot of a smart or host-assisted clone are gone
    within moments (they lingered until the PV controller's next look at the prime, or the next periodic
    look of the clone)."""
    k = shared_kubectl
    ns = new_namespace(k, "gone")

    def none_left(after: str) -> None:
        wait_for(lambda: temporaries(k, ns) == [], GONE_AT_ONCE, 0.1,
                 message=f"no prime, temporary claim or snapshot {GONE_AT_ONCE}s after {after} succeeded: "
                         f"{temporaries(k, ns)}")

    for name in ("first", "second"):  # one after the other: neither may be lucky with a periodic look
        k.apply(import_dv(name, {"blank": {}}), "-n", ns)
        wait_dv(k, ns, name, "Succeeded")
        none_left(name)
    k.apply(clone_dv("copy", {"pvc": {"namespace": ns, "name": "first"}}, storage_class=TARGET.storage_class),
            "-n", ns)
    wait_dv(k, ns, "copy", "Succeeded")
    none_left("the smart clone")
    assert get(k, "pvc", "copy", ns)["metadata"]["annotations"]["cdi.kubevirt.io/cloneType"] == TARGET.smart_clone

    # host-assisted: a class without snapshots, where the bytes travel through a temporary claim
    k.apply(clone_dv("hosted", {"pvc": {"namespace": ns, "name": "first"}}, storage_class=TARGET.copy_class),
            "-n", ns)
    wait_dv(k, ns, "hosted", "Succeeded")
    none_left("the host-assisted clone")
    assert get(k, "pvc", "hosted", ns)["metadata"]["annotations"]["cdi.kubevirt.io/cloneType"] == "copy"

    # the upload populator, through the upload proxy
    image = images["qcow2.qcow2"]
    result = image_upload(shared_cdi_up, "dv", "uploaded", "-n", ns, "--size", "64Mi", "--storage-class",
                          TARGET.storage_class, "--image-path", str(image.path))
    assert result.returncode == 0, result.stdout + result.stderr
    wait_dv(k, ns, "uploaded", "Succeeded")
    none_left("the upload")
    assert get(k, "pvc", "uploaded", ns)["spec"]["dataSourceRef"]["kind"] == "VolumeUploadSource"
    assert read_back(k, "uploaded", image.virtual_size, namespace=ns) == image.sha256

    assert sorted(p["metadata"]["name"] for p in k.json("get", "pvc", "-n", ns)["items"]) == \
        ["copy", "first", "hosted", "second", "uploaded"]
