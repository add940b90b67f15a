"""The local storage of `cdi up` through the real kubectl: classes, provisioning and binding,
Block volumes, CSI clones and snapshot restores that keep bytes and holes, expansion, and
reclaiming."""

from __future__ import annotations

import json
from pathlib import Path

from tests.e2e.workloads import (
    BLOCK_DESCRIBE,
    DESCRIBE,
    SPARSE_WRITE,
    get,
    new_namespace,
    pod,
    pvc,
    run_to_completion,
    wait_bound,
)
from tests.support.cluster import CdiUp, Kubectl, wait_for

MIB = 1024 * 1024


BLOCK_WRITE = """
import os
fd = os.open("/dev/cdi-block-volume", os.O_RDWR)
size = os.lseek(fd, 0, os.SEEK_END)
os.pwrite(fd, b"block-data" * 400, 5 * 1024 * 1024)
os.fsync(fd)
print(size)
"""


def _describe(k: Kubectl, ns: str, claim: str, name: str, block: bool = False) -> dict:  # type: ignore[type-arg]
    out = run_to_completion(k, ns, pod(name, BLOCK_DESCRIBE if block else DESCRIBE, claim, block=block,
                                       python=True))
    return json.loads(out)  # type: ignore[no-any-return]


def test_classes_snapshot_class_and_driver(shared_kubectl: Kubectl) -> None:
    k = shared_kubectl
    classes = {c["metadata"]["name"]: c for c in k.json("get", "storageclass")["items"]}
    assert classes["local"]["volumeBindingMode"] == "Immediate"
    assert classes["local"]["metadata"]["annotations"]["storageclass.kubernetes.io/is-default-class"] == "true"
    assert classes["local-wffc"]["volumeBindingMode"] == "WaitForFirstConsumer"
    assert all(classes[n]["allowVolumeExpansion"] for n in ("local", "local-wffc", "local-nosnap"))
    assert classes["local-nosnap"]["provisioner"] != classes["local"]["provisioner"]
    vsclass = k.json("get", "volumesnapshotclass", "local")
    assert vsclass["driver"] == classes["local"]["provisioner"]
    assert k.exists("csidriver", classes["local"]["provisioner"])
    assert not k.exists("csidriver", classes["local-nosnap"]["provisioner"])


def test_claim_binds_with_default_class_and_reports_capacity(shared_kubectl: Kubectl) -> None:
    k = shared_kubectl
    ns = new_namespace(k, "bind")
    k.apply(pvc("plain", "100Mi"), "-n", ns)
    claim = wait_bound(k, ns, "plain")
    assert claim["spec"]["storageClassName"] == "local"
    assert claim["status"]["capacity"]["storage"] == "100Mi"
    assert claim["status"]["accessModes"] == ["ReadWriteOnce"]
    pv = k.json("get", "pv", claim["spec"]["volumeName"])
    assert pv["metadata"]["name"] == f"pvc-{claim['metadata']['uid']}"
    assert pv["spec"]["claimRef"]["name"] == "plain" and pv["spec"]["claimRef"]["uid"] == claim["metadata"]["uid"]
    assert pv["status"]["phase"] == "Bound"
    assert pv["spec"]["persistentVolumeReclaimPolicy"] == "Delete"
    assert pv["metadata"]["annotations"]["pv.kubernetes.io/provisioned-by"] == pv["spec"]["csi"]["driver"]
    assert claim["metadata"]["annotations"]["volume.kubernetes.io/storage-provisioner"] == pv["spec"]["csi"]["driver"]


def test_block_claim_is_a_device_of_the_claimed_size(shared_kubectl: Kubectl) -> None:
    k = shared_kubectl
    ns = new_namespace(k, "block")
    k.apply(pvc("raw", "48Mi", block=True), "-n", ns)
    assert run_to_completion(k, ns, pod("writer", BLOCK_WRITE, "raw", block=True, python=True)).strip() == \
        str(48 * MIB)
    described = _describe(k, ns, "raw", "reader", block=True)
    assert described["size"] == 48 * MIB


def test_clone_and_snapshot_restore_keep_bytes_and_holes(shared_kubectl: Kubectl) -> None:
    k = shared_kubectl
    ns = new_namespace(k, "copies")
    k.apply(pvc("source", "100Mi"), "-n", ns)
    run_to_completion(k, ns, pod("fill", SPARSE_WRITE, "source", python=True))
    original = _describe(k, ns, "source", "describe-source")
    assert original["size"] == 64 * MIB and original["allocated"] <= 1 * MIB  # the source is sparse

    k.apply(pvc("clone", "128Mi", source={"kind": "PersistentVolumeClaim", "name": "source"}), "-n", ns)
    k.apply({"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot", "metadata": {"name": "snap"},
             "spec": {"volumeSnapshotClassName": "local", "source": {"persistentVolumeClaimName": "source"}}},
            "-n", ns)
    def ready() -> dict | None:  # type: ignore[type-arg]
        snap = get(k, "volumesnapshot", "snap", ns)
        return snap if ((snap or {}).get("status") or {}).get("readyToUse") else None

    snapshot = wait_for(ready, 30, 0.1, message="snapshot ready")
    assert snapshot["status"]["restoreSize"] == "100Mi"
    content = k.json("get", "volumesnapshotcontent", snapshot["status"]["boundVolumeSnapshotContentName"])
    assert content["status"]["readyToUse"] is True and content["status"]["restoreSize"] == 100 * MIB
    assert content["status"]["snapshotHandle"]
    k.apply(pvc("restored", "100Mi", source={"kind": "VolumeSnapshot", "name": "snap",
                                             "apiGroup": "snapshot.storage.k8s.io"}), "-n", ns)
    wait_bound(k, ns, "clone")
    wait_bound(k, ns, "restored")
    # the source changes after the snapshot: neither copy may see it
    run_to_completion(k, ns, pod("scribble", "echo changed > /data/disk.img", "source"))
    for claim in ("clone", "restored"):
        copy = _describe(k, ns, claim, f"describe-{claim}")
        assert copy["sha256"] == original["sha256"], claim
        assert copy["size"] == original["size"]
        assert copy["allocated"] <= original["allocated"] + 64 * 1024, f"{claim} lost its holes"
    assert get(k, "pvc", "clone", ns)["status"]["capacity"]["storage"] == "128Mi"


def test_block_clone_has_identical_bytes(shared_kubectl: Kubectl) -> None:
    k = shared_kubectl
    ns = new_namespace(k, "blockclone")
    k.apply(pvc("raw", "32Mi", block=True), "-n", ns)
    run_to_completion(k, ns, pod("writer", BLOCK_WRITE, "raw", block=True, python=True))
    k.apply(pvc("copy", "32Mi", block=True, source={"kind": "PersistentVolumeClaim", "name": "raw"}), "-n", ns)
    wait_bound(k, ns, "copy")
    assert _describe(k, ns, "copy", "d-copy", block=True) == _describe(k, ns, "raw", "d-raw", block=True)


def test_no_snapshot_class_refuses_clone(shared_kubectl: Kubectl) -> None:
    k = shared_kubectl
    ns = new_namespace(k, "nosnap")
    k.apply(pvc("source", "16Mi", storage_class="local-nosnap"), "-n", ns)
    wait_bound(k, ns, "source")
    k.apply(pvc("clone", "16Mi", storage_class="local-nosnap",
                source={"kind": "PersistentVolumeClaim", "name": "source"}), "-n", ns)

    def failed() -> str | None:
        events = k.json("get", "events", "-n", ns, "--field-selector", "involvedObject.name=clone")["items"]
        return next((e["message"] for e in events if e["reason"] == "ProvisioningFailed"), None)

    assert "does not support cloning" in wait_for(failed, 30, 0.2, message="ProvisioningFailed")
    assert get(k, "pvc", "clone", ns)["status"]["phase"] == "Pending"


def test_expansion_grows_the_volume(shared_kubectl: Kubectl) -> None:
    k = shared_kubectl
    ns = new_namespace(k, "grow")
    k.apply(pvc("raw", "16Mi", block=True), "-n", ns)
    wait_bound(k, ns, "raw")
    k("patch", "pvc", "raw", "-n", ns, "--type=merge", "-p", '{"spec":{"resources":{"requests":{"storage":"40Mi"}}}}')
    wait_for(lambda: (get(k, "pvc", "raw", ns)["status"].get("capacity") or {}).get("storage") == "40Mi", 30, 0.1,
             message="capacity 40Mi")
    assert _describe(k, ns, "raw", "measure", block=True)["size"] == 40 * MIB
    shrink = k("patch", "pvc", "raw", "-n", ns, "--type=merge", "-p",
               '{"spec":{"resources":{"requests":{"storage":"8Mi"}}}}', check=False)
    assert shrink.returncode != 0


def test_reclaim_delete_removes_bytes_and_retain_keeps_them(shared_cdi_up: CdiUp, shared_kubectl: Kubectl) -> None:
    k = shared_kubectl
    ns = new_namespace(k, "reclaim")
    local = k.json("get", "storageclass", "local")
    retain_class = f"retain-{ns}"
    k.apply({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": retain_class},
             "provisioner": local["provisioner"], "reclaimPolicy": "Retain", "volumeBindingMode": "Immediate"})
    k.apply(pvc("gone", "8Mi"), "-n", ns)
    k.apply(pvc("kept", "8Mi", storage_class=retain_class), "-n", ns)
    volumes = Path(shared_cdi_up.data_dir) / "storage" / "volumes"
    gone_pv = wait_bound(k, ns, "gone")["spec"]["volumeName"]
    kept_pv = wait_bound(k, ns, "kept")["spec"]["volumeName"]
    run_to_completion(k, ns, pod("fill", "echo precious > /data/x", "kept"))
    assert (volumes / f"{gone_pv}.json").exists() and (volumes / f"{kept_pv}.json").exists()
    k("delete", "pvc", "gone", "kept", "-n", ns, "--wait=true")
    wait_for(lambda: not k.exists("pv", gone_pv), 30, 0.1, message="Delete policy PV removed")
    assert not (volumes / gone_pv).exists() and not (volumes / f"{gone_pv}.json").exists()
    wait_for(lambda: (k.json("get", "pv", kept_pv)["status"].get("phase") == "Released"), 30, 0.1,
             message="Retain policy PV released")
    assert (volumes / kept_pv / "x").read_text() == "precious\n"
    k("delete", "pv", kept_pv, "--wait=true")
    assert (volumes / kept_pv / "x").exists()  # Retain: the bytes outlive the PV object


def test_populator_hands_its_volume_to_the_target_claim(shared_kubectl: Kubectl) -> None:
    """The lib-volume-populator flow CDI's populators use: the provisioner leaves a claim whose
    dataSourceRef is a populator's kind alone; the populator fills a prime claim, points the
    prime's PV at the target claim, and deletes the prime; the target binds, the PV survives."""
    k = shared_kubectl
    ns = new_namespace(k, "populate")
    target = pvc("target", "16Mi")
    target["spec"]["dataSourceRef"] = {"apiGroup": "cdi.kubevirt.io", "kind": "VolumeImportSource", "name": "src"}
    k.apply(target, "-n", ns)
    k.apply(pvc("prime", "16Mi"), "-n", ns)
    prime = wait_bound(k, ns, "prime")
    run_to_completion(k, ns, pod("populate", "echo populated > /data/disk.img", "prime"))
    claim = get(k, "pvc", "target", ns)
    assert claim["status"]["phase"] == "Pending" and not claim["spec"].get("volumeName")
    volume = prime["spec"]["volumeName"]
    ref = {"namespace": ns, "name": "target", "uid": claim["metadata"]["uid"],
           "resourceVersion": claim["metadata"]["resourceVersion"]}
    k("patch", "pv", volume, "--type=merge", "-p", json.dumps({"spec": {"claimRef": ref}}))
    k("delete", "pvc", "prime", "-n", ns, "--wait=true")
    bound = wait_bound(k, ns, "target")
    assert bound["spec"]["volumeName"] == volume
    assert k.json("get", "pv", volume)["status"]["phase"] == "Bound"
    assert run_to_completion(k, ns, pod("read", "cat /data/disk.img", "target")).strip() == "populated"
